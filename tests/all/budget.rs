//! Result budgets, the replacement ledger and tool-use summaries, through the
//! library API: real grep output and synthetic messages.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use keel_host::batch::user_message;
use keel_host::budget::ledger::{Decision, Ledger};
use keel_host::budget::{Budget, BudgetConfig, Threshold};
use keel_host::context;
use keel_host::events::summary::{self, BoxError, DefaultSummarizer, Summarizer, Summary, SummaryCall};
use keel_host::tool::{CallContext, CallError};
use keel_host::{Invocation, Tool, ToolResult, ToolSpec, ToolUse};
use serde_json::{Value, json};
use tracing_subscriber::fmt::format::FmtSpan;

use crate::{block_on, example_host, logged};

/// `n` chars of ASCII lines of 100 chars each, tagged with `tag`.
fn text(tag: char, n: usize) -> String {
    let line = format!("{}\n", tag.to_string().repeat(99));
    line.repeat(n / 100 + 1)[..n].to_owned()
}

/// The preview the design asks for, computed independently for ASCII text:
/// the whole lines that fit in 2,000 bytes with their newlines, less the last
/// newline.
fn expected_preview(content: &str) -> &str {
    let mut end = 0;
    for line in content.split_inclusive('\n') {
        if end + line.len() > 2_000 {
            break;
        }
        end += line.len();
    }
    &content[..end - 1]
}

#[test]
fn a_grep_returning_3_mb_is_persisted_with_a_2_kb_preview() {
    let root = tempfile::tempdir().unwrap();
    let workspace = root.path().join("ws");
    let session = root.path().join("session");
    std::fs::create_dir_all(&workspace).unwrap();
    let lines: String = (0..30_000).map(|i| format!("needle {i:06} {}\n", "-".repeat(80))).collect();
    std::fs::write(workspace.join("big.txt"), &lines).unwrap();
    let expected: String =
        lines.lines().enumerate().map(|(n, line)| format!("big.txt:{}:{line}\n", n + 1)).collect();
    assert!(expected.len() > 3_000_000, "{}", expected.len());

    let host = block_on(example_host(&workspace).build()).unwrap();
    let grep = host.pool().get("grep").unwrap();
    let output = block_on(async {
        let call = grep.tool.invoke(json!({ "pattern": "needle" }), crate::at_root()).await.unwrap();
        call.call(CallContext::new(context::initial())).await.unwrap()
    });
    assert_eq!(output.to_text().len(), expected.len(), "grep printed every line");

    let budget = Budget::new(&BudgetConfig::default(), &session);
    let threshold = budget.threshold(grep.tool.spec());
    assert_eq!(threshold, Threshold::Chars(50_000));
    let result = block_on(budget.per_tool(ToolResult::ok("toolu_grep", output.to_text()), threshold));

    let size = expected.len();
    assert_eq!(
        result,
        ToolResult::ok(
            "toolu_grep",
            format!(
                "<persisted-output>\nOutput too large ({size} chars, {size} bytes). Full output saved to: \
                 tool-results/toolu_grep.txt\n\nPreview (first {} bytes):\n{}\n...\n</persisted-output>",
                expected_preview(&expected).len(),
                expected_preview(&expected)
            )
        )
    );
    assert!(expected_preview(&expected).starts_with("big.txt:1:needle 000000 ---"));
    assert_eq!(std::fs::read_to_string(session.join("tool-results/toolu_grep.txt")).unwrap(), expected);
    let names: Vec<_> =
        std::fs::read_dir(session.join("tool-results")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["toolu_grep.txt"], "no temporary file is left");
}

/// Run both tiers over `message` as the scheduler does.
async fn enforce(budget: &Budget, message: Vec<ToolResult>, ledger: &mut Ledger) -> Vec<ToolResult> {
    let thresholds = vec![Threshold::default(); message.len()];
    let mut sent = Vec::new();
    for result in message {
        sent.push(budget.per_tool(result, Threshold::default()).await);
    }
    budget.per_message(&mut sent, &thresholds, ledger).await;
    sent
}

