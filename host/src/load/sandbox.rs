//! One call's sandbox: a fresh store with its own WASI context, limits and
//! host imports. Only this module and `engine` touch wasmtime's store types.
//!
//! What a sandbox closes, and how:
//! - CPU: fuel, set before every export call by the caller
//!   ([`Sandbox::budget`]), and a wall-clock deadline checked on every epoch
//!   tick; the caller also wraps each export call in a timer, which is what
//!   stops a guest blocked inside a host call.
//! - Memory and tables: a [`ResourceLimiter`] refuses growth past the caps
//!   and remembers which cap it was, so the trap that follows is reported as
//!   that limit.
//! - Copies from guest to host: wasmtime's hostcall fuel caps the bytes one
//!   host call's arguments or one export's result may hold.
//! - Handles: the WASI resource table and the store's component handles are
//!   both capped.
//! - Capabilities: preopens from the plugin's [`PluginGrant`], narrowed by
//!   the call's [`Grant`]; the granted environment variables and nothing else;
//!   no arguments, no sockets, no name lookups, no stdin.
//! - Network: `wasi:http` only, through the sandbox's [`Egress`], closed
//!   until the call itself opens it (see `egress`).
//! - Output: stdout and stderr are captured up to a cap, the rest dropped
//!   (never failed, so a flood does not crash the guest), and written to the
//!   host's log tagged with the plugin's name when the sandbox ends.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde_json::Value;
use wasmtime::component::{HasData, Resource};
use wasmtime::component::{ResourceTable, ResourceTableError};
use wasmtime::{ResourceLimiter, Store, Trap, UpdateDeadline};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::filesystem::{Descriptor, Dir};
use wasmtime_wasi::p2::bindings::filesystem::preopens;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{FsPerms, OpenMode, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};
use wasmtime_wasi_io::bytes::Bytes;

use crate::contract::WORKSPACE_MOUNT;
use crate::limits::{LimitKind, Limits, human_bytes, units};
use crate::load::bindings::{Guest, GuestPre, LogLevel, log_level_of_v0_2, v0_2, v0_3, v0_4};
use crate::load::egress::{Egress, Scrubber};
use crate::load::epoch::{EPOCH_TICK, Ticker};
use crate::load::grants::{Access, PluginGrant};
use crate::tool::{CallError, LogSink, ProgressSink, RefusalSink};

/// The innermost cause of a wasmtime error, which says what actually failed.
pub(crate) fn root_cause(error: &wasmtime::Error) -> String {
    error.chain().last().map(ToString::to_string).unwrap_or_default()
}

/// Bytes of a guest's stdout, and of its stderr, kept per sandbox; the rest
/// is dropped. Enough for a panic message and a few diagnostics, never a
/// flood.
pub const CAPTURED_OUTPUT_BYTES: usize = 64 << 10;

/// Bytes one write to stdout or stderr is promised room for. Writes are
/// never refused (the excess is dropped instead), so this only sizes the
/// guest's chunks.
const WRITE_PERMIT: usize = 64 << 10;

/// Bytes of one progress report or log line kept; longer ones are cut.
const MAX_REPORT_BYTES: usize = 16 << 10;

/// Bytes of progress reports and log lines, together, accepted from one
/// sandbox; later ones are dropped with one warning. Progress is for people
/// watching, and a megabyte of it is already more than anyone reads; without
/// a cap a guest could flood the host's log for as long as its fuel lasts.
pub const MAX_REPORTED_BYTES: usize = 1 << 20;

/// A query (a per-input question such as `plan`) must answer within
/// this much fuel and time: they are meant to be instant, and a query that
/// spins must not hold a batch for the whole call deadline.
pub const QUERY_FUEL: u64 = 1_000_000_000;
/// See [`QUERY_FUEL`].
pub const QUERY_DEADLINE: Duration = Duration::from_secs(2);

/// How long past its deadline an export call may take before the timer
/// around it gives up: the epoch callback normally stops guest code first,
/// within a tick; the timer is for a guest blocked in a host call.
pub const DEADLINE_GRACE: Duration = Duration::from_millis(100);

/// How much of its plugin's grant one sandbox gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// No filesystem at all: for `plan`, asked before the grant is known.
    Nothing,
    /// Every granted directory, read-only.
    ReadOnly,
    /// Every granted directory with the access the grant gives it.
    ReadWrite,
}

impl Grant {
    /// The access to a directory granted `granted`, under this grant.
    fn narrow(self, granted: Access) -> Option<Access> {
        match self {
            Grant::Nothing => None,
            Grant::ReadOnly => Some(Access::ReadOnly),
            Grant::ReadWrite => Some(granted),
        }
    }
}

/// Which fuel limit an export call runs under, for the error when it runs
/// out: the call's own budget, the batch's allowance, or a query's cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuelLimit {
    /// [`LimitKind::Fuel`] or [`LimitKind::BatchFuel`].
    pub kind: LimitKind,
    /// The limit's value.
    pub fuel: u64,
}

