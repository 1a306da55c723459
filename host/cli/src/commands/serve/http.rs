//! `keel serve --http ADDR`: MCP over streamable HTTP, on `/mcp`.
//!
//! rmcp's server transport speaks the protocol: the stateless 2026-07-28
//! version, with sessions kept only for clients of 2025-11-25 and earlier;
//! `Host` checked against an allow-list (loopback names by default) and any
//! `Origin` a browser sends refused unless listed, so DNS rebinding gets
//! nowhere; a body over the cap refused with `413` while it streams, before
//! it is parsed. Around it, this module:
//! - refuses a body whose declared length is over the cap with `413` before
//!   reading any of it (so a client that asked to be invited to send it,
//!   `Expect: 100-continue`, is not);
//! - ends a request whose body sends nothing for the idle timeout with
//!   `408`;
//! - answers `404` to a `DELETE` of a session it does not hold, as to any
//!   other request naming one, where rmcp answers `202`;
//! - refuses an `initialize` with `503` while the server holds
//!   `--max-sessions` sessions, where rmcp has no bound;
//! - answers a body that is not a JSON-RPC message with `400` and a JSON-RPC
//!   parse or invalid-request error, where rmcp gives `415`;
//! - answers `/mcp`, and `/metrics` when metrics are served here
//!   ([`super::metrics`]); `404` elsewhere;
//! - checks the bearer token, when there is one, in constant time: a missing
//!   or wrong one gets `401` with `WWW-Authenticate`, and the request never
//!   reaches the tools or the metrics;
//! - checks `Host` (over HTTP/2, `:authority`) and `Origin` for `/mcp` and
//!   `/metrics` alike ([`rebinding`]), before rmcp does;
//! - refuses to start on an address that is not loopback without a token;
//! - cuts off a client that takes longer than the header timeout to send a
//!   request's head, or leaves a connection idle past the idle timeout.
//!
//! TLS belongs to a proxy in front (see the README).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use hyper::body::{Body as _, Incoming};
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use subtle::ConstantTimeEq as _;
use tokio_util::sync::CancellationToken;

use super::Server;
use super::metrics::{self, Endpoint, METRICS_PATH};
use rebinding::Rebinding;

mod rebinding;

/// The header that names an older client's session.
const SESSION_ID: &str = "mcp-session-id";

/// The path the server answers on.
pub const MCP_PATH: &str = "/mcp";

/// Where `--http` alone listens: loopback only.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7331";

/// The flags of the HTTP transport.
#[derive(Args, Clone, Debug)]
pub struct HttpArgs {
    /// Serve MCP over streamable HTTP on this address instead of stdio;
    /// `--http` alone is `127.0.0.1:7331`, on loopback.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = DEFAULT_ADDR)]
    pub http: Option<SocketAddr>,
    /// A file holding the bearer token clients must send (surrounding
    /// whitespace is ignored).
    #[arg(long, value_name = "PATH", requires = "http", conflicts_with = "token_env")]
    pub token_file: Option<PathBuf>,
    /// An environment variable holding the bearer token clients must send.
    #[arg(long, value_name = "NAME", requires = "http")]
    pub token_env: Option<String>,
    /// A `Host` the server answers to, beside `localhost`, `127.0.0.1` and
    /// `::1` (repeat for more): the names clients reach it by.
    #[arg(long = "allow-host", value_name = "HOST", requires = "http", value_parser = allowed_host)]
    pub allow_hosts: Vec<String>,
    /// A browser `Origin` allowed to call (such as
    /// `https://app.example.com:443`; repeat for more), beside pages of
    /// this machine (`http://localhost`, `127.0.0.1`, `[::1]`, any port).
    /// Any other `Origin` is refused; a request with none (a program, not a
    /// page) passes.
    #[arg(long = "allow-origin", value_name = "ORIGIN", requires = "http", value_parser = allowed_origin)]
    pub allow_origins: Vec<String>,
    /// The largest request body accepted, in KiB; a larger one gets `413`
    /// before it is parsed.
    #[arg(long, value_name = "KIB", default_value_t = 4096 + 64, requires = "http", value_parser = one_or_more)]
    pub max_body_kib: u64,
    /// Seconds a client may take to send a request's head, and a
    /// connection may stay idle, before it is cut off.
    #[arg(long, value_name = "SECS", default_value_t = 30, requires = "http", value_parser = one_or_more)]
    pub idle_timeout_secs: u64,
    /// The most sessions of older clients (MCP 2025-11-25 and earlier) held
    /// at once; an `initialize` past it gets `503`. Each holds about 90 KB
    /// until its client ends it or leaves it unused for 5 minutes; 0 serves
    /// stateless clients only.
    #[arg(long, value_name = "COUNT", default_value_t = 1000, requires = "http")]
    pub max_sessions: usize,
}

/// `--allow-host`'s value as a `Host` header names a server: a name or an
/// address (an IPv6 one in brackets), with or without a port. Anything else
/// (a URL, a path) could never match, and would be ignored in silence.
fn allowed_host(value: &str) -> Result<String, String> {
    if is_host_and_port(value) {
        Ok(value.to_owned())
    } else {
        Err("a Host is a name or address with an optional port, such as tools.example.com or 10.0.0.5:7331, \
             without a scheme or path"
            .into())
    }
}

