//! Per-call sandbox limits and their defaults.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The limits every plugin call runs under. Each default says why it has its
/// value; all of them can be changed with [`crate::HostBuilder::limits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Fuel (roughly, WASM instructions) one call may burn, its per-input
    /// questions included. 10¹⁰ is a few seconds of pure compute: ample for a
    /// grep over a large tree, while a guest spinning forever still stops.
    pub fuel: u64,
    /// Wall-clock time one call may take, time blocked in host calls included.
    /// 30 s is long enough for real work and short enough that an agent does
    /// not appear hung.
    pub deadline: Duration,
    /// Bytes of linear memory one call may use. 256 MiB holds megabytes of
    /// output several times over while keeping ten concurrent calls well
    /// within a small machine.
    pub memory: usize,
    /// Elements of any one table. Real Rust tools use a few hundred; the cap
    /// only stops runaway growth.
    pub table_elements: usize,
    /// Bytes of WASM stack. 1 MiB is twice wasmtime's default, so that deep
    /// but finite recursion (a recursive-descent parser) still runs.
    pub stack: usize,
    /// Fuel all the calls of one batch may burn together, however the batch
    /// is split. 1.2 × 10¹¹ is ten calls at their full per-call budget, plus
    /// a question's fuel for each of the twenty calls planned behind them: a
    /// batch of real work never notices it, while a model that fans one
    /// spinning tool out over fifty calls still stops after the price of
    /// twelve. A call reserves its fuel from the allowance when it starts
    /// and gives back what it did not burn when it ends; were the allowance
    /// exactly ten calls' worth, the ten running at the default cap would
    /// hold it whole, and every question behind them would wait for one to
    /// finish.
    pub batch_fuel: u64,
    /// Bytes a guest may hand the host in one piece: one host call's
    /// arguments, or one export's result (wasmtime's "hostcall fuel"). 16 MiB
    /// is forty times the largest result a model ever reads whole (400 KB),
    /// so a real result fits, while a guest cannot make the host allocate
    /// hundreds of megabytes on its behalf.
    pub transfer: usize,
    /// Host-side handles (open files, streams, pollables) one call may hold
    /// at once. A tool walking a tree holds a handful; 10,000 only stops a
    /// guest that leaks them in a loop.
    pub resources: usize,
    /// Bytes of one `tool_use` input accepted before it is parsed as JSON.
    /// A model's whole turn is a few hundred kilobytes at most, so 4 MiB
    /// passes any real input and refuses a 50 MB blob before a parser sees it.
    pub input: usize,
    /// HTTP requests one call may make, refused ones counted too. A tool
    /// fetching a page, or paging through an API, makes a handful; 100
    /// stops a guest looping on requests long before it becomes a flood.
    pub network_requests: usize,
    /// Bytes one call may send, all requests together: their bodies, and
    /// each one's URL and headers as the guest wrote them. 16 MiB uploads a
    /// real file; it stops a guest pumping data out, through a body or a head.
    pub network_sent: usize,
    /// Bytes of response bodies one call may receive, all requests
    /// together. 64 MiB is a large download, and far beyond any result a
    /// model reads, while a guest cannot fill memory or disk from the net.
    pub network_received: usize,
    /// How long resolving a name and connecting (TLS included) may take.
    /// 10 s covers a slow resolver and a distant server.
    pub network_connect: Duration,
    /// How long a response may take to start, and how long its body may
    /// stall between chunks. 20 s leaves a tool time to report the failure
    /// inside the default deadline; it is always cut to the call's deadline.
    pub network_response: Duration,
    /// Connections one call may hold open at once. A tool fetching pages
    /// side by side uses a few; 8 stops a guest opening hundreds.
    pub network_connections: usize,
    /// Bytes of the shared context, as compact JSON text, that context
    /// modifiers may make it. Every call, and every question asked about
    /// one, is handed the whole context, copied into its sandbox and parsed
    /// there, and `keel serve` keeps it for as long as it runs. A working
    /// directory and a record of the files written take a few kilobytes;
    /// 1 MiB holds thousands of such entries, while one plugin cannot grow
    /// the context until every later call of every tool runs out of memory.
    /// A modifier is held to it too, on its own.
    pub context: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: 10_000_000_000,
            deadline: Duration::from_secs(30),
            memory: 256 << 20,
            table_elements: 100_000,
            stack: 1 << 20,
            batch_fuel: 120_000_000_000,
            transfer: 16 << 20,
            resources: 10_000,
            input: 4 << 20,
            network_requests: 100,
            network_sent: 16 << 20,
            network_received: 64 << 20,
            network_connect: Duration::from_secs(10),
            network_response: Duration::from_secs(20),
            network_connections: 8,
            context: 1 << 20,
        }
    }
}

