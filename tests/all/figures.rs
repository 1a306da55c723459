//! The figures `call_finished` carries: each step's time, the fuel burnt,
//! the memory peak, the bytes in and out, and the outcome, for calls whose
//! cost is known; and the progress a long call reports in MCP's shape.

use keel_host::events::{CallFigures, Outcome, Step};
use keel_host::limits::Limits;
use keel_host::{Event, ToolUse};
use serde_json::{Value, json};

use crate::{events_of, host_of};

/// The figures of every call that finished, by `tool_use` id.
fn figures_of(events: &[Event]) -> Vec<(String, CallFigures)> {
    events
        .iter()
        .filter_map(|event| match event {
            Event::CallFinished { tool_use_id, figures: Some(figures), .. } => {
                Some((tool_use_id.clone(), (**figures).clone()))
            }
            _ => None,
        })
        .collect()
}

fn figures_for<'a>(all: &'a [(String, CallFigures)], id: &str) -> &'a CallFigures {
    &all.iter().find(|(call, _)| call == id).unwrap_or_else(|| panic!("no figures for {id}: {all:?}")).1
}

fn hash(id: &str, repeat: u64) -> ToolUse {
    ToolUse::new(id, "hash", json!({ "text": "0123456789abcdef".repeat(64), "repeat": repeat }))
}

#[test]
fn hashing_twice_the_bytes_burns_about_twice_the_fuel() {
    let workspace = tempfile::tempdir().unwrap();
    let limits = Limits::default();
    let host =
        crate::block_on(host_of(workspace.path(), &["keel_tool_hash"]).limits(limits).build()).unwrap();
    // 1 KiB repeated: 1 MiB, then 2 MiB, made and hashed inside the guest.
    let (events, results, _) = events_of(&host, vec![hash("one", 1024), hash("two", 2048)]);
    assert!(results.iter().all(|result| !result.is_error), "{results:?}");
    let all = figures_of(&events);
    let (one, two) = (figures_for(&all, "one"), figures_for(&all, "two"));
    for (figures, bytes) in [(one, 1u64 << 20), (two, 2 << 20)] {
        let fuel = figures.fuel.expect("a plugin's call burns fuel");
        // Every byte hashed costs at least one instruction, and the call
        // ended inside its limit.
        assert!(fuel >= bytes, "{fuel} fuel for {bytes} bytes");
        assert!(fuel < limits.fuel, "{fuel} fuel is over the limit {}", limits.fuel);
        assert_eq!(figures.outcome, Outcome::Ok);
        assert_eq!(figures.tool, "hash");
        let input = json!({ "text": "0123456789abcdef".repeat(64), "repeat": bytes >> 10 });
        assert_eq!(figures.bytes_in, serde_json::to_string(&input).unwrap().len() as u64);
        let id = if bytes == 1 << 20 { "one" } else { "two" };
        let result = results.iter().find(|result| result.tool_use_id == id).unwrap();
        assert_eq!(figures.bytes_out, result.content.text().len() as u64);
    }
    let (fuel_one, fuel_two) = (one.fuel.unwrap() as f64, two.fuel.unwrap() as f64);
    let ratio = fuel_two / fuel_one;
    assert!((1.6..=2.2).contains(&ratio), "2 MiB burnt {ratio:.2}× the fuel of 1 MiB");
}

#[test]
fn every_step_of_a_call_is_timed_and_the_steps_do_not_overlap() {
    let workspace = tempfile::tempdir().unwrap();
    let host = crate::block_on(host_of(workspace.path(), &["keel_tool_hash"]).build()).unwrap();
    let (events, _, _) = events_of(&host, vec![hash("h", 1)]);
    let all = figures_of(&events);
    let figures = figures_for(&all, "h");
    for step in Step::ALL {
        assert!(figures.steps.iter().any(|time| time.step == step), "no {step} step in {figures:?}");
    }
    for pair in figures.steps.windows(2) {
        assert!(pair[0].end_us() <= pair[1].start_us, "{pair:?} overlap");
    }
    let total: u64 = Step::ALL.iter().map(|&step| figures.duration_us(step)).sum();
    assert!(total <= figures.end_us() - figures.start_us());
    // The steps are on the wall clock.
    let now = keel_host::events::now_us();
    assert!(figures.end_us() <= now && now - figures.end_us() < 60_000_000, "{figures:?}");
    // A call's start comes before its figures.
    let started = events.iter().position(|event| matches!(event, Event::CallStarted { .. })).unwrap();
    let finished = events.iter().position(|event| matches!(event, Event::CallFinished { .. })).unwrap();
    assert!(started < finished);
}