/// The directories a plugin is granted, opened once when it is loaded and
/// shared by all its sandboxes: a sandbox's preopens are clones of these
/// handles, so a fresh sandbox opens no directory, and the handles a guest
/// sees follow the sandbox's [`Grant`] at the moment it first asks for them.
pub struct Mounts(Vec<Mount>);

/// One granted directory: a read-only handle, and a writable one when the
/// grant gives write access.
struct Mount {
    guest: String,
    access: Access,
    read_only: Dir,
    read_write: Option<Dir>,
}

impl Mounts {
    /// No directories: for sandboxes that must see none.
    pub fn none() -> Self {
        Mounts(Vec::new())
    }

    /// Open every directory of `capabilities`. The error names the directory
    /// and why it could not be opened.
    pub fn open(capabilities: &PluginGrant) -> std::io::Result<Self> {
        let mounts = std::iter::once((
            capabilities.workspace.as_path(),
            WORKSPACE_MOUNT,
            capabilities.workspace_access,
        ))
        .chain(capabilities.dirs.iter().map(|dir| (dir.host.as_path(), dir.mount.as_str(), dir.access)));
        let mut opened = Vec::new();
        for (host, guest, access) in mounts {
            let named = |error: std::io::Error| {
                std::io::Error::new(
                    error.kind(),
                    format!("cannot open {} for {guest}: {error}", host.display()),
                )
            };
            let dir = cap_std::fs::Dir::open_ambient_dir(host, cap_std::ambient_authority())
                .map_err(named)?
                .into_std_file();
            let read_write = match access {
                Access::ReadOnly => None,
                Access::ReadWrite => Some(Dir::new(
                    dir.try_clone().map_err(named)?,
                    FsPerms::ReadWrite,
                    OpenMode::READ | OpenMode::WRITE,
                    true,
                )),
            };
            // Filesystem calls run on the calling thread instead of hopping
            // to tokio's blocking pool: up to ten times faster for
            // file-reading tools.
            let read_only = Dir::new(dir, FsPerms::ReadOnly, OpenMode::READ, true);
            opened.push(Mount { guest: guest.to_owned(), access, read_only, read_write });
        }
        Ok(Mounts(opened))
    }

    /// The handles a sandbox with `grant` sees, each with its mount point.
    fn granted(&self, grant: Grant) -> impl Iterator<Item = (&Dir, &str)> {
        self.0.iter().filter_map(move |mount| {
            let dir = match grant.narrow(mount.access)? {
                Access::ReadOnly => &mount.read_only,
                Access::ReadWrite => {
                    mount.read_write.as_ref().expect("a writable mount has a writable handle")
                }
            };
            Some((dir, mount.guest.as_str()))
        })
    }
}

/// wasmtime-wasi's `wasi:filesystem/preopens`, served from the sandbox's
/// [`Mounts`] instead of directories opened for each sandbox.
pub(crate) struct SharedPreopens;

impl HasData for SharedPreopens {
    type Data<'a> = &'a mut SandboxState;
}

impl preopens::Host for &mut SandboxState {
    fn get_directories(&mut self) -> wasmtime::Result<Vec<(Resource<Descriptor>, String)>> {
        let mut directories = Vec::new();
        for (dir, guest) in self.mounts.granted(self.grant) {
            let descriptor = self.table.push(Descriptor::Dir(dir.clone()))?;
            directories.push((descriptor, guest.to_owned()));
        }
        Ok(directories)
    }
}

/// The data of one sandbox's store.
pub struct SandboxState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    egress: Egress,
    /// The plugin's secrets, masked in what the guest reports.
    scrubber: Scrubber,
    table: ResourceTable,
    mounts: Arc<Mounts>,
    grant: Grant,
    limiter: CallLimiter,
    plugin: Arc<str>,
    progress: Option<ProgressSink>,
    log: Option<LogSink>,
    deadline: Instant,
    deadline_limit: Duration,
    fuel_limit: FuelLimit,
    stdout: Capture,
    stderr: Capture,
    reported: usize,
}

impl WasiView for SandboxState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl WasiHttpView for SandboxState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        self.egress.deadline = self.deadline;
        WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.egress }
    }
}

impl v0_3::keel::tool::types::Host for SandboxState {}

impl v0_2::keel::tool::types::Host for SandboxState {}

/// A 0.2.0 guest's host imports: the same as the newest version's.
impl v0_2::keel::tool::host::Host for SandboxState {
    async fn progress(&mut self, data: String) {
        v0_3::keel::tool::host::Host::progress(self, data).await;
    }

    async fn log(&mut self, level: v0_2::keel::tool::types::LogLevel, message: String) {
        v0_3::keel::tool::host::Host::log(self, log_level_of_v0_2(level), message).await;
    }
}