impl Limits {
    /// The value of the limit `kind`, as an error message states it:
    /// `10000000000 units`, `30s`, `256 MiB`, `100000 elements`.
    pub fn value_of(&self, kind: LimitKind) -> String {
        match kind {
            LimitKind::Fuel => units(self.fuel),
            LimitKind::BatchFuel => units(self.batch_fuel),
            LimitKind::Deadline => format!("{:?}", self.deadline),
            LimitKind::Memory => human_bytes(self.memory),
            LimitKind::Table => format!("{} elements", self.table_elements),
            LimitKind::Stack => human_bytes(self.stack),
            LimitKind::Transfer => human_bytes(self.transfer),
            LimitKind::Resources => format!("{} handles", self.resources),
            LimitKind::Input => human_bytes(self.input),
            LimitKind::NetworkRequests => format!("{} requests", self.network_requests),
            LimitKind::NetworkSent => human_bytes(self.network_sent),
            LimitKind::NetworkReceived => human_bytes(self.network_received),
            LimitKind::NetworkConnect => format!("{:?}", self.network_connect),
            LimitKind::NetworkResponse => format!("{:?}", self.network_response),
            LimitKind::NetworkConnections => format!("{} connections", self.network_connections),
            LimitKind::Context => human_bytes(self.context),
        }
    }
}

/// An amount of fuel as an error message states it: `1000 units`.
pub fn units(fuel: u64) -> String {
    format!("{fuel} units")
}

/// The fuel allowance of one whole batch, shared by its calls: however a batch
/// is split, together its calls burn no more than this.
///
/// A call reserves its fuel before each export call and gives back what it
/// left unburnt. A reservation that finds too little left while other
/// reservations are out ([`BatchFuel::reserve`]) waits for them to come back
/// rather than fail: ten calls running at full budget hold a default
/// allowance whole, and the questions of the calls planned behind them would
/// otherwise be refused fuel the batch has not burnt.
#[derive(Clone, Debug)]
pub struct BatchFuel {
    pool: Arc<FuelPool>,
    total: u64,
}

/// The shared state of a [`BatchFuel`]: atomics, since every export call of
/// every call of a batch reserves and gives back.
#[derive(Debug, Default)]
struct FuelPool {
    /// What is left to reserve.
    left: AtomicU64,
    /// What is reserved and not yet given back.
    out: AtomicU64,
    /// Reservations waiting for fuel to come back.
    waiting: AtomicU64,
    /// Woken when a reservation comes back while one waits.
    returned: tokio::sync::Notify,
}

impl BatchFuel {
    /// An allowance of `total` fuel.
    pub fn new(total: u64) -> Self {
        let pool = FuelPool { left: AtomicU64::new(total), ..FuelPool::default() };
        BatchFuel { pool: Arc::new(pool), total }
    }

    /// The allowance it started with.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// What is left, not counting what is reserved.
    pub fn left(&self) -> u64 {
        self.pool.left.load(Ordering::SeqCst)
    }

