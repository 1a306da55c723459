//! `fixed`: a test guest that says at load that every call of it is
//! concurrency-safe and read-only (`FIXED_PLAN`) and that it checks no input
//! (`CHECKS_INPUT = false`), and traps if it is asked any of those per call
//! all the same.
//!
//! A host that honours the load-time answers never asks `plan` or `check`:
//! its calls run side by side and succeed. A host that asked would get a trap
//! and its conservative answers instead: a call run alone, a call refused.
//! The calls write the file their input names, if any, which the read-only
//! grant the fixed plan claims must refuse.

use keel_guest::{Context, Output, Permission, Plan, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;

/// Input of `fixed`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Text handed back as `ok: <message>`.
    pub message: String,
    /// A file to write under the working directory first, which the
    /// read-only grant refuses.
    #[serde(default)]
    pub write: Option<String>,
}

/// Trap (a panic is a trap in wasm): the host asked a question the tool
/// answered once, at load.
fn asked(question: &str) -> ! {
    panic!("fixed: `{question}` was asked, though answered at load");
}

/// The `fixed` tool.
pub struct Fixed;

impl Tool for Fixed {
    type Input = Input;
    const NAME: &str = "fixed";
    const DESCRIPTION: &str = "Test guest: answers `ok: <message>`, its plan and checks fixed at load.";
    const FIXED_PLAN: Option<Plan> = Some(Plan::SAFE_READ_ONLY);
    const CHECKS_INPUT: bool = false;
    // Its questions trap when asked: the SDK must not ask them in the call.
    const HOLD_CLAIMS: bool = false;

    fn is_concurrency_safe(_input: &Input, _cx: &Context) -> bool {
        asked("is_concurrency_safe")
    }

    fn is_read_only(_input: &Input, _cx: &Context) -> bool {
        asked("is_read_only")
    }

    fn validate_input(_input: &Input, _cx: &Context) -> Result<()> {
        asked("validate_input")
    }

    fn check_permissions(_input: &Input, _cx: &Context) -> Permission {
        asked("check_permissions")
    }

    fn call(input: Input, cx: &Context) -> Result<Output> {
        if let Some(file) = &input.write {
            let path = cx.resolve(file);
            std::fs::write(&path, "written")
                .map_err(|error| keel_guest::Error::io("failed to write", path.display(), &error))?;
        }
        Ok(format!("ok: {}", input.message).into())
    }
}

keel_guest::export!(Fixed);
