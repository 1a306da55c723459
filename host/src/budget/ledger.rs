//! The replacement ledger (`ContentReplacementState` in the runtime keel
//! follows): every
//! per-message budget decision, so that none is ever made twice.
//!
//! An agent re-sends its whole history with every request, and the provider
//! caches the prompt by prefix: if a result sent whole in turn 3 came back as
//! a preview in turn 7, or a preview changed by one byte, every cached token
//! after it would be lost. So a result is decided once — kept whole, or
//! replaced by exact bytes — and [`Budget::per_message`] applies the recorded
//! decision ever after.
//!
//! The ledger serializes to JSON (an agent stores it beside its transcript),
//! [clones](Clone) for a sub-agent that continues from the same history
//! (the copies are independent), and can be [rebuilt from the messages as
//! sent](Ledger::reconstruct) when the JSON was not kept.
//!
//! [`Budget::per_message`]: crate::budget::Budget::per_message

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::persist::is_replacement;

/// What the per-message budget decided for one result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case", deny_unknown_fields)]
pub enum Decision {
    /// Seen and sent whole; it stays whole.
    Kept,
    /// Sent as this replacement (a `<persisted-output>` block, or the error
    /// left when persisting failed); it is always sent as these bytes.
    Replaced {
        /// The exact content sent.
        content: String,
        /// Whether it was sent as an error.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

/// Every decision so far, by `tool_use` id. Serialized as a JSON object from
/// id to decision, in id order:
///
/// ```json
/// {"toolu_1":{"decision":"kept"},"toolu_2":{"decision":"replaced","content":"<persisted-output>…"}}
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Ledger {
    decisions: BTreeMap<String, Decision>,
}

/// Why a ledger could not be read or rebuilt.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The JSON is not a ledger. Its text ends the message, and is not
    /// also the error's `source` (a report of the chain would repeat it).
    #[error("failed to read the replacement ledger: {0}")]
    Json(serde_json::Error),
    /// A message of the transcript is not of the expected shape.
    #[error("failed to rebuild the replacement ledger: transcript[{message}]{block}: {reason}")]
    Transcript {
        /// The index of the message.
        message: usize,
        /// `.content[i]` when a block is at fault, else empty.
        block: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl Ledger {
    /// An empty ledger, for a new session.
    pub fn new() -> Self {
        Ledger::default()
    }

    /// The decision made for `tool_use_id`, if any.
    pub fn get(&self, tool_use_id: &str) -> Option<&Decision> {
        self.decisions.get(tool_use_id)
    }

    /// Every decision, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Decision)> {
        self.decisions.iter().map(|(id, decision)| (id.as_str(), decision))
    }

    /// How many results have a decision.
    pub fn len(&self) -> usize {
        self.decisions.len()
    }

    /// Whether no result has a decision yet.
    pub fn is_empty(&self) -> bool {
        self.decisions.is_empty()
    }

    /// Record `decision` for `tool_use_id`, unless one is recorded already:
    /// the first decision stands.
    pub(crate) fn record(&mut self, tool_use_id: &str, decision: Decision) {
        self.decisions.entry(tool_use_id.to_owned()).or_insert(decision);
    }

    /// The ledger as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a map of strings serializes")
    }

    /// Read a ledger written by [`Ledger::to_json`].
    pub fn from_json(text: &str) -> Result<Self, LedgerError> {
        serde_json::from_str(text).map_err(LedgerError::Json)
    }

    /// Rebuild the ledger from a transcript: the messages as they were sent,
    /// in order (`{"role": "user", "content": [tool_result blocks]}`, other
    /// roles and blocks allowed and skipped).
    ///
    /// Every `tool_result` block is a decision: one whose content is a
    /// replacement ([`is_replacement`]) was replaced by exactly that content,
    /// any other was kept. A block whose content is not a string (an array
    /// of content blocks) was kept. The first block of an id stands. Running
    /// [`Budget::per_message`](crate::budget::Budget::per_message) with the
    /// rebuilt ledger over the same results, whole or as sent, yields the
    /// same bytes again.
    ///
    /// A result whose own output happens to look like a replacement is
    /// recorded as replaced by itself, which sends the same bytes as keeping
    /// it.
    pub fn reconstruct<'a>(transcript: impl IntoIterator<Item = &'a Value>) -> Result<Self, LedgerError> {
        let mut ledger = Ledger::new();
        for (index, message) in transcript.into_iter().enumerate() {
            let fail = |block: String, reason: &str| LedgerError::Transcript {
                message: index,
                block,
                reason: reason.to_owned(),
            };
            let Value::Object(message) = message else {
                return Err(fail(String::new(), "expected a message object"));
            };
            match message.get("role") {
                Some(Value::String(role)) if role == "user" => {}
                Some(Value::String(_)) => continue,
                _ => return Err(fail(String::new(), "`role` must be a string")),
            }
            let blocks = match message.get("content") {
                Some(Value::Array(blocks)) => blocks,
                Some(Value::String(_)) => continue,
                _ => return Err(fail(String::new(), "`content` must be a string or an array")),
            };
            for (at, block) in blocks.iter().enumerate() {
                let fail = |reason: &str| fail(format!(".content[{at}]"), reason);
                let Value::Object(block) = block else { return Err(fail("expected a content block object")) };
                if block.get("type").and_then(Value::as_str) != Some("tool_result") {
                    continue;
                }
                let id = match block.get("tool_use_id") {
                    Some(Value::String(id)) if !id.is_empty() => id,
                    _ => return Err(fail("`tool_use_id` must be a non-empty string")),
                };
                let is_error = match block.get("is_error") {
                    None => false,
                    Some(Value::Bool(is_error)) => *is_error,
                    Some(_) => return Err(fail("`is_error` must be a boolean")),
                };
                let decision = match block.get("content") {
                    Some(Value::String(content)) if is_replacement(content, is_error) => {
                        Decision::Replaced { content: content.clone(), is_error }
                    }
                    _ => Decision::Kept,
                };
                ledger.record(id, decision);
            }
        }
        Ok(ledger)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn replaced(content: &str) -> Decision {
        Decision::Replaced { content: content.into(), is_error: false }
    }

    #[test]
    fn a_ledger_that_is_not_json_says_why_once() {
        let error = Ledger::from_json("{").unwrap_err();
        assert_eq!(
            error.to_string(),
            "failed to read the replacement ledger: EOF while parsing an object at line 1 column 1"
        );
        assert!(std::error::Error::source(&error).is_none(), "a report of the chain would repeat the reason");
    }

    #[test]
    fn the_first_decision_stands() {
        let mut ledger = Ledger::new();
        ledger.record("a", Decision::Kept);
        ledger.record("a", replaced("x"));
        ledger.record("b", replaced("y"));
        ledger.record("b", Decision::Kept);
        assert_eq!(ledger.get("a"), Some(&Decision::Kept));
        assert_eq!(ledger.get("b"), Some(&replaced("y")));
        assert_eq!(ledger.get("c"), None);
        assert_eq!(ledger.len(), 2);
    }

    #[test]
    fn serializes_to_exact_json_and_back() {
        let mut ledger = Ledger::new();
        ledger.record("toolu_2", Decision::Replaced { content: "no space".into(), is_error: true });
        ledger.record("toolu_1", Decision::Kept);
        ledger.record("toolu_3", replaced("<persisted-output>\n</persisted-output>"));
        let text = ledger.to_json();
        assert_eq!(
            text,
            r#"{"toolu_1":{"decision":"kept"},"toolu_2":{"decision":"replaced","content":"no space","is_error":true},"toolu_3":{"decision":"replaced","content":"<persisted-output>\n</persisted-output>"}}"#
        );
        assert_eq!(Ledger::from_json(&text).unwrap(), ledger);
        assert_eq!(Ledger::from_json("{}").unwrap(), Ledger::new());
    }

    #[test]
    fn malformed_json_is_an_error() {
        let error = Ledger::from_json(r#"{"a":{"decision":"forgotten"}}"#).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("failed to read the replacement ledger: unknown variant `forgotten`"),
            "{error}"
        );
        let error = Ledger::from_json(r#"{"a":{"decision":"replaced"}}"#).unwrap_err();
        assert!(error.to_string().contains("missing field `content`"), "{error}");
        let error = Ledger::from_json(r#"{"a":{"decision":"replaced","content":"x","why":1}}"#).unwrap_err();
        assert!(error.to_string().contains("unknown field `why`"), "{error}");
    }

    #[test]
    fn a_clone_is_independent() {
        let mut parent = Ledger::new();
        parent.record("a", Decision::Kept);
        let mut child = parent.clone();
        child.record("b", replaced("x"));
        parent.record("c", Decision::Kept);
        assert_eq!(parent.iter().map(|(id, _)| id).collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(child.iter().map(|(id, _)| id).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn reconstructs_replaced_and_kept_results_skipping_other_messages() {
        let block = "<persisted-output>\nOutput too large\n</persisted-output>";
        let failed = "Failed to save the full output (9 chars, 9 bytes) to p: disk full.";
        let transcript = [
            json!({ "role": "user", "content": "hello" }),
            json!({ "role": "assistant", "content": [{ "type": "tool_use", "id": "a", "name": "grep", "input": {} }] }),
            json!({ "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "a", "content": block },
                { "type": "tool_result", "tool_use_id": "b", "content": "whole", "is_error": true },
                { "type": "text", "text": "and a note" },
                { "type": "tool_result", "tool_use_id": "c", "content": failed, "is_error": true },
                { "type": "tool_result", "tool_use_id": "d", "content": failed },
                { "type": "tool_result", "tool_use_id": "e", "content": [{ "type": "text", "text": block }] },
                { "type": "tool_result", "tool_use_id": "f" },
            ]}),
            json!({ "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "a", "content": "again" }] }),
        ];
        let ledger = Ledger::reconstruct(&transcript).unwrap();
        let expected: Vec<(&str, Decision)> = vec![
            ("a", replaced(block)),
            ("b", Decision::Kept),
            ("c", Decision::Replaced { content: failed.into(), is_error: true }),
            ("d", Decision::Kept),
            ("e", Decision::Kept),
            ("f", Decision::Kept),
        ];
        assert_eq!(ledger.iter().map(|(id, d)| (id, d.clone())).collect::<Vec<_>>(), expected);
    }

    #[test]
    fn a_malformed_transcript_is_an_error_naming_the_place() {
        let error =
            |transcript: Value| Ledger::reconstruct(transcript.as_array().unwrap()).unwrap_err().to_string();
        assert_eq!(
            error(json!([{ "role": "user", "content": [] }, 7])),
            "failed to rebuild the replacement ledger: transcript[1]: expected a message object"
        );
        assert_eq!(
            error(json!([{ "content": [] }])),
            "failed to rebuild the replacement ledger: transcript[0]: `role` must be a string"
        );
        assert_eq!(
            error(json!([{ "role": "user", "content": 3 }])),
            "failed to rebuild the replacement ledger: transcript[0]: `content` must be a string or an array"
        );
        assert_eq!(
            error(json!([{ "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "" }] }])),
            "failed to rebuild the replacement ledger: transcript[0].content[0]: `tool_use_id` must be a \
             non-empty string"
        );
        assert_eq!(
            error(json!([{ "role": "user", "content": [
                { "type": "text", "text": "x" },
                { "type": "tool_result", "tool_use_id": "a", "is_error": "yes" },
            ] }])),
            "failed to rebuild the replacement ledger: transcript[0].content[1]: `is_error` must be a boolean"
        );
        assert_eq!(
            error(json!([{ "role": "user", "content": ["x"] }])),
            "failed to rebuild the replacement ledger: transcript[0].content[0]: expected a content block object"
        );
    }
}
