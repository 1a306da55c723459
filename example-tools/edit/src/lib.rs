//! `edit`: replace an exact string in one file of the workspace.
//!
//! The tool an agent uses to change part of a file without sending all of it
//! back. `old_string` must appear exactly once, unless `replace_all` says to
//! replace every occurrence: an edit that could land in more than one place is
//! refused, with each place quoted, so the model adds context instead of
//! guessing. The file keeps its line endings (a CRLF file's edit is made in
//! CRLF, whatever the input's line endings were) and whether it ends with a
//! newline.
//!
//! The new content is written over the old in the same file, truncated
//! first, then synced, so the file keeps its mode: WASI gives a guest no way
//! to set one, and a new file renamed over the old would have the mode a new
//! file gets (an executable script would lose its executable bit, a private
//! file would become readable by all). The price is atomicity: a reader
//! during the write, or a crash, can find the file part-written, as after
//! `write_file` over an existing file.
//!
//! Destructive (the old text is gone), not concurrency-safe (a later call
//! must see the change), not read-only. Its permission subject is the file,
//! named from the workspace root, so a rule `edit(secrets/**)` holds after a
//! `cd`; its context modifier names the file under `files_edited`.

use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::ops::Range;
use std::path::Path;

use keel_guest::{Context, Error, Output, Result, Tool, bail, json};
use schemars::JsonSchema;
use serde::Deserialize;

/// The largest file `edit` changes. It holds the old and the new text at
/// once, so this stays well inside a sandbox's default 256 MiB of memory.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Unchanged lines shown before and after each change in the result.
pub const CONTEXT_LINES: usize = 3;

/// Hunks of the diff shown at most; a `replace_all` over a large file would
/// otherwise hand back most of the file.
pub const MAX_HUNKS: usize = 5;

/// Places quoted at most when `old_string` appears more than once.
pub const MAX_QUOTED: usize = 10;

/// Characters shown of one line, in the diff and in a quoted place; a
/// minified file's line would otherwise fill the result.
pub const MAX_SHOWN_LINE_CHARS: usize = 200;

/// Input of `edit`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Path of the file to edit, relative to the working directory.
    pub file_path: String,
    /// The exact text to replace, whitespace and indentation included. It must
    /// appear exactly once in the file unless `replace_all` is set.
    pub old_string: String,
    /// The text to put in its place; it must differ from `old_string`.
    pub new_string: String,
    /// Replace every occurrence of `old_string`. Default: false.
    #[serde(default)]
    pub replace_all: bool,
}

/// The `edit` tool.
pub struct Edit;

impl Tool for Edit {
    type Input = Input;
    const NAME: &str = "edit";
    const DESCRIPTION: &str = "Replaces an exact string in a file of the workspace. `old_string` \
        must appear exactly once, whitespace included, unless `replace_all` is set; add surrounding \
        lines to make it unique. The file keeps its line endings and its final newline. Returns \
        the changed lines as a diff.";
    const SEARCH_HINT: Option<&str> = Some("replace exact text in a file");

    fn is_destructive(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        if input.file_path.trim().is_empty() {
            bail!("`file_path` must not be empty");
        }
        if input.old_string.is_empty() {
            bail!("`old_string` must not be empty");
        }
        if input.old_string == input.new_string {
            bail!("`old_string` and `new_string` are the same, so the edit would change nothing");
        }
        Ok(())
    }

    fn permission_subject(input: &Input, cx: &Context) -> Option<String> {
        Some(cx.workspace_relative(&input.file_path))
    }

    fn activity_description(input: &Input, _cx: &Context) -> Option<String> {
        Some(format!("Editing {}", input.file_path))
    }

    fn call(input: Input, cx: &Context) -> Result<Output> {
        let name = &input.file_path;
        let path = cx.resolve(name);
        let text = read(&path, name)?;
        let edited = apply(&text, &input.old_string, &input.new_string, input.replace_all, name)?;
        write_in_place(&path, &edited.text).map_err(|error| Error::io("cannot write", name, &error))?;
        let count = edited.replacements;
        let unit = if count == 1 { "replacement" } else { "replacements" };
        let report = format!("Edited {name}: {count} {unit}\n{}", edited.diff);
        Ok(Output::text(report).with_context_modifier(json!({
            "files_edited": { cx.workspace_relative(name): { "replacements": count } }
        })))
    }
}