/// A 0.4.0 guest's host imports: the same as 0.3.0's, whose types they share.
impl v0_4::keel::tool::host::Host for SandboxState {
    async fn progress(&mut self, data: String) {
        v0_3::keel::tool::host::Host::progress(self, data).await;
    }

    async fn log(&mut self, level: LogLevel, message: String) {
        v0_3::keel::tool::host::Host::log(self, level, message).await;
    }
}

impl v0_3::keel::tool::host::Host for SandboxState {
    async fn progress(&mut self, mut data: String) {
        if self.progress.is_none() || !self.within_report_budget(data.len()) {
            return;
        }
        self.scrubber.scrub_cut(&mut data, MAX_REPORT_BYTES);
        // A guest that sends something other than JSON still reports progress.
        let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
        if let Some(sink) = &self.progress {
            sink(value);
        }
    }

    async fn log(&mut self, level: LogLevel, mut message: String) {
        if !self.within_report_budget(message.len()) {
            return;
        }
        self.scrubber.scrub_cut(&mut message, MAX_REPORT_BYTES);
        let plugin = &*self.plugin;
        match level {
            LogLevel::Trace => tracing::trace!(plugin, "{message}"),
            LogLevel::Debug => tracing::debug!(plugin, "{message}"),
            LogLevel::Info => tracing::info!(plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            LogLevel::Error => tracing::error!(plugin, "{message}"),
        }
        if let Some(sink) = &self.log {
            sink(tool_log_level(level), &message);
        }
    }
}

impl SandboxState {
    /// The least state a store can run a tool with: no filesystem, no
    /// limiter, output dropped. Only the benchmark's floor uses it, to
    /// measure what a fresh instance costs with nothing of keel around it.
    pub(crate) fn bare() -> Self {
        SandboxState::bare_in(Arc::new(Mounts::none()))
    }

    /// [`SandboxState::bare`], with `mounts` read-only.
    pub(crate) fn bare_in(mounts: Arc<Mounts>) -> Self {
        let capture = Capture::new(0);
        let plugin: Arc<str> = Arc::from("floor");
        let deadline = Instant::now() + Duration::from_secs(3600);
        SandboxState {
            wasi: WasiCtxBuilder::new().build(),
            http: WasiHttpCtx::new(),
            egress: Egress::new(Arc::default(), &Limits::default(), plugin.clone(), deadline),
            scrubber: Scrubber::default(),
            table: ResourceTable::new(),
            mounts,
            grant: Grant::ReadOnly,
            limiter: CallLimiter { memory: usize::MAX, table_elements: usize::MAX, hit: None, peak: 0 },
            plugin,
            progress: None,
            log: None,
            deadline,
            deadline_limit: Duration::from_secs(3600),
            fuel_limit: FuelLimit { kind: LimitKind::Fuel, fuel: u64::MAX },
            stdout: capture.clone(),
            stderr: capture,
            reported: 0,
        }
    }

    /// Count `len` bytes against [`MAX_REPORTED_BYTES`]; false once spent.
    fn within_report_budget(&mut self, len: usize) -> bool {
        let before = self.reported;
        self.reported = self.reported.saturating_add(len.min(MAX_REPORT_BYTES));
        if self.reported <= MAX_REPORTED_BYTES {
            return true;
        }
        if before <= MAX_REPORTED_BYTES {
            tracing::warn!(
                plugin = &*self.plugin,
                "dropping further progress and log lines: over {} this call",
                human_bytes(MAX_REPORTED_BYTES)
            );
        }
        false
    }

    /// Write what the guest printed to the host's log, tagged with the plugin.
    fn log_output(&self) {
        log_captured(&self.plugin, "stdout", &self.stdout, &self.scrubber);
        log_captured(&self.plugin, "stderr", &self.stderr, &self.scrubber);
    }
}

/// A contract log level as the host's tools name it.
fn tool_log_level(level: LogLevel) -> crate::tool::LogLevel {
    match level {
        LogLevel::Trace => crate::tool::LogLevel::Trace,
        LogLevel::Debug => crate::tool::LogLevel::Debug,
        LogLevel::Info => crate::tool::LogLevel::Info,
        LogLevel::Warn => crate::tool::LogLevel::Warn,
        LogLevel::Error => crate::tool::LogLevel::Error,
    }
}

/// Write what `capture` holds to the host's log as one line tagged with the
/// plugin and the stream, secrets masked, and warn of what was dropped;
/// empty it.
fn log_captured(plugin: &str, stream: &str, capture: &Capture, scrubber: &Scrubber) {
    let (bytes, dropped) = capture.take();
    let dropped = dropped + bytes.len().saturating_sub(capture.capacity) as u64;
    if !bytes.is_empty() {
        let text = capture.shown(&bytes, scrubber);
        tracing::info!(plugin, stream, "{}", text.trim_end());
    }
    if dropped > 0 {
        tracing::warn!(
            plugin,
            stream,
            "dropped {dropped} bytes of {stream} past the {} kept",
            human_bytes(capture.capacity)
        );
    }
}

/// A guest's stdout or stderr: the first `capacity` bytes are kept to be
/// shown (and `overlap` more, never shown), the rest counted and dropped.
/// Writes always succeed: a guest whose `println!` failed would panic, and
/// printing too much is no reason to crash a tool.
#[derive(Clone)]
pub struct Capture {
    inner: Arc<Mutex<Captured>>,
    capacity: usize,
    /// Bytes kept past `capacity` and never shown, so that a secret the end
    /// of what is shown runs through is whole where it is masked.
    overlap: usize,
}

#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: u64,
}

