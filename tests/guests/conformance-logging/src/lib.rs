//! `test_tool_with_logging`: three log lines while it runs, as the
//! conformance suite's `tools-call-with-logging` scenario asks.

use std::time::Duration;

use keel_guest::log;
use keel_guest::{Context, Output, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;

/// No input.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Input {}

/// The tool.
pub struct WithLogging;

impl Tool for WithLogging {
    type Input = Input;
    const NAME: &str = "test_tool_with_logging";
    const DESCRIPTION: &str = "Logs three lines while it runs.";

    fn call(_input: Input, _cx: &Context) -> Result<Output> {
        log::info("Tool execution started");
        std::thread::sleep(Duration::from_millis(50));
        log::info("Tool processing data");
        std::thread::sleep(Duration::from_millis(50));
        log::info("Tool execution completed");
        Ok(Output::text("Logged three lines."))
    }
}

keel_guest::export!(WithLogging);
