//! Figures 8 and 13: MCP on stdio. `keel serve` runs as a child process and
//! an rmcp client drives it, one `tools/call` of `echo` at a time, then
//! 1,000 at once; the baseline is the same client driving the smallest rmcp
//! stdio server with a native echo tool ([`serve_native_echo`]), spawned
//! from the same binary. Both report the round trip's median and the
//! server's CPU time per call, read from its CPU-time clock.
//!
//! [`compare`] puts any stdio MCP server in the native server's place.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::{ClientInitializeError, RequestContext, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};

use super::{BenchOptions, Figure, answered, median, tempdir};
use super::{Error, Result};

/// The arguments that make the `keel` binary serve the native echo of
/// [`serve_native_echo`] on stdio: the baseline of the MCP figures.
pub const NATIVE_ECHO_ARGS: [&str; 2] = ["bench", "--serve-native-echo"];

/// What every call echoes.
const TEXT: &str = "hello";

/// The name of a tool no server of these figures has.
const NO_TOOL: &str = "no-such-tool";

/// How long a server may take to answer, before the figures end with an
/// error rather than wait without end: the handshake, which may include a
/// launcher's download (`npx -y`), and then each call.
const PATIENCE: Patience = Patience { handshake: Duration::from_secs(120), reply: Duration::from_secs(60) };

/// How long a server may take to answer the handshake, and each call.
#[derive(Clone, Copy)]
struct Patience {
    handshake: Duration,
    reply: Duration,
}

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
pub(super) fn figures(options: &BenchOptions, mut report: impl FnMut(Figure) -> Result<()>) -> Result<()> {
    let workspace = tempdir()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| Error::io("start a runtime for", &options.keel, error))?;
    rt.block_on(async {
        let serve = super::keel_serve(options, &options.tools, workspace.path());
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
        )?;
        report(
            Figure::new(&format!("mcp_stdio_server_cpu_per_call {name}"), cpu[0], cpu[1], "µs").at_most(2.0),
        )?;
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
        ))?;
        report(Figure::new(
            &format!("mcp_stdio_server_cpu_per_call_no_sandbox {alone}"),
            cpu[0],
            cpu[1],
            "µs",
        ))?;
        let calls = options.scale(1_000, 200);
        let (keel_ms, keel_lost) = keel.burst(calls).await;
        let (native_ms, native_lost) = native.burst(calls).await;
        report(Figure::new(
            &format!("mcp_stdio_burst_{calls} (all answered, ms) {name}"),
            keel_ms,
            native_ms,
            "ms",
        ))?;
        report(answered(
            &format!("mcp_stdio_burst_{calls}_answered (keel serve replies / calls sent)"),
            keel_lost,
            calls,
        ))?;
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
    let (warm_up, rounds, per_round) =
        (options.scale(200, 50), options.scale(5, 1), options.scale(1_000, 400));
    for _ in 0..warm_up {
        keel_call().await?;
        other_call().await?;
    }
    let (mut keel_sample, mut other_sample) = (Sample::default(), Sample::default());
    for _ in 0..rounds {
        other.measure(per_round, &mut other_sample, &other_call).await?;
        keel.measure(per_round, &mut keel_sample, &keel_call).await?;
    }
    Ok([
        [median(keel_sample.latencies.clone()), median(other_sample.latencies.clone())],
        [keel_sample.cpu_per_call(), other_sample.cpu_per_call()],
    ])
}

