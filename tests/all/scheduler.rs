//! The scheduler: partitioned runs under the cap, ordered results, context
//! modifiers, progress as it happens, and interrupts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use keel_host::config::Config;
use keel_host::tool::{CallContext, CallError, CallOutput, Invocation, Tool, ToolSpec};
use keel_host::{Event, Host, ToolResult, ToolUse};
use serde_json::{Value, json};

use crate::{block_on, events_of, host_of, most_in_flight};

#[test]
fn safe_calls_overlap_and_never_exceed_the_cap() {
    let workspace = tempfile::tempdir().unwrap();
    let config = Config { max_tool_use_concurrency: Some(3), ..Config::default() };
    let builder = host_of(workspace.path(), &["keel_tool_sleep"]).config(config);
    let host = block_on(builder.build()).unwrap();
    assert_eq!(host.max_tool_use_concurrency(), 3);
    let uses = (0..12).map(|i| ToolUse::new(format!("s{i:02}"), "sleep", json!({ "ms": 40 }))).collect();
    let (events, results, _) = events_of(&host, uses);
    assert_eq!(most_in_flight(&events), 3, "three at once, never more");
    assert!(results.iter().all(|r| r.content.text() == "Slept 40 ms"));
    let ids: Vec<&str> = results.iter().map(|r| r.tool_use_id.as_str()).collect();
    assert_eq!(ids, (0..12).map(|i| format!("s{i:02}")).collect::<Vec<_>>());
}

#[test]
fn calls_at_full_budget_leave_the_calls_behind_them_safe_to_plan() {
    // The default limits: ten calls in flight reserve the whole batch
    // allowance (ten calls at full budget). The questions of the calls
    // planned behind them wait for the fuel those calls do not burn, so
    // every call is still planned safe and the batch stays one run.
    let workspace = tempfile::tempdir().unwrap();
    let host = block_on(host_of(workspace.path(), &["keel_tool_sleep"]).build()).unwrap();
    let uses: Vec<ToolUse> =
        (0..30).map(|i| ToolUse::new(format!("s{i}"), "sleep", json!({ "ms": 100, "steps": 1 }))).collect();
    let (events, results, _) = events_of(&host, uses);
    assert!(results.iter().all(|result| !result.is_error), "{results:?}");
    let plan = events.iter().find_map(|event| match event {
        Event::BatchPlan { batches } => Some(batches.clone()),
        _ => None,
    });
    let plan = plan.expect("a plan is sent");
    assert_eq!(plan.len(), 1, "one concurrent run: {plan:?}");
    assert!(plan[0].concurrent && plan[0].tool_use_ids.len() == 30, "{plan:?}");
    assert_eq!(most_in_flight(&events), 10);
}

#[test]
fn an_unsafe_call_runs_alone_between_safe_runs() {
    let workspace = tempfile::tempdir().unwrap();
    let builder = host_of(workspace.path(), &["keel_tool_sleep", "keel_tool_write_file"]);
    let host = block_on(builder.build()).unwrap();
    let sleep = |id: &str| ToolUse::new(id, "sleep", json!({ "ms": 30 }));
    let write = ToolUse::new("w", "write_file", json!({ "file_path": "f", "content": "x" }));
    let (events, _, _) = events_of(&host, vec![sleep("a"), sleep("b"), write, sleep("c"), sleep("d")]);
    let order: Vec<String> = events
        .iter()
        .filter_map(|event| match event {
            Event::CallStarted { tool_use_id, .. } => Some(format!("+{tool_use_id}")),
            Event::CallFinished { tool_use_id, .. } => Some(format!("-{tool_use_id}")),
            _ => None,
        })
        .collect();
    let at = |tag: &str| order.iter().position(|t| t == tag).unwrap();
    assert!(at("-a") < at("+w") && at("-b") < at("+w"), "the write waits for the run before it: {order:?}");
    assert!(at("-w") < at("+c") && at("-w") < at("+d"), "the run after waits for the write: {order:?}");
    assert_eq!(most_in_flight(&events), 2);
}

