//! What a batch run reports as it goes, what each call cost
//! ([`figures`]), and the label a batch gets once it finished ([`summary`]).

pub mod figures;
pub mod summary;

pub use figures::{CallFigures, Outcome, Step, StepTime, now_us};

use serde::Serialize;
use serde_json::Value;

use crate::batch::ToolResult;
use crate::content::Content;

/// One event of a batch run. Serialized as one JSON object with a `type`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// How the batch was cut: runs that may go in parallel, calls that go alone.
    BatchPlan {
        /// The groups, in order.
        batches: Vec<PlannedGroup>,
    },
    /// A call began to run.
    CallStarted {
        /// Its `tool_use` id.
        tool_use_id: String,
        /// The tool's name.
        tool: String,
        /// What it is doing, for a progress display.
        #[serde(skip_serializing_if = "Option::is_none")]
        activity: Option<String>,
    },
    /// A running call reported progress; sent the moment the tool sent it.
    Progress {
        /// Its `tool_use` id.
        tool_use_id: String,
        /// What the tool reported.
        data: Value,
    },
    /// A running call's HTTP request was refused before anything was sent.
    NetworkRefused {
        /// Its `tool_use` id.
        tool_use_id: String,
        /// The request's method.
        method: String,
        /// The request's URL.
        url: String,
        /// The rule or limit that refused it.
        reason: String,
    },
    /// A running call sent a log line.
    ToolLog {
        /// Its `tool_use` id.
        tool_use_id: String,
        /// How much it matters.
        level: crate::tool::LogLevel,
        /// The line, secrets masked.
        message: String,
    },
    /// A call ended, its result held to its tool's budget.
    CallFinished {
        /// Its `tool_use` id.
        tool_use_id: String,
        /// Whether it failed.
        is_error: bool,
        /// What it cost, step by step, and how it ended. Left out of a
        /// normalized trace (`keel test`), which must not depend on timing.
        #[serde(skip_serializing_if = "Option::is_none")]
        figures: Option<Box<CallFigures>>,
    },
    /// A call's result, in the order of the batch: it waits for the results
    /// of the calls before it.
    ToolResult {
        /// Its `tool_use` id.
        tool_use_id: String,
        /// What the model reads: text, or text and image blocks.
        content: Content,
        /// The structured value of a tool that declares an output schema.
        #[serde(skip_serializing_if = "Option::is_none")]
        structured_content: Option<Value>,
        /// Whether the call failed.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    /// The per-message budget replaced a result already sent as
    /// `tool_result`: the message handed back holds this content instead.
    /// Results stream whole (within their per-tool budget) as calls finish;
    /// the per-message budget can only judge once all are in.
    ToolResultReplaced {
        /// Its `tool_use` id.
        tool_use_id: String,
        /// The replacement: a `<persisted-output>` block.
        content: Content,
    },
    /// Every call of the batch has its result.
    BatchFinished {
        /// Calls in the batch.
        calls: usize,
        /// Calls whose result is an error.
        errors: usize,
        /// Whether the batch was interrupted.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        interrupted: bool,
    },
    /// A short label for the batch, made off the critical path after it
    /// finished. Never sent when no label could be made.
    Summary {
        /// The calls it summarizes.
        tool_use_ids: Vec<String>,
        /// The label, at most 50 chars.
        label: String,
    },
}

/// One group of the plan, by `tool_use` ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedGroup {
    /// Whether its calls may overlap.
    pub concurrent: bool,
    /// Its calls.
    pub tool_use_ids: Vec<String>,
}

impl Event {
    /// Whether a running tool reported it itself: progress, a log line, a
    /// refused request. The other events tell a call's course.
    pub fn is_report(&self) -> bool {
        matches!(self, Event::Progress { .. } | Event::ToolLog { .. } | Event::NetworkRefused { .. })
    }

    /// The event that carries `result`.
    pub fn tool_result(result: &ToolResult) -> Self {
        Event::ToolResult {
            tool_use_id: result.tool_use_id.clone(),
            content: result.content.clone(),
            structured_content: result.structured.clone(),
            is_error: result.is_error,
        }
    }

    /// The `tool_use` id the event concerns, if it concerns one call.
    pub fn tool_use_id(&self) -> Option<&str> {
        match self {
            Event::CallStarted { tool_use_id, .. }
            | Event::Progress { tool_use_id, .. }
            | Event::NetworkRefused { tool_use_id, .. }
            | Event::ToolLog { tool_use_id, .. }
            | Event::CallFinished { tool_use_id, .. }
            | Event::ToolResult { tool_use_id, .. }
            | Event::ToolResultReplaced { tool_use_id, .. } => Some(tool_use_id),
            Event::BatchPlan { .. } | Event::BatchFinished { .. } | Event::Summary { .. } => None,
        }
    }
}
