//! Hostile guests against the sandbox limits: each attack ends in an error
//! result naming the limit and its value, and the call right after it runs.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_host::context;
use keel_host::limits::{BatchFuel, Limits};
use keel_host::load::PluginTool;
use keel_host::tool::{CallContext, CallError, ResultSize, Tool};
use keel_host::{Host, ToolResult, ToolUse};
use serde_json::{Value, json};

use crate::{block_on, guest, shared_cache};

fn host(workspace: &Path, limits: Limits) -> Host {
    let builder = Host::builder()
        .workspace(workspace)
        .plugins(guest("keel_guest_hostile"))
        .plugins(guest("keel_guest_trap_queries"))
        .limits(limits)
        .cache_dir(Some(shared_cache()));
    block_on(builder.build()).unwrap()
}

fn attack(id: &str, input: Value) -> ToolUse {
    ToolUse::new(id, "hostile", input)
}

fn healthy() -> ToolUse {
    attack("healthy", json!({ "act": "ok" }))
}

/// Run `attack` then a healthy call; return the attack's result after
/// checking the healthy call succeeded.
fn survive(host: &Host, input: Value) -> ToolResult {
    let results = block_on(host.run_batch(&[attack("attack", input), healthy()])).results;
    assert_eq!(results[1], ToolResult::ok("healthy", "ok"), "the call after the attack runs");
    results.into_iter().next().unwrap()
}

fn failed(message: &str) -> ToolResult {
    ToolResult::error("attack", format!("hostile failed: {message}"))
}

#[test]
fn a_loop_in_call_stops_at_the_fuel_limit() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits { fuel: 200_000_000, ..Limits::default() });
    assert_eq!(survive(&host, json!({ "act": "loop" })), failed("fuel limit of 200000000 units exceeded"));
}

#[test]
fn a_loop_in_call_stops_at_the_deadline() {
    let workspace = tempfile::tempdir().unwrap();
    let limits = Limits { fuel: u64::MAX, deadline: Duration::from_millis(300), ..Limits::default() };
    let host = host(workspace.path(), limits);
    assert_eq!(survive(&host, json!({ "act": "loop" })), failed("deadline of 300ms exceeded"));
}

#[test]
fn a_spinning_guest_leaves_its_thread_to_timers_and_io_while_it_runs() {
    let workspace = tempfile::tempdir().unwrap();
    let limits = Limits { fuel: u64::MAX, deadline: Duration::from_millis(1_000), ..Limits::default() };
    let host = host(workspace.path(), limits);
    // One thread, as each of `keel serve --http`'s per-core runtimes has: a
    // guest spinning on it must still let the runtime's timers (and its
    // sockets, which the same driver polls) come round between its slices.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ticks = runtime.block_on(async {
        let spinning =
            tokio::spawn(async move { host.run_batch(&[attack("attack", json!({ "act": "loop" }))]).await });
        let mut ticks = 0;
        while !spinning.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
            ticks += 1;
        }
        let results = spinning.await.unwrap().results;
        assert_eq!(results[0], failed("deadline of 1s exceeded"));
        ticks
    });
    // A slice is 10 ms, so a second of spinning leaves room for about a
    // hundred; a runtime that looks at its timers only every 61 slices, two.
    assert!(ticks >= 20, "the timer came round {ticks} times in a second of spinning");
}

#[test]
fn the_deadline_covers_a_guest_blocked_in_a_host_call() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits { deadline: Duration::from_millis(300), ..Limits::default() });
    let started = Instant::now();
    // `sleep` blocks in WASI's `poll`, a host call the epoch cannot interrupt.
    assert_eq!(survive(&host, json!({ "act": "sleep", "secs": 600 })), failed("deadline of 300ms exceeded"));
    assert!(started.elapsed() < Duration::from_secs(60), "stopped, not waited out: {:?}", started.elapsed());
}

#[test]
fn a_loop_in_a_question_gives_its_conservative_answer() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    let tool = host.pool().get("hostile").unwrap().tool.clone();
    block_on(async {
        let mut spinning = tool
            .invoke(
                json!({ "act": "ok", "read_only": true, "concurrency_safe": true,
                            "loop_in": ["plan", "is_destructive"] }),
                crate::at_root(),
            )
            .await
            .unwrap();
        assert!(!spinning.is_read_only().await, "fallback: assume it writes");
        assert!(!spinning.is_concurrency_safe().await, "fallback: run alone");
        assert!(spinning.is_destructive().await, "fallback: assume irreversible");
        let output = spinning.call(CallContext::new(context::initial())).await.unwrap();
        assert_eq!(output.to_text(), "ok", "the call itself runs in a fresh sandbox");
    });
    let results =
        block_on(host.run_batch(&[attack("c", json!({ "act": "ok", "loop_in": ["check"] })), healthy()]))
            .results;
    assert_eq!(
        results,
        [
            ToolResult::error(
                "c",
                "Invalid input for hostile: the tool's input check failed; the call was refused"
            ),
            ToolResult::ok("healthy", "ok"),
        ]
    );
}

