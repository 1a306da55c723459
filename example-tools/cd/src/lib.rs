//! `cd`: change the working directory of the calls that follow.
//!
//! It changes nothing on disk: its only effect is a context modifier setting
//! `cwd`, which the host applies before the next call. Not concurrency-safe:
//! a call beside it must not depend on whether the change happened yet. Its
//! permission subject is the target directory, named from the workspace root.

use keel_guest::{Context, Output, Result, Tool, WORKSPACE_MOUNT, bail, json};
use schemars::JsonSchema;
use serde::Deserialize;

/// Input of `cd`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The directory to change to, relative to the working directory.
    pub path: String,
}

/// The `cd` tool.
pub struct Cd;

impl Tool for Cd {
    type Input = Input;
    const NAME: &str = "cd";
    const DESCRIPTION: &str = "Changes the working directory that later tool calls resolve relative \
        paths against. The directory must exist inside the workspace.";
    const SEARCH_HINT: Option<&str> = Some("change the working directory");

    fn is_read_only(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn is_destructive(_input: &Input, _cx: &Context) -> bool {
        false
    }

    fn permission_subject(input: &Input, cx: &Context) -> Option<String> {
        Some(cx.workspace_relative(&input.path))
    }

    fn call(input: Input, cx: &Context) -> Result<Output> {
        let target = cx.resolve(&input.path);
        if !target.starts_with(WORKSPACE_MOUNT) {
            bail!("{} is outside the workspace", input.path);
        }
        match std::fs::metadata(&target) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => bail!("{} is not a directory", input.path),
            Err(error) => return Err(keel_guest::Error::io("cannot change to", &input.path, &error)),
        }
        let cwd = target.display().to_string();
        let shown = cwd.strip_prefix(WORKSPACE_MOUNT).filter(|rest| !rest.is_empty()).unwrap_or("/");
        Ok(Output::text(format!("Working directory is now {shown}"))
            .with_context_modifier(json!({ "cwd": cwd })))
    }
}

keel_guest::export!(Cd);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_to_leave_the_workspace() {
        let cx = Context::new(json!({ "cwd": "/workspace/src" }));
        let error = Cd::call(Input { path: "../..".into() }, &cx).unwrap_err();
        assert_eq!(error.message(), "../.. is outside the workspace");
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let cx = Context::workspace_root();
        let error = Cd::call(Input { path: "surely-missing".into() }, &cx).unwrap_err();
        assert!(error.message().starts_with("cannot change to surely-missing: "), "{error}");
    }

    #[test]
    fn is_not_concurrency_safe() {
        assert!(!Cd::is_concurrency_safe(&Input { path: ".".into() }, &Context::workspace_root()));
    }

    #[test]
    fn names_the_target_from_the_workspace_root_after_a_cd() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        let subject = |path: &str| Cd::permission_subject(&Input { path: path.into() }, &secrets);
        assert_eq!(subject("deep").as_deref(), Some("secrets/deep"));
        assert_eq!(subject("..").as_deref(), Some("."));
        assert_eq!(subject("../../etc").as_deref(), Some("/etc"));
    }
}
