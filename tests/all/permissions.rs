//! Validation, then permission, for every call: each step in order with its
//! exact error text, the host's rules from `keel.toml` on top of the tool's
//! own check, and the prompter an embedding agent supplies.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use keel_host::config::Config;
use keel_host::permissions::{Approval, ApprovalRequest, KeelFile, Prompter};
use keel_host::{Event, Host, HostBuilder, ToolResult, ToolSpec, ToolUse};
use serde_json::{Value, json};

use crate::{Fake, block_on, events_of, guest, logs_of, shared_cache};

/// A host over a fresh workspace with `probe` and `write_file`, configured
/// by `keel_toml`.
fn host_with(keel_toml: &str) -> (tempfile::TempDir, HostBuilder) {
    let workspace = tempfile::tempdir().unwrap();
    let config = Config::parse(keel_toml, "keel.toml".as_ref()).unwrap();
    let builder = Host::builder()
        .workspace(workspace.path())
        .plugins(guest("keel_guest_probe"))
        .plugins(guest("keel_tool_write_file"))
        .cache_dir(Some(shared_cache()))
        .config(config);
    (workspace, builder)
}

fn results(builder: HostBuilder, uses: &[ToolUse]) -> Vec<ToolResult> {
    let host = block_on(builder.build()).unwrap();
    block_on(host.run_batch(uses)).results
}

fn probe(id: &str, input: Value) -> ToolUse {
    ToolUse::new(id, "probe", input)
}

#[test]
fn every_step_fails_with_its_own_message_in_order() {
    let (_workspace, builder) = host_with("");
    let batch = [
        ToolUse::new("name", "porbe", json!({})),
        probe("schema", json!({ "count": 300 })),
        probe("unknown_field", json!({ "cuont": 3 })),
        probe("validate", json!({ "invalid": "`count` must be even", "permission": "deny" })),
        probe("deny", json!({ "permission": "deny" })),
        probe("ask", json!({ "permission": "ask" })),
        probe("ok", json!({ "count": 2 })),
    ];
    assert_eq!(
        results(builder, &batch),
        [
            ToolResult::error("name", "No such tool: porbe. Did you mean probe?"),
            ToolResult::error(
                "schema",
                "Invalid input for probe: /count: 300 is greater than the maximum of 255 (rule: maximum)"
            ),
            ToolResult::error(
                "unknown_field",
                "Invalid input for probe: (root): Additional properties are not allowed ('cuont' was unexpected) \
                 (rule: additionalProperties)"
            ),
            ToolResult::error("validate", "Invalid input for probe: `count` must be even"),
            ToolResult::error("deny", "Permission to use probe denied: the probe says no"),
            ToolResult::error(
                "ask",
                "probe requires approval, and no one can be asked in this run: the probe wants a yes"
            ),
            // No rule has a pattern, so the host never asked for a subject.
            ToolResult::ok("ok", "count 2; checks: validate-input, check-permissions"),
        ]
    );
}

#[test]
fn check_permissions_is_not_called_when_validation_fails() {
    let (_workspace, builder) = host_with("");
    let host = block_on(builder.build()).unwrap();
    // One thread, so the guest's log lines reach this thread's subscriber.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let run = |input: Value| logs_of(|| runtime.block_on(host.run_batch(&[probe("p", input)])).results);

    let (refused, logs) = run(json!({ "invalid": "no" }));
    assert_eq!(refused, [ToolResult::error("p", "Invalid input for probe: no")]);
    assert_eq!(logs.matches("probe: validate-input").count(), 1, "{logs}");
    assert_eq!(logs.matches("probe: check-permissions").count(), 0, "{logs}");

    // The same capture sees the permission check when validation passes.
    let (allowed, logs) = run(json!({}));
    assert_eq!(allowed, [ToolResult::ok("p", "count none; checks: validate-input, check-permissions")]);
    assert_eq!(logs.matches("probe: validate-input").count(), 1, "{logs}");
    assert_eq!(logs.matches("probe: check-permissions").count(), 1, "{logs}");
}

