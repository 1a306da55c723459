//! `echo`: hand the input text back — the smallest useful tool, and the one
//! the benchmarks measure keel's own per-call cost with.

use keel_guest::{Context, Output, Plan, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;

/// Input of `echo`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The text to hand back.
    pub text: String,
}

/// The `echo` tool.
pub struct Echo;

impl Tool for Echo {
    type Input = Input;
    const NAME: &str = "echo";
    const DESCRIPTION: &str = "Returns `text` unchanged.";
    const FIXED_PLAN: Option<Plan> = Some(Plan::SAFE_READ_ONLY);
    // Any text is fine: the schema says all there is to check.
    const CHECKS_INPUT: bool = false;

    fn is_destructive(_input: &Input, _cx: &Context) -> bool {
        false
    }

    fn call(input: Input, _cx: &Context) -> Result<Output> {
        Ok(Output::text(input.text))
    }
}

keel_guest::export!(Echo);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_the_text_back() {
        let out = Echo::call(Input { text: "héllo\n".into() }, &Context::workspace_root()).unwrap();
        assert_eq!(out.text(), "héllo\n");
    }
}