/// `kib` KiB in bytes, or as many as a `usize` holds.
fn bytes_of_kib(kib: u64) -> usize {
    usize::try_from(kib.saturating_mul(1 << 10)).unwrap_or(usize::MAX)
}

/// A count of `--max-body-kib` or `--idle-timeout-secs`: 0 would refuse
/// every request, or cut every client off at once.
fn one_or_more(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(0) => Err("must be 1 or more".into()),
        Ok(count) => Ok(count),
        Err(error) => Err(error.to_string()),
    }
}

/// `--allow-origin`'s value as a browser's `Origin` header names a page:
/// `scheme://host[:port]` (`:*` for any port), or `null`; read as the MCP
/// server reads it. Anything else (a bare name) could never match, and
/// would be ignored in silence.
fn allowed_origin(value: &str) -> Result<String, String> {
    let page = value.strip_suffix(":*").unwrap_or(value);
    let well_formed = value.eq_ignore_ascii_case("null")
        || hyper::http::Uri::try_from(page).is_ok_and(|uri| {
            uri.scheme_str().is_some_and(|scheme| !scheme.is_empty())
                && uri.authority().is_some_and(|authority| !authority.host().is_empty())
        });
    if well_formed {
        Ok(value.to_owned())
    } else {
        Err("an Origin is scheme://host[:port] (`:*` for any port), such as https://app.example.com:443"
            .into())
    }
}

/// Whether `text` is a host name or address, with an optional port: what a
/// `Host` header holds (an IPv6 address in brackets).
fn is_host_and_port(text: &str) -> bool {
    let (host, port) = match text.rsplit_once(':') {
        // A colon inside the host is an IPv6 address's, not the port's.
        Some((host, port)) if !host.contains(':') || host.ends_with(']') => (host, Some(port)),
        _ => (text, None),
    };
    let host_is_well_formed = match host.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')) {
        Some(address) => address.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)),
    };
    let port_is_a_number =
        |port: &str| port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok();
    host_is_well_formed && port.is_none_or(port_is_a_number)
}

/// The bearer token of `args`, if it names one; an error names what could
/// not be read, or why what was read cannot be a token.
fn token(args: &HttpArgs) -> Result<Option<Arc<[u8]>>> {
    let (text, source) = match (&args.token_file, &args.token_env) {
        (Some(path), _) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("failed to read the token file {}", path.display()))?,
            format!("the token file {}", path.display()),
        ),
        (None, Some(name)) => match std::env::var(name) {
            Ok(text) => (text, format!("the token variable {name}")),
            Err(std::env::VarError::NotPresent) => bail!("the token variable {name} is not set"),
            Err(std::env::VarError::NotUnicode(_)) => bail!("the token variable {name} is not valid UTF-8"),
        },
        (None, None) => return Ok(None),
    };
    bearer_token(&text, &source).map(Some)
}

/// The token `text` holds (surrounding whitespace aside), read from
/// `source`: one line of visible ASCII characters, as a client can send it
/// in an `Authorization` header. Any other token could never be matched, and
/// every request would be refused.
fn bearer_token(text: &str, source: &str) -> Result<Arc<[u8]>> {
    let token = text.trim();
    if token.is_empty() {
        bail!("{source} holds no token");
    }
    if !token.bytes().all(|byte| byte.is_ascii_graphic()) {
        bail!(
            "{source} does not hold one token: a bearer token is one line of visible ASCII characters, without spaces"
        );
    }
    Ok(token.as_bytes().into())
}

/// The `Host` names a server answers to: loopback names and `allowed`.
pub fn allowed_hosts(allowed: &[String]) -> Vec<String> {
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(allowed.iter().cloned());
    hosts
}

