//! Persisting a result: where the full content goes, how it is written, and
//! the block the model reads instead.

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::fs::Staged;

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

/// The `tool-results` folder of a session directory, written atomically.
#[derive(Clone, Debug)]
pub struct SessionDir {
    root: PathBuf,
}

impl SessionDir {
    /// Persist into `root/tool-results/`. The folder is created on the first
    /// write.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        SessionDir { root: root.into() }
    }

    /// The folder persisted results go to.
    pub fn dir(&self) -> PathBuf {
        self.root.join(TOOL_RESULTS_SUBDIR)
    }

    /// Write `contents` to a hidden temporary file beside `file_name` and
    /// sync it; nothing exists under `file_name` until [`Staged::commit`].
    fn stage(&self, file_name: &str, contents: &[u8]) -> io::Result<Staged> {
        Staged::new(&self.dir().join(file_name), contents, true)
    }
}

impl ResultStore for SessionDir {
    fn write(&self, file_name: &str, contents: &[u8]) -> io::Result<()> {
        self.stage(file_name, contents)?.commit()
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
    let mut block = String::with_capacity(PREVIEW_SIZE_BYTES + 256);
    let _ = writeln!(block, "{PERSISTED_OUTPUT_TAG}");
    let _ = writeln!(
        block,
        "Output too large ({} chars, {} bytes). Full output saved to: {shown_path}",
        content.chars().count(),
        content.len()
    );
    push_preview(&mut block, content);
    block.push_str(PERSISTED_OUTPUT_CLOSING_TAG);
    block
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
        let temp = staged.temp_path().file_name().unwrap().to_str().unwrap().to_owned();
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
        assert_eq!(error.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(names_in(root.path()), ["tool-results"]);
    }
}
