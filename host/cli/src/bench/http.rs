//! The MCP figures over streamable HTTP: `keel serve --http` as a child
//! process against the smallest rmcp server with a native echo tool on the
//! same transport ([`serve_native_echo_http`]), spawned from the same binary.
//!
//! The client is a plain HTTP one (hyper), speaking the stateless
//! 2026-07-28 protocol: every request carries what it needs, so any
//! replica answers it and no session is kept. Each client holds one
//! HTTP/1.1 connection; the burst shares one HTTP/2 connection, as a proxy
//! in front of a server would. Every reply is checked for its own request's
//! payload.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::mcp::NativeEcho;
use super::{BenchOptions, Figure, answered, median, resident_kib, tempdir};
use super::{Error, Result};

/// The arguments that make the `keel` binary serve the native echo over
/// streamable HTTP on a loopback port, printing the address it bound on
/// stderr as `keel serve --http` does: the baseline of the HTTP figures.
pub const NATIVE_ECHO_HTTP_ARGS: [&str; 2] = ["bench", "--serve-native-echo-http"];

/// What `keel serve --http` and the native server print once they listen.
const SERVING: &str = "serving MCP on http://";

/// Serve the native echo on streamable HTTP, on the same rmcp service and
/// connection builder `keel serve --http` uses and on the runtime it runs
/// calls on ([`crate::call_runtime`]), until killed.
pub fn serve_native_echo_http() -> std::io::Result<()> {
    let runtime = crate::call_runtime().build()?;
    runtime.block_on(async {
        // As `keel serve --http` configures it.
        let config = StreamableHttpServerConfig::default().with_json_response(true);
        let service =
            StreamableHttpService::new(|| Ok(NativeEcho), Arc::new(LocalSessionManager::default()), config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        eprintln!("keel: {SERVING}{}/mcp", listener.local_addr()?);
        loop {
            let (stream, _) = listener.accept().await?;
            // As `keel serve --http` sets it: see there.
            stream.set_nodelay(true)?;
            let service = service.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let mut service = service.clone();
                    async move { tower_service::Service::call(&mut service, request).await }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
            });
        }
    })
}

/// A server process listening on a loopback port, killed when dropped.
struct Server {
    child: tokio::process::Child,
    addr: SocketAddr,
}

impl Server {
    /// Start `command` and wait (at most 60 s) for the address it serves on.
    async fn spawn(mut command: tokio::process::Command, what: &Path) -> Result<Self> {
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = command.spawn().map_err(|error| Error::io("spawn", what, error))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut lines = BufReader::new(stderr).lines();
        let addr = tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.split_once(SERVING).map(|(_, rest)| rest)
                    && let Some(addr) = rest.strip_suffix("/mcp").and_then(|addr| addr.parse().ok())
                {
                    return Some(addr);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .ok_or_else(|| failed(what, "the server did not say where it listens"))?;
        // The rest of its log goes nowhere, but must be read.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Server { child, addr })
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }
}

/// `keel serve --http` over `workspace` with the plugins in `plugins`.
async fn keel_server(options: &BenchOptions, plugins: &Path, workspace: &Path) -> Result<Server> {
    let mut command = super::keel_serve(options, plugins, workspace);
    command.args(["--http", "127.0.0.1:0"]).current_dir(workspace);
    Server::spawn(command, &options.keel).await
}

async fn native_server(options: &BenchOptions) -> Result<Server> {
    let mut command = tokio::process::Command::new(&options.keel);
    command.args(NATIVE_ECHO_HTTP_ARGS);
    Server::spawn(command, &options.keel).await
}

/// One client's connection, HTTP/1.1 or HTTP/2.
#[derive(Clone)]
enum Connection {
    /// One request at a time.
    Http1(Arc<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>),
    /// Many at once.
    Http2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// A client of one server: a connection and the calls it makes.
#[derive(Clone)]
struct Client {
    addr: SocketAddr,
    connection: Connection,
}

impl Client {
    async fn connect(addr: SocketAddr, http2: bool) -> Result<Self> {
        let what = Path::new("the HTTP benchmark's client");
        let stream =
            tokio::net::TcpStream::connect(addr).await.map_err(|error| Error::io("connect", what, error))?;
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(stream);
        let connection = if http2 {
            let (send, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|error| failed(what, error))?;
            tokio::spawn(connection);
            Connection::Http2(send)
        } else {
            let (send, connection) =
                hyper::client::conn::http1::handshake(io).await.map_err(|error| failed(what, error))?;
            tokio::spawn(connection);
            Connection::Http1(Arc::new(tokio::sync::Mutex::new(send)))
        };
        Ok(Client { addr, connection })
    }

