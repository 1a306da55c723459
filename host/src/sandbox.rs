//! One call's sandbox: a fresh store with its own WASI context, limits and
//! host imports. Only this module and `engine` touch wasmtime's store types.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::keel::tool::{host, types};
use crate::bindings::{LogLevel, Tool as ToolBindings, ToolPre};
use crate::limits::{LimitKind, Limits};
use crate::tool::{CallError, ProgressSink};

/// Where the workspace appears inside the sandbox.
pub const WORKSPACE_MOUNT: &str = "/workspace";

/// Bytes of a guest's stdout and stderr kept per call; the rest is dropped.
/// Enough for a panic message and a few diagnostics, never a flood.
const CAPTURED_OUTPUT_BYTES: usize = 64 << 10;

/// Bytes of one progress report or log line kept; longer ones are cut.
const MAX_REPORT_BYTES: usize = 16 << 10;

/// A query (a per-input question such as `is-read-only`) must answer within
/// this much fuel and time: they are meant to be instant, and a query that
/// spins must not hold a batch for the whole call deadline.
pub const QUERY_FUEL: u64 = 1_000_000_000;
/// See [`QUERY_FUEL`].
pub const QUERY_DEADLINE: Duration = Duration::from_secs(2);

/// Filesystem access granted to one sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// No filesystem at all.
    Nothing,
    /// The workspace, read-only.
    ReadOnly,
    /// The workspace, read-write.
    ReadWrite,
}

/// The data of one sandbox's store.
pub struct SandboxState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: CallLimiter,
    plugin: Arc<str>,
    progress: Option<ProgressSink>,
    deadline: Instant,
    stderr: MemoryOutputPipe,
}

impl WasiView for SandboxState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl types::Host for SandboxState {}

impl host::Host for SandboxState {
    async fn progress(&mut self, data: String) {
        let Some(sink) = &self.progress else { return };
        let data = truncate(data, MAX_REPORT_BYTES);
        // A guest that sends something other than JSON still reports progress.
        let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
        sink(value);
    }