#[test]
fn progress_arrives_before_the_call_finishes() {
    let workspace = tempfile::tempdir().unwrap();
    let builder = host_of(workspace.path(), &["keel_tool_sleep"]);
    let host = block_on(builder.build()).unwrap();
    let (events, _, _) = events_of(&host, vec![ToolUse::new("s", "sleep", json!({ "ms": 60, "steps": 3 }))]);
    let kinds: Vec<String> = events
        .iter()
        .map(|event| match event {
            Event::Progress { data, .. } => format!("progress {}", data["step"]),
            other => serde_json::to_value(other).unwrap()["type"].as_str().unwrap().to_string(),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "batch_plan",
            "call_started",
            "progress 1",
            "progress 2",
            "progress 3",
            "call_finished",
            "tool_result",
            "batch_finished",
            "summary"
        ]
    );
}

/// A native tool that sleeps `ms`, then returns a context modifier naming
/// itself: concurrency-safe, so its modifiers are queued. With `"panic"`
/// set to `"plan"` or `"call"` it panics there instead, as a host bug would;
/// with `"plan_ms"`, it takes that long to plan.
struct Marker;

fn marker_spec() -> &'static ToolSpec {
    static SPEC: std::sync::OnceLock<ToolSpec> = std::sync::OnceLock::new();
    SPEC.get_or_init(|| {
        let schema =
            json!({ "type": "object", "properties": { "ms": { "type": "integer" } }, "required": ["ms"] });
        ToolSpec::native("marker", "Test tool: sleeps, then marks the context.", schema)
    })
}

struct MarkerCall(Value);

#[async_trait]
impl Tool for Marker {
    fn spec(&self) -> &ToolSpec {
        marker_spec()
    }

    async fn invoke(&self, input: Value, _context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
        Ok(Box::new(MarkerCall(input)))
    }
}

#[async_trait]
impl Invocation for MarkerCall {
    fn input(&self) -> &Value {
        &self.0
    }

    fn set_input(&mut self, input: Value) {
        self.0 = input;
    }

    /// Only the call reads the context.
    fn set_context(&mut self, _context: Arc<Value>) {}

    async fn is_concurrency_safe(&mut self) -> bool {
        if let Some(ms) = self.0["plan_ms"].as_u64() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        assert_ne!(self.0["panic"], "plan", "planning panics");
        true
    }

    async fn call(self: Box<Self>, cx: CallContext) -> Result<CallOutput, CallError> {
        assert_ne!(self.0["panic"], "call", "the call panics");
        let ms = self.0["ms"].as_u64().unwrap();
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let seen = cx.context.get("last").cloned().unwrap_or(Value::Null);
        let modifier = json!({ "last": ms, "marks": { ms.to_string(): true } });
        Ok(CallOutput { context_modifier: Some(modifier), ..CallOutput::text(format!("saw last = {seen}")) })
    }
}

