//! `Read`: read a text file of the workspace, with line numbers, or an
//! image file as an image block.
//!
//! A text file is streamed line by line, never loaded whole: reading a range
//! costs time in proportion to the bytes before it, and memory in proportion
//! to what is shown, so the head of a log of gigabytes reads at once and its
//! tail as fast as the lines before it can be skipped. Only a file within
//! [`MAX_FILE_BYTES`] is read without a range, and only there are the lines
//! after the range counted. Time is bounded by the call's deadline, which
//! the reading checks before each chunk of the file it reads.

use std::io::{BufRead, BufReader, Read as _};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cap_std::ambient_authority;
use cap_std::fs::{Dir, File, Metadata, OpenOptions};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::content::ContentBlock;
use crate::contract::WORKSPACE_MOUNT;
use crate::limits::{LimitKind, Limits};
use crate::load::grants::PluginGrant;
use crate::tool::{
    CallContext, CallError, CallOutput, InterruptBehavior, Invocation, ResultSize, Tool, ToolSpec,
};

/// Lines returned when the input sets no `limit`.
pub const DEFAULT_LINE_LIMIT: usize = 2_000;
/// Characters kept of one line; the rest is cut. Minified files have lines of
/// megabytes, which would blow any budget on their own.
pub const MAX_LINE_CHARS: usize = 2_000;
/// Characters of output at most. `Read` is never persisted (that would make
/// the model read the persisted file back through `Read`, a loop), so it must
/// bound itself; past this it stops and says how to read on.
pub const MAX_OUTPUT_CHARS: usize = 100_000;
/// The largest file read without `offset` or `limit`, and the largest whose
/// lines after the range are counted for the "lines 3-4 of 7" footer. Past
/// it, counting would cost time in proportion to the file, not the range.
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// Bytes kept of one line before it is cut: enough for [`MAX_LINE_CHARS`]
/// characters of four bytes and one more, so a line cut here is always cut
/// by characters too, while a line of a gigabyte is never held in memory.
const MAX_LINE_BYTES: usize = (MAX_LINE_CHARS + 1) * 4;
/// The file extensions read as images: those of the media types a model
/// takes. The bytes, not the name, say which type an image is.
const IMAGE_EXTENSIONS: [&str; 5] = ["png", "jpg", "jpeg", "gif", "webp"];

/// The built-in `Read` tool.
pub struct Read {
    spec: ToolSpec,
    mounts: Arc<Mounts>,
    /// The wall-clock time one call may take.
    deadline: Duration,
}

/// The directories `Read` may read, each opened once and named by where a
/// plugin would see it: the workspace at `/workspace`, then any directory
/// the config grants `Read`. Every file is opened through one of them, with
/// cap-std, so neither `..` nor a symlink leads out of it.
struct Mounts {
    dirs: Vec<(PathBuf, Dir)>,
}

#[derive(Deserialize)]
struct Input {
    file_path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

impl Read {
    /// A `Read` confined to `workspace`, opened once with ambient authority;
    /// every file is opened through it and cannot escape it, by `..` or by a
    /// symlink pointing outside.
    pub fn new(workspace: Dir) -> Self {
        Read::with_mounts(vec![(PathBuf::from(WORKSPACE_MOUNT), workspace)])
    }

    /// A `Read` held to `grant`, as a plugin would be: the workspace and the
    /// extra directories it names, all read-only (`Read` never writes). Its
    /// environment grant is moot: `Read` reads no variables.
    pub fn with_grant(grant: &PluginGrant) -> std::io::Result<Self> {
        let open = |path: &Path| Dir::open_ambient_dir(path, ambient_authority());
        let mut mounts = vec![(PathBuf::from(WORKSPACE_MOUNT), open(&grant.workspace)?)];
        for dir in &grant.dirs {
            mounts.push((PathBuf::from(&dir.mount), open(&dir.host)?));
        }
        Ok(Read::with_mounts(mounts))
    }

