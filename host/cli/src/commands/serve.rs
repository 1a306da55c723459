//! `keel serve`: the tool pool as a Model Context Protocol server, on stdio
//! or, with `--http`, over streamable HTTP ([`http`]).
//!
//! `tools/list` is the pool as a model sees it (`keel list`); `tools/call`
//! runs one call through the same path as a call of `keel run`: schema,
//! the tool's own checks, permissions, a fresh sandbox, result budgets,
//! events. Concurrent requests are admitted by the library's scheduler as a
//! stream of calls ([`keel_host::CallStream`]), under the rules of a batch:
//! concurrency-safe calls overlap up to the cap, any other call runs alone,
//! and calls are admitted in the order they arrived ([`arrivals`]). A
//! request with a progress token gets `notifications/progress` as the tool
//! reports progress; `notifications/cancelled` interrupts its call.
//!
//! Every failure of a call is a result with `isError: true`; the server
//! goes on. On stdio, standard output carries the protocol only; logs go to
//! stderr.

mod approval;
mod arrivals;
mod fast_calls;
mod forward;
mod http;
mod metrics;
mod reload;
mod stdio;
mod stop;
mod unreadable;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result};
use clap::Args;
use keel_host::load::{Access, Grants};
use keel_host::pool::definitions::model_description;
use keel_host::tool::{LogLevel, Tool, ToolOrigin, ToolSpec};
use keel_host::{Arrival, CallStream, Event, EventSink, Host, Interrupt, ToolResult, ToolUse};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CustomRequest, CustomResult,
    Implementation, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::run::HostArgs;

/// Arguments of `keel serve`.
#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    host: HostArgs,
    /// Also append every call's events to this file as JSON lines, as
    /// `keel run --events` prints them.
    #[arg(long, value_name = "PATH")]
    events: Option<PathBuf>,
    /// Also keep the calls served (the last 10,000) in this file in the
    /// Chrome trace-event format, written again after each call.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    http: http::HttpArgs,
    #[command(flatten)]
    metrics: metrics::MetricsArgs,
}