/// Serve `server` on `addr` until the process is stopped; `/metrics` too
/// when `metrics` is given.
pub async fn serve(
    server: Server,
    addr: SocketAddr,
    args: &HttpArgs,
    metrics: Option<Endpoint>,
) -> Result<()> {
    let token = token(args)?;
    if token.is_none() && !addr.ip().is_loopback() {
        bail!(
            "refusing to serve on {addr} without a bearer token: it is not a loopback address; \
             give --token-file or --token-env"
        );
    }
    let hosts = allowed_hosts(&args.allow_hosts);
    let cancel = CancellationToken::new();
    let stopping = server.stopping.clone();
    // Pages served from this machine may call; a page of any other origin
    // (a rebinding attack's) only when listed.
    let mut origins: Vec<String> =
        ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"].map(String::from).to_vec();
    origins.extend(args.allow_origins.iter().cloned());
    let rebinding = Rebinding::new(&hosts, Some(&origins));
    // A stateless request whose handler sends nothing before its result is
    // answered with that result as JSON, not an event stream that stays open
    // until the handler's task is gone; one that reports progress first
    // still gets a stream.
    let config = StreamableHttpServerConfig::default()
        .with_json_response(true)
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_max_request_body_bytes(bytes_of_kib(args.max_body_kib))
        .with_cancellation_token(cancel.child_token());
    let sessions = Arc::new(LocalSessionManager::default());
    let mcp = StreamableHttpService::new(move || Ok(server.for_client()), sessions.clone(), config);
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("failed to listen on {addr}"))?;
    let bound = listener.local_addr()?;
    tracing::info!("serving MCP on http://{bound}{MCP_PATH}");
    // The address actually bound, for whoever started us with port 0.
    super::say(format_args!("keel: serving MCP on http://{bound}{MCP_PATH}"));
    // One runtime per core, each on a thread of its own, and the
    // connections dealt to them in turn: an HTTP/1.1 connection's requests,
    // their calls and their sandboxes then stay on one core, where a runtime
    // shared by every core hands each request from worker to worker and
    // each hand-over misses the caches the request warmed. Such a connection
    // carries one request at a time, so it loses no parallelism; an HTTP/2
    // one carries many at once, and is handed back to the shared runtime,
    // whose workers share its calls.
    let shared = tokio::runtime::Handle::current();
    let max_body = bytes_of_kib(args.max_body_kib);
    let idle = Duration::from_secs(args.idle_timeout_secs);
    let max_sessions = args.max_sessions;
    let gate = Arc::new(Gate { token, metrics, rebinding, max_body, idle, sessions, max_sessions });
    let connection = Connections { mcp, gate, idle, stopping: stopping.clone(), shared };
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let (mut dealt, mut ended) = (Vec::with_capacity(cores), Vec::with_capacity(cores));
    for core in 0..cores {
        let (deal, connections) = tokio::sync::mpsc::unbounded_channel();
        let connection = connection.clone();
        let (_, end) = super::call_thread(format!("keel-http-{core}"), move |runtime| {
            runtime.block_on(connection.serve_dealt(connections))
        })?;
        dealt.push(deal);
        ended.push(end);
    }
    for turn in 0.. {
        let (stream, peer) = tokio::select! {
            accepted = accept(&listener, "a connection") => accepted,
            () = stopping.cancelled() => break,
        };
        match stream.into_std() {
            Ok(stream) => {
                let _ = dealt[turn % cores].send((stream, peer));
            }
            Err(error) => tracing::debug!(%peer, "failed to deal the connection: {error}"),
        }
    }
    // No connection is taken from here on; the runtimes end as their open
    // connections answer their requests.
    drop((listener, dealt));
    for end in ended {
        end.await.context("a runtime serving connections panicked")?;
    }
    Ok(())
}

/// What every connection is served with.
#[derive(Clone)]
struct Connections<S> {
    mcp: S,
    gate: Arc<Gate>,
    idle: Duration,
    /// Cancelled when the server stops: each connection then answers the
    /// requests it has, and closes.
    stopping: CancellationToken,
    /// The runtime every core's worker shares, where HTTP/2 connections go.
    shared: tokio::runtime::Handle,
}

