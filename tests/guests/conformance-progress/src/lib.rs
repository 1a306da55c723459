//! `test_tool_with_progress`: three progress reports while it runs, as
//! the conformance suite's `tools-call-with-progress` scenario asks.

use std::time::Duration;

use keel_guest::{Context, Output, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

/// No input.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Input {}

/// The tool.
pub struct WithProgress;

impl Tool for WithProgress {
    type Input = Input;
    const NAME: &str = "test_tool_with_progress";
    const DESCRIPTION: &str = "Reports progress three times while it runs.";

    fn call(_input: Input, _cx: &Context) -> Result<Output> {
        for done in [0, 50, 100] {
            keel_guest::progress(&json!({ "progress": done, "total": 100 }));
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Output::text("Reported progress three times."))
    }
}

keel_guest::export!(WithProgress);
