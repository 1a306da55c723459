//! `legacy_write`: a test guest of the previous contract, `keel:tool@0.2.0`
//! (`wit/v0.2.0/tool.wit`), so that the host is proven to load and run a
//! component built before 0.3.0 beside the ones built after.
//!
//! It is written against that WIT with `wit-bindgen` directly, not through
//! the SDK (which builds 0.3.0 only), and implements every export by hand.
//! It writes one file, as `write_file` does, but as a 0.2.0 tool it cannot
//! see the working directory when it is asked about a call: its permission
//! subject is `file_path` exactly as given. Only `call` receives the context,
//! and writes the file resolved against its `cwd`.

// Only a wasm32 build exports the tool; natively the unit tests call the
// helpers and nothing calls the exports. `allow`, not `expect`: the lint
// fires in some native targets and not in others.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// The bindings of `wit/v0.2.0`, which carries their docs.
mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit/v0.2.0",
        world: "keel:tool/tool",
    });
}

use bindings::exports::keel::tool::guest::{Guest, ToolMetadata};
use bindings::keel::tool::types::{CallOutput, CallPlan, InterruptBehavior, PermissionDecision};

/// Where the host mounts the workspace inside the sandbox.
const WORKSPACE_MOUNT: &str = "/workspace";

/// The input schema, written by hand: a 0.2.0 tool has no SDK to derive it.
const INPUT_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "Input",
  "type": "object",
  "properties": {
    "file_path": { "type": "string", "description": "Path of the file to write, relative to the working directory." },
    "content": { "type": "string", "description": "The whole new content of the file." }
  },
  "required": ["file_path", "content"],
  "additionalProperties": false
}"#;

/// Input of `legacy_write`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    /// Path of the file to write, relative to the working directory.
    file_path: String,
    /// The whole new content of the file.
    content: String,
}

fn parse(input: &str) -> Result<Input, String> {
    serde_json::from_str(input).map_err(|error| format!("invalid input: {error}"))
}

/// The working directory of a context object: its `cwd`, or the workspace
/// root when it has none.
fn cwd(context: &Value) -> &str {
    context.get("cwd").and_then(Value::as_str).unwrap_or(WORKSPACE_MOUNT)
}

/// `path` resolved against `cwd` without touching the filesystem: `.` and
/// `..` folded lexically, never above `/`; an absolute path is kept.
fn resolve(cwd: &str, path: &str) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in Path::new(cwd).join(path).components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// A resolved path as the model should see it: relative to the workspace
/// root (`.` for the root itself), or absolute outside it.
fn shown(path: &Path) -> String {
    match path.strip_prefix(WORKSPACE_MOUNT) {
        Ok(rest) if rest.as_os_str().is_empty() => ".".into(),
        Ok(rest) => rest.display().to_string(),
        Err(_) => path.display().to_string(),
    }
}

/// Write `content` to `path`, creating its parent directories.
fn write(path: &Path, content: &str) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| format!("failed to create {}: {error}", shown(parent)))?;
    }
    std::fs::write(path, content).map_err(|error| format!("failed to write {}: {error}", shown(path)))
}

/// The `legacy_write` tool.
struct Legacy;

impl Guest for Legacy {
    fn metadata() -> ToolMetadata {
        ToolMetadata {
            name: "legacy_write".into(),
            aliases: vec![],
            description: "Test guest of contract 0.2.0: writes a file in the workspace, creating \
                          parent directories as needed."
                .into(),
            prompt: String::new(),
            input_schema: INPUT_SCHEMA.into(),
            output_schema: None,
            search_hint: Some("write a file with a tool of contract 0.2.0".into()),
            should_defer: false,
            always_load: false,
            strict: false,
            interrupt_behavior: InterruptBehavior::Block,
            user_facing_name: String::new(),
        }
    }

    fn is_enabled() -> bool {
        true
    }

    /// A later call must see the file, and it writes.
    fn plan(_input: String) -> CallPlan {
        CallPlan { concurrency_safe: false, read_only: false }
    }

    /// It may overwrite a file, and without the working directory it cannot
    /// tell whether the file exists.
    fn is_destructive(_input: String) -> bool {
        true
    }

    fn max_result_size() -> Option<u64> {
        Some(50_000)
    }