    fn with_mounts(dirs: Vec<(PathBuf, Dir)>) -> Self {
        let description = "Reads a text file of the workspace and returns its lines numbered like \
                `cat -n`; an image file (PNG, JPEG, GIF or WebP) is returned as an image. Reads up \
                to 2000 lines from the start by default; use `offset` and `limit` to read a long \
                file in parts, as a file over 64 MiB must be.";
        let input_schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "file_path": {
                    "type": "string",
                    "description": "Path of the file, relative to the working directory or absolute under /workspace."
                },
                "offset": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Line number to start at (1-based). Default: 1."
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Number of lines to read. Default: 2000."
                }
            },
            "required": ["file_path"],
            "additionalProperties": false
        });
        let spec = ToolSpec {
            search_hint: Some("read a text file with line numbers".into()),
            interrupt: InterruptBehavior::Cancel,
            max_result_size: ResultSize::SelfBounded,
            ..ToolSpec::native("Read", description, input_schema)
        };
        Read { spec, mounts: Arc::new(Mounts { dirs }), deadline: Limits::default().deadline }
    }

    /// This `Read`, each call held to `deadline` (the host's
    /// [`Limits::deadline`]; default: that of [`Limits::default`], 30 s): a
    /// call still reading then ends with the deadline's error, as a
    /// plugin's does, and stops reading at its next chunk of the file.
    pub fn with_deadline(self, deadline: Duration) -> Self {
        Read { deadline, ..self }
    }
}

#[async_trait]
impl Tool for Read {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, input: Value, context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
        Ok(Box::new(ReadCall { mounts: self.mounts.clone(), input, context, deadline: self.deadline }))
    }
}

struct ReadCall {
    mounts: Arc<Mounts>,
    input: Value,
    /// The context the call runs with: its `cwd` resolves `file_path`.
    context: Arc<Value>,
    /// The wall-clock time the call may take.
    deadline: Duration,
}

#[async_trait]
impl Invocation for ReadCall {
    fn input(&self) -> &Value {
        &self.input
    }

    fn set_input(&mut self, input: Value) {
        self.input = input;
    }

    fn set_context(&mut self, context: Arc<Value>) {
        self.context = context;
    }

    async fn is_concurrency_safe(&mut self) -> bool {
        true
    }

    async fn is_read_only(&mut self) -> bool {
        true
    }

    async fn is_destructive(&mut self) -> bool {
        false
    }

    async fn is_search_or_read(&mut self) -> bool {
        true
    }

    /// The file, relative to the workspace root whatever the working
    /// directory, as the call will read it.
    async fn permission_subject(&mut self) -> Option<String> {
        let path = self.input.get("file_path").and_then(Value::as_str)?;
        Some(crate::contract::workspace_relative(crate::contract::cwd(&self.context), path))
    }

    async fn activity_description(&mut self) -> Option<String> {
        let path = self.input.get("file_path").and_then(Value::as_str)?;
        Some(format!("Reading {path}"))
    }

    async fn call(self: Box<Self>, cx: CallContext) -> Result<CallOutput, CallError> {
        let input: Input = serde_json::from_value(self.input)
            .map_err(|error| CallError::Tool(format!("invalid input: {error}")))?;
        let cwd = crate::contract::cwd(&cx.context);
        let Some((mount, relative)) = self.mounts.locate(cwd, &input.file_path) else {
            return Err(CallError::Tool(self.mounts.outside(cwd, &input.file_path)));
        };
        let mounts = self.mounts.clone();
        let shown = input.file_path.clone();
        let deadline = Instant::now() + self.deadline;
        let reading = tokio::task::spawn_blocking(move || {
            let (name, dir) = &mounts.dirs[mount];
            read(dir, name, &relative, &input, deadline)
        });
        let exceeded =
            || CallError::Limit { kind: LimitKind::Deadline, value: format!("{:?}", self.deadline) };
        // The reading stops itself at its deadline between chunks; this
        // timer answers on time a read blocked inside one (a hung network
        // mount), leaving the thread to it.
        let Ok(joined) = tokio::time::timeout_at(deadline.into(), reading).await else {
            return Err(exceeded());
        };
        match joined.map_err(|error| CallError::Host(error.to_string()))? {
            Ok(output) => Ok(output),
            Err(Failure::Deadline) => Err(exceeded()),
            Err(Failure::Reason(reason)) => Err(CallError::Tool(format!("cannot read {shown}: {reason}"))),
        }
    }
}

