//! Per-input questions on the actual input, and the conservative fallback
//! when a guest traps while answering one.

use keel_host::events::PlannedGroup;
use keel_host::{Event, Host, ToolResult, ToolUse};
use serde_json::json;

use crate::{block_on, events_of, guest, shared_cache};

fn host() -> (tempfile::TempDir, Host) {
    let workspace = tempfile::tempdir().unwrap();
    let builder = Host::builder()
        .workspace(workspace.path())
        .plugins(guest("keel_guest_trap_queries"))
        .cache_dir(Some(shared_cache()));
    let host = block_on(builder.build()).unwrap();
    (workspace, host)
}

fn trapping(id: &str, exports: &[&str]) -> ToolUse {
    ToolUse::new(id, "trap_queries", json!({ "trap_in": exports, "message": id }))
}

#[test]
fn a_trap_in_is_concurrency_safe_answers_false_and_the_call_still_runs() {
    let (_workspace, host) = host();
    let batch = vec![
        trapping("healthy", &[]),
        trapping("also_healthy", &[]),
        trapping("trapped", &["is_concurrency_safe"]),
    ];
    let (events, results, _) = events_of(&host, batch);
    let plan = events.iter().find(|event| matches!(event, Event::BatchPlan { .. })).unwrap();
    assert_eq!(
        plan,
        &Event::BatchPlan {
            batches: vec![
                PlannedGroup {
                    concurrent: true,
                    tool_use_ids: vec!["healthy".into(), "also_healthy".into()]
                },
                PlannedGroup { concurrent: false, tool_use_ids: vec!["trapped".into()] },
            ]
        },
        "the guest's own answer is true; a trap falls back to false"
    );
    assert_eq!(results[2], ToolResult::ok("trapped", "ok: trapped"));
}

#[test]
fn a_trap_in_each_question_gives_its_fallback() {
    let (_workspace, host) = host();
    let tool = host.pool().get("trap_queries").unwrap().tool.clone();
    block_on(async {
        let input = |exports: &[&str]| json!({ "trap_in": exports, "message": "subject" });
        let mut healthy = tool.invoke(input(&[]), crate::at_root()).await.unwrap();
        assert!(healthy.is_read_only().await);
        assert!(!healthy.is_destructive().await);
        assert_eq!(healthy.permission_subject().await, Some("subject".into()));

        let mut trapped = tool
            .invoke(input(&["is_read_only", "is_destructive", "permission_subject"]), crate::at_root())
            .await
            .unwrap();
        assert!(!trapped.is_read_only().await, "fallback: assume it writes");
        assert!(!trapped.is_concurrency_safe().await, "one `plan` answers both: both fall back");
        assert!(trapped.is_destructive().await, "fallback: assume irreversible");
        assert_eq!(trapped.permission_subject().await, None);
    });
}

#[test]
fn traps_in_validation_permission_and_call_fail_only_their_call() {
    let (_workspace, host) = host();
    let batch = [
        trapping("v", &["validate_input"]),
        trapping("p", &["check_permissions"]),
        trapping("c", &["call"]),
        trapping("r", &["is_read_only", "is_concurrency_safe"]),
        trapping("ok", &[]),
    ];
    let results = block_on(host.run_batch(&batch)).results;
    assert_eq!(
        results[0],
        ToolResult::error(
            "v",
            "Invalid input for trap_queries: the tool's input check failed; the call was refused"
        )
    );
    assert_eq!(
        results[1],
        ToolResult::error(
            "p",
            "Invalid input for trap_queries: the tool's input check failed; the call was refused"
        ),
        "validation and the permission check are one export"
    );
    assert!(results[2].is_error);
    assert!(
        results[2].content.text().starts_with("trap_queries failed: the tool crashed: "),
        "{}",
        results[2].content
    );
    assert!(
        results[2].content.text().contains("trapping in `call` as the input asks"),
        "the guest's panic message is surfaced: {}",
        results[2].content
    );
    assert_eq!(results[3], ToolResult::ok("r", "ok: r"));
    assert_eq!(results[4], ToolResult::ok("ok", "ok: ok"));
}