impl Capture {
    /// A capture keeping `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Capture { inner: Arc::default(), capacity, overlap: 0 }
    }

    /// This capture, keeping what `scrubber` needs past its capacity to
    /// mask a secret there whole ([`Scrubber::overlap`]).
    fn masked_by(self, scrubber: &Scrubber) -> Self {
        Capture { overlap: scrubber.overlap(), ..self }
    }

    /// What of `bytes`, as kept, may be shown: the first `capacity`, with
    /// every secret masked.
    fn shown(&self, bytes: &[u8], scrubber: &Scrubber) -> String {
        let mut text = String::from_utf8_lossy(bytes).into_owned();
        scrubber.scrub_cut(&mut text, self.capacity);
        text
    }

    fn push(&self, data: &[u8]) {
        let mut captured = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let room = (self.capacity + self.overlap).saturating_sub(captured.bytes.len());
        let kept = data.len().min(room);
        captured.bytes.extend_from_slice(&data[..kept]);
        captured.dropped += (data.len() - kept) as u64;
    }

    /// What was kept so far, `overlap` included, and how many bytes past it
    /// were dropped.
    pub fn contents(&self) -> (Vec<u8>, u64) {
        let captured = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        (captured.bytes.clone(), captured.dropped)
    }

    /// [`Capture::contents`], emptying the capture.
    fn take(&self) -> (Vec<u8>, u64) {
        let mut captured = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let taken = std::mem::take(&mut *captured);
        (taken.bytes, taken.dropped)
    }
}

impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

#[async_trait::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// Enforces the memory and table caps and remembers which one was hit, so
/// the trap that follows can be reported as that limit.
/// It also keeps the largest size a memory was allowed to grow to.
struct CallLimiter {
    memory: usize,
    table_elements: usize,
    hit: Option<LimitKind>,
    peak: usize,
}

impl ResourceLimiter for CallLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory {
            self.hit = Some(LimitKind::Memory);
            return Ok(false);
        }
        self.peak = self.peak.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.table_elements {
            self.hit = Some(LimitKind::Table);
            return Ok(false);
        }
        Ok(true)
    }
}

/// The deadline callback's error: the call ran out of wall-clock time.
#[derive(Debug)]
struct DeadlineExceeded;

impl std::fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl std::error::Error for DeadlineExceeded {}

/// How wasmtime words the error of a guest that handed the host more bytes
/// than its hostcall fuel allows; the error type itself is private. The
/// hostile-guest test of the transfer limit pins this wording, so an
/// upgrade that changes it fails that test instead of misreporting.
const HOSTCALL_FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";

/// How wasmtime words the error of a guest past the store's handle limit.
const HANDLE_LIMIT_EXCEEDED: &str = "store handle limit exceeded";

/// A live instance of a plugin in its own store.
pub struct Sandbox {
    pub(crate) store: Store<SandboxState>,
    /// Boxed: the bindings are large, and a sandbox moves through every
    /// question's future.
    pub(crate) tool: Box<Guest>,
}