    /// Take up to `want` fuel now; returns what was granted (0 when spent).
    /// What is granted is reserved until [`BatchFuel::give_back`].
    pub fn take(&self, want: u64) -> u64 {
        let pool = &self.pool;
        // Counted out first, at most: meanwhile left and out together never
        // look smaller than they are, so a reservation that should wait does.
        pool.out.fetch_add(want, Ordering::SeqCst);
        let mut left = pool.left.load(Ordering::SeqCst);
        loop {
            let granted = want.min(left);
            match pool.left.compare_exchange_weak(left, left - granted, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    pool.out.fetch_sub(want - granted, Ordering::SeqCst);
                    return granted;
                }
                Err(actual) => left = actual,
            }
        }
    }

    /// Take up to `want` fuel, waiting while less than that is left and the
    /// reservations out could make it up, since what they do not burn comes
    /// back. Returns what was granted: `want`, or all that is left when what
    /// is out could not make it up (0 when the allowance is spent).
    pub async fn reserve(&self, want: u64) -> u64 {
        let pool = &self.pool;
        loop {
            let left = pool.left.load(Ordering::SeqCst);
            // Waiting helps only when what is out could make up `want`.
            if left >= want || left.saturating_add(pool.out.load(Ordering::SeqCst)) < want {
                return self.take(want);
            }
            // Counted as waiting before the state is read again, and the
            // wake-up made before that: a return in between wakes it.
            let returned = pool.returned.notified();
            pool.waiting.fetch_add(1, Ordering::SeqCst);
            let left = pool.left.load(Ordering::SeqCst);
            let worth_waiting = left < want && left.saturating_add(pool.out.load(Ordering::SeqCst)) >= want;
            if worth_waiting {
                returned.await;
            }
            pool.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// End a reservation of `taken` fuel of which `unused` was not burnt.
    pub fn give_back(&self, taken: u64, unused: u64) {
        let pool = &self.pool;
        pool.left.fetch_add(unused.min(taken), Ordering::SeqCst);
        let _ =
            pool.out.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |out| Some(out.saturating_sub(taken)));
        if pool.waiting.load(Ordering::SeqCst) > 0 {
            pool.returned.notify_waiters();
        }
    }
}

/// Which limit a call ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// The fuel budget.
    Fuel,
    /// The wall-clock deadline.
    Deadline,
    /// The linear-memory cap.
    Memory,
    /// The table-size cap.
    Table,
    /// The WASM stack cap.
    Stack,
    /// The fuel allowance of the whole batch.
    BatchFuel,
    /// The cap on bytes handed from guest to host in one piece.
    Transfer,
    /// The cap on host-side handles held at once.
    Resources,
    /// The cap on one input's size before parsing.
    Input,
    /// The cap on HTTP requests per call (`network_requests`).
    NetworkRequests,
    /// The cap on request body bytes per call (`network_sent_mib`).
    NetworkSent,
    /// The cap on response body bytes per call (`network_received_mib`).
    NetworkReceived,
    /// The time a name lookup and connection may take (`network_connect_ms`).
    NetworkConnect,
    /// The time a response may take to start or stall (`network_response_ms`).
    NetworkResponse,
    /// The cap on connections open at once (`network_connections`).
    NetworkConnections,
    /// The cap on the shared context's size (`context_kib`).
    Context,
}

impl fmt::Display for LimitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LimitKind::Fuel => "fuel limit",
            LimitKind::Deadline => "deadline",
            LimitKind::Memory => "memory limit",
            LimitKind::Table => "table limit",
            LimitKind::Stack => "stack limit",
            LimitKind::BatchFuel => "batch fuel allowance",
            LimitKind::Transfer => "guest-to-host transfer limit",
            LimitKind::Resources => "resource handle limit",
            LimitKind::Input => "input size limit",
            LimitKind::NetworkRequests => "network request limit (network_requests)",
            LimitKind::NetworkSent => "network upload limit (network_sent_mib)",
            LimitKind::NetworkReceived => "network download limit (network_received_mib)",
            LimitKind::NetworkConnect => "network connect timeout (network_connect_ms)",
            LimitKind::NetworkResponse => "network response timeout (network_response_ms)",
            LimitKind::NetworkConnections => "network connection limit (network_connections)",
            LimitKind::Context => "context size limit (context_kib)",
        })
    }
}

/// Why an input of `size` bytes of JSON text was refused under a cap of
/// `max_input`; `input` names it ("the input", "the input of content[3]"
/// in a message, "the input of [3]" in a bare array).
pub(crate) fn input_too_large(max_input: usize, input: &str, size: usize) -> String {
    format!("{} of {} exceeded: {input} is {size} bytes", LimitKind::Input, human_bytes(max_input))
}

