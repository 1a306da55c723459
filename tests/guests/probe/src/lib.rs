//! `probe`: a test guest that reports which of its checks the host called,
//! and in which order.
//!
//! Each of `validate_input`, `check_permissions` and `permission_subject`
//! logs `probe: <check>` when it is called and records it; `call` reports
//! the record as progress (`{"checks": [...]}`) and in its result. A
//! call's questions and the call itself share one sandbox, so the record
//! is that call's. The input picks what each check answers, so a test can
//! drive the host through every step of validation and permission.
//!
//! Its metadata exercises the pool: it is deferred (found through
//! `ToolSearch` by its search hint), and its aliases are `probe_v0` and
//! `Read`, the name of a built-in, which an alias must never shadow.

use std::cell::RefCell;

use keel_guest::{Context, Output, Permission, Result, Tool, Value, bail, json};
use schemars::JsonSchema;
use serde::Deserialize;

thread_local! {
    /// The checks called in this sandbox, in order.
    static CHECKS: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
}

fn record(check: &'static str) {
    CHECKS.with_borrow_mut(|checks| checks.push(check));
    keel_guest::log::info(&format!("probe: {check}"));
}

/// What `check_permissions` answers.
#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Answer {
    /// Allow (with `replace_with` as the new input, when given).
    #[default]
    Allow,
    /// Deny with "the probe says no".
    Deny,
    /// Ask with "the probe wants a yes".
    Ask,
}

/// Input of `probe`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// When set, `validate_input` fails with this message.
    #[serde(default)]
    pub invalid: Option<String>,
    /// What `check_permissions` answers. Default: allow.
    #[serde(default)]
    pub permission: Answer,
    /// An input `check_permissions` allows the call with instead of this one.
    #[serde(default)]
    pub replace_with: Option<Value>,
    /// What `permission_subject` answers; none when absent.
    #[serde(default)]
    pub subject: Option<String>,
    /// A number the call reports back, so a test can tell which input ran.
    #[serde(default)]
    pub count: Option<u8>,
}

/// The `probe` tool.
pub struct Probe;

impl Tool for Probe {
    type Input = Input;
    const NAME: &str = "probe";
    const DESCRIPTION: &str = "Test guest: reports which of its checks the host called, in order.";
    const ALIASES: &[&str] = &["probe_v0", "Read"];
    const SEARCH_HINT: Option<&str> = Some("count validation and permission checks");
    const SHOULD_DEFER: bool = true;

    fn is_read_only(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        record("validate-input");
        if let Some(message) = &input.invalid {
            bail!("{message}");
        }
        Ok(())
    }

    fn check_permissions(input: &Input, _cx: &Context) -> Permission {
        record("check-permissions");
        match (input.permission, &input.replace_with) {
            (Answer::Allow, None) => Permission::Allow,
            (Answer::Allow, Some(replacement)) => Permission::AllowWithInput(replacement.clone()),
            (Answer::Deny, _) => Permission::Deny("the probe says no".into()),
            (Answer::Ask, _) => Permission::Ask("the probe wants a yes".into()),
        }
    }

    fn permission_subject(input: &Input, _cx: &Context) -> Option<String> {
        record("permission-subject");
        input.subject.clone()
    }

    fn call(input: Input, _cx: &Context) -> Result<Output> {
        let checks = CHECKS.with_borrow(Vec::clone);
        keel_guest::progress(&json!({ "checks": checks }));
        let count = input.count.map_or_else(|| "none".to_string(), |count| count.to_string());
        Ok(Output::text(format!("count {count}; checks: {}", checks.join(", "))))
    }
}

keel_guest::export!(Probe);

#[cfg(test)]
mod tests {
    use super::*;

    fn cx() -> Context {
        Context::workspace_root()
    }

    fn input(text: &str) -> Input {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn records_the_checks_in_the_order_they_are_called() {
        let probe = input(r#"{"count": 3, "subject": "a"}"#);
        assert_eq!(Probe::validate_input(&probe, &cx()), Ok(()));
        assert_eq!(Probe::check_permissions(&probe, &cx()), Permission::Allow);
        assert_eq!(Probe::permission_subject(&probe, &cx()).as_deref(), Some("a"));
        let out = Probe::call(probe, &Context::workspace_root()).unwrap();
        assert_eq!(out.text(), "count 3; checks: validate-input, check-permissions, permission-subject");
    }

    #[test]
    fn answers_as_the_input_says() {
        assert_eq!(
            Probe::validate_input(&input(r#"{"invalid": "no good"}"#), &cx()).unwrap_err().message(),
            "no good"
        );
        assert_eq!(
            Probe::check_permissions(&input(r#"{"permission": "deny"}"#), &cx()),
            Permission::Deny("the probe says no".into())
        );
        assert_eq!(
            Probe::check_permissions(&input(r#"{"permission": "ask"}"#), &cx()),
            Permission::Ask("the probe wants a yes".into())
        );
        assert_eq!(
            Probe::check_permissions(&input(r#"{"replace_with": {"count": 9}}"#), &cx()),
            Permission::AllowWithInput(json!({ "count": 9 }))
        );
    }
}
