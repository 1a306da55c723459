//! Figures 8 and 13: MCP on stdio. `keel serve` runs as a child process and
//! an rmcp client drives it, one `tools/call` of `echo` at a time, then
//! 1,000 at once; the baseline is the same client driving the smallest rmcp
//! stdio server with a native echo tool ([`serve_native_echo`]), spawned
//! from the same binary. Both report the round trip's median and the
//! server's CPU time per call, read from `/proc/<pid>/stat`.
//!
//! [`compare`] puts any stdio MCP server in the native server's place.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};

use super::{BenchOptions, Figure, answered, median, tempdir};
use keel_host::{Error, Result};

/// The arguments that make the `keel` binary serve the native echo of
/// [`serve_native_echo`] on stdio: the baseline of the MCP figures.
pub const NATIVE_ECHO_ARGS: [&str; 2] = ["bench", "--serve-native-echo"];

/// What every call echoes.
const TEXT: &str = "hello";

/// The name of a tool no server of these figures has.
const NO_TOOL: &str = "no-such-tool";

/// The smallest MCP server over the transport `keel serve` uses: rmcp on
/// stdio pipes, one `echo` tool answered natively. Serves until the client
/// closes stdin.
pub fn serve_native_echo() -> std::io::Result<()> {
    // The runtime of `keel serve` (`call_runtime`), so the two servers differ
    // only in the tool.
    let runtime = crate::call_runtime().build()?;
    runtime.block_on(async {
        let (stdin, stdout) = rmcp::transport::stdio_pipes();
        let transport = AsyncRwTransport::new_server(stdin, stdout);
        let service = NativeEcho.serve(transport).await.map_err(std::io::Error::other)?;
        service.waiting().await.map_err(std::io::Error::other)?;
        Ok(())
    })
}

/// One tool, `echo`, that returns its `text`.
#[derive(Clone, Copy)]
pub(super) struct NativeEcho;