/// Tell whoever started the server `line` on stderr. A server whose stderr
/// is gone (the pipe's reader closed it) goes on as before: the line is
/// lost, where `eprintln!` would panic.
fn say(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Build the host from the flags and `keel.toml`, then answer MCP requests
/// on stdin and stdout until the client closes stdin, or over HTTP; either
/// until `SIGINT` or `SIGTERM` ([`stop`]).
pub fn run(args: &ServeArgs) -> Result<()> {
    let runtime = keel_cli::call_runtime().build()?;
    // From the start: a signal while the plugins load, or before a client
    // sends `initialize`, stops the server too.
    let stopping = CancellationToken::new();
    let trace = std::sync::OnceLock::new();
    let served = runtime.block_on(async {
        stop::Stop::listen()?.or(stopping.clone(), serve(args, stopping.clone(), &trace)).await
    });
    // What is left is not worth a wait the user asks to end: a signal now
    // (a second one, after a stop) ends keel at once.
    let signalled = stopping.is_cancelled();
    crate::interrupt::exit_on_signal(move |signal| match signalled {
        true => (format!("keel: {} again: stopping now", signal.name()), 0),
        false => (format!("keel: stopped by {}", signal.name()), signal.status()),
    })?;
    // The tasks still running are dropped now. A blocking read of stdin
    // cannot be cancelled: it is not waited for past the grace.
    runtime.shutdown_timeout(stop::GRACE);
    // Then the trace gets every call, however long its last write takes.
    if let Some(trace) = trace.get() {
        trace.finish();
    }
    served
}

/// Serve as [`run`] says, on the runtime, until `stopping` is cancelled;
/// then end once every request in flight is answered ([`stop`]).
async fn serve(
    args: &ServeArgs,
    stopping: CancellationToken,
    kept_trace: &std::sync::OnceLock<Arc<super::run::trace::TraceFile>>,
) -> Result<()> {
    let (config, config_path) = args.host.config_and_path()?;
    // A report that cannot be written, or would replace what the server
    // reads or the other report, is refused before anything loads.
    let reports = [("--events", "events file", &args.events), ("--trace", "trace", &args.trace)];
    let trace_target =
        super::run::trace::check_reports(&reports, || args.host.inputs(config_path.as_deref()))?
            .pop()
            .flatten();
    // Calls that need approval ask the user of the client that made them.
    let prompter = approval::ClientPrompter::default();
    // One session directory for the server's life, reloads included:
    // results persisted before a reload stay where they were shown.
    let session = session_dir(args.host.workspace.as_deref());
    let host_args = args.host.clone();
    let asker = prompter.clone();
    let builder = move || {
        // Each call's result is final: no ledger to keep them stable.
        let mut builder = host_args
            .builder_without_plugins()
            .config(config.clone())
            .without_ledger()
            .prompter(Arc::new(prompter.clone()));
        if let Some(dir) = &session {
            builder = builder.session_dir(dir.clone());
        }
        builder
    };
    let first = builder();
    let (_, grants) = first.resolve_grants()?;
    let limits = first.resolve_limits();
    let runtime = Arc::new(args.host.runtime(&limits, first.cache())?);
    // Every server over HTTP counts its calls; one on stdio only when
    // asked to serve them.
    let metrics = (args.http.http.is_some() || args.metrics.metrics_addr.is_some())
        .then(|| Arc::new(metrics::Metrics::new()));
    // Until it serves, a stop ends it at once: there is nothing to answer.
    let loading = reload::Plugins::load(args.host.plugin_paths()?, runtime.clone(), grants, limits);
    let loading = crate::progress::shown(crate::progress::LOADING, loading);
    let Some(plugins) = stopping.run_until_cancelled(loading).await else { return Ok(()) };
    let mut plugins = plugins?;
    if let Some(metrics) = &metrics {
        metrics.plugins_loaded(plugins.tools().len());
        plugins.count_in(metrics.clone());
    }
    let first = first.engine(runtime).plugin_tools(plugins.tools());
    let Some(host) = stopping.run_until_cancelled(first.build()).await else {
        return Ok(());
    };
    let host = host?;
    let events = match &args.events {
        Some(path) => Some(EventLog::create(path)?),
        None => None,
    };
    // Kept by `run` too, which writes it last, once the server is gone.
    let trace = match trace_target {
        Some(target) => {
            let trace = Arc::new(super::run::trace::TraceFile::create(target)?);
            Some(kept_trace.get_or_init(|| trace).clone())
        }
        None => None,
    };
    // On stdio, the session's thread runs the calls, and so their warm-ups.
    let transport = match args.http.http {
        Some(addr) => Transport::Http(addr),
        None => Transport::Stdio(stdio::Session::start()?),
    };
    let warm_on = match &transport {
        Transport::Stdio(session) => session.handle(),
        Transport::Http(_) => tokio::runtime::Handle::current(),
    };
    let server = Server { trace, stopping, ..Server::new(host, events, asker, metrics.clone(), warm_on) };
    let watched = server.clone();
    tokio::spawn(reload::watch(
        plugins,
        move || Ok(builder()),
        move |host| {
            let server = watched.clone();
            async move { server.reloaded(host).await }
        },
    ));
    let endpoint = metrics.map(|metrics| metrics::Endpoint::new(metrics, server.live.clone()));
    if let (Some(endpoint), Some(addr)) = (&endpoint, args.metrics.metrics_addr) {
        let hosts = http::allowed_hosts(&args.http.allow_hosts).into();
        http::serve_metrics(endpoint.clone(), addr, hosts).await?;
    }
    match transport {
        Transport::Http(addr) => {
            // `/metrics` on the MCP listener, behind its token, unless it
            // has a listener of its own.
            let endpoint = endpoint.filter(|_| args.metrics.metrics_addr.is_none());
            http::serve(server, addr, &args.http, endpoint).await
        }
        Transport::Stdio(session) => session.serve(server).await,
    }
}

/// A thread of its own, named `name`, whose current-thread runtime `run`
/// drives: the calls run there send their replies before their sandboxes
/// are torn down, and find its stack mapped. Gives the runtime's handle,
/// and what `run` returns once the thread ends.
fn call_thread<T: Send + 'static>(
    name: String,
    run: impl FnOnce(tokio::runtime::Runtime) -> T + Send + 'static,
) -> Result<(tokio::runtime::Handle, tokio::sync::oneshot::Receiver<T>)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .with_context(|| format!("failed to start the runtime of {name}"))?;
    let handle = runtime.handle().clone();
    let (done, ended) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            // A call's reply goes out before its sandbox is torn down.
            keel_host::defer_teardown_on_this_thread();
            // Its calls run on this thread's stack, not on a worker's.
            keel_host::prefault_thread_stack();
            let _ = done.send(run(runtime));
        })
        .context("failed to start a thread for calls")?;
    Ok((handle, ended))
}

/// Where the server takes its requests.
enum Transport {
    /// One session on stdin and stdout, on a thread of its own.
    Stdio(stdio::Session),
    /// Streamable HTTP on this address.
    Http(std::net::SocketAddr),
}

