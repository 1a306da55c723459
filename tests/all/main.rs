//! keel's integration tests: real guests, built once by `build.rs`, through
//! the real host. One module per topic.

mod batch;
mod budget;
mod cache;
mod content;
mod context;
mod contract;
mod figures;
mod fuzz;
mod grants;
mod hostile;
mod load;
mod malformed;
mod network;
mod permissions;
mod pool;
mod queries;
mod scheduler;
mod soak;
mod special_files;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use keel_host::tool::{CallContext, CallError, CallOutput};
use keel_host::{Event, Host, HostBuilder, Invocation, Tool, ToolResult, ToolSpec, ToolUse};
use serde_json::Value;

/// Where `build.rs` put the example tools and the test guests.
pub fn guest(name: &str) -> PathBuf {
    let path = Path::new(env!("KEEL_TEST_GUESTS_DIR")).join(format!("{name}.wasm"));
    assert!(path.is_file(), "guest {} was not built", path.display());
    path
}

/// A host over `workspace` with the `guests` named, sharing one compile
/// cache across the test run so each guest is compiled once.
pub fn host_of(workspace: &Path, guests: &[&str]) -> HostBuilder {
    guests
        .iter()
        .fold(Host::builder().workspace(workspace), |builder, name| builder.plugins(guest(name)))
        .cache_dir(Some(shared_cache()))
}

/// A host over `workspace` with the two example tools grep and write_file.
pub fn example_host(workspace: &Path) -> HostBuilder {
    host_of(workspace, &["keel_tool_grep", "keel_tool_write_file"])
}

/// Run `uses` from a fresh context, reading every event: the events, the
/// results and the final context.
pub fn events_of(host: &Host, uses: Vec<ToolUse>) -> (Vec<Event>, Vec<ToolResult>, Value) {
    block_on(async {
        let mut run = host.start_batch(uses, keel_host::context::initial());
        let mut events = Vec::new();
        while let Some(event) = run.next_event().await {
            events.push(event);
        }
        let outcome = run.finish().await;
        (events, outcome.results, outcome.context)
    })
}

/// The most calls in flight at once, from the order of start and finish events.
pub fn most_in_flight(events: &[Event]) -> usize {
    let (mut now, mut most) = (0usize, 0usize);
    for event in events {
        match event {
            Event::CallStarted { .. } => {
                now += 1;
                most = most.max(now);
            }
            Event::CallFinished { .. } => now -= 1,
            _ => {}
        }
    }
    most
}

/// The compile cache shared by the tests of one run.
pub fn shared_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache")
}

/// The context of a call made at the workspace root, as a tool is invoked
/// with it.
pub fn at_root() -> Arc<Value> {
    Arc::new(keel_host::context::initial())
}

/// Run `future` on a runtime of this thread under a tracing subscriber that
/// writes every event at every level, and with `spans` each span's start or
/// more: its output, and what the subscriber wrote.
pub fn logged<F: std::future::Future>(
    future: F,
    spans: tracing_subscriber::fmt::format::FmtSpan,
) -> (F::Output, String) {
    // While one subscriber alone is registered, tracing settles a call
    // site's interest by the subscriber of the thread that reaches it
    // first: a test on a thread with none would make it skip this one's.
    // The global capture is registered beside it, so it never is alone.
    capture_globally();
    let log = keel_tests::Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(spans)
        .with_ansi(false)
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let output = tracing::subscriber::with_default(subscriber, || runtime.block_on(future));
    (output, log.text())
}

/// Log lines at `INFO` and above written while `f` runs on this thread,
/// by the global subscriber of [`capture_globally`].
pub fn logs_of<T>(f: impl FnOnce() -> T) -> (T, String) {
    capture_globally();
    CAPTURED.with(|captured| captured.borrow_mut().clear());
    let value = f();
    let text = CAPTURED.with(|captured| String::from_utf8(captured.borrow().clone()).unwrap());
    (value, text)
}

thread_local! {
    /// What the global subscriber wrote on this thread.
    static CAPTURED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Install, once, the global subscriber of these tests: every thread's lines
/// at `INFO` and above go to that thread's own buffer. A scoped
/// (`with_default`) subscriber alone would not do: tracing caches each call
/// site's interest across threads, and a test on another thread with no
/// subscriber could make it skip ours.
fn capture_globally() {
    struct ThisThread;
    impl std::io::Write for ThisThread {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            CAPTURED.with(|captured| captured.borrow_mut().extend_from_slice(bytes));
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(|| ThisThread)
            .with_ansi(false)
            .without_time()
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber in the tests");
    });
}

/// A multi-threaded runtime, as the CLI uses.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(future)
}

/// A native tool that only has a spec; its calls answer `ran <name>`.
pub struct Fake(pub ToolSpec);

#[async_trait]
impl Tool for Fake {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    async fn invoke(&self, input: Value, _context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
        Ok(Box::new(FakeCall { name: self.0.name.clone(), input }))
    }
}

struct FakeCall {
    name: String,
    input: Value,
}

#[async_trait]
impl Invocation for FakeCall {
    fn input(&self) -> &Value {
        &self.input
    }

    fn set_input(&mut self, input: Value) {
        self.input = input;
    }

    /// Its answers are the defaults, whatever the context.
    fn set_context(&mut self, _context: Arc<Value>) {}

    async fn call(self: Box<Self>, _cx: CallContext) -> Result<CallOutput, CallError> {
        Ok(CallOutput::text(format!("ran {}", self.name)))
    }
}

#[test]
fn logged_sees_a_call_site_another_thread_reached_first() {
    fn site() {
        tracing::info!("a call site of this test alone");
    }
    let ((), text) = logged(
        async {
            // Reached first on a thread with no subscriber, while this
            // thread's is live: it must still be logged here.
            std::thread::spawn(site).join().unwrap();
            site();
        },
        tracing_subscriber::fmt::format::FmtSpan::NONE,
    );
    assert!(text.contains("a call site of this test alone"), "{text}");
}