impl Sandbox {
    /// Instantiate `pre` in a fresh store for `plugin`, giving it `grant` of
    /// `mounts` and the environment of `capabilities`. Instantiation runs
    /// under `fuel` and [`QUERY_DEADLINE`]; `ticker` is woken once the
    /// instance is made, so that the epoch advances while it lives.
    pub async fn new(
        pre: &GuestPre<SandboxState>,
        ticker: Option<&Ticker>,
        plugin: Arc<str>,
        limits: &Limits,
        (capabilities, mounts): (&PluginGrant, &Arc<Mounts>),
        grant: Grant,
        fuel: (u64, FuelLimit),
    ) -> Result<Self, CallError> {
        let started = Instant::now();
        let egress =
            Egress::new(capabilities.network.clone(), limits, plugin.clone(), started + QUERY_DEADLINE);
        let scrubber = egress.scrubber();
        let stdout = Capture::new(CAPTURED_OUTPUT_BYTES).masked_by(&scrubber);
        let stderr = Capture::new(CAPTURED_OUTPUT_BYTES).masked_by(&scrubber);
        let wasi = wasi_ctx(capabilities, &stdout, &stderr);
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.resources);
        let state = SandboxState {
            wasi,
            http: WasiHttpCtx::new(),
            scrubber,
            egress,
            table,
            mounts: mounts.clone(),
            grant,
            limiter: CallLimiter {
                memory: limits.memory,
                table_elements: limits.table_elements,
                hit: None,
                peak: 0,
            },
            plugin,
            progress: None,
            log: None,
            deadline: started + QUERY_DEADLINE,
            deadline_limit: QUERY_DEADLINE,
            fuel_limit: fuel.1,
            stdout,
            stderr,
            reported: 0,
        };
        let mut store = Store::new(pre.engine(), state);
        store.limiter(|state| &mut state.limiter);
        store.set_hostcall_fuel(limits.transfer);
        store.set_max_component_handles(limits.resources);
        store.set_fuel(fuel.0).map_err(|error| CallError::Host(root_cause(&error)))?;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|store| {
            if Instant::now() >= store.data().deadline {
                Err(wasmtime::Error::new(DeadlineExceeded))
            } else {
                // tokio's own yield, which wakes the task only once the
                // runtime has polled its timers and sockets: a plain wake
                // from inside the task would run it again at once, and a
                // thread with one spinning guest would look at its sockets
                // only every 61 slices of 10 ms.
                Ok(UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())))
            }
        });
        let instantiated =
            within(started + QUERY_DEADLINE + DEADLINE_GRACE, Box::pin(pre.instantiate_async(&mut store)))
                .await;
        // Counted among the engine's live instances, which the epoch thread
        // reads; wake it before any export is called. (A component's start
        // function, run above, is held to its fuel.)
        if let Some(ticker) = ticker {
            ticker.wake();
        }
        let tool = match instantiated {
            Ok(Ok(tool)) => tool,
            Ok(Err(error)) => {
                let error = classify(&error, store.data(), limits);
                store.data().log_output();
                return Err(error);
            }
            Err(_) => {
                store.data().log_output();
                return Err(CallError::Limit {
                    kind: LimitKind::Deadline,
                    value: format!("{QUERY_DEADLINE:?}"),
                });
            }
        };
        Ok(Sandbox { store, tool: Box::new(tool) })
    }

    /// The largest linear memory it has had, in bytes (its initial memory
    /// included).
    pub fn memory_peak(&self) -> u64 {
        self.store.data().limiter.peak as u64
    }

    /// The filesystem access this sandbox was given.
    pub fn grant(&self) -> Grant {
        self.store.data().grant
    }

    /// Replace the filesystem access. It reaches the guest only if it has
    /// not asked for its directories yet (a guest keeps the handles it got).
    pub fn regrant(&mut self, grant: Grant) {
        self.store.data_mut().grant = grant;
    }

    /// Give the next export call `fuel` (reported as `limit` when it runs
    /// out) and `deadline`.
    pub fn budget(&mut self, fuel: u64, limit: FuelLimit, deadline: Duration) -> Result<(), CallError> {
        self.store.set_fuel(fuel).map_err(|error| CallError::Host(root_cause(&error)))?;
        let state = self.store.data_mut();
        state.fuel_limit = limit;
        state.deadline = Instant::now() + deadline;
        state.deadline_limit = deadline;
        Ok(())
    }

    /// When the timer around the next export call gives up: some time
    /// after the deadline [`Sandbox::budget`] set, which the epoch enforces.
    pub fn export_timer(&self) -> Instant {
        export_timer(self.store.data().deadline)
    }

    /// The fuel the last export call left unburnt.
    pub fn fuel_left(&self) -> u64 {
        self.store.get_fuel().unwrap_or(0)
    }

    /// The error of an export call that outlived its deadline while blocked
    /// where the epoch cannot reach (a host call).
    pub fn deadline_error(&self) -> CallError {
        CallError::Limit {
            kind: LimitKind::Deadline,
            value: format!("{:?}", self.store.data().deadline_limit),
        }
    }

    /// Open the network for the call, as far as the plugin's grant and the
    /// call's `is-open-world` answer allow; questions never get it.
    pub fn open_network(&mut self, open_world: bool) {
        self.store.data_mut().egress.open(open_world);
    }

    /// Send the guest's log lines to `sink` too.
    pub fn report_logs_to(&mut self, sink: LogSink) {
        self.store.data_mut().log = Some(sink);
    }

    /// Report the requests the network refuses to `sink`.
    pub fn report_refusals_to(&mut self, sink: RefusalSink) {
        self.store.data_mut().egress.report_refusals_to(sink);
    }

    /// The plugin's secrets, to mask in what the call hands back.
    pub fn scrubber(&self) -> &Scrubber {
        &self.store.data().scrubber
    }

    /// Send the guest's progress reports to `sink`.
    pub fn report_progress_to(&mut self, sink: ProgressSink) {
        self.store.data_mut().progress = Some(sink);
    }

    /// Turn a failed export call into the error a model reads.
    pub fn classify(&self, error: &wasmtime::Error, limits: &Limits) -> CallError {
        classify(error, self.store.data(), limits)
    }
}

