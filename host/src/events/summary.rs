//! Tool-use summaries (README, "Result budgets"): a short label for a finished batch,
//! for a compact view ("think git-commit subject, not sentence").
//!
//! A summary is display only, so it is made off the critical path:
//! [`spawn`] starts it on its own task and returns at once, the next batch
//! never waits for it, and anything that goes wrong — an error, a panic, a
//! summarizer that never answers — is swallowed as "no summary". The label is
//! cut to [`TOOL_SUMMARY_MAX_LENGTH`] chars.
//!
//! ```no_run
//! use std::sync::Arc;
//! use keel_host::events::summary::{self, DefaultSummarizer, SummaryCall};
//! # async fn run(uses: &[keel_host::ToolUse], results: &[keel_host::ToolResult]) {
//! let calls = uses.iter().zip(results).map(|(u, r)| SummaryCall::new(u, r)).collect();
//! let pending = summary::spawn(Arc::new(DefaultSummarizer), calls, summary::DEFAULT_SUMMARY_TIMEOUT);
//! // ... run the next batch; later:
//! if let Ok(Some(summary)) = pending.await {
//!     println!("{}: {:?}", summary.label, summary.tool_use_ids);
//! }
//! # }
//! ```

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt as _;
use serde::Serialize;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::batch::{ToolResult, ToolUse};

/// Chars a label may have (`TOOL_SUMMARY_MAX_LENGTH` in the runtime keel follows). A model is
/// asked for about 30, for a one-line mobile view; this cut is the backstop.
pub const TOOL_SUMMARY_MAX_LENGTH: usize = 50;

/// How long a summarizer may take before its batch has no summary: a small
/// model answers in a second or two, and a label that arrives later than the
/// next turns is of little use.
pub const DEFAULT_SUMMARY_TIMEOUT: Duration = Duration::from_secs(30);

/// The error a summarizer may fail with; it is logged and dropped.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One call of the batch, as a summarizer sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryCall {
    /// The id of its `tool_use`.
    pub tool_use_id: String,
    /// The tool name the model used.
    pub name: String,
    /// The input; `null` when it was not valid JSON.
    pub input: Value,
    /// The result's text, as sent (after budgets), images left out.
    pub output: String,
    /// Whether the call failed.
    pub is_error: bool,
}

impl SummaryCall {
    /// The call `tool_use` with its `result`.
    pub fn new(tool_use: &ToolUse, result: &ToolResult) -> Self {
        SummaryCall {
            tool_use_id: tool_use.id.clone(),
            name: tool_use.name.clone(),
            input: tool_use.input.clone().unwrap_or(Value::Null),
            output: result.content.text().into_owned(),
            is_error: result.is_error,
        }
    }
}

/// The summary of one batch, ready to forward as an event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The label: one line, at most [`TOOL_SUMMARY_MAX_LENGTH`] chars.
    pub label: String,
    /// The ids of the batch's `tool_use` blocks, in order.
    pub tool_use_ids: Vec<String>,
}

/// Makes the label of a batch; an agent plugs in a small model here.
///
/// Runs on a tokio task: an implementation must await rather than block
/// the thread, or the timeout cannot stop it.
#[async_trait]
pub trait Summarizer: Send + Sync + 'static {
    /// A label for `calls`, the batch in order. The caller trims it, folds
    /// it to one line and cuts it; an error means no summary.
    async fn summarize(&self, calls: &[SummaryCall]) -> Result<String, BoxError>;
}

/// The deterministic summarizer: counts by tool, in order of first call.
///
/// One entry per tool name, joined by `, `:
/// - `Read` called once: `Read <file name>`; more often: `Read <n> files`;
/// - any other tool called once: `<name> <subject>`, the subject being the
///   first string among the input's `pattern`, `query`, `command`, `url`
///   (as given) and `file_path`, `path` (the last path component); just
///   `<name>` without one;
/// - called more often: `<name> ×<n>`;
/// - then ` (failed)` for a single failed call, ` (<k> failed)` otherwise.
///
/// For example `Read 3 files, grep ×2 (1 failed)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultSummarizer;

impl DefaultSummarizer {
    /// The label of `calls`, before the cut.
    pub fn label(calls: &[SummaryCall]) -> String {
        let mut groups: Vec<(&str, Vec<&SummaryCall>)> = Vec::new();
        for call in calls {
            match groups.iter_mut().find(|(name, _)| *name == call.name) {
                Some((_, group)) => group.push(call),
                None => groups.push((&call.name, vec![call])),
            }
        }
        let entries: Vec<String> = groups
            .iter()
            .map(|(name, group)| {
                let mut entry = match (group.as_slice(), *name) {
                    ([call], _) => match subject(&call.input) {
                        Some(subject) => format!("{name} {subject}"),
                        None => (*name).to_owned(),
                    },
                    (group, "Read") => format!("Read {} files", group.len()),
                    (group, _) => format!("{name} ×{}", group.len()),
                };
                match group.iter().filter(|call| call.is_error).count() {
                    0 => {}
                    1 if group.len() == 1 => entry.push_str(" (failed)"),
                    failed => entry.push_str(&format!(" ({failed} failed)")),
                }
                entry
            })
            .collect();
        entries.join(", ")
    }
}

#[async_trait]
impl Summarizer for DefaultSummarizer {
    async fn summarize(&self, calls: &[SummaryCall]) -> Result<String, BoxError> {
        Ok(DefaultSummarizer::label(calls))
    }
}

