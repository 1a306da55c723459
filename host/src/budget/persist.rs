//! Persisting a result: where the full content goes, how it is written, and
//! the block the model reads instead.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::hash::{BuildHasher as _, Hasher as _, RandomState};
use std::io::{self, Write as _};
use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, Metadata, OpenOptions};
use sha2::{Digest, Sha256};

/// Opens the block that replaces a persisted result (`PERSISTED_OUTPUT_TAG`
/// in the runtime keel follows).
pub const PERSISTED_OUTPUT_TAG: &str = "<persisted-output>";

/// Closes the block that replaces a persisted result.
pub const PERSISTED_OUTPUT_CLOSING_TAG: &str = "</persisted-output>";

/// The folder of the session directory that persisted results go to.
pub const TOOL_RESULTS_SUBDIR: &str = "tool-results";

/// Bytes of a persisted result the model still sees. Enough for the first
/// few dozen lines, which is what the model needs to decide whether to read
/// the file.
pub const PREVIEW_SIZE_BYTES: usize = 2_000;

/// How the result that could not be persisted begins, so a ledger rebuilt
/// from a transcript recognises it as a replacement.
pub const PERSIST_FAILED_PREFIX: &str = "Failed to save the full output";

/// Where persisted results are written.
///
/// [`SessionDir`] is the real one; an agent with its own storage, or a test
/// that needs a full disk, supplies another.
pub trait ResultStore: Send + Sync + 'static {
    /// Write `contents` as `file_name` (such as `toolu_1.txt`) in the
    /// `tool-results` folder, all or nothing: on an error no file of that
    /// name may look complete.
    fn write(&self, file_name: &str, contents: &[u8]) -> io::Result<()>;
}

/// The `tool-results` folder of a session directory, written atomically and
/// never through a symbolic link.
///
/// The session directory is a trusted base, opened as it is named (symbolic
/// links and all: the embedder chose it), and the folders below it down to
/// `tool-results`. Each of those must be a real directory: it is made when
/// missing and opened without following a link, and the result's file is
/// made and renamed relative to the open `tool-results`, so no link, nor a
/// rename of a folder meanwhile, can send a result elsewhere. In the
/// workspace ([`SessionDir::in_workspace`]) the base is the workspace itself,
/// as a tool may change anything below it: a tool that renames a link to
/// `.keel` makes the next persisted result an error naming the link, never a
/// file written where the link points.
#[derive(Clone, Debug)]
pub struct SessionDir {
    /// Opened as it is named.
    base: PathBuf,
    /// The folders between `base` and `tool-results`, each opened without
    /// following a link.
    below: PathBuf,
}

impl SessionDir {
    /// Persist into `root/tool-results/`. `root` is trusted as it is named
    /// and made when missing; `tool-results` is made on the first write and
    /// never followed through a link.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        SessionDir { base: root.into(), below: PathBuf::new() }
    }

    /// Persist into `root/tool-results/`, where `root` may lie below
    /// `workspace`, whose tools can put links anywhere in it: then only the
    /// workspace is trusted as it is named, and every folder below it on the
    /// way to `tool-results` (`.keel`, `session`, …) must be a real
    /// directory. A `root` outside the workspace is as [`SessionDir::new`].
    pub fn in_workspace(workspace: &Path, root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        match root.strip_prefix(workspace) {
            Ok(below) if below.components().all(|part| matches!(part, Component::Normal(_))) => {
                SessionDir { base: workspace.to_path_buf(), below: below.to_path_buf() }
            }
            _ => SessionDir::new(root),
        }
    }

    /// The folder persisted results go to.
    pub fn dir(&self) -> PathBuf {
        self.base.join(&self.below).join(TOOL_RESULTS_SUBDIR)
    }

    /// `tool-results`, open, each folder on the way made when missing and
    /// refused when it is not a real directory.
    fn open(&self) -> io::Result<Dir> {
        if self.below.as_os_str().is_empty() {
            std::fs::create_dir_all(&self.base)?;
        }
        let mut dir = Dir::open_ambient_dir(&self.base, ambient_authority())?;
        let mut named = PathBuf::new();
        for part in self.below.iter().chain([OsStr::new(TOOL_RESULTS_SUBDIR)]) {
            named.push(part);
            dir = real_dir(&dir, part, &named)?;
        }
        Ok(dir)
    }

    /// Write `contents` to a hidden temporary file beside `file_name` and
    /// sync it; nothing exists under `file_name` until [`Staged::commit`].
    fn stage(&self, file_name: &str, contents: &[u8]) -> io::Result<Staged> {
        Staged::new(self.open()?, file_name, contents)
    }
}