/// How this thread tears a call's sandbox down ([`Sandbox::retire`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Teardown {
    /// At once, as the call is answered: the default.
    Inline,
    /// After the thread has run what was ready; `waiting` while a sandbox
    /// waits so.
    Deferred { waiting: bool },
    /// When the thread next goes idle, in [`tear_down_when_idle`]; the
    /// sandbox waits in [`IDLE`].
    WhenIdle,
}

thread_local! {
    static TEARDOWN: std::cell::Cell<Teardown> = const { std::cell::Cell::new(Teardown::Inline) };
    /// The sandbox of a call answered on this thread, waiting for the
    /// thread to go idle ([`Teardown::WhenIdle`]).
    static IDLE: std::cell::RefCell<Option<Sandbox>> = const { std::cell::RefCell::new(None) };
}

/// For a worker of a runtime of many threads, called each time it goes
/// idle and as it stops (tokio's `on_thread_park` and `on_thread_stop`, as
/// `keel serve` and `keel run` set them): tear down the
/// sandbox of the last call answered on this thread, if one waits; and from
/// the first time on, let calls answered on this thread leave their sandbox
/// to wait so. The reply then goes out before the teardown (resetting the
/// memory the instance dirtied, a third of a sandbox's cost), which follows
/// on the same thread, whose caches hold the store, once the thread has run
/// what was ready. At most one sandbox a thread waits so: a call answered
/// while one waits tears its own down at once, and a sandbox still waiting
/// when its thread ends goes with the thread's locals.
///
/// A runtime's blocking threads never park, so they are never asked; a
/// thread that drives a current-thread runtime has
/// [`defer_teardown_on_this_thread`] instead.
pub fn tear_down_when_idle() {
    if TEARDOWN.get() == Teardown::Inline {
        TEARDOWN.set(Teardown::WhenIdle);
    }
    // Taken out first: the teardown runs outside the borrow.
    let waiting = IDLE.try_with(|idle| idle.borrow_mut().take()).ok().flatten();
    drop(waiting);
}

/// Let calls answered on this thread tear their sandbox down after the
/// thread has run what was ready, so that their reply goes out first.
///
/// For a thread that drives a current-thread runtime, as each core's thread
/// of `keel serve --http` does: the teardown (resetting the memory the
/// instance dirtied, a third of a sandbox's cost) then follows on the same
/// thread, whose caches hold the store, while the client reads the reply. At
/// most one sandbox a thread waits so: a call answered while one waits tears
/// its own down at once. A call answered elsewhere than on a current-thread
/// runtime still tears its sandbox down at once. Other threads are not
/// affected: on a runtime of many workers the teardown could be taken by
/// another worker, where every line of the store is a cache miss.
pub fn defer_teardown_on_this_thread() {
    TEARDOWN.set(Teardown::Deferred { waiting: false });
}

impl Sandbox {
    /// Tear it down once its call is answered: at once, unless this thread
    /// defers its teardowns ([`defer_teardown_on_this_thread`]) or leaves
    /// them until it goes idle ([`tear_down_when_idle`]), and no other
    /// sandbox of it waits. Deciding reads one thread-local, because calls on
    /// every worker pass here.
    pub(crate) fn retire(self) {
        use tokio::runtime::{Handle, RuntimeFlavor};
        match TEARDOWN.get() {
            Teardown::Deferred { waiting: false } => {}
            Teardown::WhenIdle => return self.wait_for_idle(),
            _ => return drop(self),
        }
        let runtime = match Handle::try_current() {
            Ok(runtime) if runtime.runtime_flavor() == RuntimeFlavor::CurrentThread => runtime,
            _ => return drop(self),
        };
        // What the guest printed is logged now, not when the teardown runs.
        self.store.data().log_output();
        TEARDOWN.set(Teardown::Deferred { waiting: true });
        let retiring = Retiring { _sandbox: self };
        runtime.spawn(async move {
            tokio::task::yield_now().await;
            drop(retiring);
        });
    }

    /// Wait in [`IDLE`] for this thread to go idle, unless another waits
    /// there: then be torn down at once.
    fn wait_for_idle(self) {
        // Refused, it comes back and is torn down here, out of the borrow; on
        // a thread that is ending, it is torn down with the closure. Either
        // way its teardown logs what the guest printed.
        let refused = IDLE.try_with(move |idle| {
            let mut idle = idle.borrow_mut();
            if idle.is_some() {
                return Some(self);
            }
            // Kept, what the guest printed is logged now, not when the
            // teardown runs.
            self.store.data().log_output();
            *idle = Some(self);
            None
        });
        drop(refused);
    }
}

/// A sandbox waiting for its teardown; dropped, run or not (a runtime shut
/// down drops its tasks), it gives its thread's turn back.
struct Retiring {
    _sandbox: Sandbox,
}

impl Drop for Retiring {
    fn drop(&mut self) {
        waited();
    }
}