/// The result of a call that was still running on the shared runtime when
/// the process ended, after the drain ([`stop`]).
const STOPPED_AT_EXIT: &str = "Interrupted: keel stopped before the call finished.";

/// How many calls this server has received, in every version of its pool:
/// what names each call (`mcp-<n>`). A stream's arrival numbers start again
/// at 0 in the pool a reload puts in place, so they cannot name calls whose
/// persisted results share one session directory.
static CALLS_RECEIVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Where this server persists results: a session directory of its own under
/// the workspace's `.keel/session/` (the host's default session directory),
/// named by the start time and process id. Call ids (`mcp-<n>`) count from 0
/// in every server, so a shared directory would let a new server overwrite
/// the results an earlier conversation still points to. `None` when the
/// workspace cannot be opened: building the host reports that.
fn session_dir(workspace: Option<&std::path::Path>) -> Option<PathBuf> {
    let workspace = match workspace {
        Some(dir) => dir.canonicalize().ok()?,
        None => std::env::current_dir().ok()?.canonicalize().ok()?,
    };
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    let name = format!("mcp-{started}-{}", std::process::id());
    Some(workspace.join(".keel/session").join(name))
}

/// One version of the pool being served: the host, the stream its calls
/// arrive in, and its tools as MCP lists them. A reload puts another in
/// place; calls in flight keep the one they arrived in.
pub struct Live {
    stream: CallStream,
    tools: Arc<[rmcp::model::Tool]>,
    /// Kept for as long as calls of this version run.
    _host: Host,
    /// Told the results this version persisted, once it is gone.
    metrics: Option<Arc<metrics::Metrics>>,
    /// Its warm-up, stopped once another version is served: nothing is
    /// left to get ready for.
    warm_up: tokio::task::AbortHandle,
}

impl Live {
    /// The first version, or one in the place of `previous`, whose calls
    /// start once every call of `previous` has ended, from the context they
    /// left.
    fn new(
        host: Host,
        previous: Option<&CallStream>,
        metrics: Option<Arc<metrics::Metrics>>,
        warm_on: &tokio::runtime::Handle,
    ) -> Self {
        // Off the path of any call, on the runtime whose threads run the
        // calls: the first call of a plugin then neither loads its code nor
        // finds its pool slot cold.
        let warm_up = warm_on.spawn(host.warm_up()).abort_handle();
        let tools = mcp_tools(&host).into();
        let stream = match previous {
            Some(previous) => host.stream_after(previous),
            None => host.stream(keel_host::context::initial()),
        };
        Live { stream, tools, _host: host, metrics, warm_up }
    }

    /// The real name of the tool `name` calls, by its name or an alias.
    fn tool_name(&self, name: &str) -> Option<&str> {
        self._host.pool().get(name).map(|entry| entry.tool.spec().name.as_str())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(metrics) = &self.metrics {
            metrics.retire(self._host.results_persisted());
        }
    }
}

/// Where the current [`Live`] is kept.
#[derive(Clone)]
pub struct Shelf(Arc<std::sync::RwLock<Arc<Live>>>);

impl Shelf {
    fn new(live: Live) -> Self {
        Shelf(Arc::new(std::sync::RwLock::new(Arc::new(live))))
    }

    /// The version served now.
    pub fn current(&self) -> Arc<Live> {
        self.0.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Serve `live` from now on; the one it replaces lives on in the calls
    /// that hold it, and its warm-up stops (a tool's load under way ends
    /// first).
    fn replace(&self, live: Live) {
        let replaced = std::mem::replace(
            &mut *self.0.write().unwrap_or_else(|poisoned| poisoned.into_inner()),
            Arc::new(live),
        );
        replaced.warm_up.abort();
    }
}

/// The MCP server: the pool it serves now, and who it tells of changes.
/// Clones share them: over HTTP, each session (or stateless request) gets a
/// clone.
#[derive(Clone)]
struct Server {
    live: Shelf,
    /// The clients to tell when the tool list changes.
    peers: Arc<Mutex<Vec<Peer<RoleServer>>>>,
    events: Option<Arc<EventLog>>,
    /// What `/metrics` shows, when it is served.
    metrics: Option<Arc<metrics::Metrics>>,
    /// `--trace`: the calls served, kept in a trace file.
    trace: Option<Arc<super::run::trace::TraceFile>>,
    /// Who a call that needs approval asks.
    prompter: approval::ClientPrompter,
    /// The least level of tool log lines this client asked to be sent
    /// (`logging/setLevel`); none are sent until it asks.
    log_level: Arc<Mutex<Option<LogLevel>>>,
    /// Cancelled when the server stops: every call still to start or
    /// running is interrupted, so that its request is answered.
    stopping: CancellationToken,
    /// Where a stdio session's calls run; over HTTP, on the thread of the
    /// request.
    placement: Option<stdio::Placement>,
    /// The runtime each new pool is warmed up on.
    warm_on: tokio::runtime::Handle,
}

impl Server {
    fn new(
        host: Host,
        events: Option<EventLog>,
        prompter: approval::ClientPrompter,
        metrics: Option<Arc<metrics::Metrics>>,
        warm_on: tokio::runtime::Handle,
    ) -> Self {
        Server {
            live: Shelf::new(Live::new(host, None, metrics.clone(), &warm_on)),
            peers: Arc::default(),
            events: events.map(Arc::new),
            metrics,
            trace: None,
            prompter,
            log_level: Arc::default(),
            stopping: CancellationToken::new(),
            placement: None,
            warm_on,
        }
    }