impl Mounts {
    /// Which directory `path` (seen from the sandbox working directory
    /// `cwd`) is in, and the path below it; `None` when it is in none. Only
    /// lexical: the open through the cap-std directory is what stops a
    /// symlink from leading outside.
    fn locate(&self, cwd: &str, path: &str) -> Option<(usize, PathBuf)> {
        let joined = Path::new(cwd).join(path);
        let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
        for part in joined.components() {
            match part {
                Component::Normal(name) => parts.push(name),
                Component::ParentDir => {
                    parts.pop()?;
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        self.dirs.iter().enumerate().find_map(|(index, (mount, _))| {
            let mount: Vec<&std::ffi::OsStr> = mount.iter().skip(1).collect();
            let rest = parts.strip_prefix(mount.as_slice())?;
            Some((index, rest.iter().collect()))
        })
    }

    /// Why `path`, seen from `cwd`, is in none of the directories: a
    /// relative path taken from a working directory outside all of them (a
    /// tool may set any) names that directory, the cause.
    fn outside(&self, cwd: &str, path: &str) -> String {
        let outside = if self.dirs.len() > 1 { "the granted directories" } else { "the workspace" };
        if Path::new(path).is_absolute() || self.locate(cwd, "").is_some() {
            return format!("{path} is outside {outside}");
        }
        let mounts: Vec<String> = self.dirs.iter().map(|(mount, _)| mount.display().to_string()).collect();
        let under = match mounts.as_slice() {
            [one] => format!("is not under {one}"),
            all => format!("is under none of {}", all.join(", ")),
        };
        format!("{path} is outside {outside}: the working directory {cwd} {under}")
    }
}

/// Why a read gave no output.
enum Failure {
    /// The reason, as the model reads it after `cannot read <path>: `.
    Reason(String),
    /// The call's deadline passed.
    Deadline,
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Failure::Reason(reason)
    }
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Self {
        if error.get_ref().is_some_and(|inner| inner.is::<DeadlinePassed>()) {
            return Failure::Deadline;
        }
        Failure::Reason(error.to_string())
    }
}

/// The error [`Watched`] reads with once the deadline has passed.
#[derive(Debug)]
struct DeadlinePassed;

impl std::fmt::Display for DeadlinePassed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the call's deadline passed")
    }
}

impl std::error::Error for DeadlinePassed {}

/// A file that fails to read once `deadline` has passed. The clock is
/// asked before each read, which under a `BufReader` is once a chunk: a
/// skip through terabytes without a line ends within a chunk of its
/// deadline, and so does the thread doing it.
struct Watched<R> {
    inner: R,
    deadline: Instant,
}

impl<R: std::io::Read> std::io::Read for Watched<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if Instant::now() >= self.deadline {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, DeadlinePassed));
        }
        self.inner.read(buf)
    }
}

/// Read the file at `relative` in `dir`, the directory mounted at `mount`,
/// as `input` asks, by `deadline`: an image file as an image block, any
/// other as numbered lines.
fn read(
    dir: &Dir,
    mount: &Path,
    relative: &Path,
    input: &Input,
    deadline: Instant,
) -> Result<CallOutput, Failure> {
    let target = if relative.as_os_str().is_empty() { Path::new(".") } else { relative };
    let (file, metadata) = open(dir, mount, target)?;
    let size = metadata.len();
    if is_image_name(relative) {
        return Ok(read_image(file, size, &input.file_path)?);
    }
    if size > MAX_FILE_BYTES && input.offset.is_none() && input.limit.is_none() {
        return Err(Failure::Reason(format!(
            "it is larger than {} MiB; pass `offset` and `limit` to read part of it",
            MAX_FILE_BYTES >> 20
        )));
    }
    let offset = input.offset.unwrap_or(1).max(1);
    let limit = input.limit.unwrap_or(DEFAULT_LINE_LIMIT);
    // Never past the size the file had when opened, or the cap: a file
    // that grows as it is read still ends.
    let file = Watched { inner: file.take(size.max(MAX_FILE_BYTES)), deadline };
    let reader = BufReader::with_capacity(64 << 10, file);
    Ok(number_lines(reader, offset, limit, size <= MAX_FILE_BYTES).map(CallOutput::text)?)
}

