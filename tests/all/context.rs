//! Every question sees the context the call runs with (README, "How a batch
//! runs"): a permission rule on a path holds after a `cd`, however the `cd`
//! came before, for the bundled tools and for a tool of contract 0.2.0.

use std::sync::Arc;

use async_trait::async_trait;
use keel_host::config::Config;
use keel_host::tool::{CallContext, CallError, CallOutput};
use keel_host::{Host, HostBuilder, Interrupt, Invocation, Tool, ToolResult, ToolSpec, ToolUse};
use serde_json::{Value, json};

use crate::{block_on, guest, shared_cache};

const DENY_SECRETS: &str = "[permissions]\ndeny = [\"write_file(secrets/**)\", \"legacy_write(secrets/**)\", \
                            \"Read(secrets/**)\"]\n";

/// A workspace holding `secrets/k.txt`, and a host over it with the bundled
/// tools, the 0.2.0 `legacy_write`, `Read` and a safe native `hop`, under
/// `keel_toml`.
fn world(keel_toml: &str) -> (tempfile::TempDir, HostBuilder) {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::create_dir(workspace.path().join("secrets")).unwrap();
    std::fs::write(workspace.path().join("secrets/k.txt"), "the key").unwrap();
    let config = Config::parse(keel_toml, "keel.toml".as_ref()).unwrap();
    let builder = ["keel_tool_cd", "keel_tool_write_file", "keel_tool_grep", "keel_guest_legacy"]
        .iter()
        .fold(Host::builder().workspace(workspace.path()), |builder, name| builder.plugins(guest(name)))
        .tool(Arc::new(Hop(hop_spec())))
        .cache_dir(Some(shared_cache()))
        .config(config);
    (workspace, builder)
}

fn secret(workspace: &tempfile::TempDir) -> String {
    std::fs::read_to_string(workspace.path().join("secrets/k.txt")).unwrap()
}

fn cd(id: &str, path: &str) -> ToolUse {
    ToolUse::new(id, "cd", json!({ "path": path }))
}

fn write(id: &str, tool: &str, path: &str) -> ToolUse {
    ToolUse::new(id, tool, json!({ "file_path": path, "content": "overwritten" }))
}

fn denied(id: &str, tool: &str) -> ToolResult {
    ToolResult::error(
        id,
        format!("Permission to use {tool} denied: the rule `{tool}(secrets/**)` forbids it"),
    )
}

#[test]
fn a_write_after_a_cd_is_judged_where_it_writes() {
    let (workspace, builder) = world(DENY_SECRETS);
    let host = block_on(builder.build()).unwrap();
    let outcome = block_on(host.run_batch(&[cd("t1", "secrets"), write("t2", "write_file", "k.txt")]));
    assert_eq!(outcome.results[1], denied("t2", "write_file"));
    assert_eq!(secret(&workspace), "the key");

    let normalized = write("t3", "write_file", "./a/../secrets/k.txt");
    let outcome = block_on(host.run_batch(&[normalized]));
    assert_eq!(outcome.results[0], denied("t3", "write_file"), "the subject is normalized");
    assert_eq!(secret(&workspace), "the key");

    std::fs::create_dir(workspace.path().join("notes")).unwrap();
    let outcome = block_on(host.run_batch(&[cd("t4", "notes"), write("t5", "write_file", "k.txt")]));
    assert!(!outcome.results[1].is_error, "{:?}", outcome.results[1]);
    assert!(!workspace.path().join("k.txt").exists(), "it wrote under the working directory");
    assert_eq!(std::fs::read_to_string(workspace.path().join("notes/k.txt")).unwrap(), "overwritten");
}

#[test]
fn a_read_after_a_cd_is_judged_where_it_reads() {
    let (_workspace, builder) = world(DENY_SECRETS);
    let host = block_on(builder.build()).unwrap();
    let read = ToolUse::new("t2", "Read", json!({ "file_path": "k.txt" }));
    let outcome = block_on(host.run_batch(&[cd("t1", "secrets"), read]));
    assert_eq!(outcome.results[1], denied("t2", "Read"));
}