#[test]
fn queued_modifiers_apply_in_block_order_whatever_the_finishing_order() {
    let workspace = tempfile::tempdir().unwrap();
    let builder = Host::builder().workspace(workspace.path()).builtins(false).tool(Arc::new(Marker));
    let host = block_on(builder.build()).unwrap();
    // The first call sleeps longest: the calls finish in reverse order.
    let uses: Vec<ToolUse> = [90, 60, 30, 1]
        .iter()
        .enumerate()
        .map(|(i, ms)| ToolUse::new(format!("m{i}"), "marker", json!({ "ms": ms })))
        .collect();
    let (events, results, context) = events_of(&host, uses);
    let finished: Vec<&str> = events
        .iter()
        .filter_map(|event| match event {
            Event::CallFinished { tool_use_id, .. } => Some(tool_use_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(finished, ["m3", "m2", "m1", "m0"], "the calls really finished in reverse");
    assert!(
        results.iter().all(|r| r.content.text() == "saw last = null"),
        "each saw the context as the run began"
    );
    assert_eq!(
        context,
        json!({ "cwd": "/workspace", "last": 1, "marks": { "90": true, "60": true, "30": true, "1": true } }),
        "applied in block order: the last block's modifier wins"
    );
    let released: Vec<&str> = events
        .iter()
        .filter_map(|event| match event {
            Event::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(released, ["m0", "m1", "m2", "m3"], "results go out in block order");
}

#[test]
fn a_call_that_panics_the_host_gets_its_one_result_and_the_others_run() {
    let workspace = tempfile::tempdir().unwrap();
    let builder = Host::builder().workspace(workspace.path()).builtins(false).tool(Arc::new(Marker));
    let host = block_on(builder.build()).unwrap();
    let marker = |id: &str, input: Value| ToolUse::new(id, "marker", input);
    let uses = vec![
        marker("m0", json!({ "ms": 5 })),
        marker("m1", json!({ "ms": 5, "panic": "call" })),
        marker("m2", json!({ "ms": 5 })),
        marker("m3", json!({ "ms": 5, "panic": "plan" })),
        marker("m4", json!({ "ms": 5 })),
    ];
    let (_, results, _) = events_of(&host, uses);
    let outcome: Vec<(&str, bool, &str)> =
        results.iter().map(|r| (r.tool_use_id.as_str(), r.is_error, r.content.as_text().unwrap())).collect();
    assert_eq!(
        outcome,
        [
            ("m0", false, "saw last = null"),
            ("m1", true, "the host failed while running this call"),
            ("m2", false, "saw last = null"),
            ("m3", true, "the host failed while planning this call"),
            ("m4", false, "saw last = 5"),
        ]
    );
}

#[test]
fn a_panic_while_planning_past_the_window_fails_that_call_alone() {
    // Past the first window, calls are planned a chunk to a task: a panic
    // there must cost the one call, not the calls claimed after it. Slow
    // plans are kept one by one, and the same holds.
    for plan_ms in [0, 1] {
        panics_in_planning_fail_their_calls_alone(plan_ms, &[33, 34, 57]);
    }
}

fn panics_in_planning_fail_their_calls_alone(plan_ms: u64, panicking: &[usize]) {
    let workspace = tempfile::tempdir().unwrap();
    let builder = Host::builder().workspace(workspace.path()).builtins(false).tool(Arc::new(Marker));
    let host = block_on(builder.build()).unwrap();
    let uses: Vec<ToolUse> = (0..80)
        .map(|i| {
            let mut input = json!({ "ms": 0 });
            if plan_ms > 0 {
                input["plan_ms"] = json!(plan_ms);
            }
            if panicking.contains(&i) {
                input["panic"] = json!("plan");
            }
            ToolUse::new(format!("m{i:02}"), "marker", input)
        })
        .collect();
    let ids: Vec<String> = uses.iter().map(|tool_use| tool_use.id.clone()).collect();
    let outcome =
        block_on(async { tokio::time::timeout(Duration::from_secs(60), host.run_batch(&uses)).await })
            .expect("the batch finishes: no call is left claimed and never planned");
    let results = outcome.results;
    let got: Vec<&str> = results.iter().map(|result| result.tool_use_id.as_str()).collect();
    assert_eq!(got, ids, "one result per call, in order");
    for (i, result) in results.iter().enumerate() {
        if panicking.contains(&i) {
            assert_eq!(
                result.content.as_text(),
                Some("the host failed while planning this call"),
                "{result:?}"
            );
            assert!(result.is_error);
        } else {
            assert!(!result.is_error, "{result:?}");
        }
    }
}

#[test]
fn an_empty_batch_finishes_with_no_results_and_an_empty_plan() {
    let workspace = tempfile::tempdir().unwrap();
    let host = block_on(host_of(workspace.path(), &["keel_tool_echo"]).build()).unwrap();
    let (events, results, context) = block_on(async {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            let outcome = host.run_batch(&[]).await;
            assert!(outcome.results.is_empty());
            let mut run = host.start_batch(Vec::new(), keel_host::context::initial());
            let mut events = Vec::new();
            while let Some(event) = run.next_event().await {
                events.push(event);
            }
            let outcome = run.finish().await;
            (events, outcome.results, outcome.context)
        });
        waited.await.expect("an empty batch finishes")
    });
    assert!(results.is_empty());
    assert_eq!(context, keel_host::context::initial());
    assert!(matches!(events.first(), Some(Event::BatchPlan { batches }) if batches.is_empty()), "{events:?}");
    assert!(events.iter().any(|event| matches!(event, Event::BatchFinished { calls: 0, errors: 0, .. })));
}

/// The batch's task runs on a runtime of one thread, so it cannot start
/// before the interrupt: on a multi-threaded runtime a worker may start the
/// call first, and the result would say it was stopped, not that it never
/// started.
#[test]
fn an_interrupt_before_anything_starts_gives_every_call_an_interrupted_result() {
    let workspace = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let host = runtime.block_on(host_of(workspace.path(), &["keel_tool_sleep"]).build()).unwrap();
    let results = runtime.block_on(async {
        let uses =
            vec![ToolUse::new("a", "sleep", json!({ "ms": 10 })), ToolUse::new("b", "nope", json!({}))];
        let run = host.start_batch(uses, keel_host::context::initial());
        run.interrupter().interrupt();
        run.finish().await.results
    });
    assert_eq!(
        results,
        [
            ToolResult::error("a", "Interrupted: the call was not started."),
            ToolResult::error("b", "No such tool: nope"),
        ]
    );
}

#[test]
fn a_batch_longer_than_the_planning_window_runs_whole_and_in_order() {
    let workspace = tempfile::tempdir().unwrap();
    let builder = host_of(workspace.path(), &["keel_tool_echo", "keel_tool_write_file"]);
    let host = block_on(builder.build()).unwrap();
    let echo = |i: usize| ToolUse::new(format!("e{i:03}"), "echo", json!({ "text": format!("{i}") }));
    let mut uses: Vec<ToolUse> = (0..150).map(echo).collect();
    uses[100] = ToolUse::new("w", "write_file", json!({ "file_path": "f.txt", "content": "x" }));
    uses[120] = ToolUse::new("u", "no_such_tool", json!({}));
    let ids: Vec<String> = uses.iter().map(|tool_use| tool_use.id.clone()).collect();
    let (events, results, _) = events_of(&host, uses);

    let got: Vec<&str> = results.iter().map(|result| result.tool_use_id.as_str()).collect();
    assert_eq!(got, ids, "one result per call, in order");
    assert_eq!(results[7], ToolResult::ok("e007", "7"));
    assert_eq!(results[100], ToolResult::ok("w", "Wrote 1 byte to f.txt"));
    assert!(results[120].is_error && results[120].content.text().starts_with("No such tool: no_such_tool"));
    assert_eq!(results.iter().filter(|result| result.is_error).count(), 1);

    let plans: Vec<&Event> = events.iter().filter(|event| matches!(event, Event::BatchPlan { .. })).collect();
    let [Event::BatchPlan { batches }] = plans.as_slice() else { panic!("one batch plan: {plans:?}") };
    let shape: Vec<(bool, usize)> =
        batches.iter().map(|group| (group.concurrent, group.tool_use_ids.len())).collect();
    assert_eq!(shape, [(true, 100), (false, 1), (true, 19), (false, 1), (true, 29)]);
    let first_start = events.iter().position(|event| matches!(event, Event::CallStarted { .. })).unwrap();
    let plan = events.iter().position(|event| matches!(event, Event::BatchPlan { .. })).unwrap();
    assert!(first_start < plan, "calls at the head start before the tail is planned");
    let write = |tag: &str| {
        events
            .iter()
            .position(|event| match event {
                Event::CallStarted { tool_use_id, .. } => tag == "+" && tool_use_id == "w",
                Event::CallFinished { tool_use_id, .. } => tag == "-" && tool_use_id == "w",
                _ => false,
            })
            .unwrap()
    };
    let finished = |id: &str| {
        events
            .iter()
            .position(|event| matches!(event, Event::CallFinished { tool_use_id, .. } if tool_use_id == id))
    };
    assert!(finished("e099").unwrap() < write("+"), "the write waits for the run before it");
    assert!(write("-") < finished("e101").unwrap(), "the run after it waits for the write");
    assert!(most_in_flight(&events) <= host.max_tool_use_concurrency());
}

#[test]
fn calls_arriving_one_by_one_keep_a_batchs_order_and_context() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join("sub")).unwrap();
    std::fs::write(workspace.path().join("sub/in.txt"), "needle\n").unwrap();
    std::fs::write(workspace.path().join("out.txt"), "needle\n").unwrap();
    let host = block_on(host_of(workspace.path(), &["keel_tool_cd", "keel_tool_grep"]).build()).unwrap();
    let stream = host.stream(keel_host::context::initial());
    let (first, second, third) = (stream.arrive(), stream.arrive(), stream.arrive());
    assert_eq!([first.number(), second.number(), third.number()], [0, 1, 2]);
    let grep = || ToolUse::new("grep", "grep", json!({ "pattern": "needle" }));
    let (searched, moved, unknown) = block_on(async {
        // Run in the reverse of their arrival: the grep still waits for the
        // `cd` that arrived before it, and sees where it went.
        let interrupt = keel_host::Interrupt::new();
        let searched = second.run(grep(), None, &interrupt);
        let unknown = third.run(ToolUse::new("nope", "grpe", json!({})), None, &interrupt);
        let moved = first.run(ToolUse::new("cd", "cd", json!({ "path": "sub" })), None, &interrupt);
        tokio::join!(searched, moved, unknown)
    });
    assert!(!moved.is_error, "{moved:?}");
    assert!(
        searched.content.text().contains("in.txt") && !searched.content.text().contains("out.txt"),
        "{searched:?}"
    );
    assert_eq!(unknown, ToolResult::error("nope", "No such tool: grpe. Did you mean grep?"));
    assert_eq!(stream.context()["cwd"], "/workspace/sub");
}

#[test]
fn a_stream_in_the_place_of_another_starts_its_calls_after_that_ones_and_carries_its_context_on() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join("sub")).unwrap();
    std::fs::write(workspace.path().join("sub/in.txt"), "needle\n").unwrap();
    std::fs::write(workspace.path().join("out.txt"), "needle\n").unwrap();
    let tools = ["keel_tool_cd", "keel_tool_grep"];
    let before = block_on(host_of(workspace.path(), &tools).build()).unwrap();
    let replaced = before.stream(keel_host::context::initial());
    let moved = replaced.arrive();
    // The pool reloaded while the `cd` waits to run.
    let after = block_on(host_of(workspace.path(), &tools).build()).unwrap();
    let stream = after.stream_after(&replaced);
    let searched = stream.arrive();
    let interrupt = keel_host::Interrupt::new();
    let grep = ToolUse::new("grep", "grep", json!({ "pattern": "needle" }));
    let (moved, searched) = block_on(async {
        let mut searching = Box::pin(searched.run(grep, None, &interrupt));
        let wait = tokio::time::timeout(Duration::from_millis(100), searching.as_mut()).await;
        assert!(wait.is_err(), "the grep waits for the cd that arrived before the reload");
        let moving = moved.run(ToolUse::new("cd", "cd", json!({ "path": "sub" })), None, &interrupt);
        tokio::join!(moving, searching)
    });
    assert!(!moved.is_error, "{moved:?}");
    assert!(
        searched.content.text().contains("in.txt") && !searched.content.text().contains("out.txt"),
        "the grep ran where the cd went: {searched:?}"
    );
    assert_eq!(stream.context()["cwd"], "/workspace/sub");
    // A call that arrives in the replaced stream after it handed on runs in
    // the new one, under its context.
    let late = replaced.arrive();
    let back = block_on(late.run(ToolUse::new("back", "cd", json!({ "path": ".." })), None, &interrupt));
    assert!(!back.is_error, "{back:?}");
    assert_eq!(stream.context()["cwd"], "/workspace");
}