    /// Serve `host` from now on, carrying the order of calls and the
    /// context on, and tell every client the tool list changed.
    async fn reloaded(&self, host: Host) {
        let previous = self.live.current();
        self.live.replace(Live::new(host, Some(&previous.stream), self.metrics.clone(), &self.warm_on));
        drop(previous);
        if let Some(metrics) = &self.metrics {
            metrics.reloaded();
        }
        // Clients gone since are forgotten; the rest are told.
        let peers: Vec<Peer<RoleServer>> = {
            let mut peers = self.peers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            peers.retain(|peer| !peer.is_transport_closed());
            peers.clone()
        };
        for peer in &peers {
            if let Err(error) = peer.notify_tool_list_changed().await {
                tracing::debug!("failed to tell a client the tool list changed: {error}");
            }
        }
    }

    /// This server for one more client: the same host and stream, and a
    /// log level of the client's own.
    fn for_client(&self) -> Self {
        Server { log_level: Arc::default(), ..self.clone() }
    }

    /// One call from arrival to result. A cancellation, or the server
    /// stopping, interrupts the call whenever it comes: before the call
    /// starts (it never starts) or while it runs.
    async fn call(
        &self,
        tool_use: ToolUse,
        tool: Option<&str>,
        arrival: Arrival,
        cancelled: &CancellationToken,
        progress: Option<Arc<forward::Forwarder<Value>>>,
        log: Option<(Arc<forward::LogLines>, LogLevel)>,
    ) -> ToolResult {
        let stopped = || cancelled.is_cancelled() || self.stopping.is_cancelled();
        // The server's stop interrupts the call the moment it comes; a
        // cancellation, below, when the call is next polled.
        let interrupt = Interrupt::child_of(&self.stopping);
        if stopped() {
            interrupt.interrupt();
        }
        // Every event goes to an events file; a client with a progress token
        // or a log level reads only what the tool reports; the metrics and a
        // trace read a call's start and end too.
        let meter = self.metrics.as_ref().map(|metrics| Arc::new(metrics.arrive(tool)));
        let (events, progress_to, log_to) = (self.events.clone(), progress.clone(), log.clone());
        let meter_to = meter.clone();
        let trace = self.trace.clone();
        let forward = move |event: Event| {
            if let Some(meter) = &meter_to {
                meter.see(&event);
            }
            if let (Some(progress), Event::Progress { data, .. }) = (&progress_to, &event) {
                progress.send(data.clone());
            }
            if let (Some((log, least)), Event::ToolLog { level, message, .. }) = (&log_to, &event)
                && level >= least
            {
                log.send((*level, message.clone()));
            }
            if let Some(events) = &events {
                events.write(&event);
            }
            if let Some(trace) = &trace {
                trace.record(&event);
            }
        };
        let sink = if self.events.is_some() {
            Some(EventSink::every(Arc::new(forward)))
        } else if progress.is_some() || log.is_some() || meter.is_some() || self.trace.is_some() {
            Some(EventSink::lean(Arc::new(forward)))
        } else {
            None
        };
        let run = arrival.run(tool_use, sink, &interrupt);
        tokio::pin!(run);
        // The cancellation first: a call whose turn came because a stop
        // interrupted the call before it (which gave its turn up) must see
        // its own interrupt before it starts, or it would run, a `block`
        // tool to its end, though the server stopped before it began.
        let result = tokio::select! {
            biased;
            () = async {
                tokio::select! {
                    () = cancelled.cancelled() => {}
                    () = self.stopping.cancelled() => {}
                }
            } => {
                interrupt.interrupt();
                run.await
            }
            result = &mut run => result,
        };
        if let Some(meter) = meter {
            meter.finish(&result, stopped());
        }
        if let Some(progress) = progress {
            progress.finish(&self.stopping).await;
        }
        if let Some((log, _)) = log {
            log.finish(&self.stopping).await;
        }
        result
    }
}

impl ServerHandler for Server {
    #[allow(deprecated, reason = "logging is deprecated from 2026-07-28 on; older clients still use it")]
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder().enable_tools().enable_tool_list_changed().enable_logging().build(),
        )
        .with_server_info(Implementation::new("keel", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Each tool runs as a WebAssembly component in a fresh sandbox with access to the \
                 workspace only.",
        )
    }

