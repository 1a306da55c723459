//! `write_file`: write one file in the workspace.
//!
//! Not concurrency-safe (a later call must see the file), not read-only, and
//! destructive only when it would overwrite a file that exists.

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

    fn is_destructive(input: &Input) -> bool {
        // Overwriting loses the old content; creating a file loses nothing.
        // The fallback, when the file's state cannot be known, is destructive.
        let path = Context::workspace_root().resolve(&input.file_path);
        !matches!(path.try_exists(), Ok(false))
    }

    fn validate_input(input: &Input) -> Result<()> {
        if input.file_path.trim().is_empty() {
            bail!("`file_path` must not be empty");
        }
        if input.file_path.ends_with('/') {
            bail!("`file_path` names a directory: {}", input.file_path);
        }
        Ok(())
    }

    fn permission_subject(input: &Input) -> Option<String> {
        Some(input.file_path.clone())
    }

    fn activity_description(input: &Input) -> Option<String> {
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
        assert!(output.content.starts_with("Wrote 6 bytes to "), "{}", output.content);
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
            WriteFile::validate_input(&input("  ")).unwrap_err().message(),
            "`file_path` must not be empty"
        );
        assert_eq!(
            WriteFile::validate_input(&input("dir/")).unwrap_err().message(),
            "`file_path` names a directory: dir/"
        );
    }

    #[test]
    fn is_neither_read_only_nor_concurrency_safe() {
        assert!(!WriteFile::is_read_only(&input("x")));
        assert!(!WriteFile::is_concurrency_safe(&input("x")));
    }

    #[test]
    fn a_missing_target_is_not_destructive() {
        assert!(!WriteFile::is_destructive(&input("surely/not/here/notes.txt")));
    }
}