impl ResultStore for SessionDir {
    fn write(&self, file_name: &str, contents: &[u8]) -> io::Result<()> {
        self.stage(file_name, contents)?.commit()
    }
}

/// The directory `name` in `parent` (`named` in errors), made when missing:
/// refused when it is a symbolic link or no directory. It is opened after it
/// was looked at, and must still be the directory looked at, so a link put in
/// its place meanwhile is refused too.
fn real_dir(parent: &Dir, name: &OsStr, named: &Path) -> io::Result<Dir> {
    match parent.create_dir(name) {
        Err(error) if error.kind() != io::ErrorKind::AlreadyExists => return Err(error),
        _ => {}
    }
    let seen = parent.symlink_metadata(name)?;
    if seen.file_type().is_symlink() {
        return Err(io::Error::other(format!(
            "{} is a symbolic link, and results are never written through one",
            named.display()
        )));
    }
    if !seen.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{} is not a directory", named.display()),
        ));
    }
    let dir = parent.open_dir(name)?;
    if !same_file(&seen, &dir.dir_metadata()?) {
        return Err(io::Error::other(format!(
            "{} was replaced while it was opened, and results are never written through a link",
            named.display()
        )));
    }
    Ok(dir)
}

#[cfg(unix)]
fn same_file(a: &Metadata, b: &Metadata) -> bool {
    use cap_std::fs::MetadataExt as _;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// Without inode numbers to compare, the look before the open stands alone;
/// the open itself stays inside the parent directory.
#[cfg(not(unix))]
fn same_file(_: &Metadata, _: &Metadata) -> bool {
    true
}

/// Contents written under a hidden temporary name (`.<name>.<random>.tmp`)
/// in an open directory, synced. Dropped without [`Staged::commit`] (an
/// error, a panic), the temporary file is removed.
struct Staged {
    dir: Dir,
    temp: String,
    target: String,
    committed: bool,
}

impl Staged {
    fn new(dir: Dir, target: &str, contents: &[u8]) -> io::Result<Self> {
        let mut options = OpenOptions::new();
        // A new name each time, so no file (nor link) already there is
        // opened; readable by the user alone, as a temporary file is.
        options.write(true).create_new(true);
        #[cfg(unix)]
        cap_std::fs::OpenOptionsExt::mode(&mut options, 0o600);
        for _ in 0..64 {
            let temp = format!(".{target}.{:016x}.tmp", RandomState::new().build_hasher().finish());
            let mut file = match dir.open_with(&temp, &options) {
                Ok(file) => file,
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(error) => return Err(error),
            };
            let staged = Staged { dir, temp, target: target.to_owned(), committed: false };
            file.write_all(contents)?;
            file.sync_all()?;
            return Ok(staged);
        }
        Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free name for a temporary file"))
    }

    /// Rename the temporary file to its target in the same directory,
    /// replacing any file there: a reader sees the old file or the whole new
    /// one.
    fn commit(mut self) -> io::Result<()> {
        self.dir.rename(&self.temp, &self.dir, &self.target)?;
        self.committed = true;
        Ok(())
    }

    /// The name the contents wait under for [`Staged::commit`].
    #[cfg(test)]
    fn temp_name(&self) -> &str {
        &self.temp
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = self.dir.remove_file(&self.temp);
        }
    }
}