    #[allow(deprecated, reason = "logging is deprecated from 2026-07-28 on; older clients still use it")]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        *self.log_level.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some(log_level_of(request.level));
        Ok(())
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        let mut peers = self.peers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Sessions ended since are forgotten here too, not only at a reload:
        // a server never reloaded kept every HTTP session's peer.
        peers.retain(|peer| !peer.is_transport_closed());
        peers.push(context.peer);
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        if request.method == unreadable::TOO_LARGE_METHOD {
            let bytes = request.params.as_ref().and_then(|params| params["bytes"].as_u64()).unwrap_or(0);
            return Err(ErrorData::invalid_request(
                format!(
                    "the request was not read: it is {bytes} bytes, over the {} MiB limit of one message",
                    unreadable::MAX_MESSAGE_BYTES >> 20
                ),
                None,
            ));
        }
        if request.method == unreadable::INVALID_METHOD {
            let params = request.params.unwrap_or_default();
            let code = params["code"].as_i64().and_then(|code| i32::try_from(code).ok());
            let message = params["message"].as_str().unwrap_or("the request could not be read");
            let code = code.map_or(rmcp::model::ErrorCode::INVALID_REQUEST, rmcp::model::ErrorCode);
            return Err(ErrorData::new(code, message.to_owned(), None));
        }
        if let Some(why) = invalid_params(&request.method, request.params) {
            return Err(ErrorData::invalid_params(why, None));
        }
        let message = format!("method not found: {}", request.method);
        Err(ErrorData::new(rmcp::model::ErrorCode::METHOD_NOT_FOUND, message, None))
    }

    // The methods of what keel does not serve (resources, prompts): their
    // error says so, where rmcp's names only the method.
    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        Err(not_served::<rmcp::model::ListResourcesRequestMethod>())
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourceTemplatesResult, ErrorData> {
        Err(not_served::<rmcp::model::ListResourceTemplatesRequestMethod>())
    }

    async fn read_resource(
        &self,
        _request: rmcp::model::ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
        Err(not_served::<rmcp::model::ReadResourceRequestMethod>())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        Err(not_served::<rmcp::model::ListPromptsRequestMethod>())
    }

    async fn get_prompt(
        &self,
        _request: rmcp::model::GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, ErrorData> {
        Err(not_served::<rmcp::model::GetPromptRequestMethod>())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.live.current().tools.to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The pool it arrived in, which it runs in whatever reloads meanwhile.
        // On stdio the transport cancels it; over HTTP, rmcp.
        let (live, arrival, cancelled) = match context.extensions.remove::<arrivals::Stamped>() {
            Some(stamped) => (stamped.live, stamped.arrival, stamped.cancelled),
            None => {
                let live = self.live.current();
                let arrival = live.stream.arrive();
                (live, arrival, context.ct.clone())
            }
        };
        let id = format!("mcp-{}", CALLS_RECEIVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        tracing::debug!(request = %context.id, tool_use_id = %id, tool = %request.name, "call received");
        let registration = self.prompter.register(&id, &request, &context);
        let input = Value::Object(request.arguments.unwrap_or_default());
        let tool_use = ToolUse::new(id, request.name.as_ref(), input);
        let progress = context
            .meta
            .get_progress_token()
            .map(|token| Arc::new(forward::progress(context.peer.clone(), token)));
        let least = *self.log_level.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let log = least
            .map(|least| (Arc::new(forward::log(context.peer.clone(), request.name.to_string())), least));
        let tool = live.tool_name(&request.name);
        let result = match self.placement.as_ref().map(stdio::Placement::claim) {
            Some(Err(placement)) => {
                let (server, tool, cancelled) = (self.clone(), tool.map(str::to_owned), cancelled.clone());
                let id = tool_use.id.clone();
                let call = async move {
                    server.call(tool_use, tool.as_deref(), arrival, &cancelled, progress, log).await
                };
                placement.run_elsewhere(call).await.unwrap_or_else(|| ToolResult::error(id, STOPPED_AT_EXIT))
            }
            // Here, the session's thread taken until the call ends.
            _running => self.call(tool_use, tool, arrival, &cancelled, progress, log).await,
        };
        drop(live);
        // A call that stopped to ask its client answers with the question.
        if let Some(asked) =
            registration.as_ref().and_then(|registration| registration.round()?.input_required())
        {
            return Ok(asked.into());
        }
        drop(registration);
        let structured = result.structured.clone();
        let content = mcp_content(result.content);
        let mut result =
            if result.is_error { CallToolResult::error(content) } else { CallToolResult::success(content) };
        result.structured_content = structured;
        Ok(result.into())
    }
}

/// A result's blocks as MCP content: text as text, images as base64 image
/// content.
fn mcp_content(content: keel_host::Content) -> Vec<ContentBlock> {
    match content {
        keel_host::Content::Text(text) => vec![ContentBlock::text(text)],
        keel_host::Content::Blocks(blocks) => blocks
            .into_iter()
            .map(|block| match block {
                keel_host::ContentBlock::Text(text) => ContentBlock::text(text),
                keel_host::ContentBlock::Image(image) => {
                    ContentBlock::image(image.base64(), image.media_type)
                }
            })
            .collect(),
    }
}

/// The pool as the model sees it, as MCP tools.
fn mcp_tools(host: &Host) -> Vec<rmcp::model::Tool> {
    let pool = host.pool();
    pool.entries()
        .iter()
        .filter(|entry| !pool.is_deferred(entry.tool.spec()))
        .map(|entry| mcp_tool(entry.tool.as_ref(), host.grants()))
        .collect()
}

/// One tool: name, the description a model reads, the input schema, and
/// the annotations keel can vouch for whatever the input.
fn mcp_tool(tool: &dyn Tool, grants: &Grants) -> rmcp::model::Tool {
    let spec = tool.spec();
    let schema: JsonObject = match &spec.input_schema {
        Value::Object(schema) => schema.clone(),
        // A schema such as `true` accepts anything; MCP wants an object.
        _ => JsonObject::from_iter([("type".to_string(), Value::from("object"))]),
    };
    let mut listed = rmcp::model::Tool::new(spec.name.clone(), model_description(spec), Arc::new(schema));
    if spec.user_facing_name != spec.name {
        listed = listed.with_title(spec.user_facing_name.clone());
    }
    if let Some(annotations) = annotations(spec, tool.always_read_only(), grants) {
        listed = listed.with_annotations(annotations);
    }
    if let Some(Value::Object(schema)) = &spec.output_schema {
        listed.output_schema = Some(Arc::new(schema.clone()));
    }
    listed
}

/// Hints that hold for every call of the tool because the sandbox enforces
/// them, not because the tool claims them: a plugin without a network grant
/// has a closed world, and one with a grant is open-world; a plugin granted
/// no write access anywhere is read-only, and so is one whose every call runs
/// read-only (`always_read_only`: a plan fixed at load, which the grant of
/// each call follows); with no network either it can destroy nothing.
/// What a tool says about one input (`plan`, `is-destructive`, …)
/// has no place here: MCP hints are per tool, and when left out MCP assumes
/// the conservative answer, as keel does.
fn annotations(spec: &ToolSpec, always_read_only: bool, grants: &Grants) -> Option<ToolAnnotations> {
    let ToolOrigin::Plugin { .. } = spec.origin else { return None };
    let grant = grants.for_tool(&spec.name);
    let writes = !always_read_only
        && (grant.workspace_access == Access::ReadWrite
            || grant.dirs.iter().any(|dir| dir.access == Access::ReadWrite));
    let network = !grant.network.is_empty();
    let annotations = ToolAnnotations::new().open_world(network);
    Some(match (writes, network) {
        (true, _) => annotations,
        (false, true) => annotations.read_only(true),
        (false, false) => annotations.read_only(true).destructive(false),
    })
}

/// The method-not-found error of `M`, a method MCP defines that keel does
/// not serve.
fn not_served<M: rmcp::model::ConstString>() -> ErrorData {
    let message = format!("method not found: {} (keel serves tools only)", M::VALUE);
    ErrorData::new(rmcp::model::ErrorCode::METHOD_NOT_FOUND, message, None)
}

/// Why the params of `method` are not those MCP defines for it, when MCP
/// defines it: rmcp passes such a request on as one of a method it does not
/// know, where the client is owed an invalid-params error naming what is
/// wrong. `None` for a method MCP does not define.
fn invalid_params(method: &str, params: Option<Value>) -> Option<String> {
    use rmcp::model::{
        CallToolRequestMethod, CompleteRequestMethod, ConstString, GetPromptRequestMethod,
        InitializeResultMethod, ListPromptsRequestMethod, ListResourceTemplatesRequestMethod,
        ListResourcesRequestMethod, ListToolsRequestMethod, PingRequestMethod, ReadResourceRequestMethod,
        SetLevelRequestMethod, SubscribeRequestMethod, UnsubscribeRequestMethod,
    };
    const DEFINED: [&str; 13] = [
        InitializeResultMethod::VALUE,
        PingRequestMethod::VALUE,
        ListToolsRequestMethod::VALUE,
        SetLevelRequestMethod::VALUE,
        ListResourcesRequestMethod::VALUE,
        ListResourceTemplatesRequestMethod::VALUE,
        ReadResourceRequestMethod::VALUE,
        SubscribeRequestMethod::VALUE,
        UnsubscribeRequestMethod::VALUE,
        ListPromptsRequestMethod::VALUE,
        GetPromptRequestMethod::VALUE,
        CompleteRequestMethod::VALUE,
        CallToolRequestMethod::VALUE,
    ];
    if method == CallToolRequestMethod::VALUE {
        let error = serde_json::from_value::<CallToolRequestParams>(params.unwrap_or(Value::Null)).err()?;
        return Some(format!("invalid params of {method}: {error}"));
    }
    DEFINED
        .contains(&method)
        .then(|| format!("invalid params of {method}: they are not those MCP defines for it"))
}

/// The least of keel's levels that an MCP level asks for.
#[allow(deprecated, reason = "logging is deprecated from 2026-07-28 on; older clients still use it")]
fn log_level_of(level: rmcp::model::LoggingLevel) -> LogLevel {
    use rmcp::model::LoggingLevel as Mcp;
    match level {
        Mcp::Debug => LogLevel::Trace,
        Mcp::Info | Mcp::Notice => LogLevel::Info,
        Mcp::Warning => LogLevel::Warn,
        Mcp::Error | Mcp::Critical | Mcp::Alert | Mcp::Emergency => LogLevel::Error,
    }
}

/// `--events`: every call's events as JSON lines, written as they happen.
struct EventLog {
    lines: Mutex<Lines<std::fs::File>>,
    path: PathBuf,
}

impl EventLog {
    fn create(path: &std::path::Path) -> Result<Self> {
        let file = std::fs::File::create(path)
            .with_context(|| format!("failed to create events file {}", path.display()))?;
        Ok(EventLog { lines: Mutex::new(Lines::new(file)), path: path.to_path_buf() })
    }

    fn write(&self, event: &Event) {
        let mut line = serde_json::to_vec(event).expect("events serialize");
        line.push(b'\n');
        let mut lines = self.lines.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match lines.write(&line) {
            Written::Line => {}
            Written::After(lost) => {
                tracing::warn!("events file {}: written again, {lost} events lost", self.path.display());
            }
            Written::Lost(Some(error)) => tracing::warn!(
                "failed to write to events file {}: {error}; events are lost until it can be written again",
                self.path.display()
            ),
            Written::Lost(None) => {}
        }
    }
}

/// A file of JSON lines, each written whole or not at all: a line the file
/// could not take whole (a full disk) is cut off again, and the lines lost
/// until one is written are counted in an `events_lost` line before it.
struct Lines<F> {
    file: F,
    /// Bytes of whole lines written.
    written: u64,
    /// Lines lost since the last written.
    lost: u64,
}

/// What became of a line given to [`Lines::write`].
#[derive(Debug)]
enum Written {
    Line,
    /// Written, after the count of those lost before it.
    After(u64),
    /// Lost; with why, when it is the first lost since a line was written.
    Lost(Option<std::io::Error>),
}

/// A file that can be cut back to a length, and written on from there.
trait Truncate: std::io::Write {
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
}

impl Truncate for std::fs::File {
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        use std::io::Seek as _;
        self.set_len(len)?;
        self.seek(std::io::SeekFrom::Start(len)).map(drop)
    }
}

