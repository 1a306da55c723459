//! `legacy_echo`: a test guest of the previous contract, `keel:tool@0.3.0`
//! (`wit/v0.3.0/tool.wit`), so that the host is proven to load and run a
//! component built before 0.4.0 beside the ones built after.
//!
//! It is written against that WIT with `wit-bindgen` directly, not through
//! the SDK (which builds 0.4.0 only), and implements every export by hand.
//! It hands back its `text` with the working directory of the context it ran
//! in, so a test sees that the context arrives; and `check` refuses the text
//! `refuse`, so a test sees that the host asks it.

// Only a wasm32 build exports the tool; natively the unit tests call the
// helpers and nothing calls the exports. `allow`, not `expect`: the lint
// fires in some native targets and not in others.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use serde::Deserialize;
use serde_json::Value;

/// The bindings of `wit/v0.3.0`, which carries their docs.
mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit/v0.3.0",
        world: "keel:tool/tool",
    });
}

use bindings::exports::keel::tool::guest::{Guest, ToolMetadata};
use bindings::keel::tool::types::{
    CallOutput, CallPlan, ContentBlock, InterruptBehavior, PermissionDecision,
};

/// The name the model calls the tool by.
const NAME: &str = "legacy_echo";

/// The one text `check` refuses.
const REFUSED: &str = "refuse";

/// The input schema, written by hand: a 0.3.0 tool has no SDK to derive it.
const INPUT_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "Input",
  "type": "object",
  "properties": {
    "text": { "type": "string", "description": "The text to hand back." }
  },
  "required": ["text"],
  "additionalProperties": false
}"#;

/// Input of `legacy_echo`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    /// The text to hand back.
    text: String,
}

/// The input of a call, or the error shown to the model.
fn parse(input: &str) -> Result<Input, String> {
    serde_json::from_str(input).map_err(|error| format!("invalid input: {error}"))
}

/// The working directory of a context (JSON text): its `cwd`, which the
/// contract promises; an error when it is missing, so a test cannot mistake
/// a lost context for a default.
fn cwd(context: &str) -> Result<String, String> {
    let context: Value =
        serde_json::from_str(context).map_err(|error| format!("invalid context from host: {error}"))?;
    context
        .get("cwd")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| "context from host has no `cwd`".into())
}

/// What a call hands back: `text`, then the working directory it ran in.
fn echo(text: &str, cwd: &str) -> String {
    format!("{text} (cwd: {cwd})")
}

/// The `legacy_echo` tool.
struct Legacy;

impl Guest for Legacy {
    fn metadata() -> ToolMetadata {
        ToolMetadata {
            name: NAME.into(),
            aliases: vec![],
            description: "Returns `text` unchanged (a 0.3.0 component).".into(),
            prompt: String::new(),
            input_schema: INPUT_SCHEMA.into(),
            output_schema: None,
            search_hint: Some("echo text with a tool of contract 0.3.0".into()),
            should_defer: false,
            always_load: false,
            strict: false,
            interrupt_behavior: InterruptBehavior::Cancel,
            user_facing_name: String::new(),
        }
    }

    fn is_enabled() -> bool {
        true
    }

    /// It touches nothing: any number may run at once, and it writes nothing.
    fn plan(_input: String, _context: String) -> CallPlan {
        CallPlan { concurrency_safe: true, read_only: true }
    }

    fn is_destructive(_input: String, _context: String) -> bool {
        false
    }

    fn max_result_size() -> Option<u64> {
        Some(50_000)
    }

    /// Allow, unless the text is exactly `refuse`: then a validation error,
    /// so a test sees that the host asks a 0.3.0 tool.
    fn check(input: String, _context: String) -> Result<PermissionDecision, String> {
        let input = parse(&input)?;
        if input.text == REFUSED {
            return Err(format!("{NAME} refuses this text"));
        }
        Ok(PermissionDecision::Allow(None))
    }

    /// It names nothing a permission rule could match.
    fn permission_subject(_input: String, _context: String) -> Option<String> {
        None
    }

    /// The text, or nothing when the input does not parse.
    fn classifier_input(input: String, _context: String) -> String {
        parse(&input).map(|input| input.text).unwrap_or_default()
    }

    fn user_facing_name(_input: String, _context: String) -> String {
        NAME.into()
    }

    fn activity_description(_input: String, _context: String) -> Option<String> {
        None
    }

    fn is_open_world(_input: String, _context: String) -> bool {
        false
    }

    fn is_search_or_read(_input: String, _context: String) -> bool {
        false
    }

    fn requires_user_interaction() -> bool {
        false
    }

    /// JSON equality, or text equality when either side is not JSON.
    fn inputs_equivalent(a: String, b: String) -> bool {
        match (serde_json::from_str::<Value>(&a), serde_json::from_str::<Value>(&b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => a == b,
        }
    }

    /// One text block: the text, then the context's `cwd`.
    fn call(input: String, context: String) -> Result<CallOutput, String> {
        let input = parse(&input)?;
        let cwd = cwd(&context)?;
        Ok(CallOutput {
            content: vec![ContentBlock::Text(echo(&input.text, &cwd))],
            structured: None,
            context_modifier: None,
        })
    }
}

// Only a wasm32 build is a component; a native build (under `cargo test
// --workspace`) checks the code and exports nothing.
#[cfg(target_arch = "wasm32")]
bindings::export!(Legacy with_types_in bindings);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_the_text_with_the_cwd_of_the_context() {
        let context = serde_json::json!({ "cwd": "/workspace/notes" }).to_string();
        let output = Legacy::call(r#"{"text": "hi"}"#.into(), context).unwrap();
        assert!(matches!(
            output.content.as_slice(),
            [ContentBlock::Text(text)] if text == "hi (cwd: /workspace/notes)"
        ));
        assert_eq!(output.structured, None);
        assert_eq!(output.context_modifier, None);
        assert_eq!(cwd("{}").unwrap_err(), "context from host has no `cwd`");
        assert!(cwd("not json").unwrap_err().starts_with("invalid context from host: "));
    }

    #[test]
    fn checks_allow_all_but_the_refused_text() {
        let context = String::from(r#"{"cwd": "/workspace"}"#);
        let allowed = Legacy::check(r#"{"text": "refuse "}"#.into(), context.clone());
        assert!(matches!(allowed, Ok(PermissionDecision::Allow(None))));
        let refused = Legacy::check(r#"{"text": "refuse"}"#.into(), context.clone());
        assert_eq!(refused.unwrap_err(), "legacy_echo refuses this text");
        assert!(Legacy::check("{}".into(), context).unwrap_err().starts_with("invalid input: "));
    }

    #[test]
    fn the_input_schema_is_json_naming_the_text() {
        let schema: Value = serde_json::from_str(INPUT_SCHEMA).unwrap();
        assert_eq!(schema["required"], serde_json::json!(["text"]));
        assert_eq!(schema["additionalProperties"], serde_json::json!(false));
        assert_eq!(Legacy::metadata().name, "legacy_echo");
        assert!(Legacy::inputs_equivalent(r#"{"text": "a"}"#.into(), r#"{ "text":"a" }"#.into()));
    }
}