/// What a single call is about, from its input.
fn subject(input: &Value) -> Option<String> {
    let text = |key: &str| input.get(key).and_then(Value::as_str).filter(|text| !text.is_empty());
    if let Some(text) = ["pattern", "query", "command", "url"].into_iter().find_map(text) {
        return Some(text.to_owned());
    }
    let path = ["file_path", "path"].into_iter().find_map(text)?;
    let last = path.trim_end_matches('/').rsplit('/').next().filter(|last| !last.is_empty());
    Some(last.unwrap_or(path).to_owned())
}

/// `label` as shown: whitespace runs (newlines included) folded to one
/// space, trimmed, and when longer than [`TOOL_SUMMARY_MAX_LENGTH`] chars,
/// its first 49 chars (less a trailing space) and `…`. `None` when nothing
/// is left.
pub fn cut(label: &str) -> Option<String> {
    let folded = label.split_whitespace().collect::<Vec<_>>().join(" ");
    if folded.is_empty() {
        return None;
    }
    if folded.chars().count() <= TOOL_SUMMARY_MAX_LENGTH {
        return Some(folded);
    }
    let mut cut: String = folded.chars().take(TOOL_SUMMARY_MAX_LENGTH - 1).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    Some(cut)
}

/// Start summarizing the batch `calls` on a new tokio task and return at
/// once. The task yields the [`Summary`], or `None` when the batch is empty,
/// the summarizer fails, panics, takes longer than `timeout`, or gives an
/// empty label. Awaiting the handle is optional; dropping it leaves the task
/// to finish on its own (within `timeout`).
///
/// # Panics
///
/// Outside a tokio runtime.
pub fn spawn(
    summarizer: Arc<dyn Summarizer>,
    calls: Vec<SummaryCall>,
    timeout: Duration,
) -> JoinHandle<Option<Summary>> {
    tokio::spawn(async move {
        if calls.is_empty() {
            return None;
        }
        let attempt = AssertUnwindSafe(summarizer.summarize(&calls)).catch_unwind();
        let label = match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(Ok(label))) => label,
            Ok(Ok(Err(error))) => {
                tracing::debug!("no tool-use summary: the summarizer failed: {error}");
                return None;
            }
            Ok(Err(_)) => {
                tracing::debug!("no tool-use summary: the summarizer panicked");
                return None;
            }
            Err(_) => {
                tracing::debug!("no tool-use summary: the summarizer took longer than {timeout:?}");
                return None;
            }
        };
        let label = cut(&label)?;
        Some(Summary { label, tool_use_ids: calls.into_iter().map(|call| call.tool_use_id).collect() })
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(id: &str, name: &str, input: Value, is_error: bool) -> SummaryCall {
        SummaryCall { tool_use_id: id.into(), name: name.into(), input, output: String::new(), is_error }
    }

    #[test]
    fn counts_by_tool_in_order_of_first_call() {
        let calls = [
            call("1", "Read", json!({ "file_path": "src/a.rs" }), false),
            call("2", "grep", json!({ "pattern": "x" }), false),
            call("3", "Read", json!({ "file_path": "b.rs" }), false),
            call("4", "grep", json!({ "pattern": "y" }), true),
            call("5", "Read", json!({ "file_path": "c.rs" }), false),
        ];
        assert_eq!(DefaultSummarizer::label(&calls), "Read 3 files, grep ×2 (1 failed)");
    }

    #[test]
    fn a_single_call_names_its_subject() {
        let label = |name: &str, input: Value, is_error: bool| {
            DefaultSummarizer::label(&[call("1", name, input, is_error)])
        };
        assert_eq!(label("Read", json!({ "file_path": "/workspace/src/lib.rs" }), false), "Read lib.rs");
        assert_eq!(label("grep", json!({ "pattern": "fn main", "path": "src" }), false), "grep fn main");
        assert_eq!(label("ls", json!({ "path": "src/deep/" }), false), "ls deep");
        assert_eq!(label("ls", json!({ "path": "/" }), false), "ls /");
        assert_eq!(label("write_file", json!({ "content": "x" }), true), "write_file (failed)");
        assert_eq!(label("odd", Value::Null, false), "odd");
        assert_eq!(
            DefaultSummarizer::label(&[
                call("1", "write_file", json!({}), true),
                call("2", "write_file", json!({}), true)
            ]),
            "write_file ×2 (2 failed)"
        );
        assert_eq!(DefaultSummarizer::label(&[]), "");
    }

    #[test]
    fn the_cut_keeps_fifty_chars_on_one_line() {
        assert_eq!(cut("  Read a.rs,\n\tgrep x  ").as_deref(), Some("Read a.rs, grep x"));
        assert_eq!(cut(" \n "), None);
        let exact = "é".repeat(50);
        assert_eq!(cut(&exact), Some(exact.clone()));
        let over = "é".repeat(51);
        assert_eq!(cut(&over), Some(format!("{}…", "é".repeat(49))));
        assert_eq!(cut(&over).unwrap().chars().count(), 50);
        // No space is left dangling before the ellipsis.
        assert_eq!(cut(&format!("{} tail", "a".repeat(48))), Some(format!("{}…", "a".repeat(48))));
    }

    #[test]
    fn a_summary_is_serialized_for_an_event() {
        let summary = Summary { label: "grep x".into(), tool_use_ids: vec!["a".into(), "b".into()] };
        assert_eq!(
            serde_json::to_string(&summary).unwrap(),
            r#"{"label":"grep x","tool_use_ids":["a","b"]}"#
        );
    }
}