/// The file a result is persisted to, inside `tool-results/`.
///
/// An id made only of ASCII letters, digits, `_` and `-` (as every id an
/// API issues is), at most 128 bytes long, is used as it is: `<id>.txt`. Any
/// other id could name a path outside the folder or clash on a
/// case-insensitive disk, so it becomes its safe characters (at most 64)
/// followed by `-` and the first 16 hex digits of its sha256:
/// `<safe>-<hash>.txt`. A safe id that itself ends in `-` and 16 lowercase
/// hex digits takes the hashed form too, so no id used as it is can name the
/// file of another id's hashed form (`ab-c14cddc033f64b9d` and `a/b` would
/// both be `ab-c14cddc033f64b9d.txt`). Both forms are deterministic.
pub fn file_name(tool_use_id: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !tool_use_id.is_empty()
        && tool_use_id.len() <= 128
        && tool_use_id.chars().all(safe)
        && !ends_like_a_hash(tool_use_id)
    {
        return format!("{tool_use_id}.txt");
    }
    let kept: String = tool_use_id.chars().filter(|&c| safe(c)).take(64).collect();
    let digest = Sha256::digest(tool_use_id.as_bytes());
    let mut hash = String::with_capacity(16);
    for byte in &digest[..8] {
        let _ = write!(hash, "{byte:02x}");
    }
    format!("{kept}-{hash}.txt")
}

/// Whether `id` ends as a hashed file name's stem does: `-` and 16 lowercase
/// hex digits.
fn ends_like_a_hash(id: &str) -> bool {
    let Some(at) = id.len().checked_sub(17) else { return false };
    let (dash, hex) = id.as_bytes()[at..].split_at(1);
    dash == b"-" && hex.iter().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

/// The start of `content` shown in place of a persisted result, and whether
/// anything was left out.
///
/// The window is the longest prefix of at most `max_bytes` bytes that ends on
/// a character boundary (a multi-byte character straddling the limit is left
/// out whole). When the content is longer than the window and the window
/// holds a newline, the preview stops just before the last one, so it ends
/// with a whole line.
pub fn preview(content: &str, max_bytes: usize) -> (&str, bool) {
    if content.len() <= max_bytes {
        return (content, false);
    }
    let window = &content[..content.floor_char_boundary(max_bytes)];
    match window.rfind('\n') {
        Some(newline) => (&window[..newline], true),
        None => (window, true),
    }
}

/// The block that replaces a result persisted to `shown_path`.
///
/// ```text
/// <persisted-output>
/// Output too large (<chars> chars, <bytes> bytes). Full output saved to: <path>
///
/// Preview (first <n> bytes):
/// <preview>
/// ...
/// </persisted-output>
/// ```
///
/// Sizes are plain decimal numbers of the whole content; `...` stands on its
/// own line only when the preview is not the whole content.
pub fn persisted_block(content: &str, shown_path: &str) -> String {
    persisted_block_counted(content, None, shown_path)
}

/// What a result counted for in the budgets besides its text: the size that
/// made it too large, given in the header of its [`persisted_block_counted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    /// The chars the whole result counted for: its text, each image by
    /// [`image_chars`](super::image_chars), and the JSON text of a structured
    /// value the text is not.
    pub chars: u64,
    /// How many images it held.
    pub images: usize,
    /// Whether a structured value counted apart from the text.
    pub structured: bool,
}

impl Counted {
    /// What besides the text counted: `image`, `2 images`, `structured
    /// value`, `image and structured value`, …
    fn besides(&self) -> String {
        let images = match self.images {
            0 => None,
            1 => Some("image".to_owned()),
            n => Some(format!("{n} images")),
        };
        let structured = self.structured.then(|| "structured value".to_owned());
        images.into_iter().chain(structured).collect::<Vec<_>>().join(" and ")
    }
}

