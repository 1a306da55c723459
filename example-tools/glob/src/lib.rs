//! `glob`: find files by name pattern.
//!
//! Lists the files under `path` whose path below it matches `pattern`
//! (`**/*.rs`, `src/{a,b}/*.md`), newest first, so the files an agent was
//! just working on come first. Files modified at the same instant are listed
//! by path, so the order never depends on the order the directory is read
//! in. At most `limit` paths are listed, and the result says when more
//! matched.
//!
//! Matching is [`globset`]'s, with `*` held to one path component; the
//! walk starts at the pattern's literal leading directories (`src/` of
//! `src/**/*.rs`), so a narrow pattern does not read the whole tree.
//! Symbolic links are listed when they match, never followed; `.git`, `.hg`
//! and `.svn` directories are not walked into.
//!
//! Read-only and concurrency-safe; its permission subject is the directory
//! searched, named from the workspace root.

use std::cmp::Reverse;
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use globset::{GlobBuilder, GlobMatcher};
use keel_guest::{Context, Error, Output, Plan, Result, Tool, bail};
use schemars::JsonSchema;
use serde::Deserialize;

/// Paths listed when the input sets no `limit`.
pub const DEFAULT_LIMIT: usize = 100;

/// Directories never walked into: a version control system's own files are
/// never what a search for files means, and after a commit they would be
/// the newest of all. A pattern that starts inside one still finds its files.
pub const VCS_DIRS: [&str; 3] = [".git", ".hg", ".svn"];

/// Input of `glob`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The pattern, matched against each file's path below `path`: `*` matches
    /// within one directory, `**` any number of directories, `?` one
    /// character, `[abc]` one of a set, `{a,b}` either pattern. Such as
    /// `**/*.rs` or `src/{a,b}/*.md`.
    pub pattern: String,
    /// Directory to search, relative to the working directory. Default: the
    /// working directory.
    #[serde(default)]
    pub path: Option<String>,
    /// The most paths to list. Default: 100.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<usize>,
}

/// The `glob` tool.
pub struct Glob;

impl Tool for Glob {
    type Input = Input;
    const NAME: &str = "glob";
    const DESCRIPTION: &str = "Finds files whose path matches a glob pattern such as `**/*.rs` or \
        `src/{a,b}/*.md`, under `path` (default: the working directory). Lists paths relative to the \
        working directory, most recently modified first, at most `limit` (default 100).";
    const FIXED_PLAN: Option<Plan> = Some(Plan::SAFE_READ_ONLY);
    const SEARCH_HINT: Option<&str> = Some("find files by name pattern");
    const INTERRUPT: keel_guest::Interrupt = keel_guest::Interrupt::Cancel;

    fn is_destructive(_input: &Input, _cx: &Context) -> bool {
        false
    }

    fn is_search_or_read(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        Pattern::new(&input.pattern)?;
        if input.limit == Some(0) {
            bail!("`limit` must be at least 1");
        }
        Ok(())
    }

    fn permission_subject(input: &Input, cx: &Context) -> Option<String> {
        Some(cx.workspace_relative(input.path.as_deref().unwrap_or(".")))
    }

    fn activity_description(input: &Input, _cx: &Context) -> Option<String> {
        Some(format!("Finding {}", input.pattern))
    }

    fn call(input: Input, cx: &Context) -> Result<Output> {
        let pattern = Pattern::new(&input.pattern)?;
        let shown_dir = input.path.as_deref().unwrap_or(".");
        let dir = cx.resolve(shown_dir);
        match std::fs::metadata(&dir) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => bail!("cannot search {shown_dir}: it is not a directory"),
            Err(error) => return Err(Error::io("cannot search", shown_dir, &error)),
        }
        let found = pattern.find(&dir);
        let root = PathBuf::from(cx.cwd());
        let limit = input.limit.unwrap_or(DEFAULT_LIMIT);
        Ok(Output::text(list(&found, &root, limit, &input.pattern, shown_dir)))
    }
}