#[test]
fn a_call_that_stops_waiting_in_a_stream_gives_its_place_up() {
    let workspace = tempfile::tempdir().unwrap();
    let host = block_on(host_of(workspace.path(), &["keel_tool_cd", "keel_tool_grep"]).build()).unwrap();
    let stream = host.stream(keel_host::context::initial());
    let interrupt = keel_host::Interrupt::new();
    let grep = |id: &str| ToolUse::new(id, "grep", json!({ "pattern": "x" }));
    let (never_run, given_up, first, last) =
        (stream.arrive(), stream.arrive(), stream.arrive(), stream.arrive());
    block_on(async {
        // An arrival dropped unrun, and a call dropped while it waits for
        // `never_run` ahead of it: neither holds back the calls after them.
        let mut waiting = Box::pin(given_up.run(grep("given_up"), None, &interrupt));
        let wait = tokio::time::timeout(Duration::from_millis(50), waiting.as_mut()).await;
        assert!(wait.is_err(), "it waits for the call that arrived before it");
        drop(never_run);
        drop(waiting);
        let both = async {
            tokio::join!(
                last.run(grep("last"), None, &interrupt),
                first.run(ToolUse::new("first", "cd", json!({ "path": "." })), None, &interrupt)
            )
        };
        let (last, first) = tokio::time::timeout(Duration::from_secs(60), both).await.expect("nothing waits");
        assert!(!first.is_error && !last.is_error, "{first:?} {last:?}");
    });
}