#[test]
fn the_checks_are_reported_as_progress_in_the_order_they_ran() {
    let (_workspace, builder) = host_with("[permissions]\nallow = [\"probe(docs/*)\"]\n");
    let host = block_on(builder.build()).unwrap();
    let (events, _, _) = events_of(&host, vec![probe("p", json!({ "subject": "docs/a" }))]);
    let progress: Vec<&Value> = events
        .iter()
        .filter_map(|event| match event {
            Event::Progress { data, .. } => Some(data),
            _ => None,
        })
        .collect();
    assert_eq!(
        progress,
        [&json!({ "checks": ["validate-input", "check-permissions", "permission-subject"] })]
    );
}

#[test]
fn an_input_updated_by_the_tool_is_checked_against_the_schema_again() {
    let (_workspace, builder) = host_with("");
    let batch = [
        probe("valid", json!({ "count": 1, "replace_with": { "count": 9 } })),
        probe("too_big", json!({ "count": 1, "replace_with": { "count": 999 } })),
        probe("not_an_object", json!({ "replace_with": [1] })),
    ];
    assert_eq!(
        results(builder, &batch),
        [
            ToolResult::ok("valid", "count 9; checks: validate-input, check-permissions"),
            ToolResult::error(
                "too_big",
                "Invalid input for probe: /count: 999 is greater than the maximum of 255 (rule: maximum)"
            ),
            ToolResult::error(
                "not_an_object",
                r#"Invalid input for probe: (root): [1] is not of type "object" (rule: type)"#
            ),
        ]
    );
}

#[test]
fn the_rules_judge_the_subject_of_the_updated_input() {
    let (_workspace, builder) = host_with("[permissions]\ndeny = [\"probe(secret/*)\"]\n");
    let batch = [
        probe("swapped", json!({ "subject": "docs/a", "replace_with": { "subject": "secret/key" } })),
        probe("plain", json!({ "subject": "docs/a" })),
    ];
    assert_eq!(
        results(builder, &batch),
        [
            ToolResult::error(
                "swapped",
                "Permission to use probe denied: the rule `probe(secret/*)` forbids it"
            ),
            ToolResult::ok(
                "plain",
                "count none; checks: validate-input, check-permissions, permission-subject"
            ),
        ]
    );
}

#[test]
fn pattern_rules_on_write_file_paths() {
    let (workspace, builder) = host_with(
        r#"[permissions]
        allow = ["write_file(docs/**)"]
        deny = ["write_file(**/*.lock)"]
        default = "ask"
        "#,
    );
    let write =
        |id: &str, path: &str| ToolUse::new(id, "write_file", json!({ "file_path": path, "content": "x" }));
    let batch = [
        write("docs", "docs/guide/intro.md"),
        write("docs_lock", "docs/Cargo.lock"),
        write("root_lock", "Cargo.lock"),
        write("src", "src/main.rs"),
    ];
    assert_eq!(
        results(builder, &batch),
        [
            ToolResult::ok("docs", "Wrote 1 byte to docs/guide/intro.md"),
            ToolResult::error(
                "docs_lock",
                "Permission to use write_file denied: the rule `write_file(**/*.lock)` forbids it"
            ),
            ToolResult::error(
                "root_lock",
                "Permission to use write_file denied: the rule `write_file(**/*.lock)` forbids it"
            ),
            ToolResult::error(
                "src",
                "write_file requires approval, and no one can be asked in this run: no permission rule allows it"
            ),
        ]
    );
    let written: Vec<_> = walk(workspace.path());
    assert_eq!(written, ["docs/guide/intro.md"]);
}

/// The files under `dir`, relative, sorted.
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    files.sort();
    files
}