impl<F: Truncate> Lines<F> {
    fn new(file: F) -> Self {
        Lines { file, written: 0, lost: 0 }
    }

    fn write(&mut self, line: &[u8]) -> Written {
        let lost = self.lost;
        if lost > 0 {
            let marker = format!("{{\"type\":\"events_lost\",\"count\":{lost}}}\n");
            if self.append(marker.as_bytes()).is_err() {
                self.lost += 1;
                return Written::Lost(None);
            }
            self.lost = 0;
        }
        match self.append(line) {
            Ok(()) if lost > 0 => Written::After(lost),
            Ok(()) => Written::Line,
            Err(error) => {
                self.lost += 1;
                Written::Lost((self.lost == 1).then_some(error))
            }
        }
    }

    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self.file.write_all(bytes).and_then(|()| self.file.flush()) {
            Ok(()) => {
                self.written += bytes.len() as u64;
                Ok(())
            }
            Err(error) => {
                // What part of the line went in is cut off again.
                let _ = self.file.truncate(self.written);
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use async_trait::async_trait;
    use keel_host::tool::{CallError, Invocation};

    use super::*;

    /// A file that takes `room` bytes more, then fails as a full disk does,
    /// having taken what fitted.
    struct Disk {
        bytes: Vec<u8>,
        room: usize,
    }

    impl std::io::Write for Disk {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.room == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::StorageFull));
            }
            let taken = buf.len().min(self.room);
            self.bytes.extend_from_slice(&buf[..taken]);
            self.room -= taken;
            Ok(taken)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Truncate for Disk {
        fn truncate(&mut self, len: u64) -> std::io::Result<()> {
            self.bytes.truncate(len as usize);
            Ok(())
        }
    }