/// A file's text after an edit, and what to show of the change.
#[derive(Debug, PartialEq, Eq)]
pub struct Edited {
    /// The whole new text.
    pub text: String,
    /// How many occurrences were replaced.
    pub replacements: usize,
    /// The changed lines as unified-diff hunks, each with
    /// [`CONTEXT_LINES`] of context, at most [`MAX_HUNKS`] of them.
    pub diff: String,
}

/// The text of the file at `path` (named `name` in errors): a regular file
/// of UTF-8 text, at most [`MAX_FILE_BYTES`].
fn read(path: &Path, name: &str) -> Result<String> {
    let metadata = fs::symlink_metadata(path).map_err(|error| Error::io("cannot edit", name, &error))?;
    if metadata.file_type().is_symlink() {
        // The result names the file changed, so the model edits the file itself.
        bail!("cannot edit {name}: it is a symbolic link; edit the file it points to");
    }
    if metadata.is_dir() {
        bail!("cannot edit {name}: it is a directory");
    }
    if metadata.len() > MAX_FILE_BYTES {
        bail!("cannot edit {name}: it is larger than {} MiB", MAX_FILE_BYTES >> 20);
    }
    let bytes = fs::read(path).map_err(|error| Error::io("cannot edit", name, &error))?;
    String::from_utf8(bytes).map_err(|_| Error::msg(format!("cannot edit {name}: it is not UTF-8 text")))
}

/// Replace `old` with `new` in `text` (the file `name`): the one occurrence,
/// or every one when `replace_all` is set.
///
/// In a file whose first line ends in CRLF, `old` and `new` are matched and
/// inserted with CRLF line endings. The result ends with a line ending
/// exactly when `text` did (an empty result stays empty).
pub fn apply(text: &str, old: &str, new: &str, replace_all: bool, name: &str) -> Result<Edited> {
    let crlf = uses_crlf(text);
    let (old, new) = if crlf { (to_crlf(old), to_crlf(new)) } else { (old.to_owned(), new.to_owned()) };
    if old == new {
        bail!("`old_string` and `new_string` are the same, so the edit would change nothing");
    }
    let starts: Vec<usize> = text.match_indices(old.as_str()).map(|(at, _)| at).collect();
    match starts.len() {
        0 => bail!(
            "`old_string` does not appear in {name}; it must match the file exactly, whitespace and \
             indentation included"
        ),
        1 => {}
        _ if replace_all => {}
        _ => return Err(Error::msg(ambiguous(text, &starts, name))),
    }
    let mut out = String::with_capacity(text.len() + starts.len() * new.len());
    let mut last = 0;
    for &at in &starts {
        out.push_str(&text[last..at]);
        out.push_str(&new);
        last = at + old.len();
    }
    out.push_str(&text[last..]);
    keep_final_newline(text, &mut out, crlf);
    let diff = Lines::new(text).diff(&starts, old.len(), &new);
    Ok(Edited { text: out, replacements: starts.len(), diff })
}

/// Whether `text` uses CRLF line endings: its first line ends in one.
fn uses_crlf(text: &str) -> bool {
    text.find('\n').is_some_and(|at| text[..at].ends_with('\r'))
}

/// `text` with every line ending CRLF.
fn to_crlf(text: &str) -> String {
    text.replace("\r\n", "\n").replace('\n', "\r\n")
}

/// Make `after` end with a line ending exactly when `before` did.
fn keep_final_newline(before: &str, after: &mut String, crlf: bool) {
    if before.ends_with('\n') {
        if !after.is_empty() && !after.ends_with('\n') {
            after.push_str(if crlf { "\r\n" } else { "\n" });
        }
        return;
    }
    while after.ends_with('\n') {
        after.pop();
        if after.ends_with('\r') {
            after.pop();
        }
    }
}

