//! The figures of `keel bench`: each keel figure beside a baseline measured
//! in the same run, on the same engine settings.
//!
//! Every figure but the MCP server's CPU time is a median over repeated
//! rounds; that one is a total over all measured calls, divided by the
//! calls. Targets are stated, never
//! asserted: a slow machine reports `met: false` rather than failing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use keel_host::budget::ledger::Ledger;
use keel_host::budget::{Budget, BudgetConfig, Threshold};
use keel_host::load::floor::{CACHE_RACY_WINDOW, Floor};
use keel_host::{Host, ToolResult, ToolUse};

pub mod http;
pub mod mcp;
pub mod network;

/// What stops a figure from being measured.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// keel failed at something a user does too: building a host, reading
    /// or writing a file, starting a process.
    #[error(transparent)]
    Host(#[from] keel_host::Error),
    /// What the figure measures did not go as it must: a server did not
    /// start, a call failed or gave a wrong result.
    #[error("{0}")]
    Failed(String),
}

/// The result of measuring a figure.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// `action` on `path` failed with `error` (see [`keel_host::Error::io`]).
    pub fn io(action: &'static str, path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Host(keel_host::Error::io(action, path, error))
    }
}

/// One figure, as `keel bench --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    /// What is measured; says which way `ratio` is taken.
    pub name: String,
    /// keel's value.
    pub keel: f64,
    /// The baseline's value, measured in the same run.
    pub baseline: f64,
    /// The unit of both values.
    pub unit: &'static str,
    /// keel ÷ baseline (for throughput: keel's rate ÷ the baseline's).
    pub ratio: f64,
    /// The target, in words; `None` when the figure is only reported.
    pub target: Option<String>,
    /// Whether the target was met.
    pub met: Option<bool>,
}

impl Figure {
    fn new(name: &str, keel: f64, baseline: f64, unit: &'static str) -> Self {
        let ratio = if baseline == 0.0 { f64::NAN } else { keel / baseline };
        Figure { name: name.into(), keel, baseline, unit, ratio, target: None, met: None }
    }

    fn at_most(mut self, target: f64) -> Self {
        self.target = Some(format!("ratio <= {target}"));
        self.met = Some(self.ratio <= target);
        self
    }

    fn at_least(mut self, target: f64) -> Self {
        self.target = Some(format!("ratio >= {target}"));
        self.met = Some(self.ratio >= target);
        self
    }

    /// A target on keel's value itself, in the figure's unit.
    fn keel_at_most(mut self, target: f64) -> Self {
        self.target = Some(format!("keel <= {target} {}", self.unit));
        self.met = Some(self.keel <= target);
        self
    }
}

/// A burst's replies that came back right, of the `calls` sent, when
/// `lost` did not: the target is every one.
pub(crate) fn answered(name: &str, lost: usize, calls: usize) -> Figure {
    Figure::new(name, (calls - lost) as f64, calls as f64, "calls").at_least(1.0)
}

/// How long and on what to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Few iterations: for CI, so the suite cannot rot; figures are noisy.
    pub quick: bool,
    /// The directory of the bundled example tools (`echo` and `hash`).
    pub tools: PathBuf,
    /// The `keel` binary: the MCP figures run `keel serve` and their
    /// baseline ([`mcp::NATIVE_ECHO_ARGS`]) from it as child processes.
    pub keel: PathBuf,
}

impl BenchOptions {
    fn scale(&self, full: usize, quick: usize) -> usize {
        if self.quick { quick } else { full }
    }

