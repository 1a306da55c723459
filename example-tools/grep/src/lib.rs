//! `grep`: search file contents with a regular expression.
//!
//! Read-only and concurrency-safe; its permission subject is the file or
//! directory searched, named from the workspace root. By default it prints
//! one `path:line:text` line per match, files in sorted order; on a large
//! tree its output can run to megabytes, which the host's result budget
//! turns into a persisted file and a preview.
//!
//! The options are those an agent's search tool has: `case_insensitive`;
//! lines of context (`before`, `after`, `context`), printed as
//! `path-line-text` with `--` between groups, as `grep -n` does; an
//! `output_mode` of matching lines, the files with a match, or a count per
//! file; `max_matches`; and a file `type` beside the `glob`. A binary file
//! (a NUL byte in its first 8 KiB, or bytes that are not UTF-8) is skipped,
//! and the result says how many were; so is a file that cannot be read (one
//! larger than the sandbox's memory, say), and the result names the first
//! and why.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use globset::{Glob, GlobMatcher};
use keel_guest::{Context, Output, Plan, Result, Tool, bail, json};
use regex::{Regex, RegexBuilder};
use schemars::JsonSchema;
use serde::Deserialize;

/// Bytes at the start of a file looked at for a NUL byte, the sign of a
/// binary file (what git and ripgrep look at, give or take).
pub const BINARY_PROBE_BYTES: usize = 8 << 10;

/// The file types `type` takes, each with the extensions it covers.
pub const FILE_TYPES: &[(&str, &[&str])] = &[
    ("c", &["c", "h"]),
    ("cpp", &["cpp", "cc", "cxx", "hpp", "hh", "hxx", "h"]),
    ("cs", &["cs"]),
    ("css", &["css", "scss", "sass", "less"]),
    ("go", &["go"]),
    ("html", &["html", "htm"]),
    ("java", &["java"]),
    ("js", &["js", "mjs", "cjs", "jsx"]),
    ("json", &["json", "jsonl"]),
    ("kotlin", &["kt", "kts"]),
    ("md", &["md", "markdown"]),
    ("php", &["php"]),
    ("py", &["py", "pyi"]),
    ("rb", &["rb"]),
    ("rs", &["rs"]),
    ("sh", &["sh", "bash", "zsh"]),
    ("sql", &["sql"]),
    ("swift", &["swift"]),
    ("toml", &["toml"]),
    ("ts", &["ts", "tsx", "mts", "cts"]),
    ("txt", &["txt"]),
    ("xml", &["xml"]),
    ("yaml", &["yaml", "yml"]),
];

/// What `grep` prints: `Content`, each matching line as `path:line:text`;
/// `FilesWithMatches`, the path of each file with a match, one a line;
/// `Count`, each file with a match and its number of matching lines, as
/// `path:count`.
//
// The variants carry no doc comments of their own: with them the schema
// would be a `oneOf` of constants, whose error names no value a model could
// use instead, where a plain `enum` lists them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    #[default]
    Content,
    FilesWithMatches,
    Count,
}

/// Input of `grep`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
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
    /// Only search files of this type, by extension: `rs`, `py`, `js`, `ts`,
    /// `md`, `go`, `c`, `cpp`, `java`, `json`, `toml`, `yaml`, `sh`, ...
    /// With `glob`, a file must match both.
    #[serde(default, rename = "type")]
    pub file_type: Option<String>,
    /// Match letters whatever their case, like `grep -i`. Default: false.
    #[serde(default)]
    pub case_insensitive: bool,
    /// Lines to print before each match (`content` mode), like `grep -B`.
    #[serde(default)]
    pub before: Option<usize>,
    /// Lines to print after each match (`content` mode), like `grep -A`.
    #[serde(default)]
    pub after: Option<usize>,
    /// Lines to print before and after each match (`content` mode), like
    /// `grep -C`; `before` and `after` override it.
    #[serde(default)]
    pub context: Option<usize>,
    /// `content` (the default): matching lines as `path:line:text`;
    /// `files_with_matches`: the paths of files with a match; `count`:
    /// `path:count` for each file with a match.
    #[serde(default)]
    pub output_mode: OutputMode,
    /// Stop after this many results: matching lines in `content` mode, files
    /// in the others. The result says when more were left out.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_matches: Option<usize>,
}

/// The `grep` tool.
pub struct Grep;

