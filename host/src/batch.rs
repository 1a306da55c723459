//! Batches in and results out: `tool_use` blocks as an agent hands them over,
//! and the user message of `tool_result` blocks that goes back.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::content::{Content, ContentBlock};
use crate::error::{Error, Result};
use crate::limits::{Limits, input_too_large};

/// One `tool_use` block of a model turn.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolUse {
    /// The block's id; its result carries it as `tool_use_id`.
    pub id: String,
    /// The name of the tool the model called.
    pub name: String,
    /// The input, or why it is not JSON (a model may emit broken JSON text).
    pub input: Result<Value, String>,
}

impl ToolUse {
    /// A call with a JSON input.
    pub fn new(id: impl Into<String>, name: impl Into<String>, input: Value) -> Self {
        ToolUse { id: id.into(), name: name.into(), input: Ok(input) }
    }
}

/// One `tool_result` block, as the Anthropic Messages API takes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ToolResult {
    /// Always `tool_result`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The id of the `tool_use` it answers.
    pub tool_use_id: String,
    /// What the model reads: text, or text and image blocks. A structured
    /// value the tool gave no text for is here as its JSON text.
    pub content: Content,
    /// Set when the call failed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// The structured value of a tool that declares an output schema,
    /// checked against it (MCP's `structuredContent`). Not part of the
    /// Anthropic block. Kept when the budgets replace the result if its JSON
    /// is at most [`crate::budget::KEPT_STRUCTURED_BYTES`]; a larger one is dropped,
    /// and the result made an error saying so.
    #[serde(skip)]
    pub structured: Option<Value>,
}

impl ToolResult {
    /// A successful result.
    pub fn ok(tool_use_id: impl Into<String>, content: impl Into<Content>) -> Self {
        ToolResult {
            kind: "tool_result",
            tool_use_id: tool_use_id.into(),
            content: content.into(),
            is_error: false,
            structured: None,
        }
    }

    /// A failed result.
    pub fn error(tool_use_id: impl Into<String>, message: impl Into<String>) -> Self {
        ToolResult {
            kind: "tool_result",
            tool_use_id: tool_use_id.into(),
            content: Content::Text(message.into()),
            is_error: true,
            structured: None,
        }
    }
}

