//! `write_file`: write one file in the workspace.
//!
//! Not concurrency-safe (a later call must see the file), not read-only, and
//! destructive only when it would overwrite a file that exists. Its permission
//! subject is the file, named from the workspace root, so a rule
//! `write_file(secrets/**)` holds after a `cd`.

use std::path::Path;

use keel_guest::{Context, Output, Result, Tool, bail, json};
use schemars::JsonSchema;
use serde::Deserialize;

/// Input of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Path of the file to write, relative to the working directory.
    pub file_path: String,
    /// The whole new content of the file.
    pub content: String,
}

/// The `write_file` tool.
pub struct WriteFile;

impl Tool for WriteFile {
    type Input = Input;
    const NAME: &str = "write_file";
    const DESCRIPTION: &str = "Writes a file in the workspace, creating it or replacing its \
        whole content. Parent directories are created as needed.";
    const SEARCH_HINT: Option<&str> = Some("create or overwrite a file");

    fn is_destructive(input: &Input, cx: &Context) -> bool {
        // Overwriting loses the old content; creating a file loses nothing.
        // The fallback, when the file's state cannot be known, is destructive.
        // The path resolves as the call will resolve it: against the cwd.
        let path = cx.resolve(&input.file_path);
        !matches!(path.try_exists(), Ok(false))
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        if input.file_path.trim().is_empty() {
            bail!("`file_path` must not be empty");
        }
        if input.file_path.ends_with('/') {
            bail!("`file_path` names a directory: {}", input.file_path);
        }
        Ok(())
    }

    fn permission_subject(input: &Input, cx: &Context) -> Option<String> {
        Some(cx.workspace_relative(&input.file_path))
    }

    fn activity_description(input: &Input, _cx: &Context) -> Option<String> {
        Some(format!("Writing {}", input.file_path))
    }

    fn call(input: Input, cx: &Context) -> Result<Output> {
        let path = cx.resolve(&input.file_path);
        write(&path, &input.content)?;
        let shown = display_path(&path);
        let bytes = input.content.len();
        let unit = if bytes == 1 { "byte" } else { "bytes" };
        Ok(Output::text(format!("Wrote {bytes} {unit} to {shown}")).with_context_modifier(json!({
            "files_written": { shown: { "bytes": bytes } }
        })))
    }
}

/// Write `content` to `path`, creating parent directories.
pub fn write(path: &Path, content: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| keel_guest::Error::io("failed to create", parent.display(), &error))?;
    }
    std::fs::write(path, content)
        .map_err(|error| keel_guest::Error::io("failed to write", path.display(), &error))
}

/// The path as the model should see it: relative to the workspace mount.
fn display_path(path: &Path) -> String {
    path.strip_prefix(keel_guest::WORKSPACE_MOUNT).unwrap_or(path).display().to_string()
}

keel_guest::export!(WriteFile);

#[cfg(test)]
mod tests {
    use super::*;

    fn input(file_path: &str) -> Input {
        Input { file_path: file_path.into(), content: "hello\n".into() }
    }

    #[test]
    fn writes_the_file_and_creates_parents() {
        let dir = tempfile::tempdir().unwrap();
        let cx = Context::new(json!({ "cwd": dir.path() }));
        let output = WriteFile::call(input("a/b/notes.txt"), &cx).unwrap();
        let written = dir.path().join("a/b/notes.txt");
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "hello\n");
        assert!(output.text().starts_with("Wrote 6 bytes to "), "{}", output.text());
    }

    #[test]
    fn names_the_written_file_in_its_context_modifier() {
        let dir = tempfile::tempdir().unwrap();
        let cx = Context::new(json!({ "cwd": dir.path() }));
        let output = WriteFile::call(input("notes.txt"), &cx).unwrap();
        let shown = dir.path().join("notes.txt").display().to_string();
        assert_eq!(output.context_modifier, Some(json!({ "files_written": { shown: { "bytes": 6 } } })));
    }

    #[test]
    fn rejects_an_empty_or_directory_path() {
        assert_eq!(
            WriteFile::validate_input(&input("  "), &Context::workspace_root()).unwrap_err().message(),
            "`file_path` must not be empty"
        );
        assert_eq!(
            WriteFile::validate_input(&input("dir/"), &Context::workspace_root()).unwrap_err().message(),
            "`file_path` names a directory: dir/"
        );
    }

    #[test]
    fn is_neither_read_only_nor_concurrency_safe() {
        let cx = Context::workspace_root();
        assert!(!WriteFile::is_read_only(&input("x"), &cx));
        assert!(!WriteFile::is_concurrency_safe(&input("x"), &cx));
    }

    #[test]
    fn a_missing_target_is_not_destructive() {
        assert!(!WriteFile::is_destructive(&input("surely/not/here/notes.txt"), &Context::workspace_root()));
    }

    #[test]
    fn overwriting_is_destructive_against_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("secrets")).unwrap();
        std::fs::write(dir.path().join("secrets/k.txt"), "old").unwrap();
        let secrets = Context::new(json!({ "cwd": dir.path().join("secrets") }));
        assert!(WriteFile::is_destructive(&input("k.txt"), &secrets), "k.txt exists in the cwd");
        assert!(!WriteFile::is_destructive(&input("new.txt"), &secrets));
        let root = Context::new(json!({ "cwd": dir.path() }));
        assert!(!WriteFile::is_destructive(&input("k.txt"), &root), "no k.txt at the root");
    }

    #[test]
    fn names_the_file_from_the_workspace_root_after_a_cd() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        assert_eq!(
            WriteFile::permission_subject(&input("k.txt"), &secrets).as_deref(),
            Some("secrets/k.txt")
        );
        assert_eq!(WriteFile::permission_subject(&input("../k.txt"), &secrets).as_deref(), Some("k.txt"));
        let root = Context::workspace_root();
        assert_eq!(
            WriteFile::permission_subject(&input("./a/../secrets/k.txt"), &root).as_deref(),
            Some("secrets/k.txt")
        );
        assert_eq!(
            WriteFile::permission_subject(&input("/etc/passwd"), &root).as_deref(),
            Some("/etc/passwd")
        );
    }
}