    fn check(input: String) -> Result<PermissionDecision, String> {
        let input = parse(&input)?;
        if input.file_path.trim().is_empty() {
            return Err("`file_path` must not be empty".into());
        }
        Ok(PermissionDecision::Allow(None))
    }

    /// `file_path` exactly as given: a 0.2.0 tool cannot see the cwd.
    fn permission_subject(input: String) -> Option<String> {
        parse(&input).ok().map(|input| input.file_path)
    }

    fn classifier_input(input: String) -> String {
        parse(&input).map(|input| input.file_path).unwrap_or_default()
    }

    fn user_facing_name(_input: String) -> String {
        "legacy_write".into()
    }

    fn activity_description(input: String) -> Option<String> {
        parse(&input).ok().map(|input| format!("Writing {}", input.file_path))
    }

    fn is_open_world(_input: String) -> bool {
        false
    }

    fn is_search_or_read(_input: String) -> bool {
        false
    }

    fn requires_user_interaction() -> bool {
        false
    }

    fn inputs_equivalent(a: String, b: String) -> bool {
        match (serde_json::from_str::<Value>(&a), serde_json::from_str::<Value>(&b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => a == b,
        }
    }

    /// Write the file resolved against the context's `cwd`.
    fn call(input: String, context: String) -> Result<CallOutput, String> {
        let input = parse(&input)?;
        let context: Value =
            serde_json::from_str(&context).map_err(|error| format!("invalid context from host: {error}"))?;
        let path = resolve(cwd(&context), &input.file_path);
        write(&path, &input.content)?;
        let bytes = input.content.len();
        let unit = if bytes == 1 { "byte" } else { "bytes" };
        Ok(CallOutput {
            content: format!("Wrote {bytes} {unit} to {}", shown(&path)),
            context_modifier: None,
        })
    }
}

// Only a wasm32 build is a component; a native build (under `cargo test
// --workspace`) checks the code and exports nothing.
#[cfg(target_arch = "wasm32")]
bindings::export!(Legacy with_types_in bindings);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_against_the_working_directory() {
        assert_eq!(resolve("/workspace/secrets", "k.txt"), PathBuf::from("/workspace/secrets/k.txt"));
        assert_eq!(resolve("/workspace", "./a/../b.txt"), PathBuf::from("/workspace/b.txt"));
        assert_eq!(resolve("/workspace", "../../etc"), PathBuf::from("/etc"));
        assert_eq!(cwd(&serde_json::json!({})), WORKSPACE_MOUNT);
    }

    #[test]
    fn shows_a_path_from_the_workspace_root() {
        assert_eq!(shown(Path::new("/workspace/notes/a.txt")), "notes/a.txt");
        assert_eq!(shown(Path::new("/workspace")), ".");
        assert_eq!(shown(Path::new("/etc/passwd")), "/etc/passwd");
    }

    #[test]
    fn names_the_path_as_given_and_checks_it() {
        let input = r#"{"file_path": "k.txt", "content": "x"}"#;
        assert_eq!(Legacy::permission_subject(input.into()).as_deref(), Some("k.txt"));
        assert!(matches!(Legacy::check(input.into()), Ok(PermissionDecision::Allow(None))));
        let empty = r#"{"file_path": " ", "content": "x"}"#;
        assert_eq!(Legacy::check(empty.into()).unwrap_err(), "`file_path` must not be empty");
        assert!(Legacy::check("{}".into()).unwrap_err().starts_with("invalid input: "));
        assert_eq!(Legacy::permission_subject("{}".into()), None);
    }

    #[test]
    fn writes_the_file_against_the_cwd_and_creates_parents() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let context = serde_json::json!({ "cwd": dir }).to_string();
        let input = r#"{"file_path": "notes/a.txt", "content": "overwritten"}"#;
        let output = Legacy::call(input.into(), context).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("notes/a.txt")).unwrap(), "overwritten");
        assert!(output.content.starts_with("Wrote 11 bytes to "), "{}", output.content);
        assert!(output.content.ends_with("notes/a.txt"), "{}", output.content);
    }

    #[test]
    fn the_input_schema_is_json_naming_both_fields() {
        let schema: Value = serde_json::from_str(INPUT_SCHEMA).unwrap();
        assert_eq!(schema["required"], serde_json::json!(["file_path", "content"]));
        assert_eq!(Legacy::metadata().name, "legacy_write");
    }
}