impl ServerHandler for NativeEcho {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("keel-native-echo", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({
            "type": "object",
            "properties": { "text": { "type": "string" } },
            "required": ["text"],
        });
        let Value::Object(schema) = schema else { unreachable!("the schema is an object") };
        let tool = rmcp::model::Tool::new("echo", "Returns its text.", Arc::new(schema));
        Ok(ListToolsResult::with_all_items(vec![tool]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let text = request.arguments.as_ref().and_then(|arguments| arguments.get("text"));
        let result = match text.and_then(Value::as_str) {
            Some(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            None => CallToolResult::error(vec![ContentBlock::text("`text` must be a string")]),
        };
        Ok(result.into())
    }
}

/// Figure 8: the `tools/call` round trip's median and the server's CPU time
/// per call, `keel serve` against the native echo server, and the same for
/// a call `keel serve` answers without a sandbox; then figure 13,
/// the burst: 1,000 calls at once on one session of each.
pub(super) fn figures(options: &BenchOptions, mut report: impl FnMut(Figure)) -> Result<()> {
    let workspace = tempdir()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| Error::io("start a runtime for", &options.keel, error))?;
    rt.block_on(async {
        let mut serve = tokio::process::Command::new(&options.keel);
        serve.arg("serve").arg("--plugins").arg(&options.tools).arg("--workspace").arg(workspace.path());
        let keel = Server::spawn(serve, workspace.path(), &options.keel).await?;
        let mut echo = tokio::process::Command::new(&options.keel);
        echo.args(NATIVE_ECHO_ARGS);
        let native = Server::spawn(echo, workspace.path(), &options.keel).await?;
        let arguments = echo_arguments();
        let native_echo = || native.call_tool("echo", &arguments);
        let [latency, cpu] = round_trip(options, (&keel, || keel.call()), (&native, native_echo)).await?;
        let name = "(keel serve / native rmcp echo)";
        report(
            Figure::new(&format!("mcp_stdio_round_trip_p50 {name}"), latency[0], latency[1], "µs")
                .at_most(1.5),
        );
        report(
            Figure::new(&format!("mcp_stdio_server_cpu_per_call {name}"), cpu[0], cpu[1], "µs").at_most(2.0),
        );
        // What serving costs keel without a sandbox: a call of a tool it
        // does not have is answered by the same path up to the tool's
        // lookup, and makes no sandbox.
        let [latency, cpu] =
            round_trip(options, (&keel, || keel.call_no_tool()), (&native, native_echo)).await?;
        let alone = "(keel serve answering a call of no tool / native rmcp echo)";
        report(Figure::new(
            &format!("mcp_stdio_round_trip_p50_no_sandbox {alone}"),
            latency[0],
            latency[1],
            "µs",
        ));
        report(Figure::new(
            &format!("mcp_stdio_server_cpu_per_call_no_sandbox {alone}"),
            cpu[0],
            cpu[1],
            "µs",
        ));
        let calls = options.scale(1_000, 200);
        let (keel_ms, keel_lost) = keel.burst(calls).await;
        let (native_ms, native_lost) = native.burst(calls).await;
        report(Figure::new(
            &format!("mcp_stdio_burst_{calls} (all answered, ms) {name}"),
            keel_ms,
            native_ms,
            "ms",
        ));
        report(answered(
            &format!("mcp_stdio_burst_{calls}_answered (keel serve replies / calls sent)"),
            keel_lost,
            calls,
        ));
        if native_lost > 0 {
            tracing::warn!("the native server lost {native_lost} of {calls} calls of the burst");
        }
        keel.close().await;
        native.close().await;
        Ok(())
    })
}

fn echo_arguments() -> JsonObject {
    JsonObject::from_iter([("text".to_string(), Value::from(TEXT))])
}

/// The round trip's median and the server's CPU time per call, `[keel,
/// other]`, of `keel_call` and `other_call`: each a call on one server's
/// client, the two called in turn, round by round.
async fn round_trip<K, O>(
    options: &BenchOptions,
    (keel, keel_call): (&Server, impl Fn() -> K),
    (other, other_call): (&Server, impl Fn() -> O),
) -> Result<[[f64; 2]; 2]>
where
    K: Future<Output = Result<()>>,
    O: Future<Output = Result<()>>,
{
    let ticks_per_second = clock_ticks_per_second()? as f64;
    let (warm_up, rounds, per_round) =
        (options.scale(200, 50), options.scale(5, 1), options.scale(1_000, 400));
    // CPU time is read in clock ticks, 10 ms on most systems: more rounds,
    // up to ten times the planned ones, until each server's CPU time spans
    // enough ticks that a tick more or less matters little.
    let (min_ticks, max_rounds) = (options.scale(20, 2) as u64, 10 * rounds);
    for _ in 0..warm_up {
        keel_call().await?;
        other_call().await?;
    }
    let (mut keel_sample, mut other_sample) = (Sample::default(), Sample::default());
    for round in 0..max_rounds {
        let enough = keel_sample.cpu_ticks.min(other_sample.cpu_ticks) >= min_ticks;
        if round >= rounds && enough {
            break;
        }
        other.measure(per_round, &mut other_sample, &other_call).await?;
        keel.measure(per_round, &mut keel_sample, &keel_call).await?;
    }
    Ok([
        [median(keel_sample.latencies.clone()), median(other_sample.latencies.clone())],
        [keel_sample.cpu_per_call(ticks_per_second), other_sample.cpu_per_call(ticks_per_second)],
    ])
}

/// `keel bench --mcp-server`: keel beside the stdio MCP server `command`
/// (run by `sh -c`), on the same client and the same columns: the round
/// trip p50 and server CPU per call (keel's `echo` against `tool` called
/// with `arguments`), 200 calls at once, the first call after the
/// handshake, and the whole start: from spawning the server to the first
/// call's reply. A server may answer the handshake at once and load its
/// tools after it, or load them first: only the whole start compares the
/// two alike.
pub fn compare(
    options: &BenchOptions,
    command: &str,
    tool: &str,
    arguments: &JsonObject,
    mut report: impl FnMut(Figure),
) -> Result<()> {
    let workspace = tempdir()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| Error::io("start a runtime for", &options.keel, error))?;
    let shell = Path::new("/bin/sh");
    rt.block_on(async {
        let mut serve = tokio::process::Command::new(&options.keel);
        serve.arg("serve").arg("--plugins").arg(&options.tools).arg("--workspace").arg(workspace.path());
        let spawned = Instant::now();
        let keel = Server::spawn(serve, workspace.path(), &options.keel).await?;
        let started = Instant::now();
        keel.call().await?;
        let keel_first = started.elapsed().as_secs_f64() * 1e3;
        let keel_start = spawned.elapsed().as_secs_f64() * 1e3;
        let mut theirs = tokio::process::Command::new(shell);
        theirs.arg("-c").arg(format!("exec {command}"));
        // The server runs with the machine's transparent huge pages, as it
        // would anywhere else, not with the huge pages `keel` turned off.
        #[cfg(target_os = "linux")]
        // SAFETY: one prctl system call, which allocates nothing and takes no
        // lock, between fork and exec.
        unsafe {
            theirs.pre_exec(|| Ok(rustix::thread::disable_transparent_huge_pages(false)?));
        }
        let spawned = Instant::now();
        let other = Server::spawn(theirs, workspace.path(), shell).await.map_err(|_| {
            Error::Engine(format!("`{command}` did not start as an MCP server on stdio (run by `sh -c`)"))
        })?;
        let started = Instant::now();
        other.call_tool(tool, arguments).await.map_err(|error| {
            Error::Engine(format!(
                "`{command}` could not call {tool} with {}: {error}",
                Value::Object(arguments.clone())
            ))
        })?;
        let other_first = started.elapsed().as_secs_f64() * 1e3;
        let other_start = spawned.elapsed().as_secs_f64() * 1e3;
        let name = format!("(keel serve echo / {command}: {tool})");
        let [latency, cpu] =
            round_trip(options, (&keel, || keel.call()), (&other, || other.call_tool(tool, arguments)))
                .await?;
        report(Figure::new(&format!("mcp_stdio_round_trip_p50 {name}"), latency[0], latency[1], "µs"));
        report(Figure::new(&format!("mcp_stdio_server_cpu_per_call {name}"), cpu[0], cpu[1], "µs"));
        let calls = 200;
        let (keel_ms, keel_lost) = keel.burst(calls).await;
        let (other_ms, other_lost) = other.burst_of(calls, tool, arguments).await;
        report(Figure::new(
            &format!("mcp_stdio_burst_{calls} (all answered, ms) {name}"),
            keel_ms,
            other_ms,
            "ms",
        ));
        report(answered(
            &format!("mcp_stdio_burst_{calls}_answered (keel serve replies / calls sent)"),
            keel_lost,
            calls,
        ));
        report(answered(
            &format!("mcp_stdio_burst_{calls}_answered ({command} replies / calls sent)"),
            other_lost,
            calls,
        ));
        report(Figure::new(&format!("mcp_stdio_first_call {name}"), keel_first, other_first, "ms"));
        report(Figure::new(&format!("mcp_stdio_start_to_first_reply {name}"), keel_start, other_start, "ms"));
        keel.close().await;
        other.close().await;
        Ok(())
    })
}

/// What one server's measured calls took.
#[derive(Default)]
struct Sample {
    /// Each round trip, in µs.
    latencies: Vec<f64>,
    /// The server's user and system CPU time over the measured calls.
    cpu_ticks: u64,
}

impl Sample {
    fn cpu_per_call(&self, ticks_per_second: f64) -> f64 {
        self.cpu_ticks as f64 / ticks_per_second * 1e6 / self.latencies.len() as f64
    }
}

/// A server process and the client connected to it.
struct Server {
    client: RunningService<RoleClient, ()>,
    pid: u32,
}

impl Server {
    async fn spawn(mut command: tokio::process::Command, workspace: &Path, keel: &Path) -> Result<Self> {
        command.current_dir(workspace);
        let (transport, _) =
            TokioChildProcess::builder(command).spawn().map_err(|error| Error::io("spawn", keel, error))?;
        let pid = transport.id().ok_or_else(|| failed(keel, "the server exited at once"))?;
        let client = ().serve(transport).await.map_err(|error| failed(keel, error))?;
        Ok(Server { client, pid })
    }

