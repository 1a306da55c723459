//! `trap_queries`: a hostile guest that traps in the exports its input names.
//!
//! The host must answer a trap in any per-input export with that export's
//! conservative fallback and carry on; this guest lets a test pick exactly
//! which exports trap for one call. An export that does not trap gives the
//! answer opposite to its host fallback where there is one
//! (concurrency-safe, read-only, not destructive, a permission subject), so a
//! test can tell the guest's answer from the fallback.

use keel_guest::{Context, Output, Permission, Result, Tool, bail};
use schemars::JsonSchema;
use serde::Deserialize;

/// The exports that can be made to trap, by their trait method names.
pub const EXPORTS: &[&str] = &[
    "is_concurrency_safe",
    "is_read_only",
    "is_destructive",
    "validate_input",
    "check_permissions",
    "permission_subject",
    "call",
];

/// Input of `trap_queries`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Exports that trap for this input: any of `is_concurrency_safe`,
    /// `is_read_only`, `is_destructive`, `validate_input`,
    /// `check_permissions`, `permission_subject` and `call`.
    #[serde(default)]
    pub trap_in: Vec<String>,
    /// Text echoed back by `call` as `ok: <message>`.
    #[serde(default)]
    pub message: String,
}

/// Trap (a panic is a trap in wasm) if `export` is listed in the input.
fn trap_if_named(input: &Input, export: &str) {
    if input.trap_in.iter().any(|name| name == export) {
        panic!("trap_queries: trapping in `{export}` as the input asks");
    }
}

/// The `trap_queries` tool.
pub struct TrapQueries;

impl Tool for TrapQueries {
    type Input = Input;
    const NAME: &str = "trap_queries";
    const DESCRIPTION: &str = "Test guest: traps in each export named in `trap_in`, \
        and otherwise answers `ok: <message>`.";

    fn is_concurrency_safe(input: &Input, _cx: &Context) -> bool {
        trap_if_named(input, "is_concurrency_safe");
        true
    }

    fn is_read_only(input: &Input, _cx: &Context) -> bool {
        trap_if_named(input, "is_read_only");
        true
    }

    fn is_destructive(input: &Input, _cx: &Context) -> bool {
        trap_if_named(input, "is_destructive");
        false
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        trap_if_named(input, "validate_input");
        // A misspelt name would otherwise make a test pass without the trap
        // it meant to cause.
        if let Some(unknown) = input.trap_in.iter().find(|name| !EXPORTS.contains(&name.as_str())) {
            bail!("`trap_in` names `{unknown}`, which is not one of {EXPORTS:?}");
        }
        Ok(())
    }

    fn check_permissions(input: &Input, _cx: &Context) -> Permission {
        trap_if_named(input, "check_permissions");
        Permission::Allow
    }

    fn permission_subject(input: &Input, _cx: &Context) -> Option<String> {
        trap_if_named(input, "permission_subject");
        Some(input.message.clone())
    }

    fn call(input: Input, _cx: &Context) -> Result<Output> {
        trap_if_named(&input, "call");
        Ok(format!("ok: {}", input.message).into())
    }
}

keel_guest::export!(TrapQueries);

#[cfg(test)]
mod tests {
    use super::*;

    fn input(trap_in: &[&str]) -> Input {
        Input { trap_in: trap_in.iter().map(|name| name.to_string()).collect(), message: "hi".into() }
    }

    #[test]
    fn answers_every_query_when_nothing_traps() {
        let input = input(&[]);
        let cx = Context::workspace_root();
        assert!(TrapQueries::is_concurrency_safe(&input, &cx));
        assert!(TrapQueries::is_read_only(&input, &cx));
        assert!(!TrapQueries::is_destructive(&input, &cx));
        assert_eq!(TrapQueries::validate_input(&input, &cx), Ok(()));
        assert_eq!(TrapQueries::check_permissions(&input, &cx), Permission::Allow);
        assert_eq!(TrapQueries::permission_subject(&input, &cx).as_deref(), Some("hi"));
        let output = TrapQueries::call(input, &cx).unwrap();
        assert_eq!(output.text(), "ok: hi");
    }

    /// An export's name, and a call of it that discards the answer.
    type Query = (&'static str, fn(Input));

    /// The exports that trap for an input whose `trap_in` is `trap_in`.
    fn trapping(trap_in: &[&str]) -> Vec<&'static str> {
        let queries: [Query; 7] = [
            ("is_concurrency_safe", |i| {
                TrapQueries::is_concurrency_safe(&i, &Context::workspace_root());
            }),
            ("is_read_only", |i| {
                TrapQueries::is_read_only(&i, &Context::workspace_root());
            }),
            ("is_destructive", |i| {
                TrapQueries::is_destructive(&i, &Context::workspace_root());
            }),
            ("validate_input", |i| {
                let _ = TrapQueries::validate_input(&i, &Context::workspace_root());
            }),
            ("check_permissions", |i| {
                TrapQueries::check_permissions(&i, &Context::workspace_root());
            }),
            ("permission_subject", |i| {
                TrapQueries::permission_subject(&i, &Context::workspace_root());
            }),
            ("call", |i| {
                let _ = TrapQueries::call(i, &Context::workspace_root());
            }),
        ];
        queries
            .into_iter()
            .filter(|(_, query)| std::panic::catch_unwind(|| query(input(trap_in))).is_err())
            .map(|(name, _)| name)
            .collect()
    }

    #[test]
    fn traps_only_in_the_named_exports() {
        assert_eq!(trapping(&[]), [] as [&str; 0]);
        for &export in EXPORTS {
            assert_eq!(trapping(&[export]), [export]);
        }
        assert_eq!(trapping(&["call", "is_read_only"]), ["is_read_only", "call"]);
    }

    #[test]
    fn rejects_a_misspelt_export_name() {
        let error =
            TrapQueries::validate_input(&input(&["is_readonly"]), &Context::workspace_root()).unwrap_err();
        assert_eq!(
            error.message(),
            "`trap_in` names `is_readonly`, which is not one of [\"is_concurrency_safe\", \
             \"is_read_only\", \"is_destructive\", \"validate_input\", \"check_permissions\", \
             \"permission_subject\", \"call\"]"
        );
    }
}