#[test]
fn a_call_that_panics_the_host_in_a_stream_gets_its_one_result_and_the_stream_goes_on() {
    let workspace = tempfile::tempdir().unwrap();
    let builder = Host::builder().workspace(workspace.path()).builtins(false).tool(Arc::new(Marker));
    let host = block_on(builder.build()).unwrap();
    let stream = host.stream(keel_host::context::initial());
    let interrupt = keel_host::Interrupt::new();
    let marker = |id: &str, input: Value| ToolUse::new(id, "marker", input);
    let results = block_on(async {
        let calls = [
            marker("m0", json!({ "ms": 5, "panic": "call" })),
            marker("m1", json!({ "ms": 5, "panic": "plan" })),
            marker("m2", json!({ "ms": 5 })),
        ];
        let mut results = Vec::new();
        for call in calls {
            results.push(stream.arrive().run(call, None, &interrupt).await);
        }
        results
    });
    assert_eq!(
        results,
        [
            ToolResult::error("m0", "the host failed while running this call"),
            ToolResult::error("m1", "the host failed while planning this call"),
            ToolResult::ok("m2", "saw last = null"),
        ]
    );
}

#[test]
fn an_arrival_holds_one_call() {
    let workspace = tempfile::tempdir().unwrap();
    let host = block_on(host_of(workspace.path(), &["keel_tool_grep"]).build()).unwrap();
    let stream = host.stream(keel_host::context::initial());
    let arrival = stream.arrive();
    let interrupt = keel_host::Interrupt::new();
    let grep = |id: &str| ToolUse::new(id, "grep", json!({ "pattern": "x" }));
    let (first, again) = block_on(async {
        let again = arrival.clone();
        (arrival.run(grep("first"), None, &interrupt).await, again.run(grep("again"), None, &interrupt).await)
    });
    assert!(!first.is_error, "{first:?}");
    assert_eq!(
        again,
        ToolResult::error("again", "the host ran this call from an arrival that had already run one")
    );
}