/// A checked, compiled pattern.
pub struct Pattern {
    matcher: GlobMatcher,
    /// The leading components that hold no glob syntax: the walk starts there.
    prefix: PathBuf,
    /// How deep below `prefix` a match can be, when the pattern says.
    depth: Option<usize>,
}

/// A file that matched: its path and when it was last modified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its path, below the searched directory's parent as the walk saw it.
    pub path: PathBuf,
    /// Its modification time; the epoch when the file system gives none.
    pub modified: SystemTime,
}

impl Pattern {
    /// Check `pattern` and compile it. It must be relative and stay below
    /// the directory searched.
    pub fn new(pattern: &str) -> Result<Self> {
        if pattern.trim().is_empty() {
            bail!("`pattern` must not be empty");
        }
        if pattern.starts_with('/') {
            bail!("`pattern` must be relative to `path`; put the directory in `path`: {pattern}");
        }
        if pattern.split('/').any(|part| part == "..") {
            bail!("`pattern` must not climb out of `path` with `..`; put the directory in `path`: {pattern}");
        }
        // Matched against paths such as `src/main.rs`: `./src/*.rs` and
        // `src//*.rs` mean the same.
        let parts: Vec<&str> = pattern.split('/').filter(|part| !part.is_empty() && *part != ".").collect();
        let glob = GlobBuilder::new(&parts.join("/"))
            .literal_separator(true)
            .build()
            .map_err(|error| Error::msg(format!("`pattern` is not a valid glob: {error}")))?;
        let literal = parts
            .iter()
            .take(parts.len().saturating_sub(1))
            .take_while(|part| !part.contains(['*', '?', '[', '{', '\\']))
            .count();
        let prefix: PathBuf = parts[..literal].iter().collect();
        // `**` reaches any depth; an alternative may hold a `/` of its own.
        let depth = (!pattern.contains("**") && !pattern.contains('{')).then_some(parts.len() - literal);
        Ok(Pattern { matcher: glob.compile_matcher(), prefix, depth })
    }

    /// Every file (or symbolic link) below `dir` whose path below it matches,
    /// in no particular order. Entries that cannot be read are passed over.
    pub fn find(&self, dir: &Path) -> Vec<Found> {
        let start = dir.join(&self.prefix);
        let mut walk = walkdir::WalkDir::new(&start).follow_links(false).min_depth(1);
        if let Some(depth) = self.depth {
            walk = walk.max_depth(depth);
        }
        let mut found = Vec::new();
        let walk = walk.into_iter().filter_entry(|entry| {
            !(entry.file_type().is_dir()
                && entry.file_name().to_str().is_some_and(|name| VCS_DIRS.contains(&name)))
        });
        for entry in walk.filter_map(|entry| entry.ok()) {
            if entry.file_type().is_dir() {
                continue;
            }
            let Ok(below) = entry.path().strip_prefix(dir) else { continue };
            if !self.matcher.is_match(below) {
                continue;
            }
            let modified = entry
                .metadata()
                .ok()
                .and_then(|metadata| metadata.modified().ok())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            found.push(Found { path: entry.into_path(), modified });
        }
        found
    }
}

/// Sort `found` newest first (by path on a tie), and list at most `limit`
/// paths, relative to `root` when below it; say when more matched, and when
/// nothing did.
pub fn list(found: &[Found], root: &Path, limit: usize, pattern: &str, dir: &str) -> String {
    if found.is_empty() {
        return format!("No files match {pattern} in {dir}");
    }
    let mut sorted: Vec<&Found> = found.iter().collect();
    sorted.sort_by(|a, b| (Reverse(a.modified), &a.path).cmp(&(Reverse(b.modified), &b.path)));
    let mut out = String::new();
    for file in sorted.iter().take(limit) {
        out.push_str(&shown(root, &file.path));
        out.push('\n');
    }
    if found.len() > limit {
        out.push_str(&format!(
            "(showing the {limit} most recently modified of {} matches; narrow the pattern or raise `limit`)\n",
            found.len()
        ));
    }
    out
}