#[test]
fn the_stricter_of_the_tool_and_the_rules_wins() {
    let (_workspace, builder) = host_with(
        r#"[permissions]
        allow = ["probe"]
        ask = ["probe(review/*)"]
        deny = ["probe(secret/**)"]
        "#,
    );
    let batch = [
        probe("tool_asks", json!({ "permission": "ask", "subject": "notes/a" })),
        probe("rule_asks", json!({ "subject": "review/a" })),
        probe("both_ask", json!({ "permission": "ask", "subject": "review/a" })),
        probe("tool_asks_rule_denies", json!({ "permission": "ask", "subject": "secret/a" })),
        probe("no_subject", json!({})),
        probe("allowed", json!({ "subject": "notes/a" })),
    ];
    let ask = "probe requires approval, and no one can be asked in this run: ";
    assert_eq!(
        results(builder, &batch),
        [
            ToolResult::error("tool_asks", format!("{ask}the probe wants a yes")),
            ToolResult::error("rule_asks", format!("{ask}the rule `probe(review/*)` asks for approval")),
            ToolResult::error(
                "both_ask",
                format!("{ask}the probe wants a yes; the rule `probe(review/*)` asks for approval")
            ),
            ToolResult::error(
                "tool_asks_rule_denies",
                "Permission to use probe denied: the rule `probe(secret/**)` forbids it"
            ),
            ToolResult::error(
                "no_subject",
                "Permission to use probe denied: the rule `probe(secret/**)` forbids it, and the tool does not say \
                 what this call touches"
            ),
            ToolResult::ok(
                "allowed",
                "count none; checks: validate-input, check-permissions, permission-subject"
            ),
        ]
    );
}

#[test]
fn the_default_deny_refuses_what_no_rule_allows() {
    let (_workspace, builder) = host_with("[permissions]\ndefault = \"deny\"\nallow = [\"probe\"]\n");
    let batch =
        [probe("p", json!({})), ToolUse::new("w", "write_file", json!({ "file_path": "a", "content": "" }))];
    assert_eq!(
        results(builder, &batch),
        [
            ToolResult::ok("p", "count none; checks: validate-input, check-permissions"),
            ToolResult::error("w", "Permission to use write_file denied: no permission rule allows it"),
        ]
    );
}

/// Approves calls whose subject starts with `ok/`, refuses others with
/// advice, and remembers what it was asked.
#[derive(Default)]
struct Reviewer(Mutex<Vec<ApprovalRequest>>);

#[async_trait]
impl Prompter for Reviewer {
    async fn ask(&self, request: &ApprovalRequest) -> Approval {
        self.0.lock().unwrap().push(request.clone());
        match request.subject.as_deref() {
            Some(subject) if subject.starts_with("ok/") => Approval::Allow,
            _ => Approval::Deny(Some("write under ok/ instead".into())),
        }
    }
}

#[test]
fn an_ask_goes_to_the_prompter_and_its_answer_decides() {
    let (workspace, builder) = host_with("[permissions]\nask = [\"write_file\"]\n");
    let reviewer = Arc::new(Reviewer::default());
    let batch = [
        ToolUse::new("yes", "write_file", json!({ "file_path": "ok/a.txt", "content": "a" })),
        ToolUse::new("no", "write_file", json!({ "file_path": "b.txt", "content": "b" })),
        probe("untouched", json!({})),
    ];
    assert_eq!(
        results(builder.prompter(reviewer.clone()), &batch),
        [
            ToolResult::ok("yes", "Wrote 1 byte to ok/a.txt"),
            ToolResult::error(
                "no",
                "Permission to use write_file denied by the user: write under ok/ instead"
            ),
            ToolResult::ok("untouched", "count none; checks: validate-input, check-permissions"),
        ]
    );
    assert_eq!(walk(workspace.path()), ["ok/a.txt"]);
    let asked = reviewer.0.lock().unwrap().clone();
    assert_eq!(
        asked,
        [
            ApprovalRequest {
                tool_use_id: "yes".into(),
                tool: "write_file".into(),
                input: json!({ "file_path": "ok/a.txt", "content": "a" }),
                subject: Some("ok/a.txt".into()),
                reasons: vec!["the rule `write_file` asks for approval".into()],
            },
            ApprovalRequest {
                tool_use_id: "no".into(),
                tool: "write_file".into(),
                input: json!({ "file_path": "b.txt", "content": "b" }),
                subject: Some("b.txt".into()),
                reasons: vec!["the rule `write_file` asks for approval".into()],
            },
        ]
    );
}

/// Never answers.
struct Silent;

#[async_trait]
impl Prompter for Silent {
    async fn ask(&self, _request: &ApprovalRequest) -> Approval {
        std::future::pending().await
    }
}