impl<S> Connections<S>
where
    S: tower_service::Service<Request<ToRmcp>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    /// Serve each connection `connections` deals this thread's runtime in
    /// a task of its own, until no more come (the server stops taking them);
    /// then end once each has answered its requests.
    async fn serve_dealt(
        self,
        mut connections: tokio::sync::mpsc::UnboundedReceiver<(std::net::TcpStream, SocketAddr)>,
    ) {
        let mut serving = tokio::task::JoinSet::new();
        loop {
            let (stream, peer) = tokio::select! {
                dealt = connections.recv() => match dealt {
                    Some(dealt) => dealt,
                    None => break,
                },
                // Finished connections are let go of as they end.
                Some(_) = serving.join_next(), if !serving.is_empty() => continue,
            };
            match tokio::net::TcpStream::from_std(stream) {
                Ok(stream) => {
                    serving.spawn(self.clone().serve_here_or_shared(stream, peer));
                }
                Err(error) => tracing::debug!(%peer, "failed to take the connection: {error}"),
            }
        }
        while serving.join_next().await.is_some() {}
    }

    /// Serve an HTTP/1.1 connection here, and hand an HTTP/2 one (known by
    /// its preface) to the shared runtime, waiting for it to end there.
    async fn serve_here_or_shared(self, stream: tokio::net::TcpStream, peer: SocketAddr) {
        let preface = tokio::select! {
            preface = tokio::time::timeout(self.idle, is_http2(&stream)) => preface,
            () = self.stopping.cancelled() => return,
        };
        match preface {
            Ok(Ok(false)) => self.serve(stream, peer).await,
            Ok(Ok(true)) => match stream.into_std() {
                Ok(stream) => {
                    let shared = self.shared.clone();
                    let handed = shared.spawn(async move {
                        match tokio::net::TcpStream::from_std(stream) {
                            Ok(stream) => self.serve(stream, peer).await,
                            Err(error) => {
                                tracing::debug!(%peer, "failed to hand the connection over: {error}")
                            }
                        }
                    });
                    let _ = handed.await;
                }
                Err(error) => tracing::debug!(%peer, "failed to hand the connection over: {error}"),
            },
            Ok(Err(error)) => tracing::debug!(%peer, "connection ended: {error}"),
            Err(_) => tracing::debug!(%peer, "connection idle for {:?}: cut off", self.idle),
        }
    }

    /// Serve one connection until it ends, idles past the timeout, or the
    /// server stops: then its requests are answered, and it closes (HTTP/2
    /// sends GOAWAY; HTTP/1.1 takes no next request).
    async fn serve(self, stream: tokio::net::TcpStream, peer: SocketAddr) {
        // A reply goes out in more than one write (its head, then its
        // events); with Nagle's algorithm on, a write waits for the client's
        // delayed ACK of the one before, 40 ms on Linux.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%peer, "failed to set TCP_NODELAY: {error}");
        }
        let Connections { mcp, gate, idle, stopping, .. } = self;
        let activity = Activity::new();
        let watched = Watched { inner: stream, activity: activity.clone() };
        let in_service = activity.clone();
        let service = hyper::service::service_fn(move |request| {
            let (mut mcp, gate, activity) = (mcp.clone(), gate.clone(), in_service.clone());
            async move {
                let _busy = activity.busy();
                Ok::<_, Infallible>(gate.answer(request, &mut mcp).await)
            }
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(idle);
        builder.http2().timer(TokioTimer::new()).keep_alive_interval(idle / 2).keep_alive_timeout(idle);
        let connection = builder.serve_connection(TokioIo::new(watched), service);
        tokio::pin!(connection);
        let outcome = tokio::select! {
            outcome = connection.as_mut() => outcome,
            () = activity.idle_for(idle) => {
                tracing::debug!(%peer, "connection idle for {idle:?}: cut off");
                return;
            }
            () = stopping.cancelled() => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(error) = outcome {
            tracing::debug!(%peer, "connection ended: {error}");
        }
    }
}

/// What an HTTP/2 client sends first on a connection without TLS.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How many bytes of [`HTTP2_PREFACE`] tell an HTTP/2 client: `PRI`, a
/// method no HTTP/1.1 server accepts, was chosen for the preface so that
/// its first line could be told apart (RFC 9113 §3.4). The rest is hyper's
/// to read, under the connection's idle watch.
const HTTP2_TOLD_BY: usize = 3;

/// Whether the client of `stream` speaks HTTP/2, by the first bytes it sent,
/// which are left to be read. Until enough have come to tell, the task
/// sleeps until the socket has more to read: a client that stalls midway
/// costs nothing while it waits.
async fn is_http2(stream: &tokio::net::TcpStream) -> std::io::Result<bool> {
    let mut head = [0; HTTP2_TOLD_BY];
    loop {
        stream.readable().await?;
        // Peeked within `try_io`, so that a peek that finds too few bytes
        // clears the readiness it saw, and none that came after it.
        let peeked = stream.try_io(tokio::io::Interest::READABLE, || {
            let peeked = peek(stream, &mut head)?;
            if 0 < peeked && peeked < head.len() && head[..peeked] == HTTP2_PREFACE[..peeked] {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            Ok(peeked)
        });
        match peeked {
            Ok(peeked) => return Ok(peeked == head.len() && head[..] == HTTP2_PREFACE[..head.len()]),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
}

/// The bytes waiting to be read from `stream`, copied into `into` and left
/// there, without waiting for any: through a second handle on the same
/// socket, which std peeks through and which shares the socket's
/// non-blocking mode, so that it fails with `WouldBlock` when none wait.
fn peek(stream: &tokio::net::TcpStream, into: &mut [u8]) -> std::io::Result<usize> {
    use std::os::fd::AsFd as _;
    std::net::TcpStream::from(stream.as_fd().try_clone_to_owned()?).peek(into)
}

/// The next connection `listener` accepts. A failed accept of one
/// connection (a client gone) loses that connection only: it is logged as
/// failing to accept `what`, and the listener goes on. When the process is
/// out of descriptors or memory, every accept fails at once until some are
/// freed: that is logged once, and accepting is tried again every
/// [`RESOURCES_RETRY`], not at once in a loop that logs every failure.
async fn accept(listener: &tokio::net::TcpListener, what: &str) -> (tokio::net::TcpStream, SocketAddr) {
    let mut short = false;
    loop {
        match listener.accept().await {
            Ok(accepted) => {
                if short {
                    // Said as the failure was, so that whoever saw it sees it end.
                    tracing::warn!("accepting {what} again");
                }
                return accepted;
            }
            Err(error) if out_of_resources(&error) => {
                if !short {
                    tracing::warn!(
                        "failed to accept {what}: {error}; trying again every {} ms",
                        RESOURCES_RETRY.as_millis()
                    );
                    short = true;
                }
                tokio::time::sleep(RESOURCES_RETRY).await;
            }
            Err(error) => tracing::warn!("failed to accept {what}: {error}"),
        }
    }
}

/// How long the listener waits before accepting again when the process is
/// out of descriptors or memory: long enough not to spin, short enough that
/// a connection closed meanwhile soon makes room.
const RESOURCES_RETRY: Duration = Duration::from_millis(100);

/// Whether a failed accept says the process or the system is short of what
/// every connection needs, rather than that one connection failed.
fn out_of_resources(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// What one connection is doing: when it last moved a byte, and how many of
/// its requests are being answered. A connection that moved nothing for the
/// idle timeout while answering nothing is cut off; a long call keeps its
/// connection, and an open event stream sends keep-alive events.
#[derive(Clone)]
struct Activity(Arc<ActivityState>);

struct ActivityState {
    since: std::sync::Mutex<tokio::time::Instant>,
    busy: std::sync::atomic::AtomicUsize,
}

/// A request being answered; dropped when its handler returns.
struct Busy(Activity);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.0.busy.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.0.touch();
    }
}

impl Activity {
    fn new() -> Self {
        Activity(Arc::new(ActivityState {
            since: std::sync::Mutex::new(tokio::time::Instant::now()),
            busy: std::sync::atomic::AtomicUsize::new(0),
        }))
    }

    fn touch(&self) {
        *self.0.since.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = tokio::time::Instant::now();
    }

    fn busy(&self) -> Busy {
        self.0.busy.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Busy(self.clone())
    }

    /// Resolves once the connection has been idle for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let since = *self.0.since.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let busy = self.0.busy.load(std::sync::atomic::Ordering::Relaxed) > 0;
            if !busy && since.elapsed() >= idle {
                return;
            }
            let wait = if busy { idle } else { idle.saturating_sub(since.elapsed()) };
            tokio::time::sleep(wait.max(Duration::from_millis(50))).await;
        }
    }
}

/// A connection's stream, noting every byte it moves in its [`Activity`].
struct Watched<S> {
    inner: S,
    activity: Activity,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, data);
        if let std::task::Poll::Ready(Ok(n)) = polled
            && n > 0
        {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The answer of `endpoint` to a request for `/metrics` that passed the
/// checks: the metrics to a `GET` (or `HEAD`), `405` to any other method.
fn metrics_response<B>(endpoint: &Endpoint, request: &Request<B>) -> Response<Body> {
    if request.method() != hyper::Method::GET && request.method() != hyper::Method::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "metrics are read with GET\n");
        response.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let mut response = plain(StatusCode::OK, endpoint.render());
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(metrics::CONTENT_TYPE));
    response
}