impl Tool for Grep {
    type Input = Input;
    const NAME: &str = "grep";
    const DESCRIPTION: &str = "Searches file contents for a regular expression and prints \
        each matching line as `path:line:text`, paths relative to the working directory. \
        Options: `case_insensitive`; `before`, `after` or `context` lines around each match; \
        `output_mode` `files_with_matches` or `count`; `max_matches`; a file-name `glob` and a \
        file `type` such as `rs` or `py`. Binary files are skipped.";
    const FIXED_PLAN: Option<Plan> = Some(Plan::SAFE_READ_ONLY);
    const SEARCH_HINT: Option<&str> = Some("search file contents with a regex");
    const INTERRUPT: keel_guest::Interrupt = keel_guest::Interrupt::Cancel;

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
        if let Some(name) = &input.file_type {
            extensions(name)?;
        }
        if input.max_matches == Some(0) {
            bail!("`max_matches` must be at least 1");
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
        let report = search.run(&root, &target, &mut out)?;
        keel_guest::progress(&json!({ "files_searched": report.files }));
        if out.is_empty() {
            let files = report.files;
            return Ok(Output::text(format!("No matches in {files} files{}", report.skipped_note(" "))));
        }
        if report.more {
            let max = search.max.unwrap_or_default();
            let unit = match (search.mode, max) {
                (OutputMode::Content, 1) => "match",
                (OutputMode::Content, _) => "matches",
                (_, 1) => "file",
                _ => "files",
            };
            let _ = writeln!(out, "(stopped after {max} {unit}; raise `max_matches` to see more)");
        }
        if report.binary > 0 || report.unreadable > 0 {
            let _ = writeln!(out, "{}", report.skipped_note(""));
        }
        Ok(Output::text(out))
    }
}

/// The extensions of the file type `name`.
pub fn extensions(name: &str) -> Result<&'static [&'static str]> {
    match FILE_TYPES.iter().find(|(known, _)| *known == name) {
        Some((_, extensions)) => Ok(extensions),
        None => {
            let known: Vec<&str> = FILE_TYPES.iter().map(|(known, _)| *known).collect();
            bail!("`type` {name:?} is not a known file type; use one of {}", known.join(", "))
        }
    }
}

/// A compiled search: the regex, the file filters and how to print.
pub struct Search {
    regex: Regex,
    glob: Option<GlobMatcher>,
    extensions: Option<&'static [&'static str]>,
    mode: OutputMode,
    before: usize,
    after: usize,
    max: Option<usize>,
}

/// What a search went through.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Text files searched.
    pub files: usize,
    /// Binary files skipped.
    pub binary: usize,
    /// Files that could not be read, skipped.
    pub unreadable: usize,
    /// The first of them, and why: `path: reason`.
    pub first_unreadable: Option<String>,
    /// Whether `max_matches` stopped the search with more to find.
    pub more: bool,
}

impl Report {
    /// `(N binary files skipped)` and `(N files that could not be read
    /// skipped, the first FILE: REASON)` after `space`, or nothing when no
    /// file was skipped.
    fn skipped_note(&self, space: &str) -> String {
        let binary = match self.binary {
            0 => String::new(),
            1 => format!("{space}(1 binary file skipped)"),
            n => format!("{space}({n} binary files skipped)"),
        };
        let space = if binary.is_empty() { space } else { " " };
        let first = self.first_unreadable.as_deref().unwrap_or_default();
        let unreadable = match self.unreadable {
            0 => String::new(),
            1 => format!("{space}(1 file that could not be read skipped: {first})"),
            n => format!("{space}({n} files that could not be read skipped, the first {first})"),
        };
        binary + &unreadable
    }
}

/// Where a search stands as it goes from file to file.
#[derive(Default)]
struct Progress {
    report: Report,
    /// Results printed: matching lines, or files in the other modes.
    results: usize,
    /// Whether anything was printed, for the `--` between context groups.
    printed: bool,
}

impl Search {
    /// Compile the input's pattern and filters.
    pub fn new(input: &Input) -> Result<Self> {
        let regex = RegexBuilder::new(&input.pattern).case_insensitive(input.case_insensitive).build()?;
        let glob = input.glob.as_deref().map(Glob::new).transpose()?.map(|g| g.compile_matcher());
        let extensions = input.file_type.as_deref().map(extensions).transpose()?;
        let context = input.context.unwrap_or(0);
        Ok(Search {
            regex,
            glob,
            extensions,
            mode: input.output_mode,
            before: input.before.unwrap_or(context),
            after: input.after.unwrap_or(context),
            max: input.max_matches,
        })
    }