#[test]
fn a_change_made_inside_a_concurrent_run_reaches_the_call_after_it() {
    let (workspace, builder) = world(DENY_SECRETS);
    let host = block_on(builder.build()).unwrap();
    // `hop` and `grep` run together; `hop`'s change applies when the run
    // ends, after the write was planned at the root.
    let batch = [
        ToolUse::new("t1", "hop", json!({ "to": "secrets" })),
        ToolUse::new("t2", "grep", json!({ "pattern": "key", "path": "." })),
        write("t3", "write_file", "k.txt"),
    ];
    let (events, results, _) = crate::events_of(&host, batch.to_vec());
    let plan = events.iter().find_map(|event| match event {
        keel_host::Event::BatchPlan { batches } => Some(batches.clone()),
        _ => None,
    });
    let first = &plan.expect("the batch is planned")[0];
    assert!(first.concurrent && first.tool_use_ids == ["t1", "t2"], "hop and grep form one run: {first:?}");
    assert_eq!(results[2], denied("t3", "write_file"));
    assert_eq!(secret(&workspace), "the key");
}

#[test]
fn a_cd_in_an_earlier_batch_holds_for_the_next() {
    let (workspace, builder) = world(DENY_SECRETS);
    let host = block_on(builder.build()).unwrap();
    let first = block_on(async {
        let mut run = host.start_batch(vec![cd("t1", "secrets")], keel_host::context::initial());
        while run.next_event().await.is_some() {}
        run.finish().await
    });
    assert_eq!(first.context["cwd"], "/workspace/secrets");
    let second = block_on(async {
        let mut run = host.start_batch(vec![write("t2", "write_file", "k.txt")], first.context);
        while run.next_event().await.is_some() {}
        run.finish().await
    });
    assert_eq!(second.results[0], denied("t2", "write_file"));
    assert_eq!(secret(&workspace), "the key");
}

#[test]
fn calls_arriving_one_by_one_are_judged_where_they_run() {
    let (workspace, builder) = world(DENY_SECRETS);
    let host = block_on(builder.build()).unwrap();
    let stream = host.stream(keel_host::context::initial());
    let results = block_on(async {
        // Both arrive before either runs: the write is planned at the root.
        let (first, second) = (stream.arrive(), stream.arrive());
        let interrupt = Interrupt::new();
        tokio::join!(
            first.run(cd("t1", "secrets"), None, &interrupt),
            second.run(write("t2", "write_file", "k.txt"), None, &interrupt)
        )
    });
    assert!(!results.0.is_error, "{:?}", results.0);
    assert_eq!(results.1, denied("t2", "write_file"));
    assert_eq!(secret(&workspace), "the key");
}

#[test]
fn a_tool_of_contract_0_2_0_loads_runs_and_cannot_walk_around_a_rule() {
    let (workspace, builder) = world(DENY_SECRETS);
    let host = block_on(builder.build()).unwrap();
    let legacy = host.pool().get("legacy_write").expect("a 0.2.0 component loads beside newer ones");
    assert!(matches!(
        legacy.tool.spec().origin,
        keel_host::tool::ToolOrigin::Plugin { contract: "0.2.0", .. }
    ));

    let outcome = block_on(host.run_batch(&[write("t1", "legacy_write", "notes/a.txt")]));
    assert_eq!(outcome.results[0], ToolResult::ok("t1", "Wrote 11 bytes to notes/a.txt"));

    let outcome = block_on(host.run_batch(&[write("t2", "legacy_write", "secrets/k.txt")]));
    assert_eq!(outcome.results[0], denied("t2", "legacy_write"), "at the root its subject holds");

    // After a cd it names `k.txt`, blind to the working directory: the subject
    // is unknown, so the pattern deny rule applies.
    let outcome = block_on(host.run_batch(&[cd("t3", "secrets"), write("t4", "legacy_write", "k.txt")]));
    let refused = &outcome.results[1];
    assert!(refused.is_error, "{refused:?}");
    assert!(
        refused
            .content
            .text()
            .starts_with("Permission to use legacy_write denied: the rule `legacy_write(secrets/**)`"),
        "{refused:?}"
    );
    assert_eq!(secret(&workspace), "the key");
}

#[test]
fn a_0_2_0_tool_after_a_cd_gets_no_pattern_allow() {
    let rules = "[permissions]\ndefault = \"deny\"\nallow = [\"legacy_write(notes/**)\", \"cd\"]\n";
    let (workspace, builder) = world(rules);
    let host = block_on(builder.build()).unwrap();
    std::fs::create_dir(workspace.path().join("notes")).unwrap();
    let outcome = block_on(host.run_batch(&[write("t1", "legacy_write", "notes/a.txt")]));
    assert!(!outcome.results[0].is_error, "{:?}", outcome.results[0]);
    let outcome = block_on(host.run_batch(&[cd("t2", "notes"), write("t3", "legacy_write", "b.txt")]));
    assert!(
        outcome.results[1].is_error,
        "an unknown subject is allowed by no pattern: {:?}",
        outcome.results[1]
    );
    assert!(!workspace.path().join("notes/b.txt").exists());
}