#[test]
fn ten_results_totalling_400k_chars_are_persisted_largest_first_until_200k() {
    let session = tempfile::tempdir().unwrap();
    let budget = Budget::new(&BudgetConfig::default(), session.path());
    let message: Vec<ToolResult> =
        (0..10).map(|i| ToolResult::ok(format!("toolu_{i}"), text(char::from(b'a' + i), 40_000))).collect();
    let mut ledger = Ledger::new();
    let sent = block_on(enforce(&budget, message.clone(), &mut ledger));

    let block = |i: usize| {
        format!(
            "<persisted-output>\nOutput too large (40000 chars, 40000 bytes). Full output saved to: \
             tool-results/toolu_{i}.txt\n\nPreview (first 1999 bytes):\n{}\n...\n</persisted-output>",
            &message[i].content.text()[..1_999]
        )
    };
    // Equal sizes: the earliest go first; six bring 400K under 200K.
    for (i, result) in sent.iter().enumerate() {
        let expected = if i < 6 { block(i) } else { message[i].content.text().into_owned() };
        assert_eq!(result, &ToolResult::ok(format!("toolu_{i}"), expected), "toolu_{i}");
    }
    let total: usize = sent.iter().map(|r| r.content.text().chars().count()).sum();
    assert_eq!(total, 6 * block(0).len() + 4 * 40_000);
    assert!(total <= 200_000);
    for (i, original) in message.iter().enumerate().take(6) {
        let file = session.path().join(format!("tool-results/toolu_{i}.txt"));
        assert_eq!(std::fs::read_to_string(file).unwrap(), original.content.text());
    }
    assert!(!session.path().join("tool-results/toolu_6.txt").exists());
    assert_eq!(ledger.get("toolu_0"), Some(&Decision::Replaced { content: block(0), is_error: false }));
    assert_eq!(ledger.get("toolu_9"), Some(&Decision::Kept));
}

/// A session of three messages: a big grep, a message over the limit, and
/// one that fits only because nothing earlier counts against it.
fn session_messages() -> Vec<Vec<ToolResult>> {
    vec![
        vec![ToolResult::ok("u1", text('g', 120_000)), ToolResult::ok("u2", "short")],
        vec![
            ToolResult::ok("u3", text('a', 45_000)),
            ToolResult::ok("u4", text('b', 45_000)),
            ToolResult::ok("u5", text('c', 45_000)),
            ToolResult::ok("u6", text('d', 45_000)),
            ToolResult::ok("u7", text('e', 45_000)),
            ToolResult::error("u8", "No such tool: fetch"),
        ],
        vec![ToolResult::ok("u9", text('f', 49_000)), ToolResult::ok("u10", text('h', 49_000))],
    ]
}

#[test]
fn a_resumed_transcript_rebuilds_the_ledger_and_byte_identical_messages() {
    let session = tempfile::tempdir().unwrap();
    let budget = Budget::new(&BudgetConfig::default(), session.path());
    let originals = session_messages();
    let mut ledger = Ledger::new();
    let transcript: Vec<Value> = originals
        .iter()
        .map(|message| user_message(&block_on(enforce(&budget, message.clone(), &mut ledger))))
        .collect();
    let sent_bytes = serde_json::to_string(&transcript).unwrap();
    let replaced: Vec<&str> =
        ledger.iter().filter(|(_, d)| matches!(d, Decision::Replaced { .. })).map(|(id, _)| id).collect();
    assert_eq!(replaced, ["u1", "u3"], "u1 by its tool's cap, u3 by its message's");

    // Resume: only the transcript survived, read back from disk.
    let resumed: Vec<Value> = serde_json::from_str(&sent_bytes).unwrap();
    let rebuilt = Ledger::reconstruct(&resumed).unwrap();
    assert_eq!(rebuilt, ledger);

    // Even a stricter budget over an empty session directory, given the
    // rebuilt ledger, sends the same bytes: no decision is revisited and
    // nothing is written again.
    let elsewhere = tempfile::tempdir().unwrap();
    let stricter: BudgetConfig =
        keel_host::config::Config::parse("[budget]\nper_message_chars = 1000\n", "keel.toml".as_ref())
            .unwrap()
            .budget;
    let strict = Budget::new(&stricter, elsewhere.path());
    for (label, budget) in [("same budget", &budget), ("stricter budget", &strict)] {
        let mut ledger = rebuilt.clone();
        // Over the results as sent.
        let again: Vec<Value> = resumed
            .iter()
            .map(|message| {
                let mut results = as_results(message);
                let thresholds = vec![Threshold::default(); results.len()];
                block_on(budget.per_message(&mut results, &thresholds, &mut ledger));
                user_message(&results)
            })
            .collect();
        assert_eq!(serde_json::to_string(&again).unwrap(), sent_bytes, "{label}, as sent");
        // Over the original results, whole.
        let mut ledger = rebuilt.clone();
        let again: Vec<Value> = originals
            .iter()
            .map(|message| {
                let mut results = message.clone();
                let thresholds = vec![Threshold::default(); results.len()];
                block_on(budget.per_message(&mut results, &thresholds, &mut ledger));
                user_message(&results)
            })
            .collect();
        assert_eq!(serde_json::to_string(&again).unwrap(), sent_bytes, "{label}, from the originals");
    }
    assert!(!elsewhere.path().join("tool-results").exists(), "nothing was persisted again");

    // The JSON form carries the same decisions.
    assert_eq!(Ledger::from_json(&ledger.to_json()).unwrap(), ledger);
}