    fn tool(&self, name: &str) -> PathBuf {
        self.tools.join(format!("keel_tool_{name}.wasm"))
    }
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// A runtime of `workers` threads, set up as `keel serve` sets up its own.
fn runtime(workers: usize) -> tokio::runtime::Runtime {
    crate::call_runtime().worker_threads(workers).build().expect("a tokio runtime")
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

async fn echo_host(options: &BenchOptions, workspace: &Path) -> Result<Host> {
    Ok(Host::builder()
        .workspace(workspace)
        .plugins(options.tool("echo"))
        .plugins(options.tool("hash"))
        .cache_dir(keel_host::load::default_cache_dir())
        .build()
        .await?)
}

fn echo_use(id: usize) -> ToolUse {
    ToolUse::new(format!("toolu_{id}"), "echo", json!({ "text": "hello" }))
}

/// Figure 1: one call through keel's whole path against the floor.
pub fn per_call(options: &BenchOptions) -> Result<Figure> {
    let workspace = tempdir()?;
    let rt = runtime(1);
    let host = rt.block_on(echo_host(options, workspace.path()))?;
    let floor = Floor::new(&options.tool("echo"))?;
    let (rounds, per_round) = (options.scale(30, 5), options.scale(200, 20));
    let input = r#"{"text":"hello"}"#;
    // Each batch is made before the clock starts, as the floor's input is:
    // what an agent hands keel is not part of keel's path.
    let uses: Vec<ToolUse> = (0..per_round).map(echo_use).collect();
    let (mut keel, mut bare) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for tool_use in &uses {
            floor.call(input).await.expect("echo does not fail");
            host.run_batch(std::slice::from_ref(tool_use)).await;
        }
        for _ in 0..rounds {
            let started = Instant::now();
            for _ in 0..per_round {
                floor.call(input).await.expect("echo does not fail");
            }
            bare.push(started.elapsed().as_secs_f64() * 1e6 / per_round as f64);
            let started = Instant::now();
            for tool_use in &uses {
                host.run_batch(std::slice::from_ref(tool_use)).await;
            }
            keel.push(started.elapsed().as_secs_f64() * 1e6 / per_round as f64);
        }
    });
    Ok(Figure::new("per_call_overhead (keel / floor)", median(keel), median(bare), "µs").at_most(1.25))
}

/// Figure 1, after idle: one call through keel's whole path against the
/// floor, each call after 5 ms in which the process does nothing, as calls
/// arrive from a model between its turns: what a call costs when the
/// caches hold something else.
pub fn per_call_after_idle(options: &BenchOptions) -> Result<Figure> {
    let workspace = tempdir()?;
    let rt = runtime(1);
    let host = rt.block_on(echo_host(options, workspace.path()))?;
    let floor = Floor::new(&options.tool("echo"))?;
    let calls = options.scale(200, 20);
    let input = r#"{"text":"hello"}"#;
    let idle = std::time::Duration::from_millis(5);
    let (mut keel, mut bare) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for id in 0..calls {
            std::thread::sleep(idle);
            let started = Instant::now();
            floor.call(input).await.expect("echo does not fail");
            bare.push(started.elapsed().as_secs_f64() * 1e6);
            let batch = [echo_use(id)];
            std::thread::sleep(idle);
            let started = Instant::now();
            host.run_batch(&batch).await;
            keel.push(started.elapsed().as_secs_f64() * 1e6);
        }
    });
    Ok(Figure::new(
        "per_call_overhead_after_idle (keel / floor, each after 5 ms idle)",
        median(keel),
        median(bare),
        "µs",
    ))
}

