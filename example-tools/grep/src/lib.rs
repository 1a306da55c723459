//! `grep`: search file contents with a regular expression.
//!
//! Read-only and concurrency-safe; its permission subject is the file or
//! directory searched, named from the workspace root. Prints one
//! `path:line:text` line per match;
//! on a large tree its output can run to megabytes, which the host's result
//! budget turns into a persisted file and a preview.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use globset::{Glob, GlobMatcher};
use keel_guest::{Context, Output, Result, Tool, bail, json};
use regex::Regex;
use schemars::JsonSchema;
use serde::Deserialize;

/// Input of `grep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Regular expression to search for (Rust regex syntax).
    pub pattern: String,
    /// File or directory to search, relative to the working directory.
    /// Default: the working directory.
    #[serde(default)]
    pub path: Option<String>,
    /// Only search files whose name matches this glob, such as `*.rs`.
    #[serde(default)]
    pub glob: Option<String>,
}

/// The `grep` tool.
pub struct Grep;

impl Tool for Grep {
    type Input = Input;
    const NAME: &str = "grep";
    const DESCRIPTION: &str = "Searches file contents for a regular expression and prints \
        each matching line as `path:line:text`, paths relative to the working directory.";
    const SEARCH_HINT: Option<&str> = Some("search file contents with a regex");
    const INTERRUPT: keel_guest::Interrupt = keel_guest::Interrupt::Cancel;

    fn is_concurrency_safe(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn is_read_only(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn is_search_or_read(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        if let Err(error) = Regex::new(&input.pattern) {
            bail!("`pattern` is not a valid regex: {error}");
        }
        if let Some(Err(error)) = input.glob.as_deref().map(Glob::new) {
            bail!("`glob` is not a valid glob: {error}");
        }
        Ok(())
    }

    fn permission_subject(input: &Input, cx: &Context) -> Option<String> {
        Some(cx.workspace_relative(input.path.as_deref().unwrap_or(".")))
    }

    fn activity_description(input: &Input, _cx: &Context) -> Option<String> {
        Some(format!("Searching for {}", input.pattern))
    }

    fn call(input: Input, cx: &Context) -> Result<Output> {
        let root = PathBuf::from(cx.cwd());
        let target = cx.resolve(input.path.as_deref().unwrap_or("."));
        let search = Search::new(&input)?;
        let mut out = String::new();
        let files = search.run(&root, &target, &mut out)?;
        keel_guest::progress(&json!({ "files_searched": files }));
        if out.is_empty() {
            return Ok(Output::text(format!("No matches in {files} files")));
        }
        Ok(Output::text(out))
    }
}

/// A compiled search: the regex and the optional file-name filter.
pub struct Search {
    regex: Regex,
    glob: Option<GlobMatcher>,
}

impl Search {
    /// Compile the input's pattern and glob.
    pub fn new(input: &Input) -> Result<Self> {
        let regex = Regex::new(&input.pattern)?;
        let glob = input.glob.as_deref().map(Glob::new).transpose()?.map(|g| g.compile_matcher());
        Ok(Search { regex, glob })
    }

    /// Search `target` (a file or a directory tree, in sorted order), append
    /// `path:line:text` lines to `out` with paths relative to `root`, and
    /// return how many files were searched.
    pub fn run(&self, root: &Path, target: &Path, out: &mut String) -> Result<usize> {
        let metadata = fs::metadata(target)
            .map_err(|error| keel_guest::Error::io("cannot search", shown(root, target), &error))?;
        if metadata.is_file() {
            self.file(root, target, out);
            return Ok(1);
        }
        let mut files = 0;
        let walk = walkdir::WalkDir::new(target).sort_by_file_name().follow_links(false);
        for entry in walk.into_iter().filter_map(|entry| entry.ok()) {
            if !entry.file_type().is_file() || !self.wanted(entry.path()) {
                continue;
            }
            files += 1;
            self.file(root, entry.path(), out);
        }
        Ok(files)
    }

    fn wanted(&self, path: &Path) -> bool {
        match (&self.glob, path.file_name()) {
            (Some(glob), Some(name)) => glob.is_match(name),
            (Some(_), None) => false,
            (None, _) => true,
        }
    }

    fn file(&self, root: &Path, path: &Path, out: &mut String) {
        // Binary and unreadable files are skipped, as grep tools do by default.
        let Ok(text) = fs::read_to_string(path) else { return };
        let shown = shown(root, path);
        for (number, line) in text.lines().enumerate() {
            if self.regex.is_match(line) {
                let _ = writeln!(out, "{shown}:{}:{line}", number + 1);
            }
        }
    }
}

fn shown(root: &Path, path: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

keel_guest::export!(Grep);

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("src/deep")).unwrap();
        fs::write(dir.path().join("src/a.rs"), "fn main() {}\nlet needle = 1;\n").unwrap();
        fs::write(dir.path().join("src/deep/b.txt"), "no\nneedle here\nneedle again\n").unwrap();
        fs::write(dir.path().join("top.rs"), "needle\n").unwrap();
        fs::write(dir.path().join("bin.dat"), [0xff, 0xfe, b'n']).unwrap();
        dir
    }