/// The block that replaces a result persisted to `shown_path`, as
/// [`persisted_block`], whose text `content` is not all it counted for. With
/// `counted`, the header gives the size that made the result too large, and
/// the text's own after it:
///
/// ```text
/// <persisted-output>
/// Output too large (<chars> chars counted with its image; the text alone is <chars> chars, <bytes> bytes). Full output saved to: <path>
/// …
/// ```
///
/// Without `counted`, it is [`persisted_block`].
pub fn persisted_block_counted(content: &str, counted: Option<Counted>, shown_path: &str) -> String {
    let mut block = String::with_capacity(PREVIEW_SIZE_BYTES + 256);
    let _ = writeln!(block, "{PERSISTED_OUTPUT_TAG}");
    let (chars, bytes) = (content.chars().count(), content.len());
    match counted {
        Some(counted) => {
            let _ = writeln!(
                block,
                "Output too large ({} chars counted with its {}; the text alone is {chars} chars, {bytes} \
                 bytes). Full output saved to: {shown_path}",
                counted.chars,
                counted.besides()
            );
        }
        None => {
            let _ = writeln!(
                block,
                "Output too large ({chars} chars, {bytes} bytes). Full output saved to: {shown_path}"
            );
        }
    }
    push_preview(&mut block, content);
    block.push_str(PERSISTED_OUTPUT_CLOSING_TAG);
    block
}

/// The file a result's structured value is persisted to when it is left out
/// and its JSON is not the result's text: `<stem>-structured.json`, named
/// after the result's own file.
pub fn structured_file_name(tool_use_id: &str) -> String {
    let text = file_name(tool_use_id);
    let stem = text.strip_suffix(".txt").unwrap_or(&text);
    format!("{stem}-structured.json")
}

/// Where the JSON text of a structured value left out of a persisted result
/// went, for [`structured_left_out`].
#[derive(Clone, Copy)]
pub enum StructuredPlace<'a> {
    /// It is the result's text, persisted (or not) as the output above.
    Text,
    /// Saved to this path, shown as the model sees it.
    Saved(&'a str),
    /// Not saved to this path, for this reason.
    Failed(&'a str, &'a dyn std::fmt::Display),
}

/// What the model reads, after the persisted output, in place of a
/// structured value too large to stay beside it (over
/// [`KEPT_STRUCTURED_BYTES`](super::KEPT_STRUCTURED_BYTES) bytes of JSON):
/// a `<persisted-output>` block saying so and where the value went.
///
/// ```text
/// <persisted-output>
/// Structured value left out (<bytes> bytes of JSON): a persisted result keeps one of at most 2000 bytes, so this result is an error. Saved to: <path>
/// </persisted-output>
/// ```
pub fn structured_left_out(json_bytes: usize, place: StructuredPlace<'_>) -> String {
    let place = match place {
        StructuredPlace::Text => "It is the output above, as JSON.".to_owned(),
        StructuredPlace::Saved(shown_path) => format!("Saved to: {shown_path}"),
        StructuredPlace::Failed(shown_path, error) => format!("Failed to save it to {shown_path}: {error}."),
    };
    format!(
        "{PERSISTED_OUTPUT_TAG}\nStructured value left out ({json_bytes} bytes of JSON): a persisted result \
         keeps one of at most {} bytes, so this result is an error. {place}\n{PERSISTED_OUTPUT_CLOSING_TAG}",
        super::KEPT_STRUCTURED_BYTES
    )
}

/// The file an image of a result is persisted to: image `number` (from 1) of
/// the result of `tool_use_id`, named after the result's own file.
pub fn image_file_name(tool_use_id: &str, number: usize, extension: &str) -> String {
    let text = file_name(tool_use_id);
    let stem = text.strip_suffix(".txt").unwrap_or(&text);
    format!("{stem}-image-{number}.{extension}")
}

/// What the model reads in place of a persisted image: a
/// `<persisted-output>` block saying why it was left out and where it is.
///
/// ```text
/// <persisted-output>
/// Image left out (image/png, 6291456 bytes): the image (9000×1 px, 6291456 bytes) is larger than …. Saved to: tool-results/t1-image-1.png
/// </persisted-output>
/// ```
pub fn persisted_image_block(image: &crate::content::Image, why: &str, shown_path: &str) -> String {
    format!(
        "{PERSISTED_OUTPUT_TAG}\nImage left out ({}, {} bytes): {why}. Saved to: {shown_path}\n{PERSISTED_OUTPUT_CLOSING_TAG}",
        image.media_type,
        image.data.len()
    )
}

