//! `test_error_handling`: a tool error, as the conformance suite's
//! `tools-call-error` scenario asks.

use keel_guest::bail;
use keel_guest::{Context, Output, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;

/// No input.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Input {}

/// The tool.
pub struct ErrorHandling;

impl Tool for ErrorHandling {
    type Input = Input;
    const NAME: &str = "test_error_handling";
    const DESCRIPTION: &str = "Always fails.";

    fn call(_input: Input, _cx: &Context) -> Result<Output> {
        bail!("This tool intentionally returns an error for testing")
    }
}

keel_guest::export!(ErrorHandling);