    /// One `echo` call; fails unless it echoes.
    async fn call(&self) -> Result<()> {
        self.echo(TEXT).await
    }

    /// One `echo` call of `text`; fails unless it echoes `text`.
    async fn echo(&self, text: &str) -> Result<()> {
        let arguments = JsonObject::from_iter([("text".to_string(), Value::from(text))]);
        let result = self
            .client
            .call_tool(CallToolRequestParams::new("echo").with_arguments(arguments))
            .await
            .map_err(|error| failed(Path::new("echo"), error))?;
        let echoed = match result.content.as_slice() {
            [block] => block.as_text().map(|echoed| echoed.text.as_str()),
            _ => None,
        };
        if result.is_error == Some(true) || echoed != Some(text) {
            return Err(failed(Path::new("echo"), format!("unexpected result {result:?}")));
        }
        Ok(())
    }

    /// One call of a tool the server does not have; fails unless it is
    /// answered with an error result that says so.
    async fn call_no_tool(&self) -> Result<()> {
        let request = CallToolRequestParams::new(NO_TOOL).with_arguments(echo_arguments());
        let result =
            self.client.call_tool(request).await.map_err(|error| failed(Path::new(NO_TOOL), error))?;
        let said = match result.content.as_slice() {
            [block] => block.as_text().is_some_and(|said| said.text.contains(NO_TOOL)),
            _ => false,
        };
        if result.is_error != Some(true) || !said {
            return Err(failed(Path::new(NO_TOOL), format!("unexpected result {result:?}")));
        }
        Ok(())
    }

