//! The compile cache: a second start does not recompile, nor, when the
//! plugin's load-time answers are known, load the code before its first call.

use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_host::{Host, Limits, ToolResult, ToolUse};
use serde_json::{Value, json};

use tracing_subscriber::fmt::format::FmtSpan;

use crate::{block_on, guest, logged};

/// The compiled components in `cache` (beside them, its index).
fn compiled(cache: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(cache).unwrap().map(|entry| entry.unwrap().path());
    entries.filter(|path| path.extension().is_some_and(|ext| ext == "cwasm")).collect()
}

fn start_with(plugin: &Path, workspace: &Path, cache: &Path, limits: Limits) -> Host {
    let builder = Host::builder()
        .workspace(workspace)
        .plugins(plugin)
        .cache_dir(Some(cache.to_path_buf()))
        .limits(limits);
    block_on(builder.build()).unwrap()
}

fn start(workspace: &Path, cache: &Path) -> Host {
    start_with(&guest("keel_tool_write_file"), workspace, cache, Limits::default())
}

/// A guest copied into a directory of its own, old enough for the cache's
/// index to know it by its identity (a file that changed in the last 2 s is
/// read and hashed on every start instead), with a workspace and a compile
/// cache of its own.
struct Settled {
    _dir: tempfile::TempDir,
    plugin: PathBuf,
    workspace: tempfile::TempDir,
    cache: tempfile::TempDir,
}

impl Settled {
    fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join(format!("{name}.wasm"));
        std::fs::copy(guest(name), &plugin).unwrap();
        std::thread::sleep(Duration::from_millis(2_100));
        let (workspace, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        Settled { _dir: dir, plugin, workspace, cache }
    }

    fn start(&self, limits: Limits) -> Host {
        start_with(&self.plugin, self.workspace.path(), self.cache.path(), limits)
    }
}

fn answers_from_cache(host: &Host) -> bool {
    host.load_reports()[0].1.answers_from_cache
}

fn write(host: &Host, file: &str) -> ToolResult {
    let call = ToolUse::new("w", "write_file", json!({ "file_path": file, "content": "written" }));
    block_on(host.run_batch(&[call])).results.remove(0)
}

fn spec_of(host: &Host, name: &str) -> Value {
    serde_json::to_value(host.pool().get(name).unwrap().tool.spec()).unwrap()
}

#[test]
fn a_second_start_loads_from_the_compile_cache() {
    let workspace = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let start = || start(workspace.path(), cache.path());
    let first = start();
    assert!(!first.load_reports()[0].1.from_cache, "a cold cache compiles");
    assert_eq!(compiled(cache.path()).len(), 1, "one compiled component was cached");

    let second = start();
    assert_eq!(second.load_reports()[0].0, "write_file");
    assert!(second.load_reports()[0].1.from_cache, "a warm cache is used");
    let size = std::fs::metadata(guest("keel_tool_write_file")).unwrap().len();
    assert_eq!(second.load_reports()[0].1.size, size, "the size of the file, read or not");
}

#[test]
fn a_warm_start_takes_the_load_time_answers_and_loads_the_code_at_the_first_call() {
    let settled = Settled::new("keel_tool_write_file");
    let first = settled.start(Limits::default());
    assert!(!answers_from_cache(&first), "a cold cache asks the plugin");
    let second = settled.start(Limits::default());
    assert!(answers_from_cache(&second), "a warm one does not");
    assert_eq!(spec_of(&second, "write_file"), spec_of(&first, "write_file"), "and knows the same tool");

    let result = write(&second, "out.txt");
    assert!(!result.is_error, "the code is loaded at the first call: {}", result.content);
    assert_eq!(std::fs::read_to_string(settled.workspace.path().join("out.txt")).unwrap(), "written");
}

#[test]
fn answers_that_fell_back_are_asked_again() {
    // Its `max-result-size` traps and `requires-user-interaction` spins.
    let settled = Settled::new("keel_guest_trap_load");
    assert!(!answers_from_cache(&settled.start(Limits::default())));
    assert!(
        !answers_from_cache(&settled.start(Limits::default())),
        "a fallback may have been a passing fault: it is not kept"
    );
}

#[test]
fn answers_given_under_other_limits_are_not_reused() {
    let settled = Settled::new("keel_tool_write_file");
    let smaller = Limits { memory: 64 << 20, ..Limits::default() };
    settled.start(Limits::default());
    assert!(!answers_from_cache(&settled.start(smaller)), "a limit may change an answer, or make it trap");
    assert!(answers_from_cache(&settled.start(smaller)));
    assert!(answers_from_cache(&settled.start(Limits::default())), "the first answers are still kept");
}