#[test]
fn a_call_interrupted_while_waiting_for_approval_never_starts() {
    let (workspace, builder) = host_with("[permissions]\ndefault = \"ask\"\n");
    let host = block_on(builder.prompter(Arc::new(Silent)).build()).unwrap();
    let outcome = block_on(async {
        let write = ToolUse::new("w", "write_file", json!({ "file_path": "a.txt", "content": "a" }));
        let mut run = host.start_batch(vec![write], keel_host::context::initial());
        while let Some(event) = run.next_event().await {
            if matches!(event, Event::CallStarted { .. }) {
                run.interrupter().interrupt();
            }
        }
        run.finish().await
    });
    assert_eq!(outcome.results, [ToolResult::error("w", "Interrupted: the call was not started.")]);
    assert_eq!(walk(workspace.path()), [] as [String; 0]);
}

/// A native tool that needs a person at hand.
fn ask_user() -> Arc<Fake> {
    let spec =
        ToolSpec::native("ask_user", "Test tool: asks the user a question.", json!({ "type": "object" }));
    Arc::new(Fake(ToolSpec { requires_user_interaction: true, ..spec }))
}

#[test]
fn a_tool_that_needs_a_person_is_refused_when_no_one_can_be_asked() {
    let (_workspace, builder) = host_with("");
    let call = [ToolUse::new("q", "ask_user", json!({}))];
    assert_eq!(
        results(builder.tool(ask_user()), &call),
        [ToolResult::error("q", "ask_user needs a person to interact with, and this run has no one to ask")]
    );
    let (_workspace, builder) = host_with("");
    let interactive = builder.tool(ask_user()).prompter(Arc::new(Reviewer::default()));
    assert_eq!(results(interactive, &call), [ToolResult::ok("q", "ran ask_user")]);
}

/// Can ask about the calls whose id starts with `person-` only, and allows
/// every call it is asked about.
struct SomeClients;

#[async_trait]
impl Prompter for SomeClients {
    async fn ask(&self, _request: &ApprovalRequest) -> Approval {
        Approval::Allow
    }

    fn can_ask(&self, tool_use_id: &str) -> bool {
        tool_use_id.starts_with("person-")
    }
}

#[test]
fn a_prompter_that_can_ask_about_some_calls_only_is_a_person_for_those() {
    let (_workspace, builder) = host_with("[permissions]\nask = [\"ask_user\"]\n");
    let calls =
        [ToolUse::new("person-1", "ask_user", json!({})), ToolUse::new("robot-1", "ask_user", json!({}))];
    assert_eq!(
        results(builder.tool(ask_user()).prompter(Arc::new(SomeClients)), &calls),
        [
            ToolResult::ok("person-1", "ran ask_user"),
            ToolResult::error(
                "robot-1",
                "ask_user needs a person to interact with, and this run has no one to ask"
            ),
        ]
    );
}