    async fn log(&mut self, level: LogLevel, message: String) {
        let message = truncate(message, MAX_REPORT_BYTES);
        let plugin = &*self.plugin;
        match level {
            LogLevel::Trace => tracing::trace!(plugin, "{message}"),
            LogLevel::Debug => tracing::debug!(plugin, "{message}"),
            LogLevel::Info => tracing::info!(plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            LogLevel::Error => tracing::error!(plugin, "{message}"),
        }
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Enforces the memory and table caps and remembers which one was hit, so
/// the trap that follows can be reported as that limit.
struct CallLimiter {
    memory: usize,
    table_elements: usize,
    hit: Option<LimitKind>,
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

/// A live instance of a plugin in its own store.
pub struct Sandbox {
    pub(crate) store: Store<SandboxState>,
    pub(crate) tool: ToolBindings,
    grant: Grant,
}

impl Sandbox {
    /// Instantiate `pre` in a fresh store with `grant` over `workspace`.
    pub async fn new(
        pre: &ToolPre<SandboxState>,
        plugin: Arc<str>,
        limits: &Limits,
        workspace: &Path,
        grant: Grant,
    ) -> Result<Self, CallError> {
        let stderr = MemoryOutputPipe::new(CAPTURED_OUTPUT_BYTES);
        let wasi = wasi_ctx(workspace, grant, &stderr)?;
        let state = SandboxState {
            wasi,
            table: ResourceTable::new(),
            limiter: CallLimiter { memory: limits.memory, table_elements: limits.table_elements, hit: None },
            plugin,
            progress: None,
            deadline: Instant::now() + QUERY_DEADLINE,
            stderr,
        };
        let mut store = Store::new(pre.engine(), state);
        store.limiter(|state| &mut state.limiter);
        store.set_fuel(QUERY_FUEL).map_err(|error| CallError::Host(error.to_string()))?;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|store| {
            if Instant::now() >= store.data().deadline {
                Err(wasmtime::Error::new(DeadlineExceeded))
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        let tool = pre
            .instantiate_async(&mut store)
            .await
            .map_err(|error| classify(&error, store.data(), limits, QUERY_FUEL))?;
        Ok(Sandbox { store, tool, grant })
    }

    /// The filesystem access this sandbox was given.
    pub fn grant(&self) -> Grant {
        self.grant
    }

    /// Replace the filesystem access, before the guest has used any.
    pub fn regrant(&mut self, workspace: &Path, grant: Grant) -> Result<(), CallError> {
        let stderr = self.store.data().stderr.clone();
        self.store.data_mut().wasi = wasi_ctx(workspace, grant, &stderr)?;
        self.grant = grant;
        Ok(())
    }

    /// Give the next export call `fuel` and `deadline`.
    pub fn budget(&mut self, fuel: u64, deadline: Duration) -> Result<(), CallError> {
        self.store.set_fuel(fuel).map_err(|error| CallError::Host(error.to_string()))?;
        self.store.data_mut().deadline = Instant::now() + deadline;
        Ok(())
    }

    /// Send the guest's progress reports to `sink`.
    pub fn report_progress_to(&mut self, sink: ProgressSink) {
        self.store.data_mut().progress = Some(sink);
    }

    /// Turn a failed export call into the error a model reads.
    pub fn classify(&self, error: &wasmtime::Error, limits: &Limits, fuel: u64) -> CallError {
        classify(error, self.store.data(), limits, fuel)
    }

    /// What the guest wrote to stderr, for diagnostics.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.store.data().stderr.contents()).into_owned()
    }
}

fn wasi_ctx(workspace: &Path, grant: Grant, stderr: &MemoryOutputPipe) -> Result<WasiCtx, CallError> {
    let mut builder = WasiCtxBuilder::new();
    // Filesystem calls then run on the calling thread instead of hopping to
    // tokio's blocking pool: up to ten times faster for file-reading tools.
    builder.allow_blocking_current_thread(true);
    builder.stdout(MemoryOutputPipe::new(CAPTURED_OUTPUT_BYTES));
    builder.stderr(stderr.clone());
    let perms = match grant {
        Grant::Nothing => None,
        Grant::ReadOnly => Some(FsPerms::ReadOnly),
        Grant::ReadWrite => Some(FsPerms::ReadWrite),
    };
    if let Some(perms) = perms {
        builder.preopened_dir(workspace, WORKSPACE_MOUNT, perms).map_err(|error| {
            CallError::Host(format!("failed to open workspace {}: {error}", workspace.display()))
        })?;
    }
    Ok(builder.build())
}

fn classify(error: &wasmtime::Error, state: &SandboxState, limits: &Limits, fuel: u64) -> CallError {
    let limit = |kind: LimitKind| {
        let value = match kind {
            LimitKind::Fuel => crate::limits::units(fuel),
            kind => limits.value_of(kind),
        };
        CallError::Limit { kind, value }
    };
    if let Some(kind) = state.limiter.hit {
        return limit(kind);
    }
    if error.downcast_ref::<DeadlineExceeded>().is_some() {
        return limit(LimitKind::Deadline);
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => limit(LimitKind::Fuel),
        Some(Trap::Interrupt) => limit(LimitKind::Deadline),
        Some(Trap::StackOverflow) => limit(LimitKind::Stack),
        Some(trap) => CallError::Trap(with_panic_message(trap.to_string(), state)),
        None => CallError::Trap(with_panic_message(format!("{error}"), state)),
    }
}

/// A Rust guest that panics prints why to stderr before it traps: that line
/// tells the model far more than "unreachable instruction executed".
fn with_panic_message(reason: String, state: &SandboxState) -> String {
    let stderr = state.stderr.contents();
    let stderr = String::from_utf8_lossy(&stderr);
    match stderr.lines().position(|line| line.contains("panicked at")) {
        Some(start) => {
            let panic: Vec<&str> = stderr.lines().skip(start).take(2).collect();
            format!("{reason}: {}", panic.join(" "))
        }
        None => reason,
    }
}