    /// One `tools/call` of `echo` with `text`; fails unless it echoes `text`.
    async fn echo(&self, id: u64, text: &str) -> Result<()> {
        self.call(id, Asked::Echo, text).await
    }

    /// One `tools/call` of what `asked` names, with `text`; fails unless
    /// the reply is the one `asked` expects.
    async fn call(&self, id: u64, asked: Asked, text: &str) -> Result<()> {
        let tool = asked.tool();
        let what = Path::new(tool);
        let body = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {
                "name": tool, "arguments": { "text": text },
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                    "io.modelcontextprotocol/clientInfo": { "name": "keel-bench", "version": "1" }
                }
            }
        });
        let request = Request::post("/mcp")
            .header("host", self.addr.to_string())
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool)
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        let response = match &self.connection {
            Connection::Http1(send) => {
                let mut send = send.lock().await;
                send.ready().await.map_err(|error| failed(what, error))?;
                send.send_request(request).await
            }
            Connection::Http2(send) => {
                let mut send = send.clone();
                send.ready().await.map_err(|error| failed(what, error))?;
                send.send_request(request).await
            }
        };
        check_reply(response, asked, text).await
    }
}

/// What a call asks for.
#[derive(Clone, Copy)]
enum Asked {
    /// `echo`, which returns the call's text.
    Echo,
    /// A tool the server does not have, which keel answers without a
    /// sandbox: an error result that names it.
    NoTool,
}

impl Asked {
    fn tool(self) -> &'static str {
        match self {
            Asked::Echo => "echo",
            Asked::NoTool => "no-such-tool",
        }
    }
}

async fn check_reply(
    response: std::result::Result<hyper::Response<hyper::body::Incoming>, hyper::Error>,
    asked: Asked,
    text: &str,
) -> Result<()> {
    let what = Path::new(asked.tool());
    let response = response.map_err(|error| failed(what, error))?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|error| failed(what, error))?.to_bytes();
    let body = String::from_utf8_lossy(&body);
    let message = message(&body);
    let result = message.as_ref().map(|message| &message["result"]);
    let said = result.and_then(|result| result["content"][0]["text"].as_str());
    let answered = match asked {
        Asked::Echo => said == Some(text),
        Asked::NoTool => {
            result.is_some_and(|result| result["isError"] == true)
                && said.is_some_and(|said| said.contains(asked.tool()))
        }
    };
    if !status.is_success() || !answered {
        return Err(failed(
            what,
            format!("{status}, expected the reply to {} of {text:?}: {body}", asked.tool()),
        ));
    }
    Ok(())
}

/// The JSON-RPC message of a reply: the body, or the last `data:` event.
fn message(body: &str) -> Option<Value> {
    if let Ok(value) = serde_json::from_str(body) {
        return Some(value);
    }
    let data = body
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .rfind(|data| data.trim().starts_with('{'))?;
    serde_json::from_str(data.trim()).ok()
}

/// `calls` calls of what `asked` names, one after another, each timed in
/// µs.
async fn latencies(client: &Client, calls: usize, asked: Asked) -> Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(calls);
    for id in 0..calls {
        let started = Instant::now();
        client.call(id as u64, asked, "hello").await?;
        samples.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok(samples)
}

