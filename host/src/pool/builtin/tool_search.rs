//! `ToolSearch`: find deferred tools by keyword and load their definitions.
//!
//! A tool that sets `should-defer` (without `always-load`) is not sent to
//! the model in full: `ToolSearch` names it in its own description, and a
//! search over the tools' search hints and names returns the full
//! definitions of the best matches, for the model to read before it calls
//! one. The pool adds `ToolSearch` last, and only when some tool is
//! deferred, so its description (which changes with the plugins) never
//! disturbs the definitions before it.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::pool::definitions::{Format, definition};
use crate::tool::{CallContext, CallError, CallOutput, InterruptBehavior, Invocation, Tool, ToolSpec};

/// The name of the tool.
pub const TOOL_SEARCH: &str = "ToolSearch";
/// Definitions returned when the input sets no `max_results`.
pub const DEFAULT_MAX_RESULTS: usize = 5;
/// The most definitions one search returns: each is a whole schema, and a
/// model that needs more should search more precisely.
pub const MAX_RESULTS: usize = 20;

/// A query word this long or longer also matches words it begins
/// ("perm" finds "permission"); shorter ones must match whole words, or
/// "a" would match everything.
const MIN_PREFIX_CHARS: usize = 3;

/// The built-in `ToolSearch` tool.
pub struct ToolSearch {
    spec: ToolSpec,
    catalog: Arc<Vec<Deferred>>,
}

/// One deferred tool, as the search sees it.
struct Deferred {
    name: String,
    name_words: Vec<String>,
    hint_words: Vec<String>,
    definition: Value,
}

#[derive(Deserialize)]
struct Input {
    query: String,
    max_results: Option<usize>,
}

impl ToolSearch {
    /// A search over `deferred`, the tools the model is shown by name only,
    /// in pool order.
    pub fn new<'a>(deferred: impl IntoIterator<Item = &'a ToolSpec>) -> Self {
        let catalog: Vec<Deferred> = deferred
            .into_iter()
            .map(|spec| Deferred {
                name: spec.name.clone(),
                name_words: words(&spec.name),
                hint_words: spec.search_hint.as_deref().map(words).unwrap_or_default(),
                definition: definition(spec, Format::Anthropic),
            })
            .collect();
        let names: Vec<&str> = catalog.iter().map(|tool| tool.name.as_str()).collect();
        let description = format!(
            "Finds tools that are available but not loaded yet, and returns their full definitions. \
                 Search with a few keywords of what you need, or with a tool's exact name, and read a \
                 tool's definition before calling it. Tools available through this search: {}.",
            names.join(", ")
        );
        let input_schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Keywords of the capability you need, or a tool's exact name."
                },
                "max_results": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_RESULTS,
                    "description": format!("Definitions to return at most. Default: {DEFAULT_MAX_RESULTS}.")
                }
            },
            "required": ["query"],
            "additionalProperties": false
        });
        let spec = ToolSpec {
            search_hint: Some("find and load deferred tools".into()),
            always_load: true,
            interrupt: InterruptBehavior::Cancel,
            user_facing_name: "Tool search".into(),
            ..ToolSpec::native(TOOL_SEARCH, &description, input_schema)
        };
        ToolSearch { spec, catalog: Arc::new(catalog) }
    }
}

#[async_trait]
impl Tool for ToolSearch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, input: Value, _context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
        Ok(Box::new(SearchCall { catalog: self.catalog.clone(), input }))
    }
}

struct SearchCall {
    catalog: Arc<Vec<Deferred>>,
    input: Value,
}

#[async_trait]
impl Invocation for SearchCall {
    fn input(&self) -> &Value {
        &self.input
    }

    fn set_input(&mut self, input: Value) {
        self.input = input;
    }

    /// A search reads the catalog, not the workspace: no answer depends on
    /// the context.
    fn set_context(&mut self, _context: Arc<Value>) {}

    async fn is_concurrency_safe(&mut self) -> bool {
        true
    }

    async fn is_read_only(&mut self) -> bool {
        true
    }

    async fn is_destructive(&mut self) -> bool {
        false
    }

    async fn is_search_or_read(&mut self) -> bool {
        true
    }

    async fn permission_subject(&mut self) -> Option<String> {
        self.input.get("query").and_then(Value::as_str).map(str::to_string)
    }

    async fn activity_description(&mut self) -> Option<String> {
        self.permission_subject().await.map(|query| format!("Searching tools for {query}"))
    }