#[test]
fn a_misspelt_export_name_is_refused_by_the_guest() {
    let (_workspace, host) = host();
    let results = block_on(host.run_batch(&[trapping("x", &["is_concurency_safe"])])).results;
    assert!(results[0].is_error);
    assert!(
        results[0].content.text().contains("`trap_in` names `is_concurency_safe`"),
        "{}",
        results[0].content
    );
}

/// A host with `fixed` (a 0.4.0 tool whose plan and checks are answered at
/// load) and `legacy_echo` (a 0.3.0 tool, asked both per call).
fn fixed_host() -> (tempfile::TempDir, Host) {
    let workspace = tempfile::tempdir().unwrap();
    let builder = Host::builder()
        .workspace(workspace.path())
        .plugins(guest("keel_guest_fixed"))
        .plugins(guest("keel_guest_legacy_v0_3"))
        .cache_dir(Some(shared_cache()));
    let host = block_on(builder.build()).unwrap();
    (workspace, host)
}

fn fixed(id: &str, input: serde_json::Value) -> ToolUse {
    ToolUse::new(id, "fixed", input)
}

#[test]
fn a_plan_fixed_at_load_is_never_asked_per_call_and_its_calls_run_side_by_side() {
    let (_workspace, host) = fixed_host();
    let batch = vec![fixed("a", json!({ "message": "a" })), fixed("b", json!({ "message": "b" }))];
    let (events, results, _) = events_of(&host, batch);
    let plan = events.iter().find(|event| matches!(event, Event::BatchPlan { .. })).unwrap();
    assert_eq!(
        plan,
        &Event::BatchPlan {
            batches: vec![PlannedGroup { concurrent: true, tool_use_ids: vec!["a".into(), "b".into()] }]
        },
        "`plan` traps when asked: asked, the calls would have run alone"
    );
    assert_eq!(
        results,
        vec![ToolResult::ok("a", "ok: a"), ToolResult::ok("b", "ok: b")],
        "`check` traps when asked: asked, the calls would have been refused"
    );
}

#[test]
fn a_plan_fixed_read_only_at_load_is_enforced_as_an_asked_one_is() {
    let (workspace, host) = fixed_host();
    let outcome = block_on(host.run_batch(&[fixed("w", json!({ "message": "w", "write": "x.txt" }))]));
    let result = &outcome.results[0];
    assert!(result.is_error, "{result:?}");
    assert!(result.content.text().starts_with("failed to write /workspace/x.txt: "), "{result:?}");
    assert!(!workspace.path().join("x.txt").exists());
}

#[test]
fn a_tool_of_contract_0_3_0_is_asked_its_plan_and_check_on_every_call() {
    let (_workspace, host) = fixed_host();
    let legacy = host.pool().get("legacy_echo").expect("a 0.3.0 component loads beside 0.4.0 ones");
    assert!(
        matches!(legacy.tool.spec().origin, keel_host::tool::ToolOrigin::Plugin { contract: "0.3.0", .. }),
        "{:?}",
        legacy.tool.spec().origin
    );
    let echo = |id: &str, text: &str| ToolUse::new(id, "legacy_echo", json!({ "text": text }));
    let batch = vec![echo("a", "hi"), echo("b", "refuse"), echo("c", "ho")];
    let (events, results, _) = events_of(&host, batch);
    let plan = events.iter().find(|event| matches!(event, Event::BatchPlan { .. })).unwrap();
    assert_eq!(
        plan,
        &Event::BatchPlan {
            batches: vec![PlannedGroup {
                concurrent: true,
                tool_use_ids: vec!["a".into(), "b".into(), "c".into()]
            }]
        },
        "its `plan` says concurrency-safe"
    );
    assert_eq!(
        results,
        vec![
            ToolResult::ok("a", "hi (cwd: /workspace)"),
            ToolResult::error("b", "Invalid input for legacy_echo: legacy_echo refuses this text"),
            ToolResult::ok("c", "ho (cwd: /workspace)"),
        ],
        "its `check` refuses what it refuses, and the context reaches its call"
    );
}
