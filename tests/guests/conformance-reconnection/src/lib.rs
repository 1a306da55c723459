//! `test_reconnection`: a call that takes a moment, for the conformance
//! suite's `server-sse-polling` scenario, which watches the event stream
//! the answer comes on.

use std::time::Duration;

use keel_guest::{Context, Output, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;

/// No input.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Input {}

/// The tool.
pub struct Reconnection;

impl Tool for Reconnection {
    type Input = Input;
    const NAME: &str = "test_reconnection";
    const DESCRIPTION: &str = "Answers after a short wait.";

    fn call(_input: Input, _cx: &Context) -> Result<Output> {
        std::thread::sleep(Duration::from_millis(100));
        Ok(Output::text("Reconnection test completed."))
    }
}

keel_guest::export!(Reconnection);