/// `clients` clients, each with its own connection to one of `addrs` in
/// turn, making `calls` calls of what `asked` names in all: calls per
/// second.
async fn throughput(addrs: &[SocketAddr], clients: usize, calls: usize, asked: Asked) -> Result<f64> {
    let mut connected = Vec::new();
    for i in 0..clients {
        connected.push(Client::connect(addrs[i % addrs.len()], false).await?);
    }
    let per_client = calls.div_ceil(clients);
    let started = Instant::now();
    let tasks: Vec<_> = connected
        .into_iter()
        .enumerate()
        .map(|(i, client)| {
            tokio::spawn(async move {
                for call in 0..per_client {
                    let text = format!("c{i}-{call}");
                    client.call(call as u64, asked, &text).await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.map_err(|error| failed(Path::new("a client"), error))??;
    }
    Ok((per_client * clients) as f64 / started.elapsed().as_secs_f64())
}

/// Calls per second of `ours` and of `theirs`, measured in turn in each of
/// `rounds` rounds: the median of each. A round takes a tenth of a second or
/// less, and this machine's other work weighs much in so short a time; the
/// median of rounds side by side holds still where one measurement of each,
/// taken apart, moved by a fifth.
async fn paired_rates<A, B>(
    rounds: usize,
    mut ours: impl FnMut() -> A,
    mut theirs: impl FnMut() -> B,
) -> Result<(f64, f64)>
where
    A: Future<Output = Result<f64>>,
    B: Future<Output = Result<f64>>,
{
    let (mut our_rates, mut their_rates) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for _ in 0..rounds {
        our_rates.push(ours().await?);
        their_rates.push(theirs().await?);
    }
    Ok((median(our_rates), median(their_rates)))
}

/// 1,000 echoes at once on one HTTP/2 connection, each with its own text:
/// the milliseconds until the last reply, and how many got no right reply
/// within 60 s.
async fn burst(addr: SocketAddr, calls: usize) -> Result<(f64, usize)> {
    let client = Client::connect(addr, true).await?;
    let started = Instant::now();
    let tasks: Vec<_> = (0..calls)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let text = format!("burst-{i}");
                tokio::time::timeout(Duration::from_secs(60), client.echo(i as u64, &text)).await
            })
        })
        .collect();
    let mut lost = 0;
    for task in tasks {
        match task.await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => {
                tracing::warn!("a burst call failed: {error}");
                lost += 1;
            }
            _ => lost += 1,
        }
    }
    Ok((started.elapsed().as_secs_f64() * 1e3, lost))
}

/// Percentile `p` (0–100) of `samples`.
fn percentile(mut samples: Vec<f64>, p: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    let at = ((samples.len() as f64 - 1.0) * p / 100.0).round() as usize;
    samples[at]
}

/// The HTTP figures: round trip p50 and p99, calls per second with 1, 10
/// and 100 clients, the p50 and calls per second of a call keel answers
/// without a sandbox, two replicas against one, and the burst.
pub(super) fn figures(options: &BenchOptions, mut report: impl FnMut(Figure) -> Result<()>) -> Result<()> {
    let workspace = tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|error| Error::io("start a runtime for", &options.keel, error))?;
    let (warm_up, calls) = (options.scale(300, 50), options.scale(3_000, 300));
    rt.block_on(async {
        let keel = keel_server(options, &options.tools, workspace.path()).await?;
        let native = native_server(options).await?;
        let (keel_client, native_client) =
            (Client::connect(keel.addr, false).await?, Client::connect(native.addr, false).await?);
        latencies(&keel_client, warm_up, Asked::Echo).await?;
        latencies(&native_client, warm_up, Asked::Echo).await?;
        let (mut keel_samples, mut native_samples) = (Vec::new(), Vec::new());
        for _ in 0..options.scale(5, 1) {
            native_samples.extend(latencies(&native_client, calls / 5, Asked::Echo).await?);
            keel_samples.extend(latencies(&keel_client, calls / 5, Asked::Echo).await?);
        }
        let name = "(keel serve --http / native rmcp echo)";
        report(
            Figure::new(
                &format!("mcp_http_p50 {name}"),
                median(keel_samples.clone()),
                median(native_samples.clone()),
                "µs",
            )
            .at_most(1.5),
        )?;
        report(Figure::new(
            &format!("mcp_http_p99 {name}"),
            percentile(keel_samples, 99.0),
            percentile(native_samples, 99.0),
            "µs",
        ))?;
        let (keel_at, native_at) = ([keel.addr], [native.addr]);
        let rounds = options.scale(7, 1);
        for clients in [1, 10, 100] {
            let per_round = options.scale(1_000.max(clients * 20), 300.max(clients * 3));
            let (keel_rate, native_rate) = paired_rates(
                rounds,
                || throughput(&keel_at, clients, per_round, Asked::Echo),
                || throughput(&native_at, clients, per_round, Asked::Echo),
            )
            .await?;
            report(
                Figure::new(
                    &format!("mcp_http_calls_per_s_{clients}_clients {name}"),
                    keel_rate,
                    native_rate,
                    "calls/s",
                )
                .at_least(0.7),
            )?;
        }
        // What serving costs keel without a sandbox: a call of a tool it
        // does not have is answered by the same path up to the tool's
        // lookup, and makes no sandbox.
        let alone = "(keel serve --http answering a call of no tool / native rmcp echo)";
        latencies(&keel_client, warm_up, Asked::NoTool).await?;
        let (mut keel_samples, mut native_samples) = (Vec::new(), Vec::new());
        for _ in 0..options.scale(5, 1) {
            native_samples.extend(latencies(&native_client, calls / 5, Asked::Echo).await?);
            keel_samples.extend(latencies(&keel_client, calls / 5, Asked::NoTool).await?);
        }
        let (keel_p50, native_p50) = (median(keel_samples), median(native_samples));
        report(Figure::new(&format!("mcp_http_p50_no_sandbox {alone}"), keel_p50, native_p50, "µs"))?;
        let per_round = options.scale(1_000, 300);
        let (keel_rate, native_rate) = paired_rates(
            rounds,
            || throughput(&keel_at, 10, per_round, Asked::NoTool),
            || throughput(&native_at, 10, per_round, Asked::Echo),
        )
        .await?;
        report(Figure::new(
            &format!("mcp_http_calls_per_s_10_clients_no_sandbox {alone}"),
            keel_rate,
            native_rate,
            "calls/s",
        ))?;
        let second = keel_server(options, &options.tools, workspace.path()).await?;
        let replicas = [keel.addr, second.addr];
        let (two, one) = paired_rates(
            rounds,
            || throughput(&replicas, 10, per_round, Asked::Echo),
            || throughput(&keel_at, 10, per_round, Asked::Echo),
        )
        .await?;
        drop(second);
        report(Figure::new(
            "mcp_http_two_replicas (10 clients: two keel serve replicas / one)",
            two,
            one,
            "calls/s",
        ))?;
        let calls = options.scale(1_000, 200);
        let (keel_ms, keel_lost) = burst(keel.addr, calls).await?;
        let (native_ms, native_lost) = burst(native.addr, calls).await?;
        report(Figure::new(
            &format!("mcp_http_burst_{calls} (all answered, ms) {name}"),
            keel_ms,
            native_ms,
            "ms",
        ))?;
        report(answered(
            &format!("mcp_http_burst_{calls}_answered (keel serve replies / calls sent)"),
            keel_lost,
            calls,
        ))?;
        if native_lost > 0 {
            tracing::warn!("the native server lost {native_lost} of {calls} calls of the burst");
        }
        drop((keel, native));
        Ok::<_, Error>(())
    })?;
    memory(options, &rt, &mut report)
}