/// What the model reads in place of an image that could not be persisted.
pub fn image_persist_failed(
    image: &crate::content::Image,
    why: &str,
    shown_path: &str,
    error: &dyn std::fmt::Display,
) -> String {
    format!(
        "{PERSIST_FAILED_PREFIX} ({}, {} bytes) to {shown_path}: {error}. The image was left out: {why}.",
        image.media_type,
        image.data.len()
    )
}

/// The error result that replaces a result which could not be persisted: the
/// reason, and the same preview a persisted block would hold.
///
/// ```text
/// Failed to save the full output (<chars> chars, <bytes> bytes) to <path>: <error>. Only this preview is left; run the tool again with a narrower input.
///
/// Preview (first <n> bytes):
/// <preview>
/// ...
/// ```
pub fn persist_failed(content: &str, shown_path: &str, error: &dyn std::fmt::Display) -> String {
    let mut text = String::with_capacity(PREVIEW_SIZE_BYTES + 256);
    let _ = writeln!(
        text,
        "{PERSIST_FAILED_PREFIX} ({} chars, {} bytes) to {shown_path}: {error}. Only this preview is \
         left; run the tool again with a narrower input.",
        content.chars().count(),
        content.len()
    );
    push_preview(&mut text, content);
    text.pop();
    text
}

fn push_preview(out: &mut String, content: &str) {
    let (shown, more) = preview(content, PREVIEW_SIZE_BYTES);
    let _ = writeln!(out, "\nPreview (first {} bytes):", shown.len());
    out.push_str(shown);
    out.push('\n');
    if more {
        out.push_str("...\n");
    }
}

/// Whether `content` (with `is_error`) is already a replacement made by a
/// budget: a persisted block, or the error left when persisting failed. Such a
/// result is never persisted again.
pub fn is_replacement(content: &str, is_error: bool) -> bool {
    let block = content.starts_with(PERSISTED_OUTPUT_TAG)
        && content[PERSISTED_OUTPUT_TAG.len()..].starts_with('\n')
        && content.ends_with(PERSISTED_OUTPUT_CLOSING_TAG);
    block || (is_error && content.starts_with(PERSIST_FAILED_PREFIX))
}