/// `--metrics-addr`: serve `/metrics` alone on `addr`, a loopback address,
/// without a token, until the process is stopped. `hosts` are the `Host`
/// names accepted, as on the MCP listener; any `Origin` passes, as there is
/// nothing a page could change.
pub async fn serve_metrics(endpoint: Endpoint, addr: SocketAddr, hosts: Arc<[String]>) -> Result<()> {
    if !addr.ip().is_loopback() {
        bail!("refusing to serve metrics on {addr} without a token: it is not a loopback address");
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("failed to listen for metrics on {addr}"))?;
    let bound = listener.local_addr()?;
    tracing::info!("serving metrics on http://{bound}{METRICS_PATH}");
    // The address actually bound, for whoever started us with port 0.
    super::say(format_args!("keel: serving metrics on http://{bound}{METRICS_PATH}"));
    let rebinding = Arc::new(Rebinding::new(&hosts, None));
    tokio::spawn(async move {
        loop {
            let (stream, peer) = accept(&listener, "a metrics connection").await;
            let (endpoint, rebinding) = (endpoint.clone(), rebinding.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let response = if request.uri().path() != METRICS_PATH {
                        plain(
                            StatusCode::NOT_FOUND,
                            format!("not found: keel serves metrics on {METRICS_PATH}\n"),
                        )
                    } else if let Err(refusal) = rebinding.check(&request) {
                        refused(&refusal)
                    } else {
                        metrics_response(&endpoint, &request)
                    };
                    async move { Ok::<_, Infallible>(response) }
                });
                let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder
                    .http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(std::time::Duration::from_secs(30));
                if let Err(error) = builder.serve_connection(TokioIo::new(stream), service).await {
                    tracing::debug!(%peer, "metrics connection ended: {error}");
                }
            });
        }
    });
    Ok(())
}

/// The body of every response.
type Body = BoxBody<Bytes, Infallible>;

/// What every request passes before it is answered.
struct Gate {
    /// The bearer token, when there is one.
    token: Option<Arc<[u8]>>,
    /// `/metrics`, when it is served here.
    metrics: Option<Endpoint>,
    rebinding: Rebinding,
    /// The largest body accepted, in bytes.
    max_body: usize,
    /// How long a request's body may send nothing before the request ends.
    idle: Duration,
    /// The sessions of older clients.
    sessions: Arc<LocalSessionManager>,
    /// The most sessions held at once.
    max_sessions: usize,
}