/// A native tool that changes the working directory and may run beside
/// other safe calls: a `cd` whose change lands when its run ends.
struct Hop(ToolSpec);

fn hop_spec() -> ToolSpec {
    let schema = json!({
        "type": "object",
        "properties": { "to": { "type": "string" } },
        "required": ["to"],
    });
    ToolSpec::native("hop", "Changes the working directory, beside other calls.", schema)
}

#[async_trait]
impl Tool for Hop {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    async fn invoke(&self, input: Value, _context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
        Ok(Box::new(HopCall(input)))
    }
}

struct HopCall(Value);

#[async_trait]
impl Invocation for HopCall {
    fn input(&self) -> &Value {
        &self.0
    }

    fn set_input(&mut self, input: Value) {
        self.0 = input;
    }

    /// Its answers do not depend on the context.
    fn set_context(&mut self, _context: Arc<Value>) {}

    async fn is_concurrency_safe(&mut self) -> bool {
        true
    }

    async fn is_read_only(&mut self) -> bool {
        true
    }

    async fn call(self: Box<Self>, cx: CallContext) -> Result<CallOutput, CallError> {
        let cwd = format!("{}/{}", keel_host::contract::cwd(&cx.context), self.0["to"].as_str().unwrap());
        Ok(CallOutput { context_modifier: Some(json!({ "cwd": cwd })), ..CallOutput::text("hopped") })
    }
}

/// A native tool that adds `bytes` bytes under `key` to the context, like a
/// plugin that grows it call after call; safe (it runs beside other safe
/// calls) when `safe` is set.
struct Grow(ToolSpec);

fn grow_tool() -> Arc<Grow> {
    let schema = json!({
        "type": "object",
        "properties": {
            "key": { "type": "string" },
            "bytes": { "type": "integer", "minimum": 0 },
            "safe": { "type": "boolean" },
        },
        "required": ["key", "bytes"],
    });
    Arc::new(Grow(ToolSpec::native("grow", "Adds bytes to the context.", schema)))
}

fn grow(id: &str, key: &str, bytes: usize, safe: bool) -> ToolUse {
    ToolUse::new(id, "grow", json!({ "key": key, "bytes": bytes, "safe": safe }))
}

#[async_trait]
impl Tool for Grow {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    async fn invoke(&self, input: Value, _context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
        Ok(Box::new(GrowCall(input)))
    }
}

struct GrowCall(Value);

#[async_trait]
impl Invocation for GrowCall {
    fn input(&self) -> &Value {
        &self.0
    }

    fn set_input(&mut self, input: Value) {
        self.0 = input;
    }

    fn set_context(&mut self, _context: Arc<Value>) {}

    async fn is_concurrency_safe(&mut self) -> bool {
        self.0["safe"].as_bool().unwrap_or(false)
    }

    async fn is_read_only(&mut self) -> bool {
        true
    }

    async fn call(self: Box<Self>, _cx: CallContext) -> Result<CallOutput, CallError> {
        let (key, bytes) = (self.0["key"].as_str().unwrap(), self.0["bytes"].as_u64().unwrap());
        let padding = "x".repeat(bytes as usize);
        Ok(CallOutput { context_modifier: Some(json!({ key: padding })), ..CallOutput::text("grown") })
    }
}

/// `world`, with `grow` beside its tools.
fn grow_world(keel_toml: &str) -> (tempfile::TempDir, Host) {
    let (workspace, builder) = world(keel_toml);
    let host = block_on(builder.tool(grow_tool()).build()).unwrap();
    (workspace, host)
}

fn refused_for_size(result: &ToolResult) {
    let text = result.content.text();
    assert!(result.is_error, "{result:?}");
    assert!(text.starts_with("grow failed: context size limit (context_kib) of "), "{text}");
    assert!(text.contains("the context is as it was"), "{text}");
}