/// A byte count as a person reads it: `256 MiB`, `1 MiB`, `512 KiB`, `100 B`.
pub fn human_bytes(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// What a call's sandboxes used, shared by the tool that runs them
/// ([`Invocation::record_usage`](crate::tool::Invocation::record_usage)) and the host
/// that reports it: updated as the call goes, read once it ended.
#[derive(Debug, Default)]
pub struct Usage {
    fuel: AtomicU64,
    memory_peak: AtomicU64,
    setups: Mutex<Vec<(Instant, Instant)>>,
}

impl Usage {
    /// A new, shared record of nothing used.
    pub fn shared() -> Arc<Usage> {
        Arc::default()
    }

    /// `fuel` more was burnt.
    pub fn burnt(&self, fuel: u64) {
        self.fuel.fetch_add(fuel, Ordering::Relaxed);
    }

    /// A sandbox's linear memory grew to `bytes`.
    pub fn memory(&self, bytes: u64) {
        self.memory_peak.fetch_max(bytes, Ordering::Relaxed);
    }

    /// A sandbox was set up from `start` to `end`.
    pub fn set_up(&self, start: Instant, end: Instant) {
        self.setups.lock().unwrap_or_else(PoisonError::into_inner).push((start, end));
    }

    /// Fuel burnt so far.
    pub fn fuel(&self) -> u64 {
        self.fuel.load(Ordering::Relaxed)
    }

    /// The largest linear memory so far, in bytes.
    pub fn memory_peak(&self) -> u64 {
        self.memory_peak.load(Ordering::Relaxed)
    }

    pub(crate) fn take_setups(&self) -> Vec<(Instant, Instant)> {
        std::mem::take(&mut *self.setups.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_fuel_is_shared_and_never_overdrawn() {
        let fuel = BatchFuel::new(100);
        let other = fuel.clone();
        assert_eq!(fuel.take(60), 60);
        assert_eq!(other.take(60), 40, "only what is left");
        assert_eq!(fuel.take(1), 0);
        other.give_back(40, 15);
        assert_eq!(fuel.left(), 15);
        assert_eq!(fuel.total(), 100);
    }

    #[test]
    fn a_reservation_waits_for_fuel_reserved_elsewhere_and_not_burnt() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let fuel = BatchFuel::new(100);
            assert_eq!(fuel.reserve(100).await, 100);
            let waiting = tokio::spawn({
                let fuel = fuel.clone();
                async move { fuel.reserve(30).await }
            });
            tokio::task::yield_now().await;
            assert!(!waiting.is_finished(), "nothing is left while the first reservation is out");
            // The first burnt 40 of its 100: 60 come back, and 30 of them go.
            fuel.give_back(100, 60);
            assert_eq!(waiting.await.unwrap(), 30);
            assert_eq!(fuel.left(), 30);
            // Nothing out: what is left is all there will be.
            fuel.give_back(30, 0);
            assert_eq!(fuel.reserve(50).await, 30);
            fuel.give_back(30, 0);
            assert_eq!(fuel.reserve(1).await, 0, "spent");
        });
    }

    #[test]
    fn each_limit_states_its_value_in_its_unit() {
        let limits = Limits::default();
        let stated: Vec<String> = [
            LimitKind::Fuel,
            LimitKind::BatchFuel,
            LimitKind::Deadline,
            LimitKind::Memory,
            LimitKind::Table,
            LimitKind::Stack,
            LimitKind::Transfer,
            LimitKind::Resources,
            LimitKind::Input,
            LimitKind::NetworkRequests,
            LimitKind::NetworkSent,
            LimitKind::NetworkReceived,
            LimitKind::NetworkConnect,
            LimitKind::NetworkResponse,
            LimitKind::NetworkConnections,
            LimitKind::Context,
        ]
        .into_iter()
        .map(|kind| format!("{kind} of {}", limits.value_of(kind)))
        .collect();
        assert_eq!(
            stated,
            [
                "fuel limit of 10000000000 units",
                "batch fuel allowance of 120000000000 units",
                "deadline of 30s",
                "memory limit of 256 MiB",
                "table limit of 100000 elements",
                "stack limit of 1 MiB",
                "guest-to-host transfer limit of 16 MiB",
                "resource handle limit of 10000 handles",
                "input size limit of 4 MiB",
                "network request limit (network_requests) of 100 requests",
                "network upload limit (network_sent_mib) of 16 MiB",
                "network download limit (network_received_mib) of 64 MiB",
                "network connect timeout (network_connect_ms) of 10s",
                "network response timeout (network_response_ms) of 20s",
                "network connection limit (network_connections) of 8 connections",
                "context size limit (context_kib) of 1 MiB",
            ]
        );
    }

    #[test]
    fn human_bytes_uses_the_largest_exact_unit() {
        assert_eq!(human_bytes(256 << 20), "256 MiB");
        assert_eq!(human_bytes(1536), "1536 B");
        assert_eq!(human_bytes(2 << 30), "2 GiB");
        assert_eq!(human_bytes(512 << 10), "512 KiB");
        assert_eq!(human_bytes(100), "100 B");
    }
}