/// The refusal of an `old_string` found at each of `starts`: how many times,
/// and the line of each, numbered.
fn ambiguous(text: &str, starts: &[usize], name: &str) -> String {
    let lines = Lines::new(text);
    let mut message = format!(
        "`old_string` appears {} times in {name}; add surrounding lines to make it unique, or set \
         `replace_all` to replace every one:",
        starts.len()
    );
    for &at in starts.iter().take(MAX_QUOTED) {
        let line = lines.of(at);
        let _ = write!(message, "\n  line {}: {}", line + 1, shown_line(lines.text(line)));
    }
    if starts.len() > MAX_QUOTED {
        let _ = write!(message, "\n  ... and {} more", starts.len() - MAX_QUOTED);
    }
    message
}

/// A line cut at [`MAX_SHOWN_LINE_CHARS`].
fn shown_line(line: &str) -> String {
    match line.char_indices().nth(MAX_SHOWN_LINE_CHARS) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line.to_owned(),
    }
}

/// The lines of a text, by the byte offset each starts at.
struct Lines<'a> {
    text: &'a str,
    /// The offset of each line's first byte, and, when the text ends with a
    /// newline, the text's length.
    starts: Vec<usize>,
    /// How many lines the text has, as [`str::lines`] counts them.
    count: usize,
}

/// Changed lines: the old lines `lines` and the occurrences in them.
struct Region {
    lines: Range<usize>,
    matches: Range<usize>,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        let starts: Vec<usize> =
            std::iter::once(0).chain(text.match_indices('\n').map(|(at, _)| at + 1)).collect();
        let count = if text.is_empty() || text.ends_with('\n') { starts.len() - 1 } else { starts.len() };
        Lines { text, starts, count }
    }

    /// The line (from 0) that byte `at` is on.
    fn of(&self, at: usize) -> usize {
        self.starts.partition_point(|&start| start <= at) - 1
    }

    /// Where line `line` starts; the text's length past its last line.
    fn start(&self, line: usize) -> usize {
        self.starts.get(line).copied().unwrap_or(self.text.len())
    }

    /// Line `line` without its line ending.
    fn text(&self, line: usize) -> &'a str {
        let text = &self.text[self.start(line)..self.start(line + 1)];
        let text = text.strip_suffix('\n').unwrap_or(text);
        text.strip_suffix('\r').unwrap_or(text)
    }

    /// The unified-diff hunks of replacing the `old_len` bytes at each of
    /// `starts` with `new`.
    fn diff(&self, starts: &[usize], old_len: usize, new: &str) -> String {
        let mut regions: Vec<Region> = Vec::new();
        for (index, &at) in starts.iter().enumerate() {
            let lines = self.of(at)..self.of(at + old_len - 1) + 1;
            match regions.last_mut() {
                Some(region) if lines.start < region.lines.end => {
                    region.lines.end = region.lines.end.max(lines.end);
                    region.matches.end = index + 1;
                }
                _ => regions.push(Region { lines, matches: index..index + 1 }),
            }
        }
        let mut hunks: Vec<&[Region]> = Vec::new();
        let mut first = 0;
        for index in 1..=regions.len() {
            let apart = regions
                .get(index)
                .is_none_or(|next| next.lines.start > regions[index - 1].lines.end + 2 * CONTEXT_LINES);
            if apart {
                hunks.push(&regions[first..index]);
                first = index;
            }
        }
        let mut out = String::new();
        // New lines minus old lines of the regions so far: where the next
        // hunk starts in the new file.
        let mut shift: isize = 0;
        for hunk in hunks.iter().take(MAX_HUNKS) {
            let from = hunk[0].lines.start.saturating_sub(CONTEXT_LINES);
            let to = (hunk[hunk.len() - 1].lines.end + CONTEXT_LINES).min(self.count);
            let mut body = String::new();
            let mut grown: isize = 0;
            let mut cursor = from;
            for region in *hunk {
                for line in cursor..region.lines.start {
                    let _ = writeln!(body, " {}", shown_line(self.text(line)));
                }
                for line in region.lines.clone() {
                    let _ = writeln!(body, "-{}", shown_line(self.text(line)));
                }
                let replaced = self.replaced(region, &starts[region.matches.clone()], old_len, new);
                for line in replaced.lines() {
                    let line = line.strip_suffix('\r').unwrap_or(line);
                    let _ = writeln!(body, "+{}", shown_line(line));
                }
                grown += replaced.lines().count() as isize - region.lines.len() as isize;
                cursor = region.lines.end;
            }
            for line in cursor..to {
                let _ = writeln!(body, " {}", shown_line(self.text(line)));
            }
            let old_count = to - from;
            let new_count = (old_count as isize + grown) as usize;
            let new_from = (from as isize + shift) as usize;
            let _ = writeln!(out, "@@ -{} +{} @@", range(from, old_count), range(new_from, new_count));
            out.push_str(&body);
            shift += grown;
        }
        if hunks.len() > MAX_HUNKS {
            let _ = writeln!(out, "({} more changed places not shown)", hunks.len() - MAX_HUNKS);
        }
        out
    }

    /// The new text of `region`'s lines: each occurrence at `starts` replaced.
    fn replaced(&self, region: &Region, starts: &[usize], old_len: usize, new: &str) -> String {
        let mut out = String::new();
        let mut last = self.start(region.lines.start);
        for &at in starts {
            out.push_str(&self.text[last..at]);
            out.push_str(new);
            last = at + old_len;
        }
        out.push_str(&self.text[last..self.start(region.lines.end)]);
        out
    }
}