#[test]
fn unbounded_memory_growth_stops_at_the_memory_limit() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits { memory: 32 << 20, ..Limits::default() });
    assert_eq!(survive(&host, json!({ "act": "grow_memory" })), failed("memory limit of 32 MiB exceeded"));
}

#[test]
fn unbounded_recursion_stops_at_the_stack_limit() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    assert_eq!(survive(&host, json!({ "act": "recurse" })), failed("stack limit of 1 MiB exceeded"));
}

#[test]
fn a_100_mb_result_stops_at_the_transfer_limit() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    assert_eq!(
        survive(&host, json!({ "act": "huge_result" })),
        failed("guest-to-host transfer limit of 16 MiB exceeded")
    );
}

#[test]
fn a_100_mb_host_call_argument_stops_at_the_transfer_limit() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    assert_eq!(
        survive(&host, json!({ "act": "huge_progress" })),
        failed("guest-to-host transfer limit of 16 MiB exceeded")
    );
}

#[test]
fn leaked_handles_stop_at_the_resource_limit() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("f.txt"), "x").unwrap();
    let host = host(workspace.path(), Limits { resources: 200, ..Limits::default() });
    assert_eq!(
        survive(&host, json!({ "act": "leak_handles", "path": "/workspace/f.txt" })),
        failed("resource handle limit of 200 handles exceeded")
    );
}

#[test]
fn a_stdout_flood_is_dropped_not_failed() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    assert_eq!(
        survive(&host, json!({ "act": "flood" })),
        ToolResult::ok("attack", "flooded 10485760 bytes"),
        "10 MiB to stdout and to stderr: kept up to the cap, the rest dropped, no write failed"
    );
}

#[test]
fn a_panic_in_call_is_a_crash_quoting_the_panic() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    let result = survive(&host, json!({ "act": "panic" }));
    assert!(result.is_error);
    assert!(result.content.text().starts_with("hostile failed: the tool crashed: "), "{}", result.content);
    assert!(result.content.text().contains("hostile: panicking in call as asked"), "{}", result.content);
}

#[test]
fn a_context_modifier_that_is_not_json_breaks_the_contract() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    let outcome = block_on(host.run_batch(&[attack("attack", json!({ "act": "bad_modifier" })), healthy()]));
    assert_eq!(
        outcome.results[0],
        failed(
            "the tool broke the keel contract: its context modifier is not JSON: \
             key must be a string at line 1 column 2"
        )
    );
    assert_eq!(outcome.results[1], ToolResult::ok("healthy", "ok"));
    assert_eq!(outcome.context, context::initial(), "the context is untouched");
}

#[test]
fn a_progress_report_that_is_not_json_arrives_as_a_string() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    let tool = host.pool().get("hostile").unwrap().tool.clone();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = reports.clone();
    let cx = CallContext::new(context::initial())
        .with_progress(Arc::new(move |value| sink.lock().unwrap().push(value)));
    let output = block_on(async {
        let call = tool.invoke(json!({ "act": "bad_progress" }), crate::at_root()).await.unwrap();
        call.call(cx).await
    })
    .unwrap();
    assert_eq!(output.to_text(), "progress sent");
    assert_eq!(*reports.lock().unwrap(), [json!("{not json")]);
}

#[test]
fn a_batch_cannot_burn_more_than_its_allowance() {
    let workspace = tempfile::tempdir().unwrap();
    let limits = Limits { fuel: 200_000_000, batch_fuel: 300_000_000, ..Limits::default() };
    let host = host(workspace.path(), limits);
    let spin = || json!({ "act": "loop" });
    let results =
        block_on(host.run_batch(&[attack("a", spin()), attack("b", spin()), attack("c", spin())])).results;
    assert_eq!(results[0], ToolResult::error("a", "hostile failed: fuel limit of 200000000 units exceeded"));
    assert_eq!(
        results[1],
        ToolResult::error("b", "hostile failed: batch fuel allowance of 300000000 units exceeded"),
        "the second call gets only what the first left"
    );
    assert!(results[2].is_error);
    assert!(
        results[2].content.text().ends_with("batch fuel allowance of 300000000 units exceeded"),
        "the third finds the allowance spent: {}",
        results[2].content
    );
    let next = block_on(host.run_batch(&[healthy()])).results;
    assert_eq!(next, [ToolResult::ok("healthy", "ok")], "the next batch has an allowance of its own");
}

