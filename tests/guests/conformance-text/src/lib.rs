//! `test_simple_text`: one text block, as the conformance suite's
//! `tools-call-simple-text` scenario asks.

use keel_guest::{Context, Output, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;

/// No input.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Input {}

/// The tool.
pub struct SimpleText;

impl Tool for SimpleText {
    type Input = Input;
    const NAME: &str = "test_simple_text";
    const DESCRIPTION: &str = "Returns a simple text response.";

    fn call(_input: Input, _cx: &Context) -> Result<Output> {
        Ok(Output::text("This is a simple text response for testing."))
    }
}

keel_guest::export!(SimpleText);