impl Gate {
    /// [`Gate::answer_checked`], with what a browser needs to let a page the
    /// server answers to call it: a CORS preflight of such a page is
    /// answered here (before the token, which a browser never sends on
    /// one), and every reply to such a page names it as allowed and shows it
    /// the session and protocol headers.
    async fn answer<S>(&self, request: Request<Incoming>, mcp: &mut S) -> Response<Body>
    where
        S: tower_service::Service<Request<ToRmcp>, Response = Response<Body>, Error = Infallible>,
    {
        let checked = self.rebinding.check(&request);
        let page = match request.headers().get(header::ORIGIN) {
            Some(origin) if checked.is_ok() => Some(origin.clone()),
            _ => None,
        };
        if let Some(page) = &page
            && request.method() == hyper::Method::OPTIONS
            && request.uri().path() == MCP_PATH
            && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            let mut response = Response::new(Full::new(Bytes::new()).boxed());
            *response.status_mut() = StatusCode::NO_CONTENT;
            let headers = response.headers_mut();
            headers
                .insert(header::ACCESS_CONTROL_ALLOW_METHODS, header::HeaderValue::from_static(CORS_METHODS));
            headers
                .insert(header::ACCESS_CONTROL_ALLOW_HEADERS, header::HeaderValue::from_static(CORS_HEADERS));
            headers.insert(header::ACCESS_CONTROL_MAX_AGE, header::HeaderValue::from_static("600"));
            return allowed_page(response, page.clone());
        }
        let response = self.answer_checked(request, checked, mcp).await;
        match page {
            Some(page) => {
                let mut response = allowed_page(response, page);
                let exposed = header::HeaderValue::from_static(CORS_EXPOSED);
                response.headers_mut().insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, exposed);
                response
            }
            None => response,
        }
    }

    /// `/mcp`, then the token and the `Host` and `Origin` checks (`checked`,
    /// their outcome), then rmcp; `/metrics` the same way when it is served
    /// here; anything else answered here.
    async fn answer_checked<S>(
        &self,
        request: Request<Incoming>,
        checked: Result<(), rebinding::Refusal>,
        mcp: &mut S,
    ) -> Response<Body>
    where
        S: tower_service::Service<Request<ToRmcp>, Response = Response<Body>, Error = Infallible>,
    {
        let path = request.uri().path();
        let metrics = self.metrics.as_ref().filter(|_| path == METRICS_PATH);
        if path != MCP_PATH && metrics.is_none() {
            return plain(StatusCode::NOT_FOUND, format!("not found: keel serves MCP on {MCP_PATH}\n"));
        }
        if let Some(token) = &self.token {
            // As RFC 6750 answers them: a request with no bearer token is
            // told one is needed, without an error code; a wrong one is
            // `invalid_token`.
            let refused = match bearer(request.headers().get(header::AUTHORIZATION), token) {
                Bearer::Right => None,
                Bearer::Missing => Some((
                    "a bearer token is required: Authorization: Bearer TOKEN\n",
                    "Bearer realm=\"keel\"",
                )),
                Bearer::Wrong => Some((
                    "the bearer token is not the one this server was given\n",
                    "Bearer realm=\"keel\", error=\"invalid_token\"",
                )),
            };
            if let Some((text, challenge)) = refused {
                let mut response = plain(StatusCode::UNAUTHORIZED, text);
                let challenge = header::HeaderValue::from_static(challenge);
                response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
                return response;
            }
        }
        if let Err(refusal) = checked {
            return refused(&refusal);
        }
        if let Some(endpoint) = metrics {
            return metrics_response(endpoint, &request);
        }
        // A body declared too large is refused before any of it is read, as
        // rmcp would once it had read that much.
        let declared = request.body().size_hint().lower();
        if !usize::try_from(declared).is_ok_and(|declared| declared <= self.max_body) {
            return self.too_large();
        }
        // rmcp ends a session it does not hold, and says it did.
        let unknown = match request.headers().get(SESSION_ID).map(header::HeaderValue::to_str) {
            Some(Ok(id)) if request.method() == hyper::Method::DELETE => {
                !self.sessions.sessions.read().await.contains_key(id)
            }
            _ => false,
        };
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let version = request.version();
        let (idle, watching) = (self.idle, stalled.clone());
        let request = request.map(|body| Sent { body, idle, deadline: None, stalled: watching });
        let response = match self.within_sessions(request).await {
            Ok(request) => mcp_response(request, mcp).await,
            Err(response) => response,
        };
        if unknown && response.status() == StatusCode::ACCEPTED {
            return plain(StatusCode::NOT_FOUND, "Not Found: Session not found");
        }
        if !stalled.load(std::sync::atomic::Ordering::Relaxed) {
            return response;
        }
        let mut response = plain(
            StatusCode::REQUEST_TIMEOUT,
            format!("request timeout: the body sent nothing for {} s\n", idle.as_secs()),
        );
        if version < hyper::Version::HTTP_2 {
            // The rest of the body would be read as the next request.
            response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
        }
        response
    }

    /// The `413` of a body over the cap, in rmcp's words for it.
    fn too_large(&self) -> Response<Body> {
        plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Payload Too Large: request body exceeds {} bytes", self.max_body),
        )
    }

    /// `request` as rmcp is to get it, or what it is answered here: an
    /// `initialize`, which would open a session, while the server holds
    /// `max_sessions` of them. Only then is a request that names no session
    /// read here, to see what it asks; the sessions a moment's concurrent
    /// `initialize` requests open may pass the bound by as many.
    async fn within_sessions(&self, request: Request<Sent>) -> Result<Request<ToRmcp>, Response<Body>> {
        let may_open = request.method() == hyper::Method::POST && !request.headers().contains_key(SESSION_ID);
        if !may_open || self.sessions.sessions.read().await.len() < self.max_sessions {
            return Ok(request.map(http_body_util::Either::Left));
        }
        let (parts, body) = request.into_parts();
        let body = match http_body_util::Limited::new(body, self.max_body).collect().await {
            Ok(body) => body.to_bytes(),
            Err(error) if error.is::<http_body_util::LengthLimitError>() => return Err(self.too_large()),
            Err(error) => {
                return Err(plain(
                    StatusCode::BAD_REQUEST,
                    format!("failed to read the request body: {error}\n"),
                ));
            }
        };
        /// What of a message tells an `initialize` request.
        #[derive(serde::Deserialize)]
        struct Opening {
            method: Option<String>,
            id: Option<serde_json::Value>,
        }
        match serde_json::from_slice::<Opening>(&body) {
            Ok(Opening { method: Some(method), id: Some(id) }) if method == "initialize" => {
                let message = format!(
                    "the server holds its maximum of {} sessions (--max-sessions): end one with DELETE, or use \
                     the stateless 2026-07-28 protocol, which needs none",
                    self.max_sessions
                );
                tracing::debug!("refused an initialize: {message}");
                let error = serde_json::json!({
                    "jsonrpc": "2.0", "id": id, "error": { "code": SESSIONS_FULL, "message": message }
                });
                let mut response = Response::new(Full::new(Bytes::from(error.to_string())).boxed());
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
                Err(response)
            }
            _ => Ok(Request::from_parts(parts, http_body_util::Either::Right(Full::new(body)))),
        }
    }
}