/// `keel bench --mcp-server`: keel beside the stdio MCP server `command`
/// (run by `sh -c`), on the same client and the same columns: the round
/// trip p50 and server CPU per call (keel's `echo` against `tool` called
/// with `arguments`), 200 calls at once, the first call after the
/// handshake, and the whole start: from spawning the server to the first
/// call's reply. A server may answer the handshake at once and load its
/// tools after it, or load them first: only the whole start compares the
/// two alike. Each server is started once, unmeasured, before the start
/// that is measured and then called. As in [`all`](super::all), an error of
/// `report` ends the measuring.
pub fn compare(
    options: &BenchOptions,
    command: &str,
    tool: &str,
    arguments: &JsonObject,
    mut report: impl FnMut(Figure) -> Result<()>,
) -> Result<()> {
    let workspace = tempdir()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| Error::io("start a runtime for", &options.keel, error))?;
    let shell = "/bin/sh";
    rt.block_on(async {
        let serve = || super::keel_serve(options, &options.tools, workspace.path());
        let theirs = || {
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
            theirs
        };
        let keel_spawn = async || Server::spawn(serve(), workspace.path(), &options.keel).await;
        let keel_call = async |keel: &Server| keel.call().await;
        let their_spawn = async || {
            Server::connect(theirs(), workspace.path(), PATIENCE).await.map_err(|cause| {
                Error::Failed(format!(
                    "`{command}` did not start as an MCP server on stdio (run by `sh -c`): {cause}"
                ))
            })
        };
        let their_call = async |other: &Server| {
            other.call_tool(tool, arguments).await.map_err(|error| {
                Error::Failed(format!(
                    "`{command}` could not call {tool} with {}: {error}",
                    Value::Object(arguments.clone())
                ))
            })
        };
        // A start of each first, unmeasured: the starts measured are then
        // what a user meets day to day, keel's plugins in its compile cache
        // and a launcher's downloads (`npx`, `uv run`) done, not a machine's
        // first start of either.
        started(&keel_spawn, &keel_call).await?.1.close().await;
        started(&their_spawn, &their_call).await?.1.close().await;
        let ([keel_first, keel_start], keel) = started(&keel_spawn, &keel_call).await?;
        let ([other_first, other_start], other) = started(&their_spawn, &their_call).await?;
        let name = format!("(keel serve echo / {command}: {tool})");
        let [latency, cpu] =
            round_trip(options, (&keel, || keel.call()), (&other, || other.call_tool(tool, arguments)))
                .await?;
        report(Figure::new(&format!("mcp_stdio_round_trip_p50 {name}"), latency[0], latency[1], "µs"))?;
        report(Figure::new(&format!("mcp_stdio_server_cpu_per_call {name}"), cpu[0], cpu[1], "µs"))?;
        let calls = 200;
        let (keel_ms, keel_lost) = keel.burst(calls).await;
        let (other_ms, other_lost) = other.burst_of(calls, tool, arguments).await;
        report(Figure::new(
            &format!("mcp_stdio_burst_{calls} (all answered, ms) {name}"),
            keel_ms,
            other_ms,
            "ms",
        ))?;
        report(answered(
            &format!("mcp_stdio_burst_{calls}_answered (keel serve replies / calls sent)"),
            keel_lost,
            calls,
        ))?;
        report(answered(
            &format!("mcp_stdio_burst_{calls}_answered ({command} replies / calls sent)"),
            other_lost,
            calls,
        ))?;
        report(Figure::new(&format!("mcp_stdio_first_call {name}"), keel_first, other_first, "ms"))?;
        report(Figure::new(
            &format!("mcp_stdio_start_to_first_reply {name}"),
            keel_start,
            other_start,
            "ms",
        ))?;
        keel.close().await;
        other.close().await;
        Ok(())
    })
}

/// A start of a server: `spawn` (the process and the handshake), then
/// `first_call`; the first call alone and the whole start, in ms.
async fn started(
    spawn: impl AsyncFn() -> Result<Server>,
    first_call: impl AsyncFn(&Server) -> Result<()>,
) -> Result<([f64; 2], Server)> {
    let spawned = Instant::now();
    let server = spawn().await?;
    let called = Instant::now();
    first_call(&server).await?;
    let done = Instant::now();
    let ms = |since: Instant| (done - since).as_secs_f64() * 1e3;
    Ok(([ms(called), ms(spawned)], server))
}

/// What one server's measured calls took.
#[derive(Default)]
struct Sample {
    /// Each round trip, in µs.
    latencies: Vec<f64>,
    /// The server's CPU time over the measured calls, in nanoseconds.
    cpu_nanos: u64,
}

impl Sample {
    /// In µs.
    fn cpu_per_call(&self) -> f64 {
        self.cpu_nanos as f64 / 1e3 / self.latencies.len() as f64
    }
}

/// A server process and the client connected to it.
struct Server {
    client: RunningService<RoleClient, ()>,
    pid: u32,
    /// How long a call may wait for its reply.
    reply_within: Duration,
}

