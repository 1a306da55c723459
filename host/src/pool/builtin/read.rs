//! `Read`: read a text file of the workspace, with line numbers.

use std::io::Read as _;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::contract::WORKSPACE_MOUNT;
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
/// Bytes of a file read at most.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The built-in `Read` tool.
pub struct Read {
    spec: ToolSpec,
    mounts: Arc<Mounts>,
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
                `cat -n`. Reads up to 2000 lines from the start by default; use `offset` and \
                `limit` to read a long file in parts.";
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
        Read { spec, mounts: Arc::new(Mounts { dirs }) }
    }
}

#[async_trait]
impl Tool for Read {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, input: Value, context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
        Ok(Box::new(ReadCall { mounts: self.mounts.clone(), input, context }))
    }
}

struct ReadCall {
    mounts: Arc<Mounts>,
    input: Value,
    /// The context the call runs with: its `cwd` resolves `file_path`.
    context: Arc<Value>,
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
            let outside =
                if self.mounts.dirs.len() > 1 { "the granted directories" } else { "the workspace" };
            return Err(CallError::Tool(format!("{} is outside {outside}", input.file_path)));
        };
        let mounts = self.mounts.clone();
        let shown = input.file_path.clone();
        let text = tokio::task::spawn_blocking(move || read_text(&mounts.dirs[mount].1, &relative))
            .await
            .map_err(|error| CallError::Host(error.to_string()))?
            .map_err(|reason| CallError::Tool(format!("cannot read {shown}: {reason}")))?;
        let offset = input.offset.unwrap_or(1).max(1);
        let limit = input.limit.unwrap_or(DEFAULT_LINE_LIMIT);
        Ok(CallOutput::text(number_lines(&text, offset, limit)))
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
}

fn read_text(workspace: &Dir, relative: &Path) -> Result<String, String> {
    let target = if relative.as_os_str().is_empty() { Path::new(".") } else { relative };
    let file = workspace.open(target).map_err(|error| error.to_string())?;
    let metadata = file.metadata().map_err(|error| error.to_string())?;
    if metadata.is_dir() {
        return Err("it is a directory".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|error| error.to_string())?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("it is larger than {} MiB", MAX_FILE_BYTES >> 20));
    }
    String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_string())
}

/// Lines `offset..offset + limit` of `text`, numbered like `cat -n`, each cut
/// at [`MAX_LINE_CHARS`], the whole stopped at [`MAX_OUTPUT_CHARS`].
fn number_lines(text: &str, offset: usize, limit: usize) -> String {
    let total = text.lines().count();
    if total == 0 {
        return "(the file is empty)".into();
    }
    if offset > total {
        return format!("(the file has {total} lines; offset {offset} is past its end)");
    }
    let mut out = String::new();
    let mut chars = 0;
    let mut stopped = false;
    for (index, line) in text.lines().enumerate().skip(offset - 1).take(limit) {
        let number = index + 1;
        let cut: String = line.chars().take(MAX_LINE_CHARS).collect();
        let marker = if cut.len() < line.len() { " [line cut]" } else { "" };
        let entry = format!("{number:>6}\t{cut}{marker}\n");
        let entry_chars = entry.chars().count();
        if chars + entry_chars > MAX_OUTPUT_CHARS {
            out.push_str(&format!(
                "(output stopped at {MAX_OUTPUT_CHARS} characters; read on with offset={number})\n"
            ));
            stopped = true;
            break;
        }
        chars += entry_chars;
        out.push_str(&entry);
    }
    let last = (offset - 1 + limit).min(total);
    if last < total && !stopped {
        out.push_str(&format!("(lines {offset}-{last} of {total}; read on with offset={})\n", last + 1));
    }
    out
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
        let error = read(dir.path(), json!({ "file_path": "link" })).unwrap_err();
        let CallError::Tool(message) = error else { panic!("{error:?}") };
        assert!(message.starts_with("cannot read link: "), "{message}");
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
        let CallError::Tool(message) = run(&tool, json!({ "file_path": "/reference/link" })).unwrap_err()
        else {
            panic!("expected a tool error")
        };
        assert!(message.starts_with("cannot read /reference/link: "), "{message}");
        assert_eq!(
            run(&tool, json!({ "file_path": "/referenced/ref.txt" })).unwrap_err(),
            CallError::Tool("/referenced/ref.txt is outside the granted directories".into())
        );
    }
}