/// The JSON-RPC error code of an `initialize` refused for the sessions the
/// server holds: one of those JSON-RPC leaves to a server's own errors.
const SESSIONS_FULL: i32 = -32000;

/// A request's body as rmcp gets it: as it comes from the connection, or
/// already read whole ([`Gate::within_sessions`]).
type ToRmcp = http_body_util::Either<Sent, Full<Bytes>>;

/// rmcp's answer to `request`, a `415` for a body it cannot read made a
/// `400` ([`unreadable_body`]).
async fn mcp_response<S>(request: Request<ToRmcp>, mcp: &mut S) -> Response<Body>
where
    S: tower_service::Service<Request<ToRmcp>, Response = Response<Body>, Error = Infallible>,
{
    let response = match mcp.call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return unreadable_body(response).await;
    }
    response
}

/// A request's body as rmcp reads it: the connection's, ended with an error
/// once it has sent nothing for the idle timeout. The connection's own idle
/// watch does not cut it off meanwhile, as a request is being answered.
struct Sent {
    body: Incoming,
    idle: Duration,
    /// When the body is cut off; set when it first has nothing to give, and
    /// put off by each frame after that.
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// Set once the body was cut off.
    stalled: Arc<std::sync::atomic::AtomicBool>,
}

impl hyper::body::Body for Sent {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use std::future::Future as _;
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.body).poll_frame(cx) {
            std::task::Poll::Ready(frame) => {
                if let Some(deadline) = &mut this.deadline {
                    deadline.as_mut().reset(tokio::time::Instant::now() + this.idle);
                }
                std::task::Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            std::task::Poll::Pending => {
                let idle = this.idle;
                let deadline = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                if deadline.as_mut().poll(cx).is_pending() {
                    return std::task::Poll::Pending;
                }
                this.stalled.store(true, std::sync::atomic::Ordering::Relaxed);
                std::task::Poll::Ready(Some(Err(format!("the body sent nothing for {idle:?}").into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// What rmcp says of a body it could not read as a JSON-RPC message.
const UNREADABLE_BODY: &str = "fail to deserialize request body ";

/// rmcp's `415` for a body that is JSON-typed but not a JSON-RPC message
/// it reads, as MCP asks for a message it cannot accept: `400`, with a
/// JSON-RPC error of no id (the exchange is the request's own) saying what
/// is wrong, as a stdio request gets it. Any other `415` (a body that is not
/// `application/json`) as it is.
async fn unreadable_body(response: Response<Body>) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let Ok(text) = body.collect().await.map(|body| body.to_bytes());
    let Some(reason) = std::str::from_utf8(&text).ok().and_then(|text| text.strip_prefix(UNREADABLE_BODY))
    else {
        return Response::from_parts(parts, Full::new(text).boxed());
    };
    let (code, message) = match reason.strip_prefix("unrecognized JSON-RPC message") {
        Some(_) => (
            rmcp::model::ErrorCode::INVALID_REQUEST,
            "the request is not a JSON-RPC 2.0 message: a request has `jsonrpc` \"2.0\", an `id`, a string \
             `method` and object `params`"
                .to_owned(),
        ),
        None => (rmcp::model::ErrorCode::PARSE_ERROR, format!("the request is not valid JSON: {reason}")),
    };
    let error =
        serde_json::json!({ "jsonrpc": "2.0", "id": null, "error": { "code": code.0, "message": message } });
    let mut response = Response::new(Full::new(Bytes::from(error.to_string())).boxed());
    *response.status_mut() = StatusCode::BAD_REQUEST;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}

/// What an `Authorization` header holds, against the server's token.
#[derive(Debug, PartialEq)]
enum Bearer {
    /// No header, or another scheme than `Bearer`.
    Missing,
    /// A bearer token that is not the server's.
    Wrong,
    /// The server's token.
    Right,
}

/// Whether `value` is `Bearer <token>` (the scheme in any case, as RFC 7235
/// has it), the token compared in constant time.
fn bearer(value: Option<&header::HeaderValue>, token: &[u8]) -> Bearer {
    let Some(bytes) = value.map(header::HeaderValue::as_bytes) else { return Bearer::Missing };
    let Some((scheme, given)) = bytes.split_at_checked(7) else { return Bearer::Missing };
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return Bearer::Missing;
    }
    if bool::from(given.ct_eq(token)) { Bearer::Right } else { Bearer::Wrong }
}

/// The `403` of a request refused by the `Host` and `Origin` checks. Any
/// client can be refused, so this is logged from `KEEL_LOG=debug` only, as
/// everything a client did is.
fn refused(refusal: &rebinding::Refusal) -> Response<Body> {
    tracing::debug!("refused a request: {}", refusal.text().trim_end());
    plain(StatusCode::FORBIDDEN, refusal.text())
}

/// The methods a page may call `/mcp` with.
const CORS_METHODS: &str = "GET, POST, DELETE";

/// The request headers a page may send `/mcp`: MCP's own, the body's type
/// and what it accepts, and the bearer token.
const CORS_HEADERS: &str = "authorization, content-type, accept, last-event-id, mcp-protocol-version, \
     mcp-session-id, mcp-method, mcp-name";

/// The reply headers a page may read: MCP's own.
const CORS_EXPOSED: &str = "mcp-session-id, mcp-protocol-version, www-authenticate";

/// `response`, to a page the server answers to, naming that page as allowed
/// to read it.
fn allowed_page(mut response: Response<Body>, page: header::HeaderValue) -> Response<Body> {
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, page);
    headers.append(header::VARY, header::HeaderValue::from_static("origin"));
    response
}

/// A plain-text response.
fn plain(status: StatusCode, text: impl Into<String>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(text.into())).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_alone_listens_on_loopback() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            http: HttpArgs,
        }
        let alone = Cli::parse_from(["keel", "--http"]);
        assert_eq!(alone.http.http, Some(DEFAULT_ADDR.parse().unwrap()));
        assert!(alone.http.http.unwrap().ip().is_loopback());
        let given = Cli::parse_from(["keel", "--http", "127.0.0.1:9000"]);
        assert_eq!(given.http.http, Some("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(Cli::parse_from(["keel"]).http.http, None, "stdio unless asked");
        assert_eq!(alone.http.max_sessions, 1000);
        for flag in ["--max-body-kib", "--idle-timeout-secs"] {
            let error = Cli::try_parse_from(["keel", "--http", flag, "0"]).err().unwrap().to_string();
            assert!(error.contains("must be 1 or more"), "{flag}: {error}");
        }
        assert_eq!(bytes_of_kib(18_014_398_509_481_984), usize::MAX, "as many as can be, never wrapped to 0");
    }

    #[test]
    fn a_bearer_token_is_one_line_of_visible_ascii() {
        let source = "the token file t";
        assert_eq!(&*bearer_token("  s3cr3t-~+/=\n", source).unwrap(), b"s3cr3t-~+/=");
        let refused = |text: &str| bearer_token(text, source).unwrap_err().to_string();
        assert_eq!(refused(" \n"), "the token file t holds no token");
        let unsendable = "the token file t does not hold one token: a bearer token is one line of visible ASCII \
                          characters, without spaces";
        assert_eq!(refused("s3cr3t\n# the old one: 0ld\n"), unsendable);
        assert_eq!(refused("two words"), unsendable);
        assert_eq!(refused("caf\u{e9}"), unsendable);
    }

    #[test]
    fn an_allowed_host_or_origin_that_could_never_match_is_refused() {
        for host in ["tools.example.com", "keel:80", "10.0.0.5:7331", "[::1]", "[::1]:9464", "my_host"] {
            assert_eq!(allowed_host(host).as_deref(), Ok(host));
        }
        for host in [
            "http://x.com",
            "x.com/mcp",
            "",
            "x.com:",
            "x.com:http",
            "x.com:+80",
            "[::1",
            "[x]:80",
            "::1",
            "a b",
        ] {
            assert!(allowed_host(host).is_err(), "{host}");
        }
        for origin in
            ["https://app.example.com:443", "http://localhost:*", "http://[::1]:*", "null", "HTTPS://a.b"]
        {
            assert_eq!(allowed_origin(origin).as_deref(), Ok(origin));
        }
        for origin in ["example.com", "example.com:443", "://a.b", "https://", "a b", ""] {
            assert!(allowed_origin(origin).is_err(), "{origin}");
        }
    }

    #[test]
    fn only_the_exact_bearer_token_matches() {
        let bearer = |text: Option<&str>| {
            let value = text.map(|text| header::HeaderValue::from_str(text).unwrap());
            bearer(value.as_ref(), b"s3cret")
        };
        assert_eq!(bearer(Some("Bearer s3cret")), Bearer::Right);
        assert_eq!(bearer(Some("bearer s3cret")), Bearer::Right);
        assert_eq!(bearer(Some("BEARER s3cret")), Bearer::Right, "the scheme is in any case");
        assert_eq!(bearer(Some("Bearer s3cre")), Bearer::Wrong);
        assert_eq!(bearer(Some("Bearer s3cret2")), Bearer::Wrong);
        assert_eq!(bearer(Some("Bearer S3CRET")), Bearer::Wrong, "the token is not");
        assert_eq!(bearer(Some("Bearer ")), Bearer::Wrong);
        assert_eq!(bearer(Some("Basic s3cret")), Bearer::Missing);
        assert_eq!(bearer(Some("s3cret")), Bearer::Missing);
        assert_eq!(bearer(Some("Bearers3cret")), Bearer::Missing);
        assert_eq!(bearer(None), Bearer::Missing);
    }
}