/// Whether `error`, or an error it came of, is a write to a closed pipe.
fn is_broken_pipe(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |error| error.source()).any(|error| {
        error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|error| error.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

impl Server {
    async fn spawn(command: tokio::process::Command, workspace: &Path, keel: &Path) -> Result<Self> {
        Server::connect(command, workspace, PATIENCE).await.map_err(|cause| failed(keel, cause))
    }

    /// [`Server::spawn`], failing with only the cause: the server could not
    /// be spawned, exited at once, or did not answer the handshake.
    async fn connect(
        mut command: tokio::process::Command,
        workspace: &Path,
        patience: Patience,
    ) -> Result<Self, String> {
        command.current_dir(workspace);
        let (transport, _) =
            TokioChildProcess::builder(command).spawn().map_err(|error| error.to_string())?;
        let pid = transport.id().ok_or("it exited at once")?;
        // Dropped unanswered, the transport kills the server.
        match tokio::time::timeout(patience.handshake, ().serve(transport)).await {
            Ok(Ok(client)) => Ok(Server { client, pid, reply_within: patience.reply }),
            // Gone before `initialize` was read: whether its output's end or
            // its input's came first (the request then meets a closed pipe)
            // is the scheduler's choice.
            Ok(Err(ClientInitializeError::ConnectionClosed(_))) => {
                Err("it closed its stdout without answering `initialize`".to_string())
            }
            Ok(Err(ClientInitializeError::TransportError { error, .. })) if is_broken_pipe(&*error.error) => {
                Err("it closed its stdout without answering `initialize`".to_string())
            }
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no reply to the handshake within {:?}", patience.handshake)),
        }
    }

    /// One `echo` call; fails unless it echoes.
    async fn call(&self) -> Result<()> {
        self.echo(TEXT).await
    }

    /// One `echo` call of `text`; fails unless it echoes `text`.
    async fn echo(&self, text: &str) -> Result<()> {
        let arguments = JsonObject::from_iter([("text".to_string(), Value::from(text))]);
        let result = self.reply("echo", CallToolRequestParams::new("echo").with_arguments(arguments)).await?;
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
        let result =
            self.reply(NO_TOOL, CallToolRequestParams::new(NO_TOOL).with_arguments(echo_arguments())).await?;
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
    /// reply in time ([`PATIENCE`]).
    async fn burst(&self, calls: usize) -> (f64, usize) {
        let started = Instant::now();
        let replies = futures::future::join_all(
            (0..calls).map(|i| async move { self.echo(&format!("burst-{i}")).await }),
        )
        .await;
        let lost = replies
            .iter()
            .filter(|reply| match reply {
                Ok(()) => false,
                Err(error) => {
                    tracing::warn!("a burst call failed: {error}");
                    true
                }
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
        let before = tree_cpu_nanos(self.pid)?;
        for _ in 0..calls {
            let started = Instant::now();
            call().await?;
            sample.latencies.push(started.elapsed().as_secs_f64() * 1e6);
        }
        sample.cpu_nanos += tree_cpu_nanos(self.pid)?.saturating_sub(before);
        Ok(())
    }

    /// One call of `tool` with `arguments`; fails if the call fails or its
    /// result is an error.
    async fn call_tool(&self, tool: &str, arguments: &JsonObject) -> Result<()> {
        let request = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.clone());
        let result = self.reply(tool, request).await?;
        if result.is_error == Some(true) {
            return Err(failed(Path::new(tool), format!("an error result {:?}", result.content)));
        }
        Ok(())
    }

    /// [`Server::burst`] of `tool` with `arguments`, whose results cannot
    /// be told apart: a reply is lost when it is missing or an error.
    async fn burst_of(&self, calls: usize, tool: &str, arguments: &JsonObject) -> (f64, usize) {
        let started = Instant::now();
        let replies = futures::future::join_all((0..calls).map(|_| self.call_tool(tool, arguments))).await;
        let lost = replies.iter().filter(|reply| reply.is_err()).count();
        (started.elapsed().as_secs_f64() * 1e3, lost)
    }

    /// The result of the call `request` of `tool`, if it comes in time
    /// ([`PATIENCE`]).
    async fn reply(&self, tool: &str, request: CallToolRequestParams) -> Result<CallToolResult> {
        match tokio::time::timeout(self.reply_within, self.client.call_tool(request)).await {
            Ok(result) => result.map_err(|error| failed(Path::new(tool), error)),
            Err(_) => {
                Err(Error::Failed(format!("a call of {tool} got no reply within {:?}", self.reply_within)))
            }
        }
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

/// [`cpu_nanos`] of process `pid` and of every process under it: a server
/// started through a launcher (`npx`, `uv run`) does its work in a child.
fn tree_cpu_nanos(pid: u32) -> Result<u64> {
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
    Ok(tree.iter().skip(1).filter_map(|&pid| cpu_nanos(pid).ok()).sum::<u64>() + cpu_nanos(pid)?)
}

/// The CPU time of process `pid`, all its threads, in nanoseconds: its
/// CPU-time clock (`clock_getcpuclockid`). `/proc/<pid>/stat` counts the
/// same time in units of 10 ms, each the CPU time of some 200 to 400 `echo`
/// calls: too coarse to tell two servers apart over a few thousand.
///
/// The clock is exact to the nanosecond for a process whose threads all
/// wait, as a server does between replies: the kernel settles a thread's
/// time when it stops. A thread still running counts only to its last
/// scheduler tick (4 ms at 250 Hz), so the figures read it before the first
/// call and after the last reply.
fn cpu_nanos(pid: u32) -> Result<u64> {
    let process = format!("/proc/{pid}");
    let fail = |error| Error::io("read the CPU clock of", &process, error);
    let pid = libc::pid_t::try_from(pid).map_err(|_| fail(std::io::Error::other("not a process id")))?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid place for the clock's id; the call writes
    // nothing else.
    let status = unsafe { libc::clock_getcpuclockid(pid, &mut clock) };
    if status != 0 {
        return Err(fail(std::io::Error::from_raw_os_error(status)));
    }
    let mut time = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `time` is a valid place for the time; the call writes nothing
    // else.
    if unsafe { libc::clock_gettime(clock, &mut time) } != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    Ok(u64::try_from(time.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(time.tv_nsec).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Patience, Server};

    /// A server that never answers the handshake, or answers it and then no
    /// call, ends the figures with an error that says so, not a wait
    /// without end. `cat` sends the client's `initialize` back to it.
    #[test]
    fn a_server_that_does_not_answer_is_given_up_on() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let workspace = tempfile::tempdir().unwrap();
        let brief = Duration::from_millis(300);
        let shell = |script: &str| {
            let mut command = tokio::process::Command::new("sh");
            command.args(["-c", script]);
            command
        };
        rt.block_on(async {
            let patience = Patience { handshake: brief, reply: brief };
            let cause = Server::connect(shell("exec cat"), workspace.path(), patience).await.err();
            assert_eq!(cause.as_deref(), Some("no reply to the handshake within 300ms"));
            let cause = Server::connect(shell("exit 0"), workspace.path(), patience).await.err();
            assert_eq!(cause.as_deref(), Some("it closed its stdout without answering `initialize`"));

            // Answers `initialize`, then reads every request and answers none.
            let mute = r#"read -r line; printf '%s\n' '{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"mute","version":"0"}}}'; while read -r line; do :; done"#;
            let patience = Patience { handshake: Duration::from_secs(30), reply: brief };
            let server = Server::connect(shell(mute), workspace.path(), patience).await.unwrap();
            let error = server.call_tool("echo", &super::echo_arguments()).await.unwrap_err();
            assert_eq!(error.to_string(), "a call of echo got no reply within 300ms");
            server.close().await;
        });
    }

    /// A server's CPU time, read while it waits for its next request, counts
    /// each request's own work, far below the 10 ms units of
    /// `/proc/<pid>/stat` and a scheduler tick. The server here is a shell
    /// that counts to 50 for each line it echoes.
    #[test]
    fn a_waiting_servers_cpu_time_counts_each_requests_work() {
        use std::io::{BufRead as _, BufReader, Write as _};
        use std::process::{Command, Stdio};

        let script =
            "while read -r line; do i=0; while [ $i -lt 50 ]; do i=$((i+1)); done; echo \"$line\"; done";
        let mut server = Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = server.id();
        let mut requests = server.stdin.take().unwrap();
        let mut replies = BufReader::new(server.stdout.take().unwrap());
        let mut call = |line: &str| {
            writeln!(requests, "{line}").unwrap();
            let mut reply = String::new();
            replies.read_line(&mut reply).unwrap();
            assert_eq!(reply.trim_end(), line);
            // The server writes its reply just before it waits again: give it
            // the time to reach the wait before the clock is read.
            std::thread::sleep(Duration::from_millis(1));
        };
        call("warm");
        let calls = 40;
        let mut steps = Vec::new();
        let mut last = super::cpu_nanos(pid).unwrap();
        for n in 0..calls {
            call(&n.to_string());
            let now = super::cpu_nanos(pid).unwrap();
            steps.push(now - last);
            last = now;
        }
        drop(requests);
        server.wait().unwrap();

        // A clock that moved only at ticks would show nothing for most calls
        // and a whole tick for a few.
        let counted = steps.iter().filter(|&&step| step > 0).count();
        assert!(counted >= calls * 3 / 4, "{counted} of {calls} calls counted: {steps:?}");
        steps.sort_unstable();
        let median = steps[steps.len() / 2];
        assert!(median < 2_000_000, "a call's median was {median} ns: {steps:?}");

        // A process that is gone has no clock to read, and says which.
        let gone = super::cpu_nanos(pid).unwrap_err().to_string();
        assert!(gone.contains(&format!("/proc/{pid}")), "{gone}");
    }
}