    /// `calls` echoes at once on this one session, each of its own text:
    /// the milliseconds until the last reply, and how many got no right
    /// reply within 60 s.
    async fn burst(&self, calls: usize) -> (f64, usize) {
        let started = Instant::now();
        let replies = futures::future::join_all((0..calls).map(|i| async move {
            let text = format!("burst-{i}");
            tokio::time::timeout(std::time::Duration::from_secs(60), self.echo(&text)).await
        }))
        .await;
        let lost = replies
            .iter()
            .filter(|reply| match reply {
                Ok(Ok(())) => false,
                Ok(Err(error)) => {
                    tracing::warn!("a burst call failed: {error}");
                    true
                }
                Err(_) => true,
            })
            .count();
        (started.elapsed().as_secs_f64() * 1e3, lost)
    }

    /// `calls` calls of `call` one after another, each timed, and the
    /// server's CPU time over all of them (its child processes' too).
    async fn measure<F: Future<Output = Result<()>>>(
        &self,
        calls: usize,
        sample: &mut Sample,
        call: impl Fn() -> F,
    ) -> Result<()> {
        let before = tree_cpu_ticks(self.pid)?;
        for _ in 0..calls {
            let started = Instant::now();
            call().await?;
            sample.latencies.push(started.elapsed().as_secs_f64() * 1e6);
        }
        sample.cpu_ticks += tree_cpu_ticks(self.pid)?.saturating_sub(before);
        Ok(())
    }

    /// One call of `tool` with `arguments`; fails if the call fails or its
    /// result is an error.
    async fn call_tool(&self, tool: &str, arguments: &JsonObject) -> Result<()> {
        let request = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.clone());
        let result = self.client.call_tool(request).await.map_err(|error| failed(Path::new(tool), error))?;
        if result.is_error == Some(true) {
            return Err(failed(Path::new(tool), format!("an error result {:?}", result.content)));
        }
        Ok(())
    }