    async fn call(self: Box<Self>, _cx: CallContext) -> Result<CallOutput, CallError> {
        let input: Input = serde_json::from_value(self.input)
            .map_err(|error| CallError::Tool(format!("invalid input: {error}")))?;
        let limit = input.max_results.unwrap_or(DEFAULT_MAX_RESULTS).clamp(1, MAX_RESULTS);
        let found = search(&self.catalog, &input.query, limit);
        let content = if found.is_empty() {
            let names: Vec<&str> = self.catalog.iter().map(|tool| tool.name.as_str()).collect();
            format!(
                "No deferred tool matches {:?}. Tools available through {TOOL_SEARCH}: {}.",
                input.query,
                names.join(", ")
            )
        } else {
            let mut out = String::from("<functions>\n");
            for tool in found {
                out.push_str(&format!("<function>{}</function>\n", tool.definition));
            }
            out.push_str("</functions>");
            out
        };
        Ok(CallOutput::text(content))
    }
}

/// The best matches for `query`, best first, at most `limit`: a tool named
/// exactly by the query comes first; then tools by how many query words
/// match their search hint or name (a whole word counts more than a
/// prefix); ties keep the pool order.
fn search<'a>(catalog: &'a [Deferred], query: &str, limit: usize) -> Vec<&'a Deferred> {
    let terms = words(query);
    let mut scored: Vec<(usize, usize, &Deferred)> = catalog
        .iter()
        .enumerate()
        .map(|(position, tool)| {
            let exact = tool.name.eq_ignore_ascii_case(query.trim());
            let score: usize = terms
                .iter()
                .map(|term| {
                    let mut known = tool.hint_words.iter().chain(&tool.name_words);
                    if known.clone().any(|word| word == term) {
                        2
                    } else if term.chars().count() >= MIN_PREFIX_CHARS
                        && known.any(|word| word.starts_with(term))
                    {
                        1
                    } else {
                        0
                    }
                })
                .sum();
            (if exact { usize::MAX } else { score }, position, tool)
        })
        .filter(|(score, _, _)| *score > 0)
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().take(limit).map(|(_, _, tool)| tool).collect()
}

/// Lowercase words of `text`: runs of letters and digits.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, hint: Option<&str>) -> ToolSpec {
        let mut spec = ToolSearch::new(std::iter::empty()).spec;
        spec.name = name.into();
        spec.description = format!("The {name} tool.");
        spec.search_hint = hint.map(str::to_string);
        spec.input_schema = json!({ "type": "object" });
        spec
    }

    fn names(found: &[&Deferred]) -> Vec<String> {
        found.iter().map(|tool| tool.name.clone()).collect()
    }

    fn catalog() -> ToolSearch {
        ToolSearch::new(&[
            spec("acme__fetch", Some("download a web page over http")),
            spec("acme__query", Some("run a query against the sales database")),
            spec("pdf_text", Some("extract text from a pdf document")),
            spec("notify", None),
        ])
    }

    #[test]
    fn ranks_by_matching_hint_and_name_words() {
        let tool = catalog();
        assert_eq!(names(&search(&tool.catalog, "database query", 5)), ["acme__query"]);
        assert_eq!(names(&search(&tool.catalog, "web page text", 5)), ["acme__fetch", "pdf_text"]);
        assert_eq!(names(&search(&tool.catalog, "ACME", 5)), ["acme__fetch", "acme__query"]);
        assert_eq!(names(&search(&tool.catalog, "acme", 1)), ["acme__fetch"]);
        assert_eq!(names(&search(&tool.catalog, "notif", 5)), ["notify"], "a prefix of three or more");
        assert!(search(&tool.catalog, "no", 5).is_empty(), "too short to be a prefix");
        assert!(search(&tool.catalog, "spreadsheet", 5).is_empty());
    }

    #[test]
    fn an_exact_name_comes_first() {
        let tool = catalog();
        assert_eq!(names(&search(&tool.catalog, "pdf_text", 5))[0], "pdf_text");
        assert_eq!(names(&search(&tool.catalog, " Notify ", 5)), ["notify"]);
    }

    #[test]
    fn the_description_names_every_deferred_tool() {
        assert!(
            catalog().spec.description.ends_with(
                "Tools available through this search: acme__fetch, acme__query, pdf_text, notify."
            ),
            "{}",
            catalog().spec.description
        );
    }

    #[test]
    fn returns_full_definitions_or_says_what_there_is() {
        let tool = catalog();
        let run = |input: Value| {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(async {
                let call = tool.invoke(input, Arc::new(json!({}))).await.unwrap();
                call.call(CallContext::new(json!({}))).await.unwrap().to_text()
            })
        };
        assert_eq!(
            run(json!({ "query": "pdf" })),
            "<functions>\n<function>{\"name\":\"pdf_text\",\"description\":\"The pdf_text tool.\",\
             \"input_schema\":{\"type\":\"object\"}}</function>\n</functions>"
        );
        assert_eq!(
            run(json!({ "query": "spreadsheet" })),
            "No deferred tool matches \"spreadsheet\". Tools available through ToolSearch: acme__fetch, \
             acme__query, pdf_text, notify."
        );
        assert_eq!(run(json!({ "query": "acme", "max_results": 1 })).matches("<function>").count(), 1);
    }
}