/// The regular file at `target` in `dir`, the directory mounted at `mount`,
/// opened for reading, and what it is; anything else is refused, saying
/// what it is. The file itself is asked once open, so nothing can swap it
/// between a look and the open.
fn open(dir: &Dir, mount: &Path, target: &Path) -> Result<(File, Metadata), String> {
    let mut options = OpenOptions::new();
    options.read(true);
    // Without waiting: the open of a named pipe waits for a writer, forever
    // in a workspace where nobody writes to it, and that of some devices for
    // the device. This is the flag of cap-fs-ext's `OpenOptionsSyncExt::nonblock`,
    // set without that crate; cap-std makes it each target's `O_NONBLOCK`,
    // which does nothing to a regular file, the only kind read.
    options._cap_fs_ext_nonblock(true);
    let file = dir.open_with(target, &options).map_err(|error| {
        // `target` holds no `..` (it was resolved lexically within its
        // mount), so only a symbolic link can have led outside.
        if escaped(&error) {
            let outside = if mount == Path::new(WORKSPACE_MOUNT) {
                "the workspace".to_owned()
            } else {
                mount.display().to_string()
            };
            return format!("it leads outside {outside}, through a symbolic link");
        }
        // A socket cannot be opened at all; say what it is, not the errno.
        match dir.metadata(target) {
            Ok(metadata) if !metadata.is_file() && !metadata.is_dir() => not_a_file(&metadata),
            _ => error.to_string(),
        }
    })?;
    let metadata = file.metadata().map_err(|error| error.to_string())?;
    if metadata.is_dir() {
        return Err("it is a directory".into());
    }
    if !metadata.is_file() {
        return Err(not_a_file(&metadata));
    }
    Ok((file, metadata))
}

/// Whether cap-std refused an open because its path led out of the
/// directory. It says so with an error of its own, kind `PermissionDenied`
/// and no OS error number, which is what sets it apart from a file the
/// user may not read.
fn escaped(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::PermissionDenied && error.raw_os_error().is_none()
}