    fn grep(dir: &Path, pattern: &str, path: Option<&str>, glob: Option<&str>) -> String {
        let input = Input { pattern: pattern.into(), path: path.map(Into::into), glob: glob.map(Into::into) };
        let cx = Context::new(json!({ "cwd": dir }));
        Grep::call(input, &cx).unwrap().text()
    }

    #[test]
    fn prints_path_line_text_in_sorted_order() {
        let dir = tree();
        assert_eq!(
            grep(dir.path(), "needle", None, None),
            "src/a.rs:2:let needle = 1;\nsrc/deep/b.txt:2:needle here\n\
             src/deep/b.txt:3:needle again\ntop.rs:1:needle\n"
        );
    }

    #[test]
    fn glob_filters_by_file_name() {
        let dir = tree();
        assert_eq!(
            grep(dir.path(), "needle", None, Some("*.rs")),
            "src/a.rs:2:let needle = 1;\ntop.rs:1:needle\n"
        );
    }

    #[test]
    fn path_narrows_to_a_directory_or_a_file() {
        let dir = tree();
        assert_eq!(grep(dir.path(), "again", Some("src/deep"), None), "src/deep/b.txt:3:needle again\n");
        assert_eq!(grep(dir.path(), "needle", Some("top.rs"), None), "top.rs:1:needle\n");
    }

    #[test]
    fn reports_no_matches_with_the_file_count() {
        let dir = tree();
        assert_eq!(grep(dir.path(), "absent", None, None), "No matches in 4 files");
    }

    #[test]
    fn a_missing_path_is_an_error_naming_it() {
        let dir = tree();
        let input = Input { pattern: "x".into(), path: Some("nope".into()), glob: None };
        let cx = Context::new(json!({ "cwd": dir.path() }));
        let error = Grep::call(input, &cx).unwrap_err();
        assert!(error.message().starts_with("cannot search nope: "), "{error}");
    }

    #[test]
    fn rejects_a_bad_regex_and_a_bad_glob() {
        let cx = Context::workspace_root();
        let bad = Input { pattern: "(".into(), path: None, glob: None };
        assert!(
            Grep::validate_input(&bad, &cx)
                .unwrap_err()
                .message()
                .starts_with("`pattern` is not a valid regex")
        );
        let bad = Input { pattern: "x".into(), path: None, glob: Some("[".into()) };
        assert!(
            Grep::validate_input(&bad, &cx).unwrap_err().message().starts_with("`glob` is not a valid glob")
        );
    }

    #[test]
    fn is_read_only_and_concurrency_safe() {
        let input = Input { pattern: "x".into(), path: None, glob: None };
        assert!(Grep::is_read_only(&input, &Context::workspace_root()));
        assert!(Grep::is_concurrency_safe(&input, &Context::workspace_root()));
    }

    #[test]
    fn names_the_searched_path_from_the_workspace_root_after_a_cd() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        let subject = |path: Option<&str>| {
            let input = Input { pattern: "x".into(), path: path.map(Into::into), glob: None };
            Grep::permission_subject(&input, &secrets)
        };
        assert_eq!(subject(Some("k.txt")).as_deref(), Some("secrets/k.txt"));
        assert_eq!(subject(None).as_deref(), Some("secrets"));
        assert_eq!(subject(Some("..")).as_deref(), Some("."));
        assert_eq!(subject(Some("/etc/passwd")).as_deref(), Some("/etc/passwd"));
        let root = Context::workspace_root();
        let input = Input { pattern: "x".into(), path: Some("./a/../secrets/k.txt".into()), glob: None };
        assert_eq!(Grep::permission_subject(&input, &root).as_deref(), Some("secrets/k.txt"));
    }
}