#[test]
fn a_call_finding_the_allowance_spent_is_refused_naming_it() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    let tool = host.pool().get("hostile").unwrap().tool.clone();
    // Reserved whole and burnt whole: nothing is out, nothing will come back.
    let spent = BatchFuel::new(1_000);
    assert_eq!(spent.take(1_000), 1_000);
    spent.give_back(1_000, 0);
    block_on(async {
        let mut call = tool.invoke(json!({ "act": "ok" }), crate::at_root()).await.unwrap();
        call.share_batch_fuel(spent.clone());
        assert_eq!(
            call.validate_input().await,
            Err("the tool's input check could not run: batch fuel allowance of 1000 units exceeded".into())
        );
        let error = call.call(CallContext::new(context::initial())).await.unwrap_err();
        assert_eq!(
            error,
            CallError::Limit { kind: keel_host::limits::LimitKind::BatchFuel, value: "1000 units".into() }
        );
    });
    assert_eq!(spent.left(), 0, "nothing was burnt, nothing was given back");
}

#[test]
fn unburnt_fuel_goes_back_to_the_batch() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    let tool = host.pool().get("hostile").unwrap().tool.clone();
    let allowance = BatchFuel::new(10_000_000_000);
    block_on(async {
        let mut call = tool.invoke(json!({ "act": "ok" }), crate::at_root()).await.unwrap();
        call.share_batch_fuel(allowance.clone());
        assert_eq!(call.validate_input().await, Ok(()));
        assert_eq!(call.call(CallContext::new(context::initial())).await.unwrap().to_text(), "ok");
    });
    let burnt = allowance.total() - allowance.left();
    assert!(burnt > 0 && burnt < 10_000_000, "only what was burnt is gone: {burnt}");
}

#[test]
fn traps_and_spins_in_the_exports_asked_at_load_give_their_fallbacks() {
    let workspace = tempfile::tempdir().unwrap();
    let runtime = Arc::new(keel_host::load::Runtime::new(&Limits::default(), Some(shared_cache())).unwrap());
    let plugin = block_on(PluginTool::load(
        &runtime,
        &guest("keel_guest_trap_load"),
        workspace.path(),
        &Limits::default(),
    ))
    .unwrap();
    let spec = plugin.spec();
    assert_eq!(spec.name, "trap_load");
    assert!(!spec.enabled, "is-enabled trapped: fallback false");
    assert_eq!(spec.max_result_size, ResultSize::Chars(50_000), "max-result-size trapped: fallback 50,000");
    assert!(!spec.requires_user_interaction, "requires-user-interaction spun: fallback false");

    let builder = Host::builder()
        .workspace(workspace.path())
        .plugins(guest("keel_guest_trap_load"))
        .plugins(guest("keel_guest_hostile"))
        .cache_dir(Some(shared_cache()));
    let host = block_on(builder.build()).unwrap();
    assert!(host.pool().get("trap_load").is_none(), "left out of the pool");
    assert!(
        host.warnings().contains(&"tool `trap_load` is disabled and left out".to_string()),
        "{:?}",
        host.warnings()
    );
    assert_eq!(block_on(host.run_batch(&[healthy()])).results, [ToolResult::ok("healthy", "ok")]);
}

#[test]
fn a_trap_in_each_per_input_question_gives_its_fallback_and_the_next_call_runs() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path(), Limits::default());
    let trapping = |export: &str| {
        ToolUse::new("attack", "trap_queries", json!({ "trap_in": [export], "message": export }))
    };
    for export in
        ["is_concurrency_safe", "is_read_only", "is_destructive", "validate_input", "check_permissions"]
    {
        let results = block_on(host.run_batch(&[trapping(export), healthy()])).results;
        let expected = match export {
            // Validation and the permission check are one export: a trap in
            // either refuses the call.
            "validate_input" | "check_permissions" => ToolResult::error(
                "attack",
                "Invalid input for trap_queries: the tool's input check failed; the call was refused",
            ),
            // The fallback only makes the call more careful; it still runs.
            _ => ToolResult::ok("attack", format!("ok: {export}")),
        };
        assert_eq!(results, [expected, ToolResult::ok("healthy", "ok")], "trap in {export}");
    }
}

#[test]
fn unbounded_table_growth_stops_at_the_table_limit() {
    let workspace = tempfile::tempdir().unwrap();
    let tools = tempfile::tempdir().unwrap();
    let wasm = wat::parse_file(concat!(env!("CARGO_MANIFEST_DIR"), "/guests/table-grow.wat")).unwrap();
    std::fs::write(tools.path().join("table_grow.wasm"), wasm).unwrap();
    let builder = Host::builder()
        .workspace(workspace.path())
        .plugins(tools.path())
        .plugins(guest("keel_guest_hostile"))
        .limits(Limits { table_elements: 10_000, ..Limits::default() })
        .cache_dir(None);
    let host = block_on(builder.build()).unwrap();
    let results =
        block_on(host.run_batch(&[ToolUse::new("attack", "table_grow", json!({})), healthy()])).results;
    assert_eq!(
        results,
        [
            ToolResult::error("attack", "table_grow failed: table limit of 10000 elements exceeded"),
            ToolResult::ok("healthy", "ok"),
        ]
    );
}