#[test]
fn pattern_rules_hold_for_the_file_a_link_of_the_workspace_leads_to() {
    let (workspace, builder) = host_with(
        r#"[permissions]
        allow = ["write_file(docs/**)", "write_file(rv/**)"]
        ask = ["write_file(review/**)"]
        deny = ["write_file(secrets/**)"]
        default = "deny"
        "#,
    );
    let root = workspace.path();
    for dir in ["secrets", "docs", "src", "review"] {
        std::fs::create_dir(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("secrets/k.txt"), "inside secret").unwrap();
    let link = |target: &str, at: &str| std::os::unix::fs::symlink(target, root.join(at)).unwrap();
    link("secrets", "pub");
    link("../secrets", "docs/s");
    link("../src", "docs/code");
    link("review", "rv");
    let write =
        |id: &str, path: &str| ToolUse::new(id, "write_file", json!({ "file_path": path, "content": "x" }));
    let batch = [
        write("direct", "secrets/k.txt"),
        write("linked", "pub/k.txt"),
        write("allowed_by_name_only", "docs/s/k.txt"),
        write("allowed_by_name_led_nowhere_allowed", "docs/code/new.rs"),
        write("asked_through_a_link", "rv/a.md"),
        write("allowed", "docs/a.md"),
    ];
    let denied = "Permission to use write_file denied: ";
    assert_eq!(
        results(builder, &batch),
        [
            ToolResult::error("direct", format!("{denied}the rule `write_file(secrets/**)` forbids it")),
            ToolResult::error(
                "linked",
                format!(
                    "{denied}the rule `write_file(secrets/**)` forbids it (pub/k.txt leads to secrets/k.txt)"
                )
            ),
            ToolResult::error(
                "allowed_by_name_only",
                format!(
                    "{denied}the rule `write_file(secrets/**)` forbids it (docs/s/k.txt leads to secrets/k.txt)"
                )
            ),
            ToolResult::error(
                "allowed_by_name_led_nowhere_allowed",
                format!("{denied}no permission rule allows it (docs/code/new.rs leads to src/new.rs)")
            ),
            ToolResult::error(
                "asked_through_a_link",
                "write_file requires approval, and no one can be asked in this run: the rule \
                 `write_file(review/**)` asks for approval (rv/a.md leads to review/a.md)"
            ),
            ToolResult::ok("allowed", "Wrote 1 byte to docs/a.md"),
        ]
    );
    assert_eq!(std::fs::read_to_string(root.join("secrets/k.txt")).unwrap(), "inside secret");
    assert!(!root.join("src/new.rs").exists() && !root.join("review/a.md").exists());
}

#[test]
fn no_call_may_name_keels_own_files_in_the_workspace_whatever_the_rules_say() {
    let workspace = tempfile::tempdir().unwrap();
    let root = workspace.path();
    let config_text = "[permissions]\nallow = [\"write_file\", \"Read\"]\n";
    std::fs::write(root.join("keel.toml"), config_text).unwrap();
    std::fs::create_dir(root.join("plugins")).unwrap();
    std::fs::copy(guest("keel_tool_write_file"), root.join("plugins/write_file.wasm")).unwrap();
    std::os::unix::fs::symlink(".", root.join("cfg")).unwrap();
    let builder = Host::builder()
        .workspace(root)
        .plugins(root.join("plugins"))
        .cache_dir(Some(shared_cache()))
        .config(Config::parse(config_text, "keel.toml".as_ref()).unwrap())
        .keel_file(KeelFile::Config, root.join("keel.toml"))
        .keel_file(KeelFile::Lock, root.join("keel.lock"));
    let host = block_on(builder.build()).unwrap();
    assert_eq!(
        host.warnings(),
        [
            "keel.toml, keel's configuration, is where the plugin write_file may write: keel refuses every call \
             that names it, but a plugin that writes it all the same changes what keel does at its next start; \
             keep it where no plugin may write"
        ],
        "the lock file is not there: no warning for it"
    );
    let write =
        |id: &str, path: &str| ToolUse::new(id, "write_file", json!({ "file_path": path, "content": "x" }));
    let batch = [
        write("config", "keel.toml"),
        write("lock", "keel.lock"),
        write("linked", "cfg/keel.toml"),
        write("plugin", "plugins/evil.wasm"),
        write("other", "notes.txt"),
        ToolUse::new("read", "Read", json!({ "file_path": "keel.toml" })),
    ];
    let denied = "Permission to use write_file denied: ";
    let rest = "; no call may change keel's own files, whatever the rules say";
    assert_eq!(
        block_on(host.run_batch(&batch)).results,
        [
            ToolResult::error(
                "config",
                format!(
                    "{denied}keel.toml is keel's configuration, which grants what every tool may do{rest}"
                )
            ),
            ToolResult::error(
                "lock",
                format!("{denied}keel.lock is keel's lock file, which pins the plugins keel runs{rest}")
            ),
            ToolResult::error(
                "linked",
                format!(
                    "{denied}cfg/keel.toml leads to keel.toml, keel's configuration, which grants what every tool \
                     may do{rest}"
                )
            ),
            ToolResult::error(
                "plugin",
                format!(
                    "{denied}plugins/evil.wasm is inside plugins, a folder keel loads its plugins from{rest}"
                )
            ),
            ToolResult::ok("other", "Wrote 1 byte to notes.txt"),
            ToolResult::ok("read", "     1\t[permissions]\n     2\tallow = [\"write_file\", \"Read\"]\n"),
        ]
    );
    assert_eq!(std::fs::read_to_string(root.join("keel.toml")).unwrap(), config_text);
    assert!(!root.join("keel.lock").exists());
    assert!(!root.join("plugins/evil.wasm").exists());
}