fn as_results(message: &Value) -> Vec<ToolResult> {
    message["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|block| {
            let id = block["tool_use_id"].as_str().unwrap();
            let content = block["content"].as_str().unwrap();
            if block.get("is_error") == Some(&Value::Bool(true)) {
                ToolResult::error(id, content)
            } else {
                ToolResult::ok(id, content)
            }
        })
        .collect()
}

#[test]
fn a_cloned_ledger_goes_its_own_way() {
    let session = tempfile::tempdir().unwrap();
    let budget = Budget::new(&BudgetConfig::default(), session.path());
    let mut parent = Ledger::new();
    block_on(enforce(&budget, session_messages().remove(0), &mut parent));
    let before = parent.clone();

    let mut child = parent.clone();
    let big = vec![ToolResult::ok("c1", text('x', 150_000)), ToolResult::ok("c2", text('y', 100_000))];
    let child_sent = block_on(enforce(&budget, big.clone(), &mut child));
    assert_eq!(parent, before, "the sub-agent's decisions stay in its own ledger");
    assert_eq!(child.len(), parent.len() + 2);

    // The parent, meeting the same ids later under a looser limit, decides
    // for itself.
    let loose: BudgetConfig =
        keel_host::config::Config::parse("[budget]\nper_message_chars = 300000\n", "keel.toml".as_ref())
            .unwrap()
            .budget;
    let mut message = big.clone();
    block_on(Budget::new(&loose, session.path()).per_message(
        &mut message,
        &[Threshold::default(); 2],
        &mut parent,
    ));
    assert_eq!(message, big);
    assert_ne!(message, child_sent);
    assert_eq!(parent.get("c1"), Some(&Decision::Kept));
    assert!(matches!(child.get("c1"), Some(Decision::Replaced { .. })));
}

struct Never;

#[async_trait]
impl Summarizer for Never {
    async fn summarize(&self, _: &[SummaryCall]) -> Result<String, BoxError> {
        std::future::pending().await
    }
}

struct Fails;

#[async_trait]
impl Summarizer for Fails {
    async fn summarize(&self, _: &[SummaryCall]) -> Result<String, BoxError> {
        Err("the model is overloaded".into())
    }
}

struct Panics;

#[async_trait]
impl Summarizer for Panics {
    async fn summarize(&self, _: &[SummaryCall]) -> Result<String, BoxError> {
        panic!("summarizer bug")
    }
}

struct Says(&'static str);

#[async_trait]
impl Summarizer for Says {
    async fn summarize(&self, _: &[SummaryCall]) -> Result<String, BoxError> {
        Ok(self.0.to_owned())
    }
}

fn calls(batch: &[ToolUse], results: &[ToolResult]) -> Vec<SummaryCall> {
    batch.iter().zip(results).map(|(tool_use, result)| SummaryCall::new(tool_use, result)).collect()
}

#[test]
fn the_default_summary_labels_the_batch_with_its_ids() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("a.txt"), "needle\n").unwrap();
    let host = block_on(example_host(root.path()).build()).unwrap();
    let batch = [
        ToolUse::new("t1", "Read", json!({ "file_path": "a.txt" })),
        ToolUse::new("t2", "grep", json!({ "pattern": "needle" })),
        ToolUse::new("t3", "Read", json!({ "file_path": "b.txt" })),
        ToolUse::new("t4", "grep", json!({ "pattern": "haystack" })),
        ToolUse::new("t5", "Read", json!({ "file_path": "a.txt", "offset": 1 })),
    ];
    let summary = block_on(async {
        let outcome = host.run_batch(&batch).await;
        summary::spawn(Arc::new(DefaultSummarizer), calls(&batch, &outcome.results), Duration::from_secs(60))
            .await
            .unwrap()
    });
    assert_eq!(
        summary,
        Some(Summary {
            label: "Read 3 files (1 failed), grep ×2".into(),
            tool_use_ids: vec!["t1".into(), "t2".into(), "t3".into(), "t4".into(), "t5".into()],
        })
    );
}