/// `file_name` inside `tool-results/`, as the model is shown it: relative to
/// the session directory when `shown_root` is empty, else under `shown_root`.
pub(crate) fn shown_path(shown_root: &str, file_name: &str) -> String {
    if shown_root.is_empty() {
        format!("{TOOL_RESULTS_SUBDIR}/{file_name}")
    } else {
        format!("{}/{TOOL_RESULTS_SUBDIR}/{file_name}", shown_root.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_short_content_is_its_own_preview() {
        assert_eq!(preview("a\nb", 2_000), ("a\nb", false));
        let exact = "x".repeat(2_000);
        assert_eq!(preview(&exact, 2_000), (exact.as_str(), false));
    }

    #[test]
    fn the_preview_stops_before_the_last_newline_in_the_window() {
        let content = format!("{}\n{}\n{}", "a".repeat(1_000), "b".repeat(998), "c".repeat(10));
        // The window is bytes 0..2000: a*1000, \n, b*998, \n — the last
        // newline is byte 1999, inside it.
        let (shown, more) = preview(&content, 2_000);
        assert_eq!(shown, format!("{}\n{}", "a".repeat(1_000), "b".repeat(998)));
        assert!(more);
    }

    #[test]
    fn a_newline_just_past_the_window_is_not_used() {
        let content = format!("{}\n{}\n", "a".repeat(10), "b".repeat(1_989));
        // The second newline is byte 2000, one past the window.
        assert_eq!(preview(&content, 2_000), ("aaaaaaaaaa", true));
    }

    #[test]
    fn without_a_newline_the_preview_is_the_whole_window() {
        let content = "z".repeat(5_000);
        assert_eq!(preview(&content, 2_000), (&content[..2_000], true));
    }

    #[test]
    fn the_preview_never_cuts_a_multi_byte_character() {
        // 1999 ASCII bytes, then `é` (2 bytes) across the limit.
        let content = format!("{}é{}", "a".repeat(1_999), "b".repeat(100));
        assert_eq!(preview(&content, 2_000), (&content[..1_999], true));
        // A 4-byte character starting at byte 1998 is left out whole.
        let content = format!("{}🦀tail", "a".repeat(1_998));
        assert_eq!(preview(&content, 2_000), (&content[..1_998], true));
        // Only multi-byte characters: 666 × 3 bytes = 1998 fit, the 667th not.
        let content = "中".repeat(1_000);
        let (shown, more) = preview(&content, 2_000);
        assert_eq!((shown.len(), shown.chars().count(), more), (1_998, 666, true));
    }

    #[test]
    fn the_persisted_block_has_the_exact_format() {
        let content = format!("{}\n{}\nrest", "l1", "x".repeat(2_100));
        assert_eq!(
            persisted_block(&content, "tool-results/toolu_1.txt"),
            format!(
                "<persisted-output>\nOutput too large (2108 chars, 2108 bytes). Full output saved to: \
                 tool-results/toolu_1.txt\n\nPreview (first 2 bytes):\nl1\n...\n</persisted-output>"
            )
        );
        assert_eq!(
            persisted_block("é\n", "p"),
            "<persisted-output>\nOutput too large (2 chars, 3 bytes). Full output saved to: p\n\n\
             Preview (first 3 bytes):\né\n\n</persisted-output>"
        );
    }

    #[test]
    fn a_block_of_a_result_that_counted_more_than_its_text_gives_that_size() {
        let counted = |images, structured| Some(Counted { chars: 21_349, images, structured });
        assert_eq!(
            persisted_block_counted("a screenshot:", counted(1, false), "tool-results/t.txt"),
            "<persisted-output>\nOutput too large (21349 chars counted with its image; the text alone is 13 \
             chars, 13 bytes). Full output saved to: tool-results/t.txt\n\nPreview (first 13 bytes):\na \
             screenshot:\n</persisted-output>"
        );
        let header = |counted| persisted_block_counted("é", counted, "p").lines().nth(1).unwrap().to_owned();
        assert_eq!(
            header(counted(2, true)),
            "Output too large (21349 chars counted with its 2 images and structured value; the text alone is \
             1 chars, 2 bytes). Full output saved to: p"
        );
        assert_eq!(
            header(counted(0, true)),
            "Output too large (21349 chars counted with its structured value; the text alone is 1 chars, 2 \
             bytes). Full output saved to: p"
        );
        assert_eq!(persisted_block_counted("é", None, "p"), persisted_block("é", "p"));
    }

    #[test]
    fn a_structured_value_left_out_says_where_it_went() {
        let error = io::Error::from_raw_os_error(28);
        let saved = structured_left_out(2_001, StructuredPlace::Saved("tool-results/a-structured.json"));
        assert_eq!(
            saved,
            "<persisted-output>\nStructured value left out (2001 bytes of JSON): a persisted result keeps one \
             of at most 2000 bytes, so this result is an error. Saved to: \
             tool-results/a-structured.json\n</persisted-output>"
        );
        assert!(is_replacement(&saved, true));
        assert!(structured_left_out(9, StructuredPlace::Failed("p", &error)).ends_with(
            " Failed to save it to p: No space left on device (os error 28).\n</persisted-output>"
        ));
        assert!(
            structured_left_out(9, StructuredPlace::Text)
                .ends_with(" It is the output above, as JSON.\n</persisted-output>")
        );
        assert_eq!(structured_file_name("a/b"), "ab-c14cddc033f64b9d-structured.json");
    }

    #[test]
    fn the_failure_notice_has_the_exact_format() {
        let error = io::Error::from_raw_os_error(28);
        assert_eq!(
            persist_failed(&"y".repeat(2_001), "tool-results/a.txt", &error),
            format!(
                "Failed to save the full output (2001 chars, 2001 bytes) to tool-results/a.txt: No space \
                 left on device (os error 28). Only this preview is left; run the tool again with a \
                 narrower input.\n\nPreview (first 2000 bytes):\n{}\n...",
                "y".repeat(2_000)
            )
        );
    }

    #[test]
    fn replacements_are_recognised_and_other_text_is_not() {
        let block = persisted_block("x", "p");
        assert!(is_replacement(&block, false));
        assert!(is_replacement(&block, true));
        let failed = persist_failed("x", "p", &"disk full");
        assert!(is_replacement(&failed, true));
        assert!(!is_replacement(&failed, false), "only an error result is a failure notice");
        assert!(!is_replacement("<persisted-output>", false));
        assert!(!is_replacement("<persisted-output>x</persisted-output>", false));
        assert!(!is_replacement("src/a.rs:1:<persisted-output>\n</persisted-output>", false));
    }

    #[test]
    fn file_names_are_the_id_or_a_safe_hashed_form() {
        assert_eq!(file_name("toolu_01ABC-x"), "toolu_01ABC-x.txt");
        assert_eq!(file_name("../../etc/passwd"), "etcpasswd-3754d6cb3a38e118.txt");
        assert_ne!(file_name("a/b"), file_name("a.b"), "ids differing only in unsafe characters differ");
        assert_eq!(file_name(""), "-e3b0c44298fc1c14.txt");
        let long = "a".repeat(129);
        assert_eq!(file_name(&long).len(), 64 + 1 + 16 + 4);
    }

    #[test]
    fn an_id_shaped_like_a_hashed_name_never_takes_another_ids_file() {
        assert_eq!(file_name("a/b"), "ab-c14cddc033f64b9d.txt");
        assert_eq!(file_name("ab-c14cddc033f64b9d"), "ab-c14cddc033f64b9d-02cfc734c6bb060a.txt");
        assert_eq!(file_name("ab-C14CDDC033F64B9D"), "ab-C14CDDC033F64B9D.txt", "only lowercase is a hash's");
        assert_eq!(file_name("ab-c14cddc033f64b9"), "ab-c14cddc033f64b9.txt", "15 digits are no hash");
        assert_eq!(file_name("c14cddc033f64b9d"), "c14cddc033f64b9d.txt", "no dash, no hash");
    }

    #[test]
    fn shown_paths_are_relative_unless_a_root_is_given() {
        assert_eq!(shown_path("", "a.txt"), "tool-results/a.txt");
        assert_eq!(shown_path("/s/1/", "a.txt"), "/s/1/tool-results/a.txt");
    }

    #[test]
    fn a_write_lands_whole_under_its_name() {
        let root = tempfile::tempdir().unwrap();
        let store = SessionDir::new(root.path());
        store.write("a.txt", b"first").unwrap();
        store.write("a.txt", b"second, longer").unwrap();
        assert_eq!(std::fs::read(root.path().join("tool-results/a.txt")).unwrap(), b"second, longer");
        assert_eq!(names_in(&store.dir()), ["a.txt"]);
    }

    #[test]
    fn a_write_interrupted_before_the_rename_leaves_no_visible_file() {
        let root = tempfile::tempdir().unwrap();
        let store = SessionDir::new(root.path());
        store.write("kept.txt", b"old, whole").unwrap();

        let staged = store.stage("a.txt", b"new content").unwrap();
        let temp = staged.temp_name().to_owned();
        assert!(temp.starts_with(".a.txt.") && temp.ends_with(".tmp"), "{temp}");
        assert_eq!(names_in(&store.dir()), [temp.clone(), "kept.txt".to_owned()]);
        assert_eq!(std::fs::read(store.dir().join(&temp)).unwrap(), b"new content", "synced before rename");
        drop(staged);
        assert_eq!(names_in(&store.dir()), ["kept.txt"], "the interrupted write left nothing behind");

        let staged = store.stage("kept.txt", b"replacement").unwrap();
        assert_eq!(std::fs::read(store.dir().join("kept.txt")).unwrap(), b"old, whole");
        staged.commit().unwrap();
        assert_eq!(std::fs::read(store.dir().join("kept.txt")).unwrap(), b"replacement");
    }

    #[test]
    fn a_folder_that_cannot_be_created_is_an_error_and_writes_nothing() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("tool-results"), "a file in the way").unwrap();
        let error = SessionDir::new(root.path()).write("a.txt", b"x").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotADirectory);
        assert_eq!(error.to_string(), "tool-results is not a directory");
        assert_eq!(names_in(root.path()), ["tool-results"]);
    }

    #[test]
    fn the_folders_below_the_workspace_are_made_when_missing() {
        let workspace = tempfile::tempdir().unwrap();
        let store = SessionDir::in_workspace(workspace.path(), workspace.path().join(".keel/session"));
        store.write("a.txt", b"whole").unwrap();
        assert_eq!(
            std::fs::read(workspace.path().join(".keel/session/tool-results/a.txt")).unwrap(),
            b"whole"
        );
        assert_eq!(store.dir(), workspace.path().join(".keel/session/tool-results"));
    }

    #[cfg(unix)]
    #[test]
    fn a_link_on_the_way_to_the_results_is_refused_and_nothing_is_written_through_it() {
        use std::os::unix::fs::symlink;
        for (link, named) in [
            (".keel", ".keel"),
            (".keel/session", ".keel/session"),
            (".keel/session/tool-results", ".keel/session/tool-results"),
        ] {
            let workspace = tempfile::tempdir().unwrap();
            let outside = tempfile::tempdir().unwrap();
            let ws = workspace.path();
            std::fs::create_dir_all(ws.join(link).parent().unwrap()).unwrap();
            symlink(outside.path(), ws.join(link)).unwrap();
            let store = SessionDir::in_workspace(ws, ws.join(".keel/session"));
            let error = store.write("a.txt", b"chosen by a tool").unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("{named} is a symbolic link, and results are never written through one")
            );
            assert!(names_in(outside.path()).is_empty(), "{link}: nothing written where the link points");
        }
        // A link to a folder inside the workspace is refused too: what a
        // tool can rename, it can rename again.
        let workspace = tempfile::tempdir().unwrap();
        let ws = workspace.path();
        std::fs::create_dir(ws.join("elsewhere")).unwrap();
        symlink("elsewhere", ws.join(".keel")).unwrap();
        let error = SessionDir::in_workspace(ws, ws.join(".keel/session")).write("a.txt", b"x").unwrap_err();
        assert_eq!(error.to_string(), ".keel is a symbolic link, and results are never written through one");
        assert!(names_in(&ws.join("elsewhere")).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn a_session_directory_named_by_the_embedder_is_followed_but_not_a_link_below_it() {
        use std::os::unix::fs::symlink;
        let place = tempfile::tempdir().unwrap();
        let real = place.path().join("real");
        std::fs::create_dir(&real).unwrap();
        symlink(&real, place.path().join("named")).unwrap();
        // Outside the workspace, the session directory is the embedder's
        // choice, taken as it is named.
        let workspace = tempfile::tempdir().unwrap();
        let store = SessionDir::in_workspace(workspace.path(), place.path().join("named"));
        store.write("a.txt", b"kept").unwrap();
        assert_eq!(std::fs::read(real.join("tool-results/a.txt")).unwrap(), b"kept");

        let outside = tempfile::tempdir().unwrap();
        std::fs::remove_dir_all(real.join("tool-results")).unwrap();
        symlink(outside.path(), real.join("tool-results")).unwrap();
        let error = SessionDir::new(place.path().join("named")).write("a.txt", b"x").unwrap_err();
        assert_eq!(
            error.to_string(),
            "tool-results is a symbolic link, and results are never written through one"
        );
        assert!(names_in(outside.path()).is_empty());
    }

    #[test]
    fn a_root_that_leaves_the_workspace_by_dots_is_taken_as_named() {
        let workspace = tempfile::tempdir().unwrap();
        let store = SessionDir::in_workspace(workspace.path(), workspace.path().join("../x"));
        assert!(store.below.as_os_str().is_empty());
        assert_eq!(store.base, workspace.path().join("../x"));
    }
}