/// A sandbox of this thread waited and is gone: the next may wait. Only a
/// waiting thread changes; a thread that drops another's (its runtime dropped
/// there) is not made to defer its own teardowns.
fn waited() {
    let _ = TEARDOWN.try_with(|teardown| {
        if teardown.get() == (Teardown::Deferred { waiting: true }) {
            teardown.set(Teardown::Deferred { waiting: false });
        }
    });
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.store.data().log_output();
    }
}

/// When the timer around an export call whose deadline is `deadline` gives
/// up: [`DEADLINE_GRACE`] plus a tick later, so that the epoch (which
/// reports the limit more precisely) normally fires first.
fn export_timer(deadline: Instant) -> Instant {
    deadline + DEADLINE_GRACE + EPOCH_TICK
}

/// `future`, given up at `until`, like [`tokio::time::timeout_at`]; but the
/// timer is set only if the first poll does not finish it.
///
/// Most export calls finish within their first poll: guest code runs on a
/// fiber until it returns, and only a wait in a host function (or an epoch
/// yield) leaves it pending. Setting no timer for them spares the runtime's
/// timer wheel a registration and, when the runtime is idle, a wake-up of
/// the thread parked on its driver.
pub async fn within<F: Future>(until: Instant, future: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut future = std::pin::pin!(future);
    let first = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(output) => Ok(output),
        // Boxed: a timer is large, and needed only here.
        Poll::Pending => Box::pin(tokio::time::timeout_at(until.into(), future)).await,
    }
}

/// Everything of a sandbox's WASI context but its directories, which
/// [`SharedPreopens`] serves.
fn wasi_ctx(capabilities: &PluginGrant, stdout: &Capture, stderr: &Capture) -> WasiCtx {
    let mut builder = WasiCtxBuilder::new();
    builder.stdout(stdout.clone());
    builder.stderr(stderr.clone());
    // These are wasmtime-wasi's defaults too; said here so that a change of
    // defaults cannot open them.
    builder.allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
    for (name, value) in &capabilities.env {
        builder.env(name, value);
    }
    builder.build()
}

fn classify(error: &wasmtime::Error, state: &SandboxState, limits: &Limits) -> CallError {
    let limit = |kind: LimitKind| CallError::Limit { kind, value: limits.value_of(kind) };
    if let Some(kind) = state.limiter.hit {
        return limit(kind);
    }
    if error.downcast_ref::<DeadlineExceeded>().is_some() {
        return CallError::Limit { kind: LimitKind::Deadline, value: format!("{:?}", state.deadline_limit) };
    }
    if matches!(error.downcast_ref::<ResourceTableError>(), Some(ResourceTableError::Full))
        || error.chain().any(|cause| cause.to_string().contains(HANDLE_LIMIT_EXCEEDED))
    {
        return limit(LimitKind::Resources);
    }
    if error.chain().any(|cause| cause.to_string().contains(HOSTCALL_FUEL_EXHAUSTED)) {
        return limit(LimitKind::Transfer);
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => {
            CallError::Limit { kind: state.fuel_limit.kind, value: units(state.fuel_limit.fuel) }
        }
        Some(Trap::Interrupt) => {
            CallError::Limit { kind: LimitKind::Deadline, value: format!("{:?}", state.deadline_limit) }
        }
        Some(Trap::StackOverflow) => limit(LimitKind::Stack),
        Some(trap) => CallError::Trap(with_panic_message(trap.to_string(), state)),
        None => CallError::Trap(with_panic_message(root_cause(error), state)),
    }
}