#[test]
fn a_plugin_changed_after_a_warm_start_is_not_run_as_another() {
    let settled = Settled::new("keel_tool_write_file");
    settled.start(Limits::default());
    let host = settled.start(Limits::default());
    assert!(answers_from_cache(&host));
    // Its code is not loaded yet, and is no longer cached: the file must be read.
    compiled(settled.cache.path()).iter().for_each(|artifact| std::fs::remove_file(artifact).unwrap());
    std::fs::write(&settled.plugin, std::fs::read(guest("keel_tool_echo")).unwrap()).unwrap();

    let result = write(&host, "out.txt");
    assert!(result.is_error);
    assert!(result.content.text().contains("changed since keel loaded it"), "{}", result.content);
    assert!(!settled.workspace.path().join("out.txt").exists());
}

#[test]
fn a_corrupt_cache_entry_is_recompiled_and_replaced() {
    let workspace = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let start = || start(workspace.path(), cache.path());
    start();
    let entry = compiled(cache.path()).remove(0);
    std::fs::write(&entry, b"garbage").unwrap();
    let host = start();
    let report = &host.load_reports()[0].1;
    // The code is loaded at the start, or at the first call when the
    // answers are known: either way the corrupt entry is not trusted.
    assert!(report.answers_from_cache || !report.from_cache, "the corrupt entry is not trusted");
    assert!(!write(&host, "out.txt").is_error);
    assert_ne!(std::fs::read(&entry).unwrap(), b"garbage", "and it was replaced");
}

#[test]
fn concurrent_first_calls_of_a_plugin_whose_code_is_not_loaded_all_run() {
    let settled = Settled::new("keel_tool_grep");
    std::fs::write(settled.workspace.path().join("notes.txt"), "a needle\n").unwrap();
    settled.start(Limits::default());
    let host = settled.start(Limits::default());
    assert!(answers_from_cache(&host));
    let calls: Vec<ToolUse> =
        (0..12).map(|i| ToolUse::new(format!("g{i}"), "grep", json!({ "pattern": "needle" }))).collect();
    let (events, results, _) = crate::events_of(&host, calls);
    assert!(crate::most_in_flight(&events) > 1, "the calls overlapped");
    for result in &results {
        assert!(
            !result.is_error && result.content.text().contains("notes.txt:1:a needle"),
            "{}",
            result.content
        );
    }
}

#[test]
fn a_warm_up_on_the_thread_of_the_calls_loads_deferred_code_beside_them() {
    let settled = Settled::new("keel_tool_write_file");
    settled.start(Limits::default());
    // The plugin alone, so that the warm-up's first step is its load.
    let builder = Host::builder()
        .workspace(settled.workspace.path())
        .plugins(&settled.plugin)
        .cache_dir(Some(settled.cache.path().to_path_buf()))
        .builtins(false);
    let host = block_on(builder.build()).unwrap();
    assert!(answers_from_cache(&host), "the code is left unloaded until a call or the warm-up");
    // One thread runs both, as a stdio session's does. The warm-up is polled
    // first: its load goes to a blocking thread, so the call is taken at
    // once, before the warm-up's sandbox is set up (a load made in place
    // would be, and that sandbox too, before the thread is let go); the call
    // then waits for that load or makes it, whichever begins first.
    let call = |id: &str| ToolUse::new(id, "write_file", json!({ "file_path": id, "content": "x" }));
    let first = [call("a")];
    let arrives = async {
        tracing::info!("the call arrives");
        host.run_batch(&first).await
    };
    let warm_up = host.warm_up();
    let (((), results), traced) = logged(async { tokio::join!(warm_up, arrives) }, FmtSpan::NEW);
    assert!(!results.results[0].is_error, "{:?}", results.results);
    let arrived = traced.find("the call arrives").unwrap();
    let set_up = traced.find("setup").unwrap_or_else(|| panic!("no sandbox was set up: {traced}"));
    assert!(arrived < set_up, "the call waited for the warm-up's load: {traced}");
    let after = block_on(host.run_batch(&[call("b")]));
    assert!(!after.results[0].is_error, "{:?}", after.results);
    assert_eq!(std::fs::read_to_string(settled.workspace.path().join("b")).unwrap(), "x");
}