#[test]
fn a_hanging_summarizer_does_not_delay_the_next_batch() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("a.txt"), "needle\n").unwrap();
    let host = block_on(example_host(root.path()).build()).unwrap();
    let first = [ToolUse::new("t1", "grep", json!({ "pattern": "needle" }))];
    let second = [ToolUse::new("t2", "Read", json!({ "file_path": "a.txt" }))];
    block_on(async {
        let outcome = host.run_batch(&first).await;
        let hanging =
            summary::spawn(Arc::new(Never), calls(&first, &outcome.results), Duration::from_secs(3_600));
        let failing =
            summary::spawn(Arc::new(Fails), calls(&first, &outcome.results), Duration::from_secs(3_600));

        let next = host.run_batch(&second).await;
        assert_eq!(next.results, [ToolResult::ok("t2", "     1\tneedle\n")]);
        assert!(!hanging.is_finished(), "the next batch ran while the summary still hung");
        assert_eq!(failing.await.unwrap(), None);
        hanging.abort();
    });
}

#[test]
fn a_summary_that_fails_panics_times_out_or_is_empty_is_none() {
    let batch = [ToolUse::new("t1", "grep", json!({ "pattern": "x" }))];
    let results = [ToolResult::ok("t1", "a:1:x\n")];
    let run = |summarizer: Arc<dyn Summarizer>, timeout: Duration| {
        let calls = calls(&batch, &results);
        block_on(async { summary::spawn(summarizer, calls, timeout).await }).unwrap()
    };
    let long = Duration::from_secs(3_600);
    assert_eq!(run(Arc::new(Fails), long), None);
    assert_eq!(run(Arc::new(Panics), long), None);
    assert_eq!(run(Arc::new(Never), Duration::from_millis(10)), None);
    assert_eq!(run(Arc::new(Says(" \n\t")), long), None);
    let none = block_on(async { summary::spawn(Arc::new(Says("x")), Vec::new(), long).await });
    assert_eq!(none.unwrap(), None, "no calls");
    assert_eq!(
        run(Arc::new(Says("Searched the whole repository for every x in sight\nand more")), long),
        Some(Summary {
            label: "Searched the whole repository for every x in sigh…".into(),
            tool_use_ids: vec!["t1".into()],
        })
    );
}

#[test]
fn a_host_without_a_ledger_decides_the_same_and_keeps_nothing() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("big.txt"), text('x', 60_000)).unwrap();
    let calls = || {
        let grep = |id: &str| ToolUse::new(id, "grep", json!({ "pattern": "x", "path": "big.txt" }));
        vec![grep("a"), grep("b")]
    };
    let kept = block_on(example_host(workspace.path()).build()).unwrap();
    let forgetful = block_on(example_host(workspace.path()).without_ledger().build()).unwrap();
    let with_ledger = block_on(kept.run_batch(&calls())).results;
    let without = block_on(forgetful.run_batch(&calls())).results;
    assert_eq!(without, with_ledger, "the same decisions");
    assert_eq!(block_on(kept.ledger()).len(), 2, "a ledger keeps one decision per call");
    assert!(block_on(forgetful.ledger()).is_empty(), "none is kept without one");
}

/// A native tool that counts the calls begun of it.
struct Counted {
    spec: ToolSpec,
    begun: Arc<AtomicUsize>,
}

impl Counted {
    /// A native tool named `name` that counts each call it begins in `begun`.
    fn new(name: &str, begun: &Arc<AtomicUsize>) -> Arc<Self> {
        let spec = ToolSpec::native(name, "Counts its calls.", json!({ "type": "object" }));
        Arc::new(Counted { spec, begun: begun.clone() })
    }
}

#[async_trait]
impl Tool for Counted {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, input: Value, context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
        self.begun.fetch_add(1, Ordering::Relaxed);
        crate::Fake(self.spec.clone()).invoke(input, context).await
    }
}

#[test]
fn a_warm_up_calls_keels_own_tool_and_keeps_nor_reports_anything_of_it() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("a.txt"), "x").unwrap();
    let begun = Arc::new(AtomicUsize::new(0));
    let counted = |name: &str| Counted::new(name, &begun);
    // Native tools named as keel's own tool and as the call of no tool.
    let host = example_host(workspace.path()).tool(counted("keel-warm-up")).tool(counted("keel warm-up"));
    let host = block_on(host.build()).unwrap();
    let ((), traced) = logged(host.warm_up(), FmtSpan::NEW);
    assert_eq!(begun.load(Ordering::Relaxed), 0, "no tool of the pool is called, whatever its name");
    assert!(block_on(host.ledger()).is_empty(), "the warm-up's call is kept in no ledger");
    assert!(traced.contains("setup"), "the plugins' warm-ups are traced as ever: {traced}");
    assert!(!traced.contains("keel-warm-up"), "the warm-up's call reaches no subscriber: {traced}");
    assert!(!traced.contains("warm-up:"), "keel's own tool failed to load: {traced}");
    let grep = ToolUse::new("a", "grep", json!({ "pattern": "x", "path": "a.txt" }));
    let results = block_on(host.run_batch(&[grep])).results;
    assert!(!results[0].is_error, "{results:?}");
    assert_eq!(block_on(host.ledger()).len(), 1, "the first call after it is kept as ever");
}