/// The resident memory of `keel serve --http` idle with 50 installed
/// plugins (their code cached, loaded and warmed up in the background once
/// the pool is ready), against the native server idle; and after 10,000
/// calls against after the first 1,000.
fn memory(
    options: &BenchOptions,
    rt: &tokio::runtime::Runtime,
    report: &mut impl FnMut(Figure) -> Result<()>,
) -> Result<()> {
    // Installed plugins: their code compiled and in the cache, their files
    // older than the cache's racy window, as after any earlier start.
    let plugins = super::fifty_plugins(options)?;
    let copied = Instant::now();
    let cache = tempdir()?;
    super::child_figures::<1>(options, &super::START_POOL_ARGS, plugins.path(), cache.path())?;
    std::thread::sleep(keel_host::load::floor::CACHE_RACY_WINDOW.saturating_sub(copied.elapsed()));
    let workspace = tempdir()?;
    rt.block_on(async {
        let mut command = super::keel_serve(options, plugins.path(), workspace.path());
        command
            .arg("--cache-dir")
            .arg(cache.path())
            .args(["--http", "127.0.0.1:0"])
            .current_dir(workspace.path());
        let keel = Server::spawn(command, &options.keel).await?;
        let native = native_server(options).await?;
        // Idle: started, and left alone for a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (idle, native_idle) =
            (resident_kib(&keel.pid().to_string())?, resident_kib(&native.pid().to_string())?);
        report(Figure::new(
            "mcp_http_serve_rss_idle_50_plugins (keel serve --http / native rmcp echo)",
            idle as f64 / 1024.0,
            native_idle as f64 / 1024.0,
            "MiB",
        ))?;
        let (first, total) = (options.scale(1_000, 200), options.scale(10_000, 2_000));
        throughput(&[keel.addr], 10, first, Asked::Echo).await?;
        let after_first = resident_kib(&keel.pid().to_string())?;
        throughput(&[keel.addr], 10, total - first, Asked::Echo).await?;
        let after_all = resident_kib(&keel.pid().to_string())?;
        report(
            Figure::new(
                &format!("mcp_http_serve_rss_growth (after {total} calls / after {first})"),
                after_all as f64 / 1024.0,
                after_first as f64 / 1024.0,
                "MiB",
            )
            .at_most(1.05),
        )?;
        Ok(())
    })
}

/// `what` (a server, a client or a tool) failed over HTTP with `error`.
fn failed(what: &Path, error: impl std::fmt::Display) -> Error {
    Error::Failed(format!("MCP over HTTP, {}: {error}", what.display()))
}
