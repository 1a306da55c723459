//! Batches in and results out: `tool_use` blocks as an agent hands them over,
//! and the user message of `tool_result` blocks that goes back.

use std::collections::HashSet;

use serde::Serialize;
use serde_json::{Value, json};

use crate::error::{Error, Result};

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

/// One `tool_result` block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ToolResult {
    /// Always `tool_result`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The id of the `tool_use` it answers.
    pub tool_use_id: String,
    /// What the model reads.
    pub content: String,
    /// Set when the call failed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

impl ToolResult {
    /// A successful result.
    pub fn ok(tool_use_id: impl Into<String>, content: impl Into<String>) -> Self {
        ToolResult {
            kind: "tool_result",
            tool_use_id: tool_use_id.into(),
            content: content.into(),
            is_error: false,
        }
    }

    /// A failed result.
    pub fn error(tool_use_id: impl Into<String>, content: impl Into<String>) -> Self {
        ToolResult {
            kind: "tool_result",
            tool_use_id: tool_use_id.into(),
            content: content.into(),
            is_error: true,
        }
    }
}

/// The user message that carries `results` back to the model.
pub fn user_message(results: &[ToolResult]) -> Value {
    json!({ "role": "user", "content": results })
}

/// Read a batch: a JSON array of `tool_use` blocks, or an assistant message
/// whose `content` holds them (other blocks, such as text, are skipped).
/// `origin` names the source in errors.
pub fn parse_batch(text: &str, origin: &str) -> Result<Vec<ToolUse>> {
    let fail = |reason: String| Error::Batch { origin: origin.to_string(), reason };
    let value: Value =
        serde_json::from_str(text).map_err(|error| fail(format!("not valid JSON: {error}")))?;
    let (blocks, from_message) = match &value {
        Value::Array(blocks) => (blocks, false),
        Value::Object(message) => {
            if let Some(role) = message.get("role").and_then(Value::as_str)
                && role != "assistant"
            {
                return Err(fail(format!(
                    "the message has role `{role}`; tool_use blocks come from `assistant`"
                )));
            }
            match message.get("content") {
                Some(Value::Array(blocks)) => (blocks, true),
                _ => return Err(fail("the message has no `content` array".into())),
            }
        }
        _ => return Err(fail("expected an array of tool_use blocks or an assistant message".into())),
    };
    let mut uses = Vec::new();
    let mut seen = HashSet::new();
    for (index, block) in blocks.iter().enumerate() {
        let at = |reason: &str| fail(format!("content[{index}]: {reason}"));
        let Value::Object(block) = block else {
            return Err(at("expected a JSON object"));
        };
        match block.get("type").and_then(Value::as_str) {
            Some("tool_use") => {}
            None if !from_message => {}
            Some(_) | None if from_message => continue,
            Some(other) => return Err(at(&format!("expected a tool_use block, found type `{other}`"))),
            None => unreachable!("covered above"),
        }
        let id = match block.get("id") {
            Some(Value::String(id)) if !id.is_empty() => id.clone(),
            _ => return Err(at("`id` must be a non-empty string")),
        };
        if !seen.insert(id.clone()) {
            return Err(at(&format!("duplicate tool_use id `{id}`")));
        }
        let name = match block.get("name") {
            Some(Value::String(name)) => name.clone(),
            _ => return Err(at("`name` must be a string")),
        };
        let input = match block.get("input") {
            None => Ok(json!({})),
            // Some agents pass the input as the model's raw JSON text.
            Some(Value::String(raw)) => {
                serde_json::from_str(raw).map_err(|error| format!("the input is not valid JSON: {error}"))
            }
            Some(input) => Ok(input.clone()),
        };
        uses.push(ToolUse { id, name, input });
    }
    Ok(uses)
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
            "failed to read batch b.json: content[1]: `id` must be a non-empty string"
        );
        assert_eq!(
            error(r#"[{"id":"a","name":"x"},{"id":"a","name":"y"}]"#),
            "failed to read batch b.json: content[1]: duplicate tool_use id `a`"
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