/// `path` relative to `root` when below it, else as it is, folded lexically.
fn shown(root: &Path, path: &Path) -> String {
    let path: PathBuf = path.components().filter(|part| *part != Component::CurDir).collect();
    path.strip_prefix(root).unwrap_or(&path).display().to_string()
}

keel_guest::export!(Glob);

#[cfg(test)]
mod tests {
    use std::fs;
    use std::time::Duration;

    use keel_guest::json;

    use super::*;

    /// A tree whose files were modified a second apart, in this order:
    /// `src/a/one.md`, `README.md`, `src/main.rs`, `src/b/two.md`,
    /// `src/c/three.md`, `src/deep/er/lib.rs`.
    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            "src/a/one.md",
            "README.md",
            "src/main.rs",
            "src/b/two.md",
            "src/c/three.md",
            "src/deep/er/lib.rs",
        ];
        for (second, name) in (0..).zip(files) {
            let path = dir.path().join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, name).unwrap();
            touch(&path, second);
        }
        dir
    }

    fn touch(path: &Path, second: u64) {
        let time = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + second);
        fs::File::options().write(true).open(path).unwrap().set_modified(time).unwrap();
    }

    fn glob(dir: &Path, pattern: &str, path: Option<&str>, limit: Option<usize>) -> Result<String> {
        let input = Input { pattern: pattern.into(), path: path.map(Into::into), limit };
        let cx = Context::new(json!({ "cwd": dir }));
        Glob::validate_input(&input, &cx)?;
        Ok(Glob::call(input, &cx)?.text())
    }

    #[test]
    fn lists_matches_newest_first() {
        let dir = tree();
        assert_eq!(glob(dir.path(), "**/*.rs", None, None).unwrap(), "src/deep/er/lib.rs\nsrc/main.rs\n");
        assert_eq!(
            glob(dir.path(), "**/*.md", None, None).unwrap(),
            "src/c/three.md\nsrc/b/two.md\nREADME.md\nsrc/a/one.md\n"
        );
    }

    #[test]
    fn a_tie_in_modification_time_is_broken_by_path() {
        let dir = tree();
        for name in ["src/c/three.md", "src/a/one.md", "src/b/two.md"] {
            touch(&dir.path().join(name), 100);
        }
        assert_eq!(
            glob(dir.path(), "src/*/*.md", None, None).unwrap(),
            "src/a/one.md\nsrc/b/two.md\nsrc/c/three.md\n"
        );
    }

    #[test]
    fn alternatives_and_a_star_that_stays_in_one_directory() {
        let dir = tree();
        assert_eq!(glob(dir.path(), "src/{a,b}/*.md", None, None).unwrap(), "src/b/two.md\nsrc/a/one.md\n");
        assert_eq!(glob(dir.path(), "*.md", None, None).unwrap(), "README.md\n", "`*` does not cross `/`");
        assert_eq!(glob(dir.path(), "src/*.rs", None, None).unwrap(), "src/main.rs\n");
        assert_eq!(glob(dir.path(), "src/main.rs", None, None).unwrap(), "src/main.rs\n");
    }

    #[test]
    fn searches_under_path_and_shows_paths_from_the_working_directory() {
        let dir = tree();
        assert_eq!(
            glob(dir.path(), "*/*.md", Some("src"), None).unwrap(),
            "src/c/three.md\nsrc/b/two.md\nsrc/a/one.md\n"
        );
        let cx = Context::new(json!({ "cwd": dir.path().join("src/a") }));
        let input = Input { pattern: "**/*.rs".into(), path: Some("..".into()), limit: None };
        let listed = Glob::call(input, &cx).unwrap().text();
        let outside = dir.path().join("src/main.rs").display().to_string();
        assert!(listed.ends_with(&format!("{outside}\n")), "a path outside the cwd stays whole: {listed}");
    }

    #[test]
    fn a_leading_dot_slash_means_the_same_and_version_control_is_left_out() {
        let dir = tree();
        fs::create_dir_all(dir.path().join(".git/refs")).unwrap();
        fs::write(dir.path().join(".git/refs/main.rs"), "").unwrap();
        fs::write(dir.path().join(".gitignore"), "").unwrap();
        assert_eq!(glob(dir.path(), "./src//*.rs", None, None).unwrap(), "src/main.rs\n");
        assert_eq!(glob(dir.path(), "**/*.rs", None, None).unwrap(), "src/deep/er/lib.rs\nsrc/main.rs\n");
        assert_eq!(glob(dir.path(), ".git*", None, None).unwrap(), ".gitignore\n");
        assert_eq!(glob(dir.path(), ".git/**/*.rs", None, None).unwrap(), ".git/refs/main.rs\n");
    }

    #[test]
    fn stops_at_the_limit_and_says_so() {
        let dir = tree();
        assert_eq!(
            glob(dir.path(), "**/*", None, Some(2)).unwrap(),
            "src/deep/er/lib.rs\nsrc/c/three.md\n\
             (showing the 2 most recently modified of 6 matches; narrow the pattern or raise `limit`)\n"
        );
        assert_eq!(glob(dir.path(), "**/*.rs", None, Some(2)).unwrap(), "src/deep/er/lib.rs\nsrc/main.rs\n");
    }

    #[test]
    fn says_when_nothing_matches() {
        let dir = tree();
        assert_eq!(glob(dir.path(), "**/*.py", None, None).unwrap(), "No files match **/*.py in .");
        assert_eq!(
            glob(dir.path(), "nope/*.rs", Some("src"), None).unwrap(),
            "No files match nope/*.rs in src"
        );
    }

    #[test]
    fn refuses_a_bad_pattern_a_zero_limit_and_a_path_that_is_no_directory() {
        let dir = tree();
        let message = |pattern: &str, path: Option<&str>, limit| {
            glob(dir.path(), pattern, path, limit).unwrap_err().message().to_owned()
        };
        assert!(message("src/[", None, None).starts_with("`pattern` is not a valid glob: "));
        assert_eq!(message(" ", None, None), "`pattern` must not be empty");
        assert_eq!(
            message("/etc/*", None, None),
            "`pattern` must be relative to `path`; put the directory in `path`: /etc/*"
        );
        assert_eq!(
            message("../*.rs", None, None),
            "`pattern` must not climb out of `path` with `..`; put the directory in `path`: ../*.rs"
        );
        assert_eq!(message("*", None, Some(0)), "`limit` must be at least 1");
        assert_eq!(message("*", Some("README.md"), None), "cannot search README.md: it is not a directory");
        assert!(message("*", Some("nope"), None).starts_with("cannot search nope: "));
    }

    #[test]
    fn is_read_only_and_concurrency_safe() {
        let input = Input { pattern: "*".into(), path: None, limit: None };
        let cx = Context::workspace_root();
        assert!(Glob::is_read_only(&input, &cx));
        assert!(Glob::is_concurrency_safe(&input, &cx));
        assert!(!Glob::is_destructive(&input, &cx));
    }

    #[test]
    fn names_the_searched_directory_from_the_workspace_root_after_a_cd() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        let subject = |path: Option<&str>| {
            let input = Input { pattern: "*".into(), path: path.map(Into::into), limit: None };
            Glob::permission_subject(&input, &secrets)
        };
        assert_eq!(subject(None).as_deref(), Some("secrets"));
        assert_eq!(subject(Some("keys")).as_deref(), Some("secrets/keys"));
        assert_eq!(subject(Some("..")).as_deref(), Some("."));
    }
}