/// `results` as the messages of an OpenAI Chat Completions conversation: one
/// `{"role": "tool", "tool_call_id", "content"}` message per result. That
/// format carries text only, so each image left out is named in one line
/// of text where it stood.
pub fn openai_messages(results: &[ToolResult]) -> Vec<Value> {
    results
        .iter()
        .map(|result| {
            let content = match &result.content {
                Content::Text(text) => text.clone(),
                Content::Blocks(blocks) => blocks
                    .iter()
                    .map(|block| match block {
                        ContentBlock::Text(text) => text.clone(),
                        ContentBlock::Image(image) => format!(
                            "[an image ({}, {} bytes) was left out: this format carries text only]",
                            image.media_type,
                            image.data.len()
                        ),
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            };
            json!({ "role": "tool", "tool_call_id": result.tool_use_id, "content": content })
        })
        .collect()
}

/// The user message that carries `results` back to the model.
pub fn user_message(results: &[ToolResult]) -> Value {
    json!({ "role": "user", "content": results })
}

/// Read a batch: a JSON array of `tool_use` blocks, or an assistant message
/// whose `content` holds them (other blocks, such as text, are skipped). An
/// OpenAI Chat Completions assistant message is read too: each of its
/// `tool_calls` (`{"id", "type": "function", "function": {"name",
/// "arguments"}}`) is a call, its `arguments` the input; so is such a call
/// in an array. `origin` names the source in errors. Inputs larger than the
/// default [`Limits::input`] fail their call; see [`parse_batch_with_limit`].
pub fn parse_batch(text: &str, origin: &str) -> Result<Vec<ToolUse>> {
    parse_batch_with_limit(text, origin, Limits::default().input)
}

/// [`parse_batch_with_limit`] for bytes as read from a file: bytes that are
/// not UTF-8 are refused with the offset of the first bad one.
pub fn parse_batch_bytes(bytes: &[u8], origin: &str, max_input: usize) -> Result<Vec<ToolUse>> {
    let text = std::str::from_utf8(bytes).map_err(|error| Error::Batch {
        origin: origin.to_string(),
        reason: format!("not UTF-8 text: invalid byte at offset {}", error.valid_up_to()),
    })?;
    parse_batch_with_limit(text, origin, max_input)
}

/// [`parse_batch`] with a cap on each input: an input of more than
/// `max_input` bytes of JSON text is measured, not parsed, and fails its own
/// call with an error naming its block, its size and the limit; the other
/// calls of the batch are read as usual. Nesting deeper than 128 levels
/// fails the same way (serde_json's recursion limit).
pub fn parse_batch_with_limit(text: &str, origin: &str, max_input: usize) -> Result<Vec<ToolUse>> {
    let fail = |reason: String| Error::Batch { origin: origin.to_string(), reason };
    // A byte order mark, as some editors write one, is not part of the JSON
    // (RFC 8259 lets a reader ignore it).
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let not_json = |error: serde_json::Error| fail(format!("not valid JSON: {error}"));
    // The list the calls are in, as errors name it (empty for a bare array,
    // so its entries are `[i]`), and whether entries that are not calls (a
    // message's text blocks) are skipped.
    let (blocks, list, from_message): (Vec<&RawValue>, &str, bool) = match text
        .trim_start()
        .as_bytes()
        .first()
    {
        Some(b'[') => (serde_json::from_str(text).map_err(not_json)?, "", false),
        Some(b'{') => {
            let message: HashMap<String, &RawValue> = serde_json::from_str(text).map_err(not_json)?;
            if let Some(Value::String(role)) = field(&message, "role")
                && role != "assistant"
            {
                return Err(fail(format!(
                    "the message has role `{role}`; tool_use blocks come from `assistant`"
                )));
            }
            let array =
                |name: &str| message.get(name).map(|raw| serde_json::from_str::<Vec<&RawValue>>(raw.get()));
            match (array("tool_calls"), array("content")) {
                (Some(Ok(calls)), content) => {
                    // Calls in both places would run only one of them: which
                    // the model meant is not known, so neither runs.
                    let blocks = content.and_then(Result::ok).unwrap_or_default();
                    let is_tool_use = |block: &&RawValue| {
                        let block = serde_json::from_str::<HashMap<String, &RawValue>>(block.get());
                        block.is_ok_and(|block| field(&block, "type") == Some(Value::from("tool_use")))
                    };
                    if let Some(index) = blocks.iter().position(is_tool_use) {
                        return Err(fail(format!(
                            "the message has both tool_use blocks in `content` (the first at \
                             content[{index}]) and `tool_calls`; give its calls one way"
                        )));
                    }
                    (calls, "tool_calls", false)
                }
                (Some(Err(_)), _) => return Err(fail("the message's `tool_calls` is not an array".into())),
                (None, Some(Ok(blocks))) => (blocks, "content", true),
                (None, _) => return Err(fail("the message has no `content` array nor `tool_calls`".into())),
            }
        }
        None => {
            return Err(fail(
                "it is empty; expected an array of tool_use blocks or an assistant message".into(),
            ));
        }
        _ => {
            serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(not_json)?;
            return Err(fail("expected an array of tool_use blocks or an assistant message".into()));
        }
    };
    let mut uses = Vec::new();
    let mut seen = HashSet::new();
    for (index, block) in blocks.iter().enumerate() {
        let at = |reason: &str| fail(format!("{list}[{index}]: {reason}"));
        let Ok(block) = serde_json::from_str::<HashMap<String, &RawValue>>(block.get()) else {
            return Err(at("expected a JSON object"));
        };
        // A `tool_use` block holds its name and input; an OpenAI call, its
        // `function`.
        let function: Option<HashMap<String, &RawValue>> = match field(&block, "type") {
            Some(Value::String(kind)) if kind == "tool_use" => None,
            Some(Value::String(kind)) if kind == "function" => {
                let function = block.get("function").map(|raw| serde_json::from_str(raw.get()));
                let Some(Ok(function)) = function else {
                    return Err(at("a function call's `function` must be an object"));
                };
                Some(function)
            }
            None if !from_message => None,
            _ if from_message => continue,
            Some(Value::String(other)) => {
                return Err(at(&format!(
                    "expected a tool_use block or a function call, found type `{other}`"
                )));
            }
            Some(_) => return Err(at("`type` must be a string")),
            None => unreachable!("covered above"),
        };
        let (holder, input_key) = match &function {
            Some(function) => (function, "arguments"),
            None => (&block, "input"),
        };
        let id = match field(&block, "id") {
            Some(Value::String(id)) if !id.is_empty() => id,
            _ => return Err(at("`id` must be a non-empty string")),
        };
        if !seen.insert(id.clone()) {
            return Err(at(&format!("duplicate tool_use id `{id}`")));
        }
        let name = match field(holder, "name") {
            Some(Value::String(name)) => name,
            _ => return Err(at("`name` must be a string")),
        };
        let input = match holder.get(input_key) {
            None => Ok(json!({})),
            Some(raw) if raw.get().len() > max_input => {
                Err(input_too_large(max_input, &format!("the input of {list}[{index}]"), raw.get().len()))
            }
            Some(raw) => match parse_value(raw) {
                // Some agents pass the input as the model's raw JSON text.
                Ok(Value::String(text)) => serde_json::from_str(&text)
                    .map_err(|error| format!("the input is not valid JSON: {error}")),
                Ok(input) => Ok(input),
                Err(error) => Err(format!("the input is not valid JSON: {error}")),
            },
        };
        uses.push(ToolUse { id, name, input });
    }
    Ok(uses)
}

fn parse_value(raw: &RawValue) -> serde_json::Result<Value> {
    serde_json::from_str(raw.get())
}

/// The value of `object`'s member `name`, if it has one (null if it nests
/// too deep to read).
fn field(object: &HashMap<String, &RawValue>, name: &str) -> Option<Value> {
    object.get(name).map(|raw| parse_value(raw).unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_array_of_tool_use_blocks() {
        let uses =
            parse_batch(r#"[{"type":"tool_use","id":"a","name":"grep","input":{"pattern":"x"}}]"#, "b.json")
                .unwrap();
        assert_eq!(uses, vec![ToolUse::new("a", "grep", json!({ "pattern": "x" }))]);
    }

    #[test]
    fn reads_an_assistant_message_skipping_text() {
        let text = r#"{"role":"assistant","content":[
            {"type":"text","text":"Let me look."},
            {"type":"tool_use","id":"a","name":"Read","input":{"file_path":"x"}}]}"#;
        assert_eq!(
            parse_batch(text, "m.json").unwrap(),
            vec![ToolUse::new("a", "Read", json!({ "file_path": "x" }))]
        );
    }

    #[test]
    fn reads_an_openai_assistant_message_and_its_calls_in_an_array() {
        let message = r#"{"role":"assistant","content":null,"tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"grep","arguments":"{\"pattern\":\"x\"}"}},
            {"id":"call_2","type":"function","function":{"name":"echo","arguments":"{\"text\": "}}]}"#;
        let uses = parse_batch(message, "m.json").unwrap();
        assert_eq!(uses[0], ToolUse::new("call_1", "grep", json!({ "pattern": "x" })));
        assert_eq!((uses[1].id.as_str(), uses[1].name.as_str()), ("call_2", "echo"));
        let error = uses[1].input.clone().unwrap_err();
        assert!(
            error.starts_with("the input is not valid JSON: "),
            "broken arguments fail their call: {error}"
        );

        let array = r#"[{"id":"c","type":"function","function":{"name":"wc","arguments":{"path":"a"}}},
            {"type":"tool_use","id":"t","name":"echo","input":{}}]"#;
        assert_eq!(
            parse_batch(array, "a.json").unwrap(),
            vec![ToolUse::new("c", "wc", json!({ "path": "a" })), ToolUse::new("t", "echo", json!({}))]
        );

        let error = |text: &str| parse_batch(text, "m.json").unwrap_err().to_string();
        assert_eq!(
            error(r#"{"role":"assistant","tool_calls":[{"id":"c","type":"custom","custom":{}}]}"#),
            "failed to read batch m.json: tool_calls[0]: expected a tool_use block or a function call, found type `custom`"
        );
        assert_eq!(
            error(
                r#"{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"arguments":"{}"}}]}"#
            ),
            "failed to read batch m.json: tool_calls[0]: `name` must be a string"
        );
        assert_eq!(
            error(r#"{"role":"assistant","tool_calls":[{"id":"c","type":"function"}]}"#),
            "failed to read batch m.json: tool_calls[0]: a function call's `function` must be an object"
        );
        assert_eq!(
            error(r#"{"role":"assistant","tool_calls":{}}"#),
            "failed to read batch m.json: the message's `tool_calls` is not an array"
        );
        assert_eq!(
            error(r#"{"role":"assistant","content":"hi"}"#),
            "failed to read batch m.json: the message has no `content` array nor `tool_calls`"
        );
    }

    #[test]
    fn a_message_with_tool_use_blocks_and_tool_calls_is_refused_naming_the_first_block() {
        let message = r#"{"role":"assistant","content":[
            {"type":"text","text":"Both."},
            {"type":"tool_use","id":"a","name":"grep","input":{"pattern":"x"}}],
            "tool_calls":[{"id":"c","type":"function","function":{"name":"wc","arguments":"{}"}}]}"#;
        assert_eq!(
            parse_batch(message, "m.json").unwrap_err().to_string(),
            "failed to read batch m.json: the message has both tool_use blocks in `content` (the first \
             at content[1]) and `tool_calls`; give its calls one way"
        );
        // Text beside `tool_calls`, as a string or as text parts, is no call.
        let text_parts = r#"{"role":"assistant","content":[{"type":"text","text":"Let me look."}],
            "tool_calls":[{"id":"c","type":"function","function":{"name":"wc","arguments":"{}"}}]}"#;
        assert_eq!(parse_batch(text_parts, "m.json").unwrap(), vec![ToolUse::new("c", "wc", json!({}))]);
        let text = r#"{"role":"assistant","content":"Let me look.",
            "tool_calls":[{"id":"c","type":"function","function":{"name":"wc","arguments":"{}"}}]}"#;
        assert_eq!(parse_batch(text, "m.json").unwrap(), vec![ToolUse::new("c", "wc", json!({}))]);
    }

    #[test]
    fn a_byte_order_mark_before_the_batch_is_ignored() {
        let uses = parse_batch("\u{feff}[{\"id\":\"a\",\"name\":\"echo\"}]", "b.json").unwrap();
        assert_eq!(uses, vec![ToolUse::new("a", "echo", json!({}))]);
    }

    #[test]
    fn an_input_that_is_broken_json_text_fails_only_that_call() {
        let uses = parse_batch(r#"[{"id":"a","name":"grep","input":"{\"pattern\": "}]"#, "b.json").unwrap();
        let error = uses[0].input.clone().unwrap_err();
        assert!(error.starts_with("the input is not valid JSON: "), "{error}");
    }

    #[test]
    fn errors_name_the_source_and_the_block() {
        let error = |text: &str| parse_batch(text, "b.json").unwrap_err().to_string();
        assert_eq!(
            error(r#"[{"id":"a","name":"x"},{"name":"y"}]"#),
            "failed to read batch b.json: [1]: `id` must be a non-empty string"
        );
        assert_eq!(
            error(r#"[{"id":"a","name":"x"},{"id":"a","name":"y"}]"#),
            "failed to read batch b.json: [1]: duplicate tool_use id `a`"
        );
        assert_eq!(
            error(r#"{"role":"assistant","content":[{"type":"tool_use","id":"","name":"x"}]}"#),
            "failed to read batch b.json: content[0]: `id` must be a non-empty string"
        );
        assert_eq!(
            error(r#"{"role":"user","content":[]}"#),
            "failed to read batch b.json: the message has role `user`; tool_use blocks come from `assistant`"
        );
        assert_eq!(
            error("42"),
            "failed to read batch b.json: expected an array of tool_use blocks or an assistant message"
        );
        assert!(error("[").starts_with("failed to read batch b.json: not valid JSON: "));
        assert_eq!(
            error(" \n"),
            "failed to read batch b.json: it is empty; expected an array of tool_use blocks or an assistant message"
        );
    }

    #[test]
    fn results_serialize_as_tool_result_blocks() {
        let message = user_message(&[ToolResult::ok("a", "fine"), ToolResult::error("b", "bad")]);
        assert_eq!(
            message.to_string(),
            r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"fine"},{"type":"tool_result","tool_use_id":"b","content":"bad","is_error":true}]}"#
        );
    }
}
