//! Figure 8: the MCP round trip. `keel serve` runs as a child process and an
//! rmcp client drives it over stdio, one `tools/call` of `echo` at a time;
//! the baseline is the same client driving the smallest rmcp stdio server
//! with a native echo tool ([`serve_native_echo`]), spawned from the same
//! binary. Both report the round trip's median and the server's CPU time
//! per call, read from `/proc/<pid>/stat`.

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

use super::{BenchOptions, Figure, median};
use keel_host::{Error, Result};

/// The arguments that make the `keel` binary serve the native echo of
/// [`serve_native_echo`] on stdio: the baseline of the MCP figures.
pub const NATIVE_ECHO_ARGS: [&str; 2] = ["bench", "--serve-native-echo"];

/// What every call echoes.
const TEXT: &str = "hello";

/// The smallest MCP server over the transport `keel serve` uses: rmcp on
/// stdio pipes, one `echo` tool answered natively. Serves until the client
/// closes stdin.
pub fn serve_native_echo() -> std::io::Result<()> {
    // The runtime of `keel serve`, so the two servers differ only in the tool.
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let (stdin, stdout) = rmcp::transport::stdio_pipes();
        let transport = AsyncRwTransport::new_server(stdin, stdout);
        let service = NativeEcho.serve(transport).await.map_err(std::io::Error::other)?;
        service.waiting().await.map_err(std::io::Error::other)?;
        Ok(())
    })
}

/// One tool, `echo`, that returns its `text`.
struct NativeEcho;

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
/// per call, `keel serve` against the native echo server.
pub(super) fn round_trip(options: &BenchOptions) -> Result<[Figure; 2]> {
    let workspace = tempfile::tempdir().map_err(|error| Error::io("create", std::env::temp_dir(), error))?;
    let ticks_per_second = clock_ticks_per_second()? as f64;
    let (warm_up, rounds, per_round) =
        (options.scale(200, 50), options.scale(5, 1), options.scale(1_000, 400));
    // CPU time is read in clock ticks, 10 ms on most systems: more rounds,
    // up to ten times the planned ones, until each server's CPU time spans
    // enough ticks that a tick more or less matters little.
    let (min_ticks, max_rounds) = (options.scale(20, 2) as u64, 10 * rounds);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| Error::io("start a runtime for", &options.keel, error))?;
    let (keel, native) = rt.block_on(async {
        let mut serve = tokio::process::Command::new(&options.keel);
        serve.arg("serve").arg("--plugins").arg(&options.tools).arg("--workspace").arg(workspace.path());
        let keel = Server::spawn(serve, workspace.path(), &options.keel).await?;
        let mut echo = tokio::process::Command::new(&options.keel);
        echo.args(NATIVE_ECHO_ARGS);
        let native = Server::spawn(echo, workspace.path(), &options.keel).await?;
        for _ in 0..warm_up {
            keel.call().await?;
            native.call().await?;
        }
        let (mut keel_sample, mut native_sample) = (Sample::default(), Sample::default());
        for round in 0..max_rounds {
            let enough = keel_sample.cpu_ticks.min(native_sample.cpu_ticks) >= min_ticks;
            if round >= rounds && enough {
                break;
            }
            native.measure(per_round, &mut native_sample).await?;
            keel.measure(per_round, &mut keel_sample).await?;
        }
        keel.close().await;
        native.close().await;
        Ok::<_, Error>((keel_sample, native_sample))
    })?;
    let name = "(keel serve / native rmcp echo)";
    let cpu = Figure::new(
        &format!("mcp_server_cpu_per_call {name}"),
        keel.cpu_per_call(ticks_per_second),
        native.cpu_per_call(ticks_per_second),
        "µs",
    );
    let latency = Figure::new(
        &format!("mcp_round_trip_p50 {name}"),
        median(keel.latencies),
        median(native.latencies),
        "µs",
    );
    Ok([latency.keel_at_most(100.0), cpu.keel_at_most(50.0)])
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
        let arguments = JsonObject::from_iter([("text".to_string(), Value::from(TEXT))]);
        let result = self
            .client
            .call_tool(CallToolRequestParams::new("echo").with_arguments(arguments))
            .await
            .map_err(|error| failed(Path::new("echo"), error))?;
        let echoed = match result.content.as_slice() {
            [block] => block.as_text().map(|text| text.text.as_str()),
            _ => None,
        };
        if result.is_error == Some(true) || echoed != Some(TEXT) {
            return Err(failed(Path::new("echo"), format!("unexpected result {result:?}")));
        }
        Ok(())
    }

    /// `calls` calls one after another, each timed, and the server's CPU
    /// time over all of them.
    async fn measure(&self, calls: usize, sample: &mut Sample) -> Result<()> {
        let before = cpu_ticks(self.pid)?;
        for _ in 0..calls {
            let started = Instant::now();
            self.call().await?;
            sample.latencies.push(started.elapsed().as_secs_f64() * 1e6);
        }
        sample.cpu_ticks += cpu_ticks(self.pid)? - before;
        Ok(())
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