#[test]
fn a_change_past_the_context_limit_fails_its_call_and_later_calls_of_other_tools_run() {
    // The default limit, 1 MiB: the second 600 KiB change would pass it.
    let (workspace, host) = grow_world("");
    std::fs::create_dir(workspace.path().join("notes")).unwrap();
    let batch = vec![
        grow("g1", "a", 600 << 10, false),
        grow("g2", "b", 600 << 10, false),
        cd("c1", "notes"),
        write("w1", "write_file", "k.txt"),
    ];
    let (events, results, context) = crate::events_of(&host, batch);
    assert!(!results[0].is_error, "{:?}", results[0]);
    refused_for_size(&results[1]);
    assert!(results[1].content.text().contains("of 1 MiB exceeded"), "{:?}", results[1]);
    assert!(!results[2].is_error && !results[3].is_error, "{results:?}");
    assert_eq!(std::fs::read_to_string(workspace.path().join("notes/k.txt")).unwrap(), "overwritten");
    assert_eq!(context["a"].as_str().map(str::len), Some(600 << 10));
    assert!(context.get("b").is_none(), "the refused change was not applied");
    assert_eq!(context["cwd"], "/workspace/notes");
    let finished = events.iter().find_map(|event| match event {
        keel_host::Event::CallFinished { tool_use_id, is_error, figures } if tool_use_id == "g2" => {
            Some((*is_error, figures.as_ref().map(|figures| figures.outcome)))
        }
        _ => None,
    });
    assert_eq!(finished, Some((true, Some(keel_host::events::figures::Outcome::Limit))));
}

#[test]
fn a_batch_of_one_is_held_to_the_context_limit_from_the_context_it_is_handed() {
    let (_workspace, host) = grow_world("[limits]\ncontext_kib = 64\n");
    let outcome = block_on(async {
        let context = json!({ "cwd": "/workspace", "a": "x".repeat(40 << 10) });
        let mut run = host.start_batch(vec![grow("g1", "b", 40 << 10, false)], context);
        while run.next_event().await.is_some() {}
        run.finish().await
    });
    refused_for_size(&outcome.results[0]);
    assert!(outcome.results[0].content.text().contains("of 64 KiB exceeded"), "{:?}", outcome.results[0]);
    assert!(outcome.context.get("b").is_none());
    assert_eq!(outcome.context["a"].as_str().map(str::len), Some(40 << 10));
}

#[test]
fn the_changes_of_a_concurrent_run_are_held_to_the_context_limit_together() {
    // Any two of the three 30 KiB changes fit in 64 KiB; all three do not.
    let (_workspace, host) = grow_world("[limits]\ncontext_kib = 64\n");
    let batch =
        [grow("g1", "a", 30 << 10, true), grow("g2", "b", 30 << 10, true), grow("g3", "c", 30 << 10, true)];
    let outcome = block_on(host.run_batch(&batch));
    let refused: Vec<&ToolResult> = outcome.results.iter().filter(|result| result.is_error).collect();
    assert_eq!(refused.len(), 1, "{:?}", outcome.results);
    refused_for_size(refused[0]);
    assert!(refused[0].content.text().contains("calls run beside it"), "{:?}", refused[0]);
    let kept = ["a", "b", "c"].iter().filter(|key| outcome.context.get(**key).is_some()).count();
    assert_eq!(kept, 2, "the two accepted changes apply when the run ends");
}

#[test]
fn calls_arriving_one_by_one_are_held_to_the_context_limit_and_the_stream_goes_on() {
    // What `keel serve` runs its calls through: the context outlives each
    // call, so a refused change must leave it as it was.
    let (workspace, host) = grow_world("[limits]\ncontext_kib = 64\n");
    std::fs::create_dir(workspace.path().join("notes")).unwrap();
    let stream = host.stream(keel_host::context::initial());
    let interrupt = Interrupt::new();
    let run = |tool_use: ToolUse| block_on(stream.arrive().run(tool_use, None, &interrupt));
    assert!(!run(grow("g1", "a", 40 << 10, false)).is_error);
    refused_for_size(&run(grow("g2", "b", 40 << 10, false)));
    let (first, second) = block_on(async {
        let (first, second) = (stream.arrive(), stream.arrive());
        tokio::join!(
            first.run(grow("g3", "c", 20 << 10, true), None, &interrupt),
            second.run(grow("g4", "d", 20 << 10, true), None, &interrupt)
        )
    });
    assert!(first.is_error != second.is_error, "one of the two fits: {first:?} {second:?}");
    refused_for_size(if first.is_error { &first } else { &second });
    assert!(!run(cd("c1", "notes")).is_error);
    assert!(!run(write("w1", "write_file", "k.txt")).is_error);
    assert!(workspace.path().join("notes/k.txt").is_file());
    let context = stream.context();
    assert!(context.get("b").is_none());
    assert_eq!(context["cwd"], "/workspace/notes");
    assert!(keel_host::context::size(&context) <= 64 << 10);
}