/// A Rust guest that panics prints why to stderr before it traps: that line
/// tells the model far more than "unreachable instruction executed".
fn with_panic_message(reason: String, state: &SandboxState) -> String {
    let (stderr, _) = state.stderr.contents();
    let stderr = state.stderr.shown(&stderr, &state.scrubber);
    match stderr.lines().position(|line| line.contains("panicked at")) {
        Some(start) => {
            let panic: Vec<&str> = stderr.lines().skip(start).take(2).collect();
            let mut message = format!("{reason}: {}", panic.join(" "));
            state.scrubber.scrub(&mut message);
            message
        }
        None => reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_keeps_its_capacity_and_counts_the_rest() {
        let capture = Capture::new(10);
        let mut stream: Box<dyn OutputStream> = capture.p2_stream();
        assert_eq!(stream.check_write().unwrap(), WRITE_PERMIT);
        stream.write(Bytes::from_static(b"0123456")).unwrap();
        stream.write(Bytes::from_static(b"789abc")).unwrap();
        assert_eq!(stream.check_write().unwrap(), WRITE_PERMIT, "a full capture still accepts writes");
        stream.write(Bytes::from(vec![b'x'; 1 << 20])).unwrap();
        assert_eq!(capture.contents(), (b"0123456789".to_vec(), 3 + (1 << 20)));
        assert_eq!(capture.take(), (b"0123456789".to_vec(), 3 + (1 << 20)));
        assert_eq!(capture.contents(), (Vec::new(), 0), "taking empties it");
    }

    #[test]
    fn captured_output_is_logged_tagged_with_the_plugin_and_what_was_dropped() {
        let log = keel_tests::Log::default();
        let capture = Capture::new(8);
        capture.push(b"hello, host\n");
        log.capture(|| log_captured("grep", "stdout", &capture, &Scrubber::default()));
        assert_eq!(
            log.text(),
            " INFO hello, h plugin=\"grep\" stream=\"stdout\"\n \
             WARN dropped 4 bytes of stdout past the 8 B kept plugin=\"grep\" stream=\"stdout\"\n"
        );
        assert_eq!(capture.contents(), (Vec::new(), 0), "logged once, then emptied");
    }

    /// A plugin's scrubber when its grant hides `secret`.
    fn scrubber_of(secret: &str) -> Scrubber {
        use crate::load::network::{NetworkGrant, SecretConfig};
        let origin = "https://example.org";
        let secret = SecretConfig { header: "x-key".into(), value: secret.into() };
        let grant = NetworkGrant::parse(&[origin.into()], &[(origin.into(), secret)], |_| None).unwrap();
        Egress::new(Arc::new(grant), &Limits::default(), Arc::from("p"), Instant::now()).scrubber()
    }

    #[test]
    fn a_secret_across_the_cut_of_a_log_or_progress_line_is_masked_whole() {
        const SECRET: &str = "s3cr3t-t0ken";
        let mut state = SandboxState::bare();
        state.scrubber = scrubber_of(SECRET);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (logged, reported) = (seen.clone(), seen.clone());
        state.log = Some(Arc::new(move |_, line: &str| logged.lock().unwrap().push(line.to_owned())));
        state.progress = Some(Arc::new(move |value: Value| {
            reported.lock().unwrap().push(value.as_str().unwrap().to_owned());
        }));
        // The cut falls after the secret's first five bytes.
        let kept = "x".repeat(MAX_REPORT_BYTES - 5);
        let line = format!("{kept}{SECRET} and more");
        futures::executor::block_on(async {
            v0_3::keel::tool::host::Host::log(&mut state, LogLevel::Info, line.clone()).await;
            v0_3::keel::tool::host::Host::progress(&mut state, line).await;
        });
        let seen = seen.lock().unwrap();
        let ends: Vec<(usize, &str)> =
            seen.iter().map(|line| (line.len(), &line[line.len().saturating_sub(10)..])).collect();
        assert_eq!(ends, [(MAX_REPORT_BYTES, "xxxxx*****"); 2], "the log line, then the progress");
        assert!(seen.iter().all(|line| line.starts_with(&kept)));
    }

    #[test]
    fn a_secret_across_the_end_of_captured_output_is_masked_whole() {
        let scrubber = scrubber_of("s3cr3t-t0ken");
        let log = keel_tests::Log::default();
        let capture = Capture::new(8).masked_by(&scrubber);
        capture.push(b"hello s3cr3t-t0ken bye\n");
        log.capture(|| log_captured("grep", "stdout", &capture, &scrubber));
        assert_eq!(
            log.text(),
            " INFO hello ** plugin=\"grep\" stream=\"stdout\"\n \
             WARN dropped 15 bytes of stdout past the 8 B kept plugin=\"grep\" stream=\"stdout\"\n"
        );

        // So is one at the end of a panic message, which the model reads.
        let mut state = SandboxState::bare();
        let panic = "thread 'main' panicked at src/lib.rs:1:1:\nkey s3cr3t-t0ken\n";
        state.stderr = Capture::new(panic.find("cr3t").unwrap()).masked_by(&scrubber);
        state.scrubber = scrubber;
        state.stderr.push(panic.as_bytes());
        assert_eq!(
            with_panic_message("unreachable".into(), &state),
            "unreachable: thread 'main' panicked at src/lib.rs:1:1: key **"
        );
    }

    #[test]
    fn a_sandbox_that_waited_elsewhere_changes_nothing_on_the_thread_that_drops_it() {
        std::thread::spawn(|| {
            waited();
            assert!(TEARDOWN.get() == Teardown::Inline, "a thread that never asked still tears down at once");
            TEARDOWN.set(Teardown::Deferred { waiting: true });
            waited();
            assert!(TEARDOWN.get() == (Teardown::Deferred { waiting: false }), "the next may wait");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_read_only_grant_narrows_every_directory() {
        assert_eq!(Grant::ReadOnly.narrow(Access::ReadWrite), Some(Access::ReadOnly));
        assert_eq!(Grant::ReadWrite.narrow(Access::ReadWrite), Some(Access::ReadWrite));
        assert_eq!(Grant::ReadWrite.narrow(Access::ReadOnly), Some(Access::ReadOnly));
        assert_eq!(Grant::Nothing.narrow(Access::ReadWrite), None);
    }
}
