//! A load test with fixed counts (not timed): 1,000 calls in batches where
//! one call in ten goes to a hostile plugin that traps, spins or hoards
//! memory. Every healthy call must still return the right result, the cap
//! must hold, and memory must come back down.

use keel_host::config::{Config, LimitsConfig};
use keel_host::{ToolResult, ToolUse};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::{block_on, events_of, host_of, most_in_flight};

const BATCHES: usize = 20;
const CALLS_PER_BATCH: usize = 50;
const CAP: usize = 4;
/// How far resident memory may stay above its level after the first batch.
/// The pooling allocator keeps up to 1 MiB of each used memory slot
/// resident by design; with a cap of 4 and a handful of slots reused, the
/// level after warm-up is the steady state, and 64 MiB is an order of
/// magnitude above any per-call leak of a 1,000-call run (a leak of one 64 MiB
/// memory bomb, or of a sandbox per call, would exceed it).
const MEMORY_MARGIN: u64 = 64 << 20;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc is readable");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[test]
fn a_thousand_calls_with_hostile_ones_mixed_in() {
    let workspace = tempfile::tempdir().unwrap();
    let limits = LimitsConfig { fuel: Some(200_000_000), memory_mib: Some(64), ..LimitsConfig::default() };
    let config = Config { max_tool_use_concurrency: Some(CAP), limits, ..Config::default() };
    let builder = host_of(workspace.path(), &["keel_tool_hash", "keel_guest_hostile"]).config(config);
    let host = block_on(builder.build()).unwrap();

    let mut baseline = None;
    let mut healthy = 0;
    for batch in 0..BATCHES {
        let uses: Vec<ToolUse> = (0..CALLS_PER_BATCH)
            .map(|i| {
                let id = format!("b{batch}c{i}");
                let attack = match i % 30 {
                    9 => Some("panic"),
                    19 => Some("loop"),
                    29 => Some("grow_memory"),
                    _ => None,
                };
                match attack {
                    Some(act) => ToolUse::new(id, "hostile", json!({ "act": act, "concurrency_safe": true })),
                    None => ToolUse::new(id.clone(), "hash", json!({ "text": id })),
                }
            })
            .collect();
        let (events, results, _) = events_of(&host, uses.clone());
        assert_eq!(results.len(), CALLS_PER_BATCH, "one result per call");
        let most = most_in_flight(&events);
        assert!(most <= CAP, "batch {batch}: {most} calls in flight, cap {CAP}");
        for (tool_use, result) in uses.iter().zip(&results) {
            assert_eq!(result.tool_use_id, tool_use.id);
            if tool_use.name == "hash" {
                healthy += 1;
                let expected = hex(&Sha256::digest(tool_use.id.as_bytes()));
                assert_eq!((result.content.text().as_ref(), result.is_error), (expected.as_str(), false));
            } else {
                assert!(result.is_error, "{}: {}", tool_use.id, result.content);
                assert!(
                    result.content.text().starts_with("hostile failed: "),
                    "{}: {}",
                    tool_use.id,
                    result.content
                );
            }
        }
        if batch == 0 {
            baseline = Some(resident_bytes());
        }
    }
    assert_eq!(healthy, 900, "one call in ten was hostile");
    let (baseline, end) = (baseline.unwrap(), resident_bytes());
    assert!(
        end <= baseline + MEMORY_MARGIN,
        "resident memory grew from {} MiB to {} MiB",
        baseline >> 20,
        end >> 20
    );
}

/// On a current-thread runtime whose thread defers its teardowns, as `keel
/// serve --http` has, a call's sandbox is torn down once the thread has run
/// what was ready (README, Performance). Calls that never wait give it
/// no such moment: while one sandbox waits, each later call tears its own down
/// at once, so more calls than the engine has instance slots (1,000) all run.
#[test]
fn calls_that_never_wait_on_one_thread_keep_at_most_one_sandbox_waiting() {
    let workspace = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    keel_host::defer_teardown_on_this_thread();
    let host = runtime.block_on(host_of(workspace.path(), &["keel_tool_echo"]).build()).unwrap();
    let calls = 1_100;
    // Unconstrained: tokio's cooperative budget would otherwise make a
    // call wait every 128, and give the runtime its moment.
    let in_one_poll = runtime.block_on(tokio::task::unconstrained(async {
        let mut in_one_poll = 0;
        for id in 0..calls {
            let batch = [ToolUse::new(format!("toolu_{id}"), "echo", json!({ "text": "hi" }))];
            let mut run = std::pin::pin!(host.run_batch(&batch));
            let mut polls = 0;
            let outcome = std::future::poll_fn(|cx| {
                polls += 1;
                run.as_mut().poll(cx)
            })
            .await;
            assert_eq!(outcome.results[0], ToolResult::ok(format!("toolu_{id}"), "hi"), "call {id}");
            in_one_poll += usize::from(polls == 1);
        }
        in_one_poll
    }));
    assert!(
        in_one_poll > 1_000,
        "only {in_one_poll} of {calls} calls finished in their first poll, so the runtime had room \
         to tear sandboxes down between them and this test no longer reaches the bound"
    );
}
