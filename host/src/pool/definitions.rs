//! Tool definitions as a model provider takes them: the `tools` of an
//! Anthropic Messages request, or the function tools of an OpenAI Chat
//! Completions request.
//!
//! The pool's order is kept, so the built-ins come first and their
//! definitions are the same bytes whatever plugins are loaded: an agent's
//! prompt cache stays valid. A deferred tool (`should-defer`, without
//! `always-load`) is not sent: the `ToolSearch` tool, which comes last,
//! lists it by name and returns its full definition when the model asks.
//!
//! The description a model reads is the tool's description, followed by its
//! longer prompt text, when it has one, after a blank line.

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::pool::ToolPool;
use crate::tool::ToolSpec;

/// A provider's shape of tool definitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Anthropic Messages `tools` entries: `name`, `description`,
    /// `input_schema` (and `strict` when the tool asks for it).
    Anthropic,
    /// OpenAI Chat Completions function tools: `{"type": "function",
    /// "function": {name, description, parameters, strict?}}`.
    OpenAi,
}

/// The definitions of every tool the model is shown, in pool order.
pub fn definitions(pool: &ToolPool, format: Format) -> Vec<Value> {
    pool.entries()
        .iter()
        .map(|entry| entry.tool.spec())
        .filter(|spec| !pool.is_deferred(spec))
        .map(|spec| definition(spec, format))
        .collect()
}

/// One tool's definition.
pub fn definition(spec: &ToolSpec, format: Format) -> Value {
    let mut fields = Map::new();
    match format {
        Format::Anthropic => {
            fields.insert("name".into(), json!(spec.name));
            fields.insert("description".into(), json!(model_description(spec)));
            fields.insert("input_schema".into(), spec.input_schema.clone());
            if spec.strict {
                fields.insert("strict".into(), json!(true));
            }
            Value::Object(fields)
        }
        Format::OpenAi => {
            fields.insert("name".into(), json!(spec.name));
            fields.insert("description".into(), json!(model_description(spec)));
            fields.insert("parameters".into(), spec.input_schema.clone());
            if spec.strict {
                fields.insert("strict".into(), json!(true));
            }
            json!({ "type": "function", "function": fields })
        }
    }
}

/// The description a model reads: the description, then the prompt text.
pub fn model_description(spec: &ToolSpec) -> String {
    if spec.prompt.trim().is_empty() {
        spec.description.clone()
    } else {
        format!("{}\n\n{}", spec.description, spec.prompt)
    }
}

/// Everything keel knows about one tool of the pool, for `keel list
/// --format json`: its spec, and whether the model is shown it in full.
#[derive(Clone, Debug, Serialize)]
pub struct Listing<'a> {
    /// The tool's input-independent facts.
    #[serde(flatten)]
    pub spec: &'a ToolSpec,
    /// Whether it is listed by name only until `ToolSearch` loads it.
    pub deferred: bool,
}

/// The pool as keel sees it, in pool order, deferred tools included.
pub fn listing(pool: &ToolPool) -> Vec<Listing<'_>> {
    pool.entries()
        .iter()
        .map(|entry| entry.tool.spec())
        .map(|spec| Listing { spec, deferred: pool.is_deferred(spec) })
        .collect()
}