    #[test]
    fn events_a_full_disk_cannot_take_are_lost_whole_and_counted() {
        let mut lines = Lines::new(Disk { bytes: Vec::new(), room: 14 });
        assert!(matches!(lines.write(b"{\"n\":1}\n"), Written::Line));
        // Half of it fits: cut off again, and said once.
        assert!(matches!(lines.write(b"{\"n\":2}\n"), Written::Lost(Some(_))));
        assert!(matches!(lines.write(b"{\"n\":3}\n"), Written::Lost(None)));
        assert_eq!(lines.file.bytes, b"{\"n\":1}\n");
        lines.file.room = 1000;
        assert!(matches!(lines.write(b"{\"n\":4}\n"), Written::After(2)));
        assert_eq!(
            String::from_utf8(lines.file.bytes.clone()).unwrap(),
            "{\"n\":1}\n{\"type\":\"events_lost\",\"count\":2}\n{\"n\":4}\n"
        );
    }

    /// A tool whose warm-up never ends: it sets `began` as it begins, and
    /// `ended` once it is dropped.
    struct Warming {
        spec: ToolSpec,
        began: Arc<AtomicBool>,
        ended: Arc<AtomicBool>,
    }

    /// Sets its flag when dropped.
    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[async_trait]
    impl Tool for Warming {
        fn spec(&self) -> &ToolSpec {
            &self.spec
        }