    /// [`Server::burst`] of `tool` with `arguments`, whose results cannot
    /// be told apart: a reply is lost when it is missing or an error.
    async fn burst_of(&self, calls: usize, tool: &str, arguments: &JsonObject) -> (f64, usize) {
        let started = Instant::now();
        let replies = futures::future::join_all((0..calls).map(|_| async move {
            tokio::time::timeout(std::time::Duration::from_secs(60), self.call_tool(tool, arguments)).await
        }))
        .await;
        let lost = replies.iter().filter(|reply| !matches!(reply, Ok(Ok(())))).count();
        (started.elapsed().as_secs_f64() * 1e3, lost)
    }

    /// Close stdin and wait for the server to exit.
    async fn close(self) {
        if let Err(error) = self.client.cancel().await {
            tracing::warn!("an MCP server did not shut down: {error}");
        }
    }
}

fn failed(what: &Path, error: impl std::fmt::Display) -> Error {
    Error::io("run", what, std::io::Error::other(format!("MCP: {error}")))
}

/// [`cpu_ticks`] of process `pid` and of every process under it: a server
/// started through a launcher (`npx`, `uv run`) does its work in a child.
fn tree_cpu_ticks(pid: u32) -> Result<u64> {
    let mut parents = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            let after_name = stat.rfind(')').map_or("", |end| &stat[end + 1..]);
            if let Some(parent) =
                after_name.split_whitespace().nth(1).and_then(|field| field.parse::<u32>().ok())
            {
                parents.push((child, parent));
            }
        }
    }
    let mut tree = vec![pid];
    let mut at = 0;
    while at < tree.len() {
        let parent = tree[at];
        tree.extend(parents.iter().filter(|&&(_, of)| of == parent).map(|&(child, _)| child));
        at += 1;
    }
    // A process that ended meanwhile has no more CPU time to count.
    Ok(tree.iter().skip(1).filter_map(|&pid| cpu_ticks(pid).ok()).sum::<u64>() + cpu_ticks(pid)?)
}

/// User plus system CPU time of process `pid`, all its threads, in clock
/// ticks: fields 14 and 15 of `/proc/<pid>/stat`.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(|error| Error::io("read", &path, error))?;
    // The command name (field 2) is in parentheses and may hold spaces;
    // the fields after it start with field 3.
    let after_name = stat.rfind(')').map_or("", |end| &stat[end + 1..]);
    let field =
        |n: usize| after_name.split_whitespace().nth(n - 3).and_then(|value| value.parse::<u64>().ok());
    match (field(14), field(15)) {
        (Some(user), Some(system)) => Ok(user + system),
        _ => Err(Error::io("parse", &path, std::io::Error::other("no utime and stime fields"))),
    }
}

/// Clock ticks per second, `sysconf(_SC_CLK_TCK)`: the `AT_CLKTCK` entry
/// the kernel passes every process in its auxiliary vector, where the C
/// library's `sysconf` reads it too.
fn clock_ticks_per_second() -> Result<u64> {
    const AT_NULL: usize = 0;
    const AT_CLKTCK: usize = 17;
    const WORD: usize = size_of::<usize>();
    let path = "/proc/self/auxv";
    let auxv = std::fs::read(path).map_err(|error| Error::io("read", path, error))?;
    let word = |bytes: &[u8]| usize::from_ne_bytes(bytes.try_into().expect("a word"));
    auxv.chunks_exact(2 * WORD)
        .map(|entry| (word(&entry[..WORD]), word(&entry[WORD..])))
        .take_while(|&(key, _)| key != AT_NULL)
        .find(|&(key, value)| key == AT_CLKTCK && value > 0)
        .map(|(_, value)| value as u64)
        .ok_or_else(|| Error::io("parse", path, std::io::Error::other("no AT_CLKTCK entry")))
}