#[test]
fn a_guest_that_grows_its_memory_to_the_cap_peaks_near_it() {
    let workspace = tempfile::tempdir().unwrap();
    let memory = 32 << 20;
    let limits = Limits { memory, ..Limits::default() };
    let host =
        crate::block_on(host_of(workspace.path(), &["keel_guest_hostile"]).limits(limits).build()).unwrap();
    let grow = ToolUse::new("grow", "hostile", json!({ "act": "grow_memory" }));
    let ok = ToolUse::new("ok", "hostile", json!({ "act": "ok" }));
    let (events, _, _) = events_of(&host, vec![grow, ok]);
    let all = figures_of(&events);
    let grown = figures_for(&all, "grow");
    assert_eq!(grown.outcome, Outcome::Limit);
    // It allocated 1 MiB at a time until the cap refused the next: its
    // memory reached within 2 MiB of the cap (one allocation and the
    // allocator's slack), and never past it.
    let peak = grown.memory_peak.expect("a plugin has a memory");
    assert!(peak <= memory as u64 && peak >= (memory as u64) - (2 << 20), "peak {peak} of cap {memory}");
    let calm = figures_for(&all, "ok");
    assert_eq!(calm.outcome, Outcome::Ok);
    assert!(calm.memory_peak.unwrap() < peak / 4, "{calm:?}");
}

#[test]
fn outcomes_say_how_each_call_ended() {
    let workspace = tempfile::tempdir().unwrap();
    let keel_toml = "[permissions]\ndeny = [\"write_file(**/a.txt)\"]\n";
    let config = keel_host::config::Config::parse(keel_toml, "keel.toml".as_ref()).unwrap();
    let host = crate::block_on(
        host_of(workspace.path(), &["keel_tool_hash", "keel_tool_write_file", "keel_guest_hostile"])
            .config(config)
            .limits(Limits { fuel: 50_000_000, ..Limits::default() })
            .build(),
    )
    .unwrap();
    let uses = vec![
        ToolUse::new("ok", "hash", json!({ "text": "a" })),
        ToolUse::new("error", "hash", json!({ "file_path": "missing.txt" })),
        ToolUse::new("denied", "write_file", json!({ "file_path": "a.txt", "content": "x" })),
        ToolUse::new("limit", "hostile", json!({ "act": "loop" })),
        ToolUse::new("crashed", "hostile", json!({ "act": "panic" })),
        ToolUse::new("unknown", "no_such_tool", Value::Null),
    ];
    let (events, results, _) = events_of(&host, uses);
    let all = figures_of(&events);
    for (id, outcome) in [
        ("ok", Outcome::Ok),
        ("error", Outcome::Error),
        ("denied", Outcome::Denied),
        ("limit", Outcome::Limit),
        ("crashed", Outcome::Crashed),
    ] {
        assert_eq!(figures_for(&all, id).outcome, outcome, "{id}: {results:?}");
    }
    // A call refused before it was planned has a result and no figures.
    assert!(all.iter().all(|(id, _)| id != "unknown"));
    assert_eq!(results.len(), 6);
}

#[test]
fn a_long_hash_reports_its_progress_as_a_count_a_total_and_a_message() {
    let workspace = tempfile::tempdir().unwrap();
    let host = crate::block_on(host_of(workspace.path(), &["keel_tool_hash"]).build()).unwrap();
    // 1 KiB repeated 65,536 times: 64 MiB, the least that reports.
    let (events, results, _) = events_of(&host, vec![hash("long", 65_536)]);
    assert!(!results[0].is_error, "{results:?}");
    let activity = events.iter().find_map(|event| match event {
        Event::CallStarted { activity, .. } => activity.clone(),
        _ => None,
    });
    assert_eq!(activity.as_deref(), Some("Hashing 64 MiB"));
    let reports: Vec<&Value> = events
        .iter()
        .filter_map(|event| match event {
            Event::Progress { data, .. } => Some(data),
            _ => None,
        })
        .collect();
    assert_eq!(reports.len(), 16, "{reports:?}");
    assert_eq!(reports[0], &json!({ "progress": 4, "total": 64, "message": "Hashed 4 of 64 MiB" }));
    assert_eq!(reports[15], &json!({ "progress": 64, "total": 64, "message": "Hashed 64 of 64 MiB" }));
}