/// Figure 2: 1,000 concurrency-safe calls, cap 10, against the floor's same
/// loop under a semaphore; with `workers` tokio workers. A round takes
/// about 15 ms, in which a machine's other work weighs much; the median of
/// 21 rounds holds still where that of 7 moved by a tenth.
pub fn throughput(options: &BenchOptions, workers: usize) -> Result<Figure> {
    let workspace = tempdir()?;
    let rt = runtime(workers);
    let host = rt.block_on(echo_host(options, workspace.path()))?;
    let floor = Arc::new(Floor::new(&options.tool("echo"))?);
    let (rounds, calls) = (options.scale(21, 3), options.scale(1_000, 200));
    let uses: Vec<ToolUse> = (0..calls).map(echo_use).collect();
    let (mut keel, mut bare) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for _ in 0..rounds {
            let started = Instant::now();
            let semaphore = Arc::new(tokio::sync::Semaphore::new(10));
            let tasks: Vec<_> = (0..calls)
                .map(|_| {
                    let (floor, semaphore) = (floor.clone(), semaphore.clone());
                    tokio::spawn(async move {
                        let _permit = semaphore.acquire().await.expect("the semaphore stays open");
                        floor.call(r#"{"text":"hello"}"#).await.expect("echo does not fail")
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("a floor call does not panic");
            }
            bare.push(calls as f64 / started.elapsed().as_secs_f64());
            let started = Instant::now();
            host.run_batch(&uses).await;
            keel.push(calls as f64 / started.elapsed().as_secs_f64());
        }
    });
    let name = format!("throughput_{workers}_workers (keel / floor calls per s)");
    Ok(Figure::new(&name, median(keel), median(bare), "calls/s").at_least(0.9))
}

/// Figure 3: 100 CPU-heavy `hash` calls, cap 10: wall time against the
/// serial time divided by the cores.
pub fn batch_speedup(options: &BenchOptions) -> Result<Figure> {
    let workspace = tempdir()?;
    let rt = runtime(cores());
    let host = rt.block_on(echo_host(options, workspace.path()))?;
    let (calls, rounds) = (options.scale(100, 20), options.scale(20_000, 2_000));
    let uses: Vec<ToolUse> = (0..calls)
        .map(|i| {
            ToolUse::new(format!("toolu_{i}"), "hash", json!({ "text": format!("{i}"), "rounds": rounds }))
        })
        .collect();
    let (serial, parallel) = rt.block_on(async {
        let started = Instant::now();
        for tool_use in &uses {
            host.run_batch(std::slice::from_ref(tool_use)).await;
        }
        let serial = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        host.run_batch(&uses).await;
        (serial, started.elapsed().as_secs_f64() * 1e3)
    });
    let ideal = serial / cores() as f64;
    Ok(Figure::new("batch_speedup (wall / (serial / cores))", parallel, ideal, "ms").at_most(1.15))
}

/// Figure 4: a ready pool of 50 plugins, compile cache warm; the cold
/// figure is reported as the baseline. Each start is a fresh `keel` process
/// ([`START_POOL_ARGS`], timed by [`start_pool`] from its `main`), so what a
/// real start pays is counted: the allocator, the code and the caches of a
/// new process all start cold. Warm means the cache holds the compiled code
/// and its index can know the plugin files: they last changed more than 2 s
/// ago, as installed plugins have (the cache reads and hashes a file changed
/// more recently on every start).
pub fn startup(options: &BenchOptions) -> Result<Figure> {
    let plugins = fifty_plugins(options)?;
    let copied = Instant::now();
    let cache = tempdir()?;
    let start = || -> Result<f64> {
        let [ms] = child_figures(options, &START_POOL_ARGS, plugins.path(), cache.path())?;
        Ok(ms)
    };
    let cold = start()?;
    std::thread::sleep(CACHE_RACY_WINDOW.saturating_sub(copied.elapsed()));
    let warm: Vec<f64> = (0..options.scale(21, 3)).map(|_| start()).collect::<Result<_>>()?;
    Ok(Figure::new("startup_50_plugins (warm cache / cold)", median(warm), cold, "ms").keel_at_most(10.0))
}

/// A directory of 50 plugins: the bundled tools, copied over and over.
pub(crate) fn fifty_plugins(options: &BenchOptions) -> Result<tempfile::TempDir> {
    let plugins = tempdir()?;
    let sources: Vec<PathBuf> = keel_host::load::plugin_files(&options.tools)?;
    for i in 0..50 {
        let source = &sources[i % sources.len()];
        let target = plugins.path().join(format!("p{i:02}.wasm"));
        std::fs::copy(source, &target).map_err(|error| Error::io("copy", source, error))?;
    }
    Ok(plugins)
}

pub(crate) fn tempdir() -> Result<tempfile::TempDir> {
    tempfile::tempdir().map_err(|error| Error::io("create", std::env::temp_dir(), error))
}

/// `keel serve` over `workspace` with the plugins in `plugins`: the server
/// every MCP figure measures, stdio unless the caller adds `--http`.
pub(crate) fn keel_serve(
    options: &BenchOptions,
    plugins: &Path,
    workspace: &Path,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(&options.keel);
    command.arg("serve").arg("--plugins").arg(plugins).arg("--workspace").arg(workspace);
    command
}

/// Run the `keel` binary with `args`, `plugins` and `cache`, and read the
/// `N` numbers it prints on one line: the figures of one fresh process.
pub(crate) fn child_figures<const N: usize>(
    options: &BenchOptions,
    args: &[&str],
    plugins: &Path,
    cache: &Path,
) -> Result<[f64; N]> {
    let output = std::process::Command::new(&options.keel)
        .args(args)
        .arg(plugins)
        .arg(cache)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|error| Error::io("run", &options.keel, error))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let numbers: Vec<f64> = stdout.split_whitespace().filter_map(|word| word.parse().ok()).collect();
    match <[f64; N]>::try_from(numbers) {
        Ok(numbers) if output.status.success() => Ok(numbers),
        _ => Err(Error::Failed(format!(
            "`keel {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))),
    }
}

/// The arguments that make the `keel` binary start a pool from a directory
/// of plugins and a compile cache (two more arguments), print how long that
/// took in milliseconds and exit: one start of figure 4.
pub const START_POOL_ARGS: [&str; 2] = ["bench", "--start-pool"];

/// Build a host of every plugin in `plugins`, which is also its workspace,
/// with its compile cache in `cache`; give the milliseconds from `started`
/// (the process's start) until its pool is ready, with the host and the
/// runtime it runs on. Tearing them down is not part of a start: the caller
/// may exit without it.
pub fn start_pool(
    plugins: &Path,
    cache: &Path,
    started: Instant,
) -> Result<(f64, Host, tokio::runtime::Runtime)> {
    let runtime = runtime(cores());
    let build =
        Host::builder().workspace(plugins).plugins(plugins).cache_dir(Some(cache.to_path_buf())).build();
    // The copies' names clash, and each clash is a warning: not what is
    // measured. The subscriber that hides them names its highest level, none,
    // so that it leaves the level the process's subscribers are asked about
    // where it was (`tracing`'s `NoSubscriber` names none, which lifts it to
    // TRACE for good).
    let quiet = tracing_subscriber::layer::SubscriberExt::with(
        tracing_subscriber::registry(),
        tracing_subscriber::filter::LevelFilter::OFF,
    );
    let host = tracing::subscriber::with_default(quiet, || runtime.block_on(build))?;
    Ok((started.elapsed().as_secs_f64() * 1e3, host, runtime))
}

/// Figure 5: `hash` of 10 MB in keel against the same sha256 natively; and
/// the same call on a bare engine with fuel and epoch interruption off, so
/// that what metering costs shows apart from the rest of the path.
pub fn tool_work(options: &BenchOptions) -> Result<Vec<Figure>> {
    let workspace = tempdir()?;
    let size = options.scale(10 << 20, 1 << 20);
    let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let path = workspace.path().join("data.bin");
    std::fs::write(&path, &bytes).map_err(|error| Error::io("write", &path, error))?;
    let rt = runtime(1);
    let host = rt.block_on(echo_host(options, workspace.path()))?;
    let input = json!({ "file_path": "data.bin" });
    let call = [ToolUse::new("toolu_1", "hash", input.clone())];
    let rounds = options.scale(7, 3);
    let time = |mut f: Box<dyn FnMut() + '_>| -> Vec<f64> {
        (0..rounds)
            .map(|_| {
                let started = Instant::now();
                f();
                started.elapsed().as_secs_f64() * 1e3
            })
            .collect()
    };
    let keel = time(Box::new(|| {
        let outcome = rt.block_on(host.run_batch(&call));
        assert!(!outcome.results[0].is_error, "hash failed: {}", outcome.results[0].content);
    }));
    let native = time(Box::new(|| {
        std::hint::black_box(Sha256::digest(&bytes));
    }));
    let unmetered = Floor::unmetered(&options.tool("hash"), workspace.path())?;
    let input = input.to_string();
    let off = time(Box::new(|| {
        let output = rt.block_on(unmetered.call(&input));
        assert!(output.is_ok(), "hash failed: {output:?}");
    }));
    let native = median(native);
    Ok(vec![
        Figure::new("tool_work_hash_10mb (keel with fuel+epoch / native)", median(keel), native, "ms"),
        Figure::new(
            "tool_work_hash_10mb_unmetered (bare, fuel+epoch off / native)",
            median(off),
            native,
            "ms",
        ),
    ])
}

/// Figure 6: per-message enforcement over ten 1 MB results against a plain
/// write of the same bytes.
pub fn budgets(options: &BenchOptions) -> Result<Figure> {
    let rounds = options.scale(7, 3);
    let content = "x".repeat(1 << 20);
    let rt = runtime(1);
    let (mut keel, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let session = tempdir()?;
        let budget = Budget::new(&BudgetConfig::default(), session.path());
        let mut results: Vec<ToolResult> =
            (0..10).map(|i| ToolResult::ok(format!("toolu_{i}"), content.clone())).collect();
        let thresholds = vec![Threshold::default(); 10];
        let started = Instant::now();
        rt.block_on(budget.per_message(&mut results, &thresholds, &mut Ledger::new()));
        keel.push(started.elapsed().as_secs_f64() * 1e3);

        let dir = tempdir()?;
        let started = Instant::now();
        for i in 0..10 {
            let path = dir.path().join(format!("{i}.txt"));
            std::fs::write(&path, &content).map_err(|error| Error::io("write", &path, error))?;
        }
        plain.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Figure::new("budget_per_message_10x1mb (keel / plain write)", median(keel), median(plain), "ms"))
}

/// Figure 9: the sha256 of 1 MiB the guest makes itself (`hash` of a
/// 1 KiB text repeated 1,024 times, one whole call) against the same Rust
/// code run natively: what the guest's compiled code costs, with no file
/// read between.
pub fn guest_compute(options: &BenchOptions) -> Result<Figure> {
    let workspace = tempdir()?;
    let rt = runtime(1);
    let host = rt.block_on(echo_host(options, workspace.path()))?;
    let text: String = (0..1024).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    let repeat = 1024;
    let call = [ToolUse::new("toolu_1", "hash", json!({ "text": text, "repeat": repeat }))];
    let expected = {
        let mut hasher = Sha256::new();
        (0..repeat).for_each(|_| hasher.update(text.as_bytes()));
        hex(&hasher.finalize())
    };
    let rounds = options.scale(21, 3);
    let (mut keel, mut native) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let started = Instant::now();
        let outcome = rt.block_on(host.run_batch(&call));
        keel.push(started.elapsed().as_secs_f64() * 1e3);
        let result = &outcome.results[0];
        if result.is_error || result.content.as_text() != Some(expected.as_str()) {
            return Err(Error::Failed(format!("hash gave {}, not {expected}", result.content)));
        }
        let started = Instant::now();
        let mut hasher = Sha256::new();
        (0..repeat).for_each(|_| hasher.update(std::hint::black_box(text.as_bytes())));
        std::hint::black_box(hasher.finalize());
        native.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Figure::new("guest_compute_sha256_1mib (keel call / native)", median(keel), median(native), "ms")
        .at_most(1.3))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Figure 10: a plugin's first call after a warm start against its later
/// calls made back to back, and against later calls that each come after
/// 5 ms idle, as a server's calls come (its first among them); and the
/// warm-up that makes the first call cheap, which runs in the background
/// once the pool is ready, against the start itself. Each start
/// is a fresh `keel` process ([`FIRST_CALL_ARGS`], timed by
/// [`first_call_in_process`]) of 50 plugins whose compiled code and answers
/// are in the compile cache.
pub fn first_call(options: &BenchOptions) -> Result<[Figure; 3]> {
    let plugins = fifty_plugins(options)?;
    let copied = Instant::now();
    let cache = tempdir()?;
    // The first start fills the cache.
    child_figures::<4>(options, &FIRST_CALL_ARGS, plugins.path(), cache.path())?;
    std::thread::sleep(CACHE_RACY_WINDOW.saturating_sub(copied.elapsed()));
    let (mut first, mut later, mut after_idle) = (Vec::new(), Vec::new(), Vec::new());
    let (mut warm_up, mut start) = (Vec::new(), Vec::new());
    for _ in 0..options.scale(11, 3) {
        let [once, then, idle, warming] =
            child_figures::<4>(options, &FIRST_CALL_ARGS, plugins.path(), cache.path())?;
        first.push(once);
        later.push(then);
        after_idle.push(idle);
        warm_up.push(warming);
        let [ms] = child_figures::<1>(options, &START_POOL_ARGS, plugins.path(), cache.path())?;
        start.push(ms);
    }
    let first = median(first);
    Ok([
        Figure::new("first_call_after_warm_start (first call / later call)", first, median(later), "µs")
            .at_most(2.0),
        Figure::new(
            "first_call_after_warm_start_vs_idle (first call / a later call after 5 ms idle)",
            first,
            median(after_idle),
            "µs",
        ),
        Figure::new(
            "first_call_warm_up_50_plugins (in the background once ready / the start)",
            median(warm_up),
            median(start),
            "ms",
        ),
    ])
}

/// The arguments that make the `keel` binary start a pool from a directory
/// of plugins and a compile cache (two more arguments), time the first call
/// of `echo` and its later calls, print both in µs, and exit: one start of
/// figure 10.
pub const FIRST_CALL_ARGS: [&str; 2] = ["bench", "--first-call"];

/// Start a pool as [`start_pool`] does and warm it up as `keel serve` does
/// once it is ready ([`Host::warm_up`]), then give the µs of the first call
/// of `echo`, the median of the 20 calls after it, the median of 10 more
/// calls each made after 5 ms in which the process does nothing, and the ms
/// the warm-up took.
pub fn first_call_in_process(plugins: &Path, cache: &Path, started: Instant) -> Result<[f64; 4]> {
    let (_, host, runtime) = start_pool(plugins, cache, started)?;
    let warming = Instant::now();
    runtime.block_on(host.warm_up());
    let warm_up = warming.elapsed().as_secs_f64() * 1e3;
    let call = |id: usize| -> Result<f64> {
        let batch = [echo_use(id)];
        let started = Instant::now();
        let outcome = runtime.block_on(host.run_batch(&batch));
        let micros = started.elapsed().as_secs_f64() * 1e6;
        if outcome.results[0].is_error {
            return Err(Error::Failed(format!("echo failed: {}", outcome.results[0].content)));
        }
        Ok(micros)
    };
    let first = call(0)?;
    let later = (1..21).map(call).collect::<Result<Vec<_>>>()?;
    let after_idle = (21..31)
        .map(|id| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            call(id)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok([first, median(later), median(after_idle), warm_up])
}

/// Figure 11: a 2 MiB image result through the result budgets and into the
/// message (checked, held to the per-tool and per-message budgets, and
/// serialized as the `tool_result` a model reads, base64 and all) against
/// copying its bytes.
pub fn rich_result(options: &BenchOptions) -> Result<Figure> {
    let data = png_of(2 << 20);
    let rt = runtime(1);
    let (mut keel, mut copy) = (Vec::new(), Vec::new());
    for _ in 0..options.scale(21, 3) {
        let session = tempdir()?;
        let budget = Budget::new(&BudgetConfig::default(), session.path());
        let started = Instant::now();
        let image = keel_host::Image::new("image/png", data.as_slice());
        image.check().map_err(|reason| Error::Failed(format!("the benchmark's image {reason}")))?;
        let content = keel_host::Content::from_blocks(vec![keel_host::ContentBlock::Image(image)]);
        let result = ToolResult::ok("toolu_1", content);
        let threshold = Threshold::default();
        let mut results = [rt.block_on(budget.per_tool(result, threshold))];
        rt.block_on(budget.per_message(&mut results, &[threshold], &mut Ledger::new()));
        let message = serde_json::to_vec(&results[0]).expect("a result serializes");
        keel.push(started.elapsed().as_secs_f64() * 1e3);
        if message.len() < data.len() {
            return Err(Error::Failed("the image did not reach the message".into()));
        }
        let started = Instant::now();
        std::hint::black_box(std::hint::black_box(&data).clone());
        copy.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Figure::new("rich_result_image_2mib (budget + message / copy)", median(keel), median(copy), "ms"))
}

/// A PNG of `size` bytes: a real header for a 1,024 × 1,024 image, then
/// filler, which is all a header check reads.
fn png_of(size: usize) -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    png.extend_from_slice(&1024u32.to_be_bytes());
    png.extend_from_slice(&1024u32.to_be_bytes());
    png.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
    png.resize(size, 0x5a);
    png
}

/// Figure 7: resident memory after 1,000 and after 10,000 calls.
pub fn memory(options: &BenchOptions) -> Result<Figure> {
    let workspace = tempdir()?;
    let rt = runtime(cores());
    let host = rt.block_on(echo_host(options, workspace.path()))?;
    let (first, total) = (options.scale(1_000, 200), options.scale(10_000, 2_000));
    let batch: Vec<ToolUse> = (0..100).map(echo_use).collect();
    let mut after_first = 0;
    for done in (100..=total).step_by(100) {
        rt.block_on(host.run_batch(&batch));
        if done == first {
            after_first = resident_kib("self")?;
        }
    }
    let name = format!("memory_rss (after {total} calls / after {first})");
    let figure =
        Figure::new(&name, resident_kib("self")? as f64 / 1024.0, after_first as f64 / 1024.0, "MiB");
    Ok(figure.at_most(1.05))
}

/// The resident set of `process` (a pid, or `self`), in KiB.
pub(crate) fn resident_kib(process: &str) -> Result<u64> {
    let path = PathBuf::from(format!("/proc/{process}/status"));
    let status = std::fs::read_to_string(&path).map_err(|error| Error::io("read", &path, error))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| Error::io("parse", &path, std::io::Error::other("no VmRSS line")))
}

/// The figures, by the first word of their name.
pub const FIGURES: &[&str] = &[
    "per_call_overhead",
    "throughput",
    "batch_speedup",
    "startup_50_plugins",
    "first_call",
    "tool_work_hash_10mb",
    "guest_compute_sha256_1mib",
    "budget_per_message_10x1mb",
    "rich_result_image_2mib",
    "memory_rss",
    "network",
    "mcp_stdio",
    "mcp_http",
];

/// Every figure whose name starts with `only` (all when `None`), in order,
/// each given to `report` as it is measured; `measuring` is told the name
/// of each group of figures (one of [`FIGURES`]) as it begins. An error of
/// `report` (its reader gone) ends the measuring, and is returned.
pub fn all(
    options: &BenchOptions,
    only: Option<&str>,
    mut report: impl FnMut(Figure) -> Result<()>,
    mut measuring: impl FnMut(&str),
) -> Result<()> {
    // A group is measured when its name and `only` agree as far as the
    // shorter goes; of its figures, those whose name starts with `only`
    // are reported.
    let mut wanted = |group: &str| {
        let wanted = only.is_none_or(|prefix| group.starts_with(prefix) || prefix.starts_with(group));
        if wanted {
            measuring(group);
        }
        wanted
    };
    let mut report = |figure: Figure| match only {
        Some(prefix) if !figure.name.starts_with(prefix) => Ok(()),
        _ => report(figure),
    };
    let start = Instant::now();
    if wanted("per_call_overhead") {
        report(per_call(options)?)?;
        report(per_call_after_idle(options)?)?;
    }
    if wanted("throughput") {
        report(throughput(options, 1)?)?;
        report(throughput(options, cores())?)?;
    }
    if wanted("batch_speedup") {
        report(batch_speedup(options)?)?;
    }
    if wanted("startup_50_plugins") {
        report(startup(options)?)?;
    }
    if wanted("first_call") {
        first_call(options)?.into_iter().try_for_each(&mut report)?;
    }
    if wanted("tool_work_hash_10mb") {
        tool_work(options)?.into_iter().try_for_each(&mut report)?;
    }
    if wanted("guest_compute_sha256_1mib") {
        report(guest_compute(options)?)?;
    }
    if wanted("budget_per_message_10x1mb") {
        report(budgets(options)?)?;
    }
    if wanted("rich_result_image_2mib") {
        report(rich_result(options)?)?;
    }
    if wanted("memory_rss") {
        report(memory(options)?)?;
    }
    if wanted("network") {
        network::figures(options)?.into_iter().try_for_each(&mut report)?;
    }
    if wanted("mcp_stdio") {
        mcp::figures(options, &mut report)?;
    }
    if wanted("mcp_http") {
        http::figures(options, &mut report)?;
    }
    tracing::debug!("benchmarks took {:?}", start.elapsed());
    Ok(())
}