    /// Search `target` (a file or a directory tree, in sorted order) and
    /// append what the output mode prints to `out`, paths relative to `root`.
    pub fn run(&self, root: &Path, target: &Path, out: &mut String) -> Result<Report> {
        let metadata = fs::metadata(target)
            .map_err(|error| keel_guest::Error::io("cannot search", shown(root, target), &error))?;
        let mut progress = Progress::default();
        if metadata.is_file() {
            self.file(root, target, out, &mut progress);
            return Ok(progress.report);
        }
        let walk = walkdir::WalkDir::new(target).sort_by_file_name().follow_links(false);
        for entry in walk.into_iter().filter_map(|entry| entry.ok()) {
            if !entry.file_type().is_file() || !self.wanted(entry.path()) {
                continue;
            }
            if !self.file(root, entry.path(), out, &mut progress) {
                break;
            }
        }
        Ok(progress.report)
    }

    fn wanted(&self, path: &Path) -> bool {
        let Some(name) = path.file_name() else { return false };
        if let Some(glob) = &self.glob
            && !glob.is_match(name)
        {
            return false;
        }
        match (self.extensions, path.extension().and_then(|extension| extension.to_str())) {
            (Some(extensions), Some(extension)) => {
                extensions.contains(&extension.to_ascii_lowercase().as_str())
            }
            (Some(_), None) => false,
            (None, _) => true,
        }
    }