/// A unified diff's range of `count` lines from line `from` (0-based): the
/// first line numbered from 1, or the line before when the range is empty.
fn range(from: usize, count: usize) -> String {
    let first = if count == 0 { from } else { from + 1 };
    format!("{first},{count}")
}

/// Replace the contents of the file at `path` with `text`, in the file
/// itself so that it keeps its mode (see the crate docs): truncated, written,
/// then synced.
pub fn write_in_place(path: &Path, text: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).truncate(true).open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

keel_guest::export!(Edit);

#[cfg(test)]
mod tests {
    use super::*;

    fn input(file_path: &str, old: &str, new: &str, replace_all: bool) -> Input {
        Input { file_path: file_path.into(), old_string: old.into(), new_string: new.into(), replace_all }
    }

    /// A workspace holding `name` with `text`, and a context at its root.
    fn file(name: &str, text: &str) -> (tempfile::TempDir, Context) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(name), text).unwrap();
        let cx = Context::new(json!({ "cwd": dir.path() }));
        (dir, cx)
    }

    fn edit(cx: &Context, input: Input) -> Result<Output> {
        Edit::validate_input(&input, cx)?;
        Edit::call(input, cx)
    }

    #[test]
    fn replaces_the_one_occurrence_and_shows_the_change_with_context() {
        let (dir, cx) = file("a.txt", "1\n2\n3\n4\nold\n6\n7\n8\n9\n");
        let output = edit(&cx, input("a.txt", "old", "new", false)).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
            "1\n2\n3\n4\nnew\n6\n7\n8\n9\n"
        );
        assert_eq!(
            output.text(),
            "Edited a.txt: 1 replacement\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-old\n+new\n 6\n 7\n 8\n"
        );
    }

    #[test]
    fn names_the_edited_file_in_its_context_modifier() {
        let (dir, cx) = file("a.txt", "x y x\n");
        let output = edit(&cx, input("a.txt", "x", "z", true)).unwrap();
        let shown = dir.path().join("a.txt").display().to_string();
        assert_eq!(
            output.context_modifier,
            Some(json!({ "files_edited": { shown: { "replacements": 2 } } }))
        );
    }

    #[test]
    fn refuses_an_old_string_that_does_not_appear() {
        let (dir, cx) = file("a.txt", "fn main() {}\n");
        let error = edit(&cx, input("a.txt", "fn  main", "fn start", false)).unwrap_err();
        assert_eq!(
            error.message(),
            "`old_string` does not appear in a.txt; it must match the file exactly, whitespace and \
             indentation included"
        );
        assert_eq!(std::fs::read_to_string(dir.path().join("a.txt")).unwrap(), "fn main() {}\n");
    }

    #[test]
    fn refuses_an_old_string_that_appears_more_than_once_quoting_each_line() {
        let (dir, cx) = file("a.txt", "let x = 1;\nlet y = 2;\n\nprint(x)\n");
        let error = edit(&cx, input("a.txt", "x", "z", false)).unwrap_err();
        assert_eq!(
            error.message(),
            "`old_string` appears 2 times in a.txt; add surrounding lines to make it unique, or set \
             `replace_all` to replace every one:\n  line 1: let x = 1;\n  line 4: print(x)"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
            "let x = 1;\nlet y = 2;\n\nprint(x)\n"
        );
    }

    #[test]
    fn quotes_at_most_ten_places() {
        let text = "x\n".repeat(12);
        let error = apply(&text, "x", "y", false, "a.txt").unwrap_err();
        let message = error.message();
        assert!(message.starts_with("`old_string` appears 12 times in a.txt;"), "{message}");
        assert!(message.ends_with("\n  line 10: x\n  ... and 2 more"), "{message}");
    }

    #[test]
    fn replace_all_replaces_every_occurrence() {
        let (dir, cx) = file("a.txt", "a-a\nb\na\n");
        let output = edit(&cx, input("a.txt", "a", "c", true)).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("a.txt")).unwrap(), "c-c\nb\nc\n");
        assert_eq!(output.text(), "Edited a.txt: 3 replacements\n@@ -1,3 +1,3 @@\n-a-a\n+c-c\n b\n-a\n+c\n");
    }

    #[test]
    fn refuses_an_empty_old_string_and_one_equal_to_the_new() {
        let cx = Context::workspace_root();
        let message = |input: Input| Edit::validate_input(&input, &cx).unwrap_err().message().to_owned();
        assert_eq!(message(input("a.txt", "", "x", false)), "`old_string` must not be empty");
        assert_eq!(
            message(input("a.txt", "same", "same", false)),
            "`old_string` and `new_string` are the same, so the edit would change nothing"
        );
        assert_eq!(message(input(" ", "a", "b", false)), "`file_path` must not be empty");
    }

    #[test]
    fn in_a_crlf_file_matches_and_inserts_with_crlf() {
        let (dir, cx) = file("a.txt", "one\r\ntwo\r\nthree\r\n");
        edit(&cx, input("a.txt", "one\ntwo", "1\n2\n2.5", false)).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("a.txt")).unwrap(), "1\r\n2\r\n2.5\r\nthree\r\n");
        let error = apply("a\r\nb\r\n", "a\nb", "a\r\nb", false, "a.txt").unwrap_err();
        assert_eq!(
            error.message(),
            "`old_string` and `new_string` are the same, so the edit would change nothing"
        );
    }

    #[test]
    fn an_lf_file_stays_lf() {
        let edited = apply("a\nb\n", "a\n", "x\r\ny\n", false, "a.txt").unwrap();
        assert_eq!(edited.text, "x\r\ny\nb\n", "the new text goes in as given");
    }

    #[test]
    fn keeps_whether_the_file_ends_with_a_newline() {
        assert_eq!(apply("a\nb\n", "b\n", "c", false, "f").unwrap().text, "a\nc\n");
        assert_eq!(apply("a\r\nb\r\n", "b\r\n", "c", false, "f").unwrap().text, "a\r\nc\r\n");
        assert_eq!(apply("a\nb", "b", "c\n\n", false, "f").unwrap().text, "a\nc");
        assert_eq!(apply("a\n", "a\n", "", false, "f").unwrap().text, "", "an emptied file stays empty");
    }

    #[test]
    fn a_deletion_shows_only_removed_lines() {
        let edited = apply("a\nb\nc\n", "b\n", "", false, "f").unwrap();
        assert_eq!(edited.text, "a\nc\n");
        assert_eq!(edited.diff, "@@ -1,3 +1,2 @@\n a\n-b\n c\n");
    }

    #[test]
    fn changes_far_apart_are_separate_hunks_numbered_in_the_new_file() {
        let text: String = (1..=20).map(|n| format!("{n}\n")).collect();
        let edited = apply(&text, "2\n", "2\n2b\n", true, "f").unwrap();
        assert_eq!(edited.replacements, 2, "2 and 12");
        assert_eq!(
            edited.diff,
            "@@ -1,5 +1,6 @@\n 1\n-2\n+2\n+2b\n 3\n 4\n 5\n\
             @@ -9,7 +10,8 @@\n 9\n 10\n 11\n-12\n+12\n+2b\n 13\n 14\n 15\n"
        );
    }

    #[test]
    fn shows_at_most_five_hunks_and_cuts_long_lines() {
        let text = "x\n\n\n\n\n\n\n\n".repeat(7);
        let edited = apply(&text, "x", "y", true, "f").unwrap();
        assert_eq!(edited.diff.matches("@@ -").count(), MAX_HUNKS);
        assert!(edited.diff.ends_with("(2 more changed places not shown)\n"), "{}", edited.diff);
        let long = "é".repeat(MAX_SHOWN_LINE_CHARS + 5);
        let edited = apply(&format!("{long}\n"), "é", "e", false, "f").unwrap_err();
        assert!(edited.message().contains(&format!("line 1: {}...", "é".repeat(MAX_SHOWN_LINE_CHARS))));
    }

    #[test]
    fn a_multiline_match_on_a_line_shared_with_another_is_one_region() {
        let edited = apply("ab\nab\n", "b\na", "X", false, "f").unwrap();
        assert_eq!(edited.text, "aXb\n");
        assert_eq!(edited.diff, "@@ -1,2 +1,1 @@\n-ab\n-ab\n+aXb\n");
    }

    #[test]
    fn leaves_no_temporary_file_behind() {
        let (dir, cx) = file("a.txt", "old\n");
        edit(&cx, input("a.txt", "old", "new", false)).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.txt"]);
    }

    #[test]
    fn keeps_the_files_mode() {
        use std::os::unix::fs::PermissionsExt as _;
        for mode in [0o755, 0o600, 0o640] {
            let (dir, cx) = file("run.sh", "echo old\n");
            let path = dir.path().join("run.sh");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            edit(&cx, input("run.sh", "old", "new", false)).unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "echo new\n");
            let kept = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(kept, mode, "{mode:o} became {kept:o}");
        }
    }

    #[test]
    fn refuses_a_missing_file_a_directory_a_symlink_and_binary_bytes() {
        let (dir, cx) = file("bin", "");
        std::fs::write(dir.path().join("bin"), [0xff, 0xfe]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("bin"), dir.path().join("link")).unwrap();
        let message = |name: &str| edit(&cx, input(name, "a", "b", false)).unwrap_err().message().to_owned();
        assert!(message("nope").starts_with("cannot edit nope: "), "{}", message("nope"));
        assert_eq!(message("sub"), "cannot edit sub: it is a directory");
        assert_eq!(message("link"), "cannot edit link: it is a symbolic link; edit the file it points to");
        assert_eq!(message("bin"), "cannot edit bin: it is not UTF-8 text");
    }

    #[test]
    fn is_destructive_and_neither_read_only_nor_concurrency_safe() {
        let cx = Context::workspace_root();
        let input = input("a.txt", "a", "b", false);
        assert!(Edit::is_destructive(&input, &cx));
        assert!(!Edit::is_read_only(&input, &cx));
        assert!(!Edit::is_concurrency_safe(&input, &cx));
    }

    #[test]
    fn names_the_file_from_the_workspace_root_after_a_cd() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        let subject = |path: &str| Edit::permission_subject(&input(path, "a", "b", false), &secrets);
        assert_eq!(subject("k.txt").as_deref(), Some("secrets/k.txt"));
        assert_eq!(subject("../k.txt").as_deref(), Some("k.txt"));
        assert_eq!(subject("/etc/passwd").as_deref(), Some("/etc/passwd"));
    }
}