#[test]
fn a_warm_up_without_an_engine_calls_no_tool_and_keeps_nothing_of_it() {
    let workspace = tempfile::tempdir().unwrap();
    let begun = Arc::new(AtomicUsize::new(0));
    let counted = |name: &str| Counted::new(name, &begun);
    // No plugin: the host has no engine to run keel's own tool on.
    let host = keel_host::Host::builder().workspace(workspace.path()).cache_dir(None);
    let host = host.tool(counted("keel warm-up")).tool(counted("keel-warm-up"));
    let host = block_on(host.build()).unwrap();
    block_on(host.warm_up());
    assert_eq!(begun.load(Ordering::Relaxed), 0, "no tool is called, whatever its name");
    assert!(block_on(host.ledger()).is_empty());
    let call = ToolUse::new("a", "keel-warm-up", json!({}));
    block_on(host.run_batch(&[call]));
    assert_eq!(begun.load(Ordering::Relaxed), 1, "a call of the tool of that name calls it");
}

/// A native tool that logs each of its warm-ups in `log`.
struct Warmed {
    spec: ToolSpec,
    log: Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait]
impl Tool for Warmed {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, input: Value, context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
        crate::Fake(self.spec.clone()).invoke(input, context).await
    }

    async fn warm_up(&self) {
        self.log.lock().unwrap().push(self.spec.name.clone());
    }
}

#[test]
fn a_warm_up_warms_every_tool_again_once_all_are_warm() {
    let workspace = tempfile::tempdir().unwrap();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let warmed = |name: &str| {
        let spec = ToolSpec::native(name, "Logs its warm-ups.", json!({ "type": "object" }));
        Arc::new(Warmed { spec, log: log.clone() })
    };
    let host = keel_host::Host::builder().workspace(workspace.path()).cache_dir(None);
    let host = block_on(host.tool(warmed("a")).tool(warmed("b")).build()).unwrap();
    block_on(host.warm_up());
    let log = log.lock().unwrap().clone();
    assert_eq!(log, ["a", "b", "a", "b"], "each tool once, then each again");
}

/// A tool that renames a link to `.keel` cannot make the host write a later
/// result where the link points: the result is an error naming the link.
#[cfg(unix)]
#[test]
fn a_link_renamed_to_keel_by_a_tool_never_carries_a_persisted_result_out_of_the_workspace() {
    let root = tempfile::tempdir().unwrap();
    let (workspace, outside) = (root.path().join("ws"), root.path().join("outside"));
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, workspace.join("link")).unwrap();
    let lines = format!("needle {}\n", "-".repeat(90)).repeat(600);
    std::fs::write(workspace.join("big.txt"), &lines).unwrap();
    let host =
        block_on(crate::host_of(&workspace, &["keel_guest_hostile", "keel_tool_grep"]).build()).unwrap();

    let rename = ToolUse::new(
        "mv",
        "hostile",
        json!({ "act": "rename", "path": "/workspace/link", "to": "/workspace/.keel" }),
    );
    let renamed = block_on(host.run_batch(&[rename])).results;
    assert_eq!(renamed, [ToolResult::ok("mv", "renamed /workspace/link to /workspace/.keel")]);
    assert!(std::fs::symlink_metadata(workspace.join(".keel")).unwrap().file_type().is_symlink());

    let grep = ToolUse::new("big", "grep", json!({ "pattern": "needle" }));
    let result = block_on(host.run_batch(&[grep])).results.remove(0);
    let text = result.content.text();
    assert!(result.is_error, "{text}");
    let head = text.lines().next().unwrap();
    assert_eq!(
        head,
        format!(
            "Failed to save the full output ({0} chars, {0} bytes) to .keel/session/tool-results/big.txt: .keel is \
             a symbolic link, and results are never written through one. Only this preview is left; run the \
             tool again with a narrower input.",
            text_len_of_grep(&lines)
        )
    );
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing was written outside the workspace");
}

/// The length of grep's output over `big.txt` holding `lines`.
fn text_len_of_grep(lines: &str) -> usize {
    lines.lines().enumerate().map(|(n, line)| format!("big.txt:{}:{line}\n", n + 1).len()).sum()
}