    /// Search one file; false when `max_matches` says to stop.
    fn file(&self, root: &Path, path: &Path, out: &mut String, progress: &mut Progress) -> bool {
        // Unreadable files are skipped, as grep tools do by default, and
        // counted, so that no search says "No matches" of a file it never read.
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) => {
                let report = &mut progress.report;
                report.unreadable += 1;
                if report.first_unreadable.is_none() {
                    report.first_unreadable = Some(format!("{}: {error}", shown(root, path)));
                }
                return true;
            }
        };
        let binary = bytes[..bytes.len().min(BINARY_PROBE_BYTES)].contains(&0);
        let text = match String::from_utf8(bytes) {
            Ok(text) if !binary => text,
            _ => {
                progress.report.binary += 1;
                return true;
            }
        };
        progress.report.files += 1;
        let shown = shown(root, path);
        match self.mode {
            OutputMode::Content => self.lines(&shown, &text, out, progress),
            OutputMode::FilesWithMatches | OutputMode::Count => {
                let count = text.lines().filter(|line| self.regex.is_match(line)).count();
                if count == 0 {
                    return true;
                }
                if self.max.is_some_and(|max| progress.results >= max) {
                    progress.report.more = true;
                    return false;
                }
                progress.results += 1;
                match self.mode {
                    OutputMode::Count => {
                        let _ = writeln!(out, "{shown}:{count}");
                    }
                    _ => {
                        let _ = writeln!(out, "{shown}");
                    }
                }
                true
            }
        }
    }

    /// Print the matching lines of `text` (the file `shown`) with their
    /// context; false when `max_matches` says to stop.
    fn lines(&self, shown: &str, text: &str, out: &mut String, progress: &mut Progress) -> bool {
        let lines: Vec<&str> = text.lines().collect();
        let grouped = self.before > 0 || self.after > 0;
        // The first line not printed yet, whether any of this file was, and
        // the last line the after-context of the latest match reaches.
        let mut next = 0;
        let mut printed_here = false;
        let mut after_until = None;
        for (index, line) in lines.iter().enumerate() {
            if !self.regex.is_match(line) {
                if after_until.is_some_and(|until| index <= until) {
                    let _ = writeln!(out, "{shown}-{}-{line}", index + 1);
                    next = index + 1;
                }
                continue;
            }
            if self.max.is_some_and(|max| progress.results >= max) {
                progress.report.more = true;
                return false;
            }
            progress.results += 1;
            let from = index.saturating_sub(self.before).max(next);
            if grouped && progress.printed && (!printed_here || from > next) {
                out.push_str("--\n");
            }
            for (number, context) in lines.iter().enumerate().take(index).skip(from) {
                let _ = writeln!(out, "{shown}-{}-{context}", number + 1);
            }
            let _ = writeln!(out, "{shown}:{}:{line}", index + 1);
            progress.printed = true;
            printed_here = true;
            next = index + 1;
            after_until = (self.after > 0).then_some(index + self.after);
        }
        true
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
        let input = Input {
            pattern: pattern.into(),
            path: path.map(Into::into),
            glob: glob.map(Into::into),
            ..Default::default()
        };
        let cx = Context::new(json!({ "cwd": dir }));
        Grep::call(input, &cx).unwrap().text()
    }

    #[test]
    fn prints_path_line_text_in_sorted_order() {
        let dir = tree();
        assert_eq!(
            grep(dir.path(), "needle", None, None),
            "src/a.rs:2:let needle = 1;\nsrc/deep/b.txt:2:needle here\n\
             src/deep/b.txt:3:needle again\ntop.rs:1:needle\n(1 binary file skipped)\n"
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
        assert_eq!(grep(dir.path(), "absent", None, None), "No matches in 3 files (1 binary file skipped)");
    }

    #[test]
    fn a_missing_path_is_an_error_naming_it() {
        let dir = tree();
        let input =
            Input { pattern: "x".into(), path: Some("nope".into()), glob: None, ..Default::default() };
        let cx = Context::new(json!({ "cwd": dir.path() }));
        let error = Grep::call(input, &cx).unwrap_err();
        assert!(error.message().starts_with("cannot search nope: "), "{error}");
    }

    #[test]
    fn rejects_a_bad_regex_and_a_bad_glob() {
        let cx = Context::workspace_root();
        let bad = Input { pattern: "(".into(), path: None, glob: None, ..Default::default() };
        assert!(
            Grep::validate_input(&bad, &cx)
                .unwrap_err()
                .message()
                .starts_with("`pattern` is not a valid regex")
        );
        let bad = Input { pattern: "x".into(), path: None, glob: Some("[".into()), ..Default::default() };
        assert!(
            Grep::validate_input(&bad, &cx).unwrap_err().message().starts_with("`glob` is not a valid glob")
        );
    }

    #[test]
    fn is_read_only_and_concurrency_safe() {
        let input = Input { pattern: "x".into(), path: None, glob: None, ..Default::default() };
        assert!(Grep::is_read_only(&input, &Context::workspace_root()));
        assert!(Grep::is_concurrency_safe(&input, &Context::workspace_root()));
    }

    #[test]
    fn names_the_searched_path_from_the_workspace_root_after_a_cd() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        let subject = |path: Option<&str>| {
            let input =
                Input { pattern: "x".into(), path: path.map(Into::into), glob: None, ..Default::default() };
            Grep::permission_subject(&input, &secrets)
        };
        assert_eq!(subject(Some("k.txt")).as_deref(), Some("secrets/k.txt"));
        assert_eq!(subject(None).as_deref(), Some("secrets"));
        assert_eq!(subject(Some("..")).as_deref(), Some("."));
        assert_eq!(subject(Some("/etc/passwd")).as_deref(), Some("/etc/passwd"));
        let root = Context::workspace_root();
        let input = Input {
            pattern: "x".into(),
            path: Some("./a/../secrets/k.txt".into()),
            glob: None,
            ..Default::default()
        };
        assert_eq!(Grep::permission_subject(&input, &root).as_deref(), Some("secrets/k.txt"));
    }

    /// `grep` with every option from `input`, searching `dir`.
    fn search(dir: &Path, input: Input) -> Result<String> {
        let cx = Context::new(json!({ "cwd": dir }));
        Grep::validate_input(&input, &cx)?;
        Ok(Grep::call(input, &cx)?.text())
    }

    /// A tree of text files only, so no note of skipped files.
    fn lines_tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let numbered: String = (1..=12)
            .map(|n| if n == 4 || n == 6 || n == 11 { format!("Hit {n}\n") } else { format!("{n}\n") })
            .collect();
        fs::write(dir.path().join("a.txt"), numbered).unwrap();
        fs::write(dir.path().join("b.py"), "hit = 1\nprint(hit)\n").unwrap();
        fs::write(dir.path().join("c.md"), "# nothing\n").unwrap();
        dir
    }

    fn input(pattern: &str) -> Input {
        Input { pattern: pattern.into(), ..Default::default() }
    }

    #[test]
    fn the_defaults_print_exactly_what_they_did() {
        let dir = lines_tree();
        assert_eq!(
            search(dir.path(), input("Hit")).unwrap(),
            "a.txt:4:Hit 4\na.txt:6:Hit 6\na.txt:11:Hit 11\n"
        );
    }

    #[test]
    fn case_insensitive_matches_either_case() {
        let dir = lines_tree();
        let found = search(dir.path(), Input { case_insensitive: true, ..input("hit") }).unwrap();
        assert_eq!(
            found,
            "a.txt:4:Hit 4\na.txt:6:Hit 6\na.txt:11:Hit 11\nb.py:1:hit = 1\nb.py:2:print(hit)\n"
        );
    }

    #[test]
    fn context_lines_are_marked_with_dashes_and_groups_split_by_two() {
        let dir = lines_tree();
        let found = search(dir.path(), Input { context: Some(1), ..input("Hit") }).unwrap();
        assert_eq!(
            found,
            "a.txt-3-3\na.txt:4:Hit 4\na.txt-5-5\na.txt:6:Hit 6\na.txt-7-7\n--\n\
             a.txt-10-10\na.txt:11:Hit 11\na.txt-12-12\n"
        );
        let found =
            search(dir.path(), Input { before: Some(2), path: Some("a.txt".into()), ..input("Hit 1") })
                .unwrap();
        assert_eq!(found, "a.txt-9-9\na.txt-10-10\na.txt:11:Hit 11\n");
        let found = search(dir.path(), Input { after: Some(5), ..input("Hit 11|hit =") }).unwrap();
        assert_eq!(found, "a.txt:11:Hit 11\na.txt-12-12\n--\nb.py:1:hit = 1\nb.py-2-print(hit)\n");
        let found =
            search(dir.path(), Input { context: Some(3), before: Some(0), ..input("Hit 4") }).unwrap();
        assert_eq!(
            found, "a.txt:4:Hit 4\na.txt-5-5\na.txt-6-Hit 6\na.txt-7-7\n",
            "`before` overrides `context`"
        );
    }

    #[test]
    fn lists_the_files_with_a_match_or_counts_per_file() {
        let dir = lines_tree();
        let files =
            Input { output_mode: OutputMode::FilesWithMatches, case_insensitive: true, ..input("hit") };
        assert_eq!(search(dir.path(), files).unwrap(), "a.txt\nb.py\n");
        let count = Input { output_mode: OutputMode::Count, case_insensitive: true, ..input("hit") };
        assert_eq!(search(dir.path(), count).unwrap(), "a.txt:3\nb.py:2\n");
        let none = Input { output_mode: OutputMode::Count, ..input("absent") };
        assert_eq!(search(dir.path(), none).unwrap(), "No matches in 3 files");
    }

    #[test]
    fn max_matches_stops_and_says_so_only_when_more_follow() {
        let dir = lines_tree();
        let found = search(dir.path(), Input { max_matches: Some(2), ..input("Hit") }).unwrap();
        assert_eq!(
            found,
            "a.txt:4:Hit 4\na.txt:6:Hit 6\n(stopped after 2 matches; raise `max_matches` to see more)\n"
        );
        let found = search(dir.path(), Input { max_matches: Some(3), ..input("Hit") }).unwrap();
        assert_eq!(
            found, "a.txt:4:Hit 4\na.txt:6:Hit 6\na.txt:11:Hit 11\n",
            "exactly three: nothing left out"
        );
        let files = Input {
            max_matches: Some(1),
            output_mode: OutputMode::FilesWithMatches,
            case_insensitive: true,
            ..input("hit")
        };
        assert_eq!(
            search(dir.path(), files).unwrap(),
            "a.txt\n(stopped after 1 file; raise `max_matches` to see more)\n"
        );
    }

    #[test]
    fn type_filters_by_extension_beside_glob() {
        let dir = lines_tree();
        let found = search(dir.path(), Input { file_type: Some("py".into()), ..input("hit") }).unwrap();
        assert_eq!(found, "b.py:1:hit = 1\nb.py:2:print(hit)\n");
        let both = Input { file_type: Some("py".into()), glob: Some("a*".into()), ..input("hit") };
        assert_eq!(search(dir.path(), both).unwrap(), "No matches in 0 files");
        assert_eq!(extensions("yaml").unwrap(), ["yaml", "yml"]);
    }

    #[test]
    fn skips_binary_files_and_counts_them() {
        let dir = lines_tree();
        let mut nul = b"Hit in a binary\n".to_vec();
        nul.push(0);
        fs::write(dir.path().join("d.bin"), nul).unwrap();
        fs::write(dir.path().join("e.dat"), [b'H', b'i', b't', 0xff]).unwrap();
        let found = search(dir.path(), Input { path: None, ..input("Hit 4") }).unwrap();
        assert_eq!(found, "a.txt:4:Hit 4\n(2 binary files skipped)\n");
        let found = search(dir.path(), Input { path: Some("d.bin".into()), ..input("Hit") }).unwrap();
        assert_eq!(found, "No matches in 0 files (1 binary file skipped)");
    }

    #[test]
    fn refuses_an_unknown_type_and_a_zero_max() {
        let cx = Context::workspace_root();
        let error =
            Grep::validate_input(&Input { file_type: Some("rust".into()), ..input("x") }, &cx).unwrap_err();
        assert!(
            error.message().starts_with("`type` \"rust\" is not a known file type; use one of c, cpp, cs, "),
            "{error}"
        );
        let error = Grep::validate_input(&Input { max_matches: Some(0), ..input("x") }, &cx).unwrap_err();
        assert_eq!(error.message(), "`max_matches` must be at least 1");
    }
}