/// A batch's tasks run calls back to back, and a call that finishes in its
/// first poll never yields: without a hand-over, a long batch of quick
/// calls would hold its thread until it ended, and every other task there
/// would wait. A task polled again at once each time it runs must not wait
/// for half the batch.
#[test]
fn a_long_batch_of_quick_calls_shares_its_thread() {
    let workspace = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let host = runtime.block_on(host_of(workspace.path(), &["keel_tool_echo"]).build()).unwrap();
    let uses: Vec<ToolUse> =
        (0..4_000).map(|i| ToolUse::new(format!("c{i}"), "echo", json!({ "text": "hi" }))).collect();
    let longest_wait = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (waited, stopped) = (longest_wait.clone(), stop.clone());
    let took = runtime.block_on(async {
        // Asks to be polled again every time it runs, behind whatever else
        // is ready, and notes the longest it waited.
        let neighbour = tokio::spawn(async move {
            let mut last = Instant::now();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let mut polled = false;
                std::future::poll_fn(|cx| {
                    if std::mem::replace(&mut polled, true) {
                        return std::task::Poll::Ready(());
                    }
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                })
                .await;
                let mut longest = waited.lock().unwrap();
                *longest = (*longest).max(last.elapsed());
                last = Instant::now();
            }
        });
        tokio::task::yield_now().await;
        *longest_wait.lock().unwrap() = Duration::ZERO;
        let started = Instant::now();
        let outcome = host.run_batch(&uses).await;
        let took = started.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        neighbour.await.unwrap();
        assert!(outcome.results.iter().all(|result| !result.is_error), "every echo answers");
        took
    });
    let longest = *longest_wait.lock().unwrap();
    assert!(longest < took / 2, "a task beside the batch waited {longest:?} of its {took:?}");
}