/// The refusal of what `metadata` describes, neither a regular file nor a
/// directory.
fn not_a_file(metadata: &Metadata) -> String {
    #[cfg(unix)]
    let what = {
        use cap_std::fs::FileTypeExt as _;
        let kind = metadata.file_type();
        if kind.is_fifo() {
            "a named pipe (FIFO)"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else {
            "a special file"
        }
    };
    #[cfg(not(unix))]
    let what = {
        let _ = metadata;
        "a special file"
    };
    format!("it is {what}, not a regular file")
}

/// Whether `path` is named like an image a model takes.
fn is_image_name(path: &Path) -> bool {
    path.extension()
        .and_then(|extension| extension.to_str())
        .is_some_and(|extension| IMAGE_EXTENSIONS.contains(&extension.to_ascii_lowercase().as_str()))
}

/// An image file of `size` bytes as a line naming it, then the image. An
/// image over the bytes a model takes is refused before it is read; one too
/// large in pixels goes to the result budget, which sets it aside in a file.
fn read_image(file: File, size: u64, shown: &str) -> Result<CallOutput, String> {
    let max = crate::budget::MAX_IMAGE_BYTES;
    if size > max {
        return Err(format!("it is an image of {size} bytes, and a model takes at most {max}"));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(max + 1).read_to_end(&mut bytes).map_err(|error| error.to_string())?;
    if bytes.len() as u64 > max {
        return Err(format!("it is an image of more than {max} bytes, and a model takes at most {max}"));
    }
    let media_type = match imagesize::image_type(&bytes) {
        Ok(imagesize::ImageType::Png) => "image/png",
        Ok(imagesize::ImageType::Jpeg) => "image/jpeg",
        Ok(imagesize::ImageType::Gif) => "image/gif",
        Ok(imagesize::ImageType::Webp) => "image/webp",
        _ => return Err("it is named as an image, but its bytes are not PNG, JPEG, GIF or WebP".into()),
    };
    let image = crate::content::Image::new(media_type, bytes);
    let info = image.check().map_err(|reason| format!("the image {reason}"))?;
    let line =
        format!("{shown}: {media_type}, {}×{} px, {} bytes", info.width, info.height, image.data.len());
    Ok(CallOutput {
        content: vec![ContentBlock::Text(line), ContentBlock::Image(image)],
        structured: None,
        context_modifier: None,
    })
}

/// One line of a file, its line ending left out, at most
/// [`MAX_LINE_BYTES`] of it kept.
struct Line {
    kept: Vec<u8>,
    /// Whether bytes of the line past [`MAX_LINE_BYTES`] were dropped.
    cut: bool,
}

/// Read the next line into `line`, holding at most [`MAX_LINE_BYTES`] of
/// it; the bytes it took from `reader` (0 at the end of the file).
fn next_line(reader: &mut impl BufRead, line: &mut Line) -> std::io::Result<usize> {
    line.kept.clear();
    line.cut = false;
    let taken = reader.by_ref().take(MAX_LINE_BYTES as u64).read_until(b'\n', &mut line.kept)?;
    let mut read = taken;
    if line.kept.last() == Some(&b'\n') {
        line.kept.pop();
        // `str::lines` drops a carriage return only before a line feed.
        if line.kept.last() == Some(&b'\r') {
            line.kept.pop();
        }
    } else if taken == MAX_LINE_BYTES {
        let rest = reader.skip_until(b'\n')?;
        read += rest;
        line.cut = rest > 0;
    }
    Ok(read)
}

/// Lines `offset..offset + limit` of what `reader` reads, numbered like
/// `cat -n`, each cut at [`MAX_LINE_CHARS`], the whole stopped at
/// [`MAX_OUTPUT_CHARS`]. Lines are counted as [`str::lines`] counts them.
/// When `count_rest` is set the lines after the range are counted, for the
/// footer saying how far the file goes; else the footer says only how to
/// read on.
fn number_lines(
    mut reader: impl BufRead,
    offset: usize,
    limit: usize,
    count_rest: bool,
) -> std::io::Result<String> {
    let mut lines = 0;
    while lines < offset - 1 {
        if reader.skip_until(b'\n')? == 0 {
            return Ok(past_the_end(lines, offset));
        }
        lines += 1;
    }
    let mut out = String::new();
    let mut chars = 0;
    let mut line = Line { kept: Vec::new(), cut: false };
    let end = (offset - 1).saturating_add(limit);
    while lines < end {
        if next_line(&mut reader, &mut line)? == 0 {
            if lines < offset {
                return Ok(past_the_end(lines, offset));
            }
            // The range reaches the end of the file: nothing to read on.
            return Ok(out);
        }
        lines += 1;
        let number = lines;
        let text = decode(&line)?;
        let cut: String = text.chars().take(MAX_LINE_CHARS).collect();
        let marker = if cut.len() < text.len() || line.cut { " [line cut]" } else { "" };
        let entry = format!("{number:>6}\t{cut}{marker}\n");
        let entry_chars = entry.chars().count();
        if chars + entry_chars > MAX_OUTPUT_CHARS {
            out.push_str(&format!(
                "(output stopped at {MAX_OUTPUT_CHARS} characters; read on with offset={number})\n"
            ));
            return Ok(out);
        }
        chars += entry_chars;
        out.push_str(&entry);
    }
    let last = lines;
    if !count_rest {
        if !reader.fill_buf()?.is_empty() {
            out.push_str(&format!(
                "(lines {offset}-{last} of a file too large to count its lines; read on with offset={})\n",
                last + 1
            ));
        }
        return Ok(out);
    }
    let mut total = last;
    while reader.skip_until(b'\n')? > 0 {
        total += 1;
    }
    if last < total {
        out.push_str(&format!("(lines {offset}-{last} of {total}; read on with offset={})\n", last + 1));
    }
    Ok(out)
}

/// What is said of an `offset` past the file's `lines` lines.
fn past_the_end(lines: usize, offset: usize) -> String {
    if lines == 0 {
        return "(the file is empty)".into();
    }
    format!("(the file has {lines} lines; offset {offset} is past its end)")
}

/// The text of `line`: UTF-8, save for a character the cut split in two,
/// which is left out.
fn decode(line: &Line) -> std::io::Result<&str> {
    let not_text = || std::io::Error::new(std::io::ErrorKind::InvalidData, "it is not UTF-8 text");
    match std::str::from_utf8(&line.kept) {
        Ok(text) => Ok(text),
        Err(error) if line.cut && error.error_len().is_none() => {
            std::str::from_utf8(&line.kept[..error.valid_up_to()]).map_err(|_| not_text())
        }
        Err(_) => Err(not_text()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(dir: &Path, input: Value) -> Result<CallOutput, CallError> {
        run(&Read::new(Dir::open_ambient_dir(dir, ambient_authority()).unwrap()), input)
    }

    fn run(tool: &Read, input: Value) -> Result<CallOutput, CallError> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let context = Arc::new(json!({ "cwd": "/workspace" }));
            let call = tool.invoke(input, context.clone()).await.unwrap();
            call.call(CallContext::shared(context)).await
        })
    }

    #[test]
    fn numbers_lines_like_cat_n() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\ntwo\nthree\n").unwrap();
        let out = read(dir.path(), json!({ "file_path": "a.txt" })).unwrap();
        assert_eq!(out.to_text(), "     1\tone\n     2\ttwo\n     3\tthree\n");
    }

    #[test]
    fn offset_and_limit_select_lines_and_say_how_to_read_on() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "1\n2\n3\n4\n5\n").unwrap();
        let out =
            read(dir.path(), json!({ "file_path": "/workspace/a.txt", "offset": 2, "limit": 2 })).unwrap();
        assert_eq!(out.to_text(), "     2\t2\n     3\t3\n(lines 2-3 of 5; read on with offset=4)\n");
    }

    #[test]
    fn bounds_its_own_output() {
        let dir = tempfile::tempdir().unwrap();
        let line = "x".repeat(MAX_LINE_CHARS * 3);
        std::fs::write(dir.path().join("big.txt"), format!("{line}\n").repeat(200)).unwrap();
        let out = read(dir.path(), json!({ "file_path": "big.txt" })).unwrap().to_text();
        assert!(out.chars().count() <= MAX_OUTPUT_CHARS + 200, "{}", out.len());
        assert!(out.lines().next().unwrap().ends_with(" [line cut]"));
        assert!(out.ends_with("read on with offset=50)\n"), "{}", &out[out.len() - 100..]);
    }

    #[test]
    fn refuses_paths_outside_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let error = read(dir.path(), json!({ "file_path": "../../etc/passwd" })).unwrap_err();
        assert_eq!(error, CallError::Tool("../../etc/passwd is outside the workspace".into()));
        let error = read(dir.path(), json!({ "file_path": "/etc/passwd" })).unwrap_err();
        assert_eq!(error, CallError::Tool("/etc/passwd is outside the workspace".into()));
    }

    #[test]
    fn a_symlink_out_of_the_workspace_is_closed() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s3cret").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        assert_eq!(
            read(dir.path(), json!({ "file_path": "link" })).unwrap_err(),
            CallError::Tool(
                "cannot read link: it leads outside the workspace, through a symbolic link".into()
            )
        );
    }

    #[test]
    fn binary_files_and_directories_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.bin"), [0xff, 0x00, 0xfe]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        assert_eq!(
            read(dir.path(), json!({ "file_path": "b.bin" })).unwrap_err(),
            CallError::Tool("cannot read b.bin: it is not UTF-8 text".into())
        );
        assert_eq!(
            read(dir.path(), json!({ "file_path": "sub" })).unwrap_err(),
            CallError::Tool("cannot read sub: it is a directory".into())
        );
    }

    #[test]
    fn granted_directories_are_read_at_their_mounts_and_stay_closed_to_symlinks() {
        use crate::load::grants::{Access, DirGrant};
        let workspace = tempfile::tempdir().unwrap();
        let reference = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(reference.path().join("ref.txt"), "from the reference\n").unwrap();
        std::fs::write(outside.path().join("secret"), "s3cret\n").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), reference.path().join("link")).unwrap();
        let mut grant = PluginGrant::workspace_only(workspace.path());
        grant.dirs.push(DirGrant {
            host: reference.path().to_path_buf(),
            mount: "/reference".into(),
            access: Access::ReadOnly,
        });
        let tool = Read::with_grant(&grant).unwrap();
        assert_eq!(
            run(&tool, json!({ "file_path": "/reference/ref.txt" })).unwrap().to_text(),
            "     1\tfrom the reference\n"
        );
        assert_eq!(
            run(&tool, json!({ "file_path": "../reference/ref.txt" })).unwrap().to_text(),
            "     1\tfrom the reference\n",
            "relative to the working directory /workspace"
        );
        assert_eq!(
            run(&tool, json!({ "file_path": "/reference/link" })).unwrap_err(),
            CallError::Tool(
                "cannot read /reference/link: it leads outside /reference, through a symbolic link".into()
            )
        );
        assert_eq!(
            run(&tool, json!({ "file_path": "/referenced/ref.txt" })).unwrap_err(),
            CallError::Tool("/referenced/ref.txt is outside the granted directories".into())
        );
    }

    #[test]
    fn a_path_outside_is_blamed_on_a_working_directory_outside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\n").unwrap();
        let tool = Read::new(Dir::open_ambient_dir(dir.path(), ambient_authority()).unwrap());
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let read_from = |cwd: &str, path: &str| {
            runtime.block_on(async {
                let context = Arc::new(json!({ "cwd": cwd }));
                let call = tool.invoke(json!({ "file_path": path }), context.clone()).await.unwrap();
                call.call(CallContext::shared(context)).await
            })
        };
        assert_eq!(
            read_from("relative/dir", "a.txt").unwrap_err(),
            CallError::Tool(
                "a.txt is outside the workspace: the working directory relative/dir is not under /workspace"
                    .into()
            )
        );
        assert_eq!(read_from("relative/dir", "/workspace/a.txt").unwrap().to_text(), "     1\tone\n");
        assert_eq!(
            read_from("/workspace/sub", "../../a.txt").unwrap_err(),
            CallError::Tool("../../a.txt is outside the workspace".into()),
            "a working directory inside is not blamed"
        );
    }

    /// What `tool` gives for `input`, on a thread of its own, waited for at
    /// most `wait`, its blocking threads ended too (dropping the runtime
    /// waits for them): a read that blocks fails the test, not hangs it.
    fn run_within(wait: Duration, tool: Read, input: Value) -> Result<CallOutput, CallError> {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sender.send(run(&tool, input));
        });
        receiver.recv_timeout(wait).expect("Read did not end in time")
    }

    #[cfg(unix)]
    #[test]
    fn a_named_pipe_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let made = std::process::Command::new("mkfifo").arg(dir.path().join("fifo")).status().unwrap();
        assert!(made.success());
        let tool = Read::new(Dir::open_ambient_dir(dir.path(), ambient_authority()).unwrap());
        assert_eq!(
            run_within(Duration::from_secs(10), tool, json!({ "file_path": "fifo" })).unwrap_err(),
            CallError::Tool("cannot read fifo: it is a named pipe (FIFO), not a regular file".into())
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_socket_is_refused_naming_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
        assert_eq!(
            read(dir.path(), json!({ "file_path": "sock" })).unwrap_err(),
            CallError::Tool("cannot read sock: it is a socket, not a regular file".into())
        );
    }

    #[test]
    fn an_offset_into_a_huge_file_without_lines_stops_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("huge.log")).unwrap();
        // 4 TiB of zeros, no line: sparse, so it takes no disk space.
        file.set_len(4 << 40).expect("the temporary directory holds sparse files");
        let tool = Read::new(Dir::open_ambient_dir(dir.path(), ambient_authority()).unwrap())
            .with_deadline(Duration::from_millis(300));
        let input = json!({ "file_path": "huge.log", "offset": 2 });
        let error = run_within(Duration::from_secs(20), tool, input).unwrap_err();
        assert_eq!(error, CallError::Limit { kind: LimitKind::Deadline, value: "300ms".into() });
        assert_eq!(error.to_string(), "deadline of 300ms exceeded");
    }

    /// A 2×2 red PNG.
    const DOT_PNG: [u8; 73] = [
        137, 80, 78, 71, 13, 10, 26, 10, 0, 0, 0, 13, 73, 72, 68, 82, 0, 0, 0, 2, 0, 0, 0, 2, 8, 2, 0, 0, 0,
        253, 212, 154, 115, 0, 0, 0, 16, 73, 68, 65, 84, 120, 156, 99, 248, 207, 192, 0, 68, 12, 16, 10, 0,
        31, 238, 3, 253, 139, 95, 20, 212, 0, 0, 0, 0, 73, 69, 78, 68, 174, 66, 96, 130,
    ];

    /// A file of `head`, then zeros up to just past [`MAX_FILE_BYTES`], then
    /// `tail`: sparse, so it takes no disk space.
    fn past_the_cap(dir: &Path, head: &str, tail: &str) {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = std::fs::File::create(dir.join("big.log")).unwrap();
        file.write_all(head.as_bytes()).unwrap();
        file.set_len(MAX_FILE_BYTES + 1).unwrap();
        file.seek(SeekFrom::Start(MAX_FILE_BYTES + 1)).unwrap();
        file.write_all(tail.as_bytes()).unwrap();
    }

    #[test]
    fn a_file_past_the_cap_needs_a_range() {
        let dir = tempfile::tempdir().unwrap();
        past_the_cap(dir.path(), "one\n", "");
        assert_eq!(
            read(dir.path(), json!({ "file_path": "big.log" })).unwrap_err(),
            CallError::Tool(
                "cannot read big.log: it is larger than 64 MiB; pass `offset` and `limit` to read part of it"
                    .into()
            )
        );
    }

    #[test]
    fn a_range_of_a_file_past_the_cap_is_read_without_counting_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        past_the_cap(dir.path(), "one\ntwo\nthree\n", "\nlast\n");
        let out = read(dir.path(), json!({ "file_path": "big.log", "offset": 2, "limit": 2 })).unwrap();
        assert_eq!(
            out.to_text(),
            "     2\ttwo\n     3\tthree\n\
             (lines 2-3 of a file too large to count its lines; read on with offset=4)\n"
        );
        let out = read(dir.path(), json!({ "file_path": "big.log", "limit": 1 })).unwrap();
        assert_eq!(
            out.to_text(),
            "     1\tone\n(lines 1-1 of a file too large to count its lines; read on with offset=2)\n"
        );
    }

    #[test]
    fn the_tail_of_a_file_past_the_cap_reads_with_its_long_line_cut() {
        let dir = tempfile::tempdir().unwrap();
        past_the_cap(dir.path(), "one\n", "\nlast\n");
        let out = read(dir.path(), json!({ "file_path": "big.log", "offset": 3 })).unwrap();
        assert_eq!(out.to_text(), "     3\tlast\n", "the range reaches the end: nothing to read on");
        let out = read(dir.path(), json!({ "file_path": "big.log", "offset": 2, "limit": 1 })).unwrap();
        let zeros = "\0".repeat(MAX_LINE_CHARS);
        assert_eq!(
            out.to_text(),
            format!(
                "     2\t{zeros} [line cut]\n(lines 2-2 of a file too large to count its lines; read on with offset=3)\n"
            )
        );
        let out = read(dir.path(), json!({ "file_path": "big.log", "offset": 9 })).unwrap();
        assert_eq!(out.to_text(), "(the file has 3 lines; offset 9 is past its end)");
    }

    #[test]
    fn counts_lines_as_str_lines_does() {
        let dir = tempfile::tempdir().unwrap();
        for (text, shown) in [
            ("a\r\nb\r\n", "     1\ta\n     2\tb\n"),
            ("a\nb", "     1\ta\n     2\tb\n"),
            ("\n", "     1\t\n"),
            ("a\r", "     1\ta\r\n"),
        ] {
            std::fs::write(dir.path().join("f.txt"), text).unwrap();
            let out = read(dir.path(), json!({ "file_path": "f.txt" })).unwrap();
            assert_eq!(out.to_text(), shown, "{text:?}");
        }
        std::fs::write(dir.path().join("f.txt"), "").unwrap();
        let out = read(dir.path(), json!({ "file_path": "f.txt", "offset": 3 })).unwrap();
        assert_eq!(out.to_text(), "(the file is empty)");
    }

    #[test]
    fn a_cut_line_never_splits_a_character() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), format!("a{}\n", "é".repeat(MAX_LINE_BYTES))).unwrap();
        let out = read(dir.path(), json!({ "file_path": "f.txt" })).unwrap().to_text();
        assert_eq!(out, format!("     1\ta{} [line cut]\n", "é".repeat(MAX_LINE_CHARS - 1)));
    }

    #[test]
    fn an_image_file_is_an_image_block_after_a_line_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("dot.PNG"), DOT_PNG).unwrap();
        let out = read(dir.path(), json!({ "file_path": "dot.PNG" })).unwrap();
        let image = crate::content::Image::new("image/png", DOT_PNG.to_vec());
        assert_eq!(
            out.content,
            [ContentBlock::Text("dot.PNG: image/png, 2×2 px, 73 bytes".into()), ContentBlock::Image(image)]
        );
    }

    #[test]
    fn an_image_over_what_a_model_takes_or_not_an_image_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("huge.png")).unwrap();
        std::io::Write::write_all(&mut &file, &DOT_PNG).unwrap();
        file.set_len(crate::budget::MAX_IMAGE_BYTES + 1).unwrap();
        std::fs::write(dir.path().join("fake.jpg"), "not an image").unwrap();
        assert_eq!(
            read(dir.path(), json!({ "file_path": "huge.png" })).unwrap_err(),
            CallError::Tool(
                "cannot read huge.png: it is an image of 5242881 bytes, and a model takes at most 5242880"
                    .into()
            )
        );
        assert_eq!(
            read(dir.path(), json!({ "file_path": "fake.jpg" })).unwrap_err(),
            CallError::Tool(
                "cannot read fake.jpg: it is named as an image, but its bytes are not PNG, JPEG, GIF or WebP"
                    .into()
            )
        );
    }
}