        async fn invoke(&self, _: Value, _: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
            Err(CallError::Host("never called".into()))
        }

        async fn warm_up(&self) {
            let _ended = Flag(self.ended.clone());
            self.began.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
    }

    /// Whether `flag` is set within a second.
    async fn within_a_second(flag: &AtomicBool) -> bool {
        for _ in 0..200 {
            if flag.load(Ordering::SeqCst) {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_replaced_pool_stops_its_warm_up() {
        let workspace = tempfile::tempdir().unwrap();
        let flags = || (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let live = |(began, ended): &(Arc<AtomicBool>, Arc<AtomicBool>)| {
            let spec =
                ToolSpec::native("warming", "Warms up forever.", serde_json::json!({ "type": "object" }));
            let tool = Arc::new(Warming { spec, began: began.clone(), ended: ended.clone() });
            let host = Host::builder().workspace(workspace.path()).cache_dir(None).tool(tool).build();
            async {
                let host = host.await.unwrap();
                Live::new(host, None, None, &tokio::runtime::Handle::current())
            }
        };
        let (first, second) = (flags(), flags());
        let shelf = Shelf::new(live(&first).await);
        assert!(within_a_second(&first.0).await, "the first version warms up");
        // A call still holding the first version keeps it alive.
        let held = shelf.current();
        shelf.replace(live(&second).await);
        assert!(within_a_second(&first.1).await, "the replaced version's warm-up still runs");
        assert!(
            within_a_second(&second.0).await && !second.1.load(Ordering::SeqCst),
            "the version served warms up on"
        );
        drop(held);
    }
}
