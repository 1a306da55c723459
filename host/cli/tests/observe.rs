//! What `keel run` and `keel serve` say about a run beside their output:
//! the trace (`--trace`), the timeline (`--timeline`), the summary line and
//! the `--stats` table; none of it changes stdout.

mod support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

/// A batch of every kind of call: a concurrent run (two greps and a sleep
/// that reports progress), a write alone, a grep that fails, an input the
/// schema refuses and an unknown tool whose name is markup.
const BATCH: &str = r#"[
    {"type":"tool_use","id":"t1","name":"grep","input":{"pattern":"alpha"}},
    {"type":"tool_use","id":"t2","name":"sleep","input":{"ms":40,"steps":4}},
    {"type":"tool_use","id":"t3","name":"grep","input":{"pattern":"beta"}},
    {"type":"tool_use","id":"t4","name":"write_file","input":{"file_path":"b.txt","content":"x"}},
    {"type":"tool_use","id":"t5","name":"grep","input":{"pattern":"x","path":"no/such/dir"}},
    {"type":"tool_use","id":"t6","name":"write_file","input":{"file_path":"c.txt"}},
    {"type":"tool_use","id":"t7\"><i>","name":"<script>x</script>","input":{}}
]"#;

const IDS: [&str; 7] = ["t1", "t2", "t3", "t4", "t5", "t6", "t7\"><i>"];

/// `keel ARGS` in `cwd` with `stdin` as its input; panics unless it
/// succeeded.
fn keel(args: &[&str], cwd: &Path, stdin: &str) -> Output {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    let output = support::run_with_input(&mut support::keel(cwd, &cache, args), stdin, KEEL_LIMIT);
    assert!(output.status.success(), "keel {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    output
}

/// How long one `keel` command of these tests may take.
const KEEL_LIMIT: Duration = Duration::from_secs(120);

fn workspace() -> tempfile::TempDir {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("a.txt"), "alpha\nbeta\n").unwrap();
    workspace
}

/// The lines of `--events` output, parsed.
fn events(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout).lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

fn of_type<'a>(events: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    events.iter().filter(move |event| event["type"] == kind)
}

#[test]
fn the_trace_has_a_span_per_step_of_every_call_and_the_groups_of_the_plan() {
    let workspace = workspace();
    let trace_path = workspace.path().join("run.trace.json");
    let output =
        keel(&["run", "--events", "--trace", trace_path.to_str().unwrap(), "-"], workspace.path(), BATCH);
    let events = events(&output.stdout);
    let trace: Value = serde_json::from_slice(&std::fs::read(&trace_path).unwrap()).unwrap();
    assert_eq!(trace["displayTimeUnit"], "ms");
    let trace = trace["traceEvents"].as_array().unwrap();
    for event in trace {
        assert!(["X", "i", "M"].contains(&event["ph"].as_str().unwrap()), "{event}");
        assert!(event["ts"].is_u64() || event["ph"] == "M", "{event}");
    }
    let tracks: Vec<&str> = trace
        .iter()
        .filter(|event| event["name"] == "thread_name")
        .map(|event| event["args"]["name"].as_str().unwrap())
        .collect();
    assert!(tracks.contains(&"plan") && tracks.contains(&"slot 1"), "{tracks:?}");

    // Every step of every finished call, exactly as its figures give it.
    let finished: Vec<&Value> = of_type(&events, "call_finished").collect();
    assert_eq!(finished.len(), 5, "t6 and t7 are refused before they are planned");
    for call in finished {
        let id = &call["tool_use_id"];
        let figures = &call["figures"];
        let expected: Vec<(&str, u64)> = figures["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|step| (step["step"].as_str().unwrap(), step["duration_us"].as_u64().unwrap()))
            .collect();
        for kind in ["questions", "setup", "call", "budget"] {
            assert!(expected.iter().any(|(step, _)| *step == kind), "{id} has a {kind} step: {figures}");
        }
        let mut spans: Vec<(u64, &str, u64)> = trace
            .iter()
            .filter(|event| {
                event["ph"] == "X" && event["args"]["tool_use_id"] == *id && event["cat"] != "tool"
            })
            .map(|event| {
                let ts = event["ts"].as_u64().unwrap();
                (ts, event["name"].as_str().unwrap(), event["dur"].as_u64().unwrap())
            })
            .collect();
        spans.sort_by_key(|span| span.0);
        let spans: Vec<(&str, u64)> = spans.into_iter().map(|(_, name, dur)| (name, dur)).collect();
        assert_eq!(spans, expected, "the steps of {id}");
        let enclosing: Vec<&Value> = trace
            .iter()
            .filter(|event| event["cat"] == "tool" && event["args"]["tool_use_id"] == *id)
            .collect();
        let [enclosing] = enclosing.as_slice() else { panic!("one span for {id}: {enclosing:?}") };
        assert_eq!(enclosing["name"], figures["tool"]);
        for figure in ["fuel", "memory_peak", "bytes_in", "bytes_out", "outcome"] {
            assert_eq!(enclosing["args"][figure], figures[figure], "{figure} of {id}");
        }
    }

    // The plan's groups, each a span on the plan's track.
    let plan = of_type(&events, "batch_plan").next().unwrap();
    let groups: Vec<&Value> = trace.iter().filter(|event| event["cat"] == "plan").collect();
    let names: Vec<&str> = groups.iter().map(|group| group["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["concurrent run (3 calls)", "alone: write_file", "concurrent run (1 call)"]);
    let planned: Vec<&Value> = plan["batches"].as_array().unwrap().iter().take(3).collect();
    for (group, planned) in groups.iter().zip(planned) {
        assert_eq!(group["args"]["tool_use_ids"], planned["tool_use_ids"]);
    }

    // On every track a span lies inside the one it starts in, or after it:
    // a viewer draws spans of one track as a stack.
    let mut tracks: std::collections::BTreeMap<u64, Vec<(u64, u64)>> = Default::default();
    for event in trace.iter().filter(|event| event["ph"] == "X") {
        let (ts, dur) = (event["ts"].as_u64().unwrap(), event["dur"].as_u64().unwrap());
        tracks.entry(event["tid"].as_u64().unwrap()).or_default().push((ts, ts + dur));
    }
    for (tid, mut spans) in tracks {
        spans.sort_by_key(|&(start, end)| (start, std::cmp::Reverse(end)));
        let mut open: Vec<(u64, u64)> = Vec::new();
        for (start, end) in spans {
            while open.last().is_some_and(|&(_, until)| until <= start) {
                open.pop();
            }
            if let Some(&outer) = open.last() {
                assert!(
                    end <= outer.1,
                    "track {tid}: {:?} starts inside {outer:?} and ends after it",
                    (start, end)
                );
            }
            open.push((start, end));
        }
    }

    // sleep's progress, each report an instant.
    let reported = of_type(&events, "progress").filter(|event| event["tool_use_id"] == "t2").count();
    let instants =
        trace.iter().filter(|event| event["ph"] == "i" && event["args"]["tool_use_id"] == "t2").count();
    assert_eq!((reported, instants), (4, 4));
}

#[test]
fn trace_timeline_and_stats_leave_stdout_as_it_was() {
    let workspace = workspace();
    let plain = keel(&["run", "-"], workspace.path(), BATCH);
    let (trace, timeline) = (workspace.path().join("t.json"), workspace.path().join("t.html"));
    let observed = keel(
        &[
            "run",
            "--stats",
            "--trace",
            trace.to_str().unwrap(),
            "--timeline",
            timeline.to_str().unwrap(),
            "-",
        ],
        workspace.path(),
        BATCH,
    );
    assert_eq!(String::from_utf8_lossy(&observed.stdout), String::from_utf8_lossy(&plain.stdout));
    assert!(trace.is_file() && timeline.is_file());
    let names: Vec<_> =
        std::fs::read_dir(workspace.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert!(!names.iter().any(|name| name.to_string_lossy().starts_with('.')), "left behind: {names:?}");

    // Without --stats: one line, the summary.
    let stderr = String::from_utf8(plain.stderr).unwrap();
    let [summary] = stderr.lines().collect::<Vec<_>>()[..] else { panic!("one line: {stderr}") };
    assert!(summary.starts_with("7 calls, 3 errors, "), "{summary}");
    assert!(summary.contains("; slowest: sleep (t2) "), "{summary}");

    // With it: a table naming every call, then the summary.
    let stderr = String::from_utf8(observed.stderr).unwrap();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1 + IDS.len() + 1, "{stderr}");
    assert!(lines[0].starts_with("tool ") && lines[0].contains("questions") && lines[0].ends_with("out"));
    for (line, id) in lines[1..].iter().zip(IDS) {
        assert!(line.contains(id), "{line} names {id}");
    }
    assert!(lines[2].starts_with("sleep ") && lines[2].contains(" ok "), "{}", lines[2]);
    assert!(lines[5].contains(" error "), "{}", lines[5]);
    assert!(lines.last().unwrap().starts_with("7 calls, 3 errors, "));
}

#[test]
fn control_characters_a_model_wrote_reach_stderr_escaped_and_json_unchanged() {
    let workspace = workspace();
    // The one call that runs is the slowest, so the summary names it too.
    let batch = json!([
        { "type": "tool_use", "id": "t\u{1b}[31m\u{7}", "name": "grep", "input": { "pattern": "alpha" } },
        { "type": "tool_use", "id": "t2\nfake", "name": "no\u{0}pe\u{1b}]0;title\u{7}", "input": {} },
    ])
    .to_string();
    let output = keel(&["run", "--stats", "-"], workspace.path(), &batch);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(!stderr.chars().any(|c| c.is_control() && c != '\n'), "{stderr:?}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 4, "{stderr}");
    let cells = |line: &str| line.split_whitespace().take(3).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(cells(lines[1]), [r"grep", r"t\u{1b}[31m\u{7}", "ok"], "{}", lines[1]);
    assert_eq!(cells(lines[2])[..2], [r"no\0pe\u{1b}]0;title\u{7}", r"t2\nfake"], "{}", lines[2]);
    assert!(lines[3].contains(r"; slowest: grep (t\u{1b}[31m\u{7}) "), "{}", lines[3]);
    // The results keep the ids as the model wrote them.
    let message: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(message["content"][0]["tool_use_id"], "t\u{1b}[31m\u{7}");
    assert_eq!(message["content"][1]["tool_use_id"], "t2\nfake");
}

#[test]
fn the_timeline_names_every_call_escapes_what_tools_control_and_loads_nothing() {
    let workspace = workspace();
    let path = workspace.path().join("timeline.html");
    keel(&["run", "--timeline", path.to_str().unwrap(), "-"], workspace.path(), BATCH);
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    for id in IDS {
        let shown = id.replace('"', "&quot;").replace('<', "&lt;").replace('>', "&gt;");
        assert!(html.contains(&format!(r#"<tspan class="id">{shown}</tspan>"#)), "the timeline names {id}");
    }
    assert!(html.contains("&lt;script&gt;x&lt;/script&gt;"));
    let lower = html.to_lowercase();
    for markup in ["<script", "<i>", "<link", "@import", "<iframe", "src=", "href=", "url(http", "url(//"] {
        assert!(!lower.contains(markup), "the timeline holds {markup}");
    }
    // The one URL it holds is the SVG namespace, which names and loads nothing.
    let urls: Vec<&str> = lower.match_indices("http").map(|(at, _)| &lower[at..at + 26]).collect();
    assert!(urls.iter().all(|url| url.starts_with("http://www.w3.org/2000/svg")), "{urls:?}");
    for step in ["questions", "setup", "permission", "call", "budget", "waiting", "progress"] {
        assert!(html.contains(step), "the legend names {step}");
    }
}

#[test]
fn a_trace_that_cannot_be_written_stops_the_run_before_it_starts_naming_the_path() {
    let workspace = workspace();
    std::fs::write(workspace.path().join("batch.json"), BATCH).unwrap();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    let mut command =
        support::keel(workspace.path(), &cache, &["run", "--trace", "no/such/dir/t.json", "batch.json"]);
    let output = support::run(&mut command, KEEL_LIMIT);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr,
        "error: failed to write trace no/such/dir/t.json: No such file or directory (os error 2)\n"
    );
    let left: Vec<_> =
        std::fs::read_dir(workspace.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert!(!left.iter().any(|name| name.to_string_lossy().starts_with(".keel-")), "{left:?}");

    // A path that is a directory is refused before the batch runs too, not
    // after its calls have written what they write.
    std::fs::create_dir(workspace.path().join("reports")).unwrap();
    let mut command =
        support::keel(workspace.path(), &cache, &["run", "--timeline", "reports", "batch.json"]);
    let output = support::run(&mut command, KEEL_LIMIT);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty(), "{}", String::from_utf8_lossy(&output.stdout));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: failed to write timeline reports: Is a directory (os error 21)\n"
    );
}

#[test]
fn a_report_that_would_replace_what_is_read_or_cannot_be_written_is_refused_before_anything_runs() {
    let workspace = workspace();
    std::fs::write(workspace.path().join("batch.json"), BATCH).unwrap();
    std::fs::write(workspace.path().join("keel.toml"), "max_tool_use_concurrency = 4\n").unwrap();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    let echo = support::bundled("echo");
    let refused = [
        (vec!["--trace", "batch.json"], "--trace batch.json is the batch"),
        (vec!["--timeline", "./sub/../batch.json"], "--timeline ./sub/../batch.json is the batch"),
        (vec!["--trace", "keel.toml"], "--trace keel.toml is the configuration"),
        (vec!["--plugins", echo.to_str().unwrap(), "--timeline", echo.to_str().unwrap()], "is a plugin"),
        (vec!["--trace", "r.json", "--timeline", "./r.json"], "--trace and --timeline name the same file"),
    ];
    std::fs::create_dir(workspace.path().join("sub")).unwrap();
    for (flags, said) in refused {
        let args = [&["run"][..], &flags, &["batch.json"]].concat();
        let output = support::run(&mut support::keel(workspace.path(), &cache, &args), KEEL_LIMIT);
        assert_eq!(output.status.code(), Some(1), "{flags:?}");
        assert!(output.stdout.is_empty(), "{flags:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.starts_with("error: ") && stderr.contains(said), "{flags:?}: {stderr}");
    }
    // Nothing was run, and nothing replaced.
    assert_eq!(std::fs::read_to_string(workspace.path().join("batch.json")).unwrap(), BATCH);
    assert!(!workspace.path().join("r.json").exists() && !workspace.path().join("b.txt").exists());
    assert!(std::fs::read(&echo).unwrap().starts_with(b"\0asm"));

    // `keel serve`'s reports alike, before anything loads, and a report in
    // a directory that does not exist, which is not made.
    for (flags, said) in [
        (["--events", "e.log", "--trace", "./e.log"], "--events and --trace name the same file, ./e.log"),
        (["--events", "e.log", "--trace", "keel.toml"], "--trace keel.toml is the configuration"),
        (["--events", "e.log", "--trace", "no/t.json"], "failed to write trace no/t.json: No such file"),
        (["--events", "no/e.log", "--trace", "t.json"], "failed to write events file no/e.log: No such file"),
    ] {
        let args = [&["serve"][..], &flags].concat();
        let output = support::run(&mut support::keel(workspace.path(), &cache, &args), KEEL_LIMIT);
        assert_eq!(output.status.code(), Some(1), "{flags:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.starts_with("error: ") && stderr.contains(said), "{flags:?}: {stderr}");
    }
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("keel.toml")).unwrap(),
        "max_tool_use_concurrency = 4\n"
    );
}

#[test]
fn a_report_through_a_link_is_written_at_its_target_and_a_pipe_is_written_through() {
    use std::os::unix::fs::{FileTypeExt as _, symlink};

    let workspace = workspace();
    let reports = workspace.path().join("reports");
    std::fs::create_dir(&reports).unwrap();
    std::fs::write(reports.join("old.html"), "old").unwrap();
    symlink("reports/old.html", workspace.path().join("timeline.html")).unwrap();
    // A link to nothing yet: the report is made where it points.
    symlink("reports/new.json", workspace.path().join("trace.json")).unwrap();
    let fifo = workspace.path().join("pipe.json");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // Its reader, already waiting when keel opens the pipe; killed, not
    // waited for, if the pipe is replaced and nothing ever opens it, or the
    // test fails before.
    struct Reader(std::process::Child);
    impl Drop for Reader {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut reader = Reader(
        std::process::Command::new("cat")
            .arg(&fifo)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let read = reader.0.stdout.take().unwrap();
    let read = std::thread::spawn(move || std::io::read_to_string(read).unwrap());

    let args = ["run", "--timeline", "timeline.html", "--trace", "trace.json", "-"];
    keel(&args, workspace.path(), BATCH);
    let args = ["run", "--events", "--trace", "pipe.json", "-"];
    keel(&args, workspace.path(), BATCH);

    for link in ["timeline.html", "trace.json"] {
        let metadata = std::fs::symlink_metadata(workspace.path().join(link)).unwrap();
        assert!(metadata.file_type().is_symlink(), "{link} is still a link");
    }
    let html = std::fs::read_to_string(reports.join("old.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    let trace: Value = serde_json::from_slice(&std::fs::read(reports.join("new.json")).unwrap()).unwrap();
    assert!(trace["traceEvents"].is_array());
    let left: Vec<_> = std::fs::read_dir(&reports).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "{left:?}");

    support::exit_within(&mut reader.0, Duration::from_secs(30));
    let piped: Value = serde_json::from_str(&read.join().unwrap()).unwrap();
    assert!(piped["traceEvents"].is_array());
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the pipe is still a pipe");
}

#[test]
fn a_report_naming_a_plugin_of_a_plugin_folder_or_the_lock_file_is_refused() {
    let workspace = workspace();
    std::fs::write(workspace.path().join("batch.json"), BATCH).unwrap();
    let plugins = workspace.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let echo = std::fs::read(support::bundled("echo")).unwrap();
    std::fs::write(plugins.join("keel_tool_echo.wasm"), &echo).unwrap();
    let lock = "# what a lock pins\n";
    std::fs::write(workspace.path().join("keel.lock"), lock).unwrap();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    let refused = [
        (
            &["run", "--plugins", "plugins", "--timeline", "plugins/keel_tool_echo.wasm", "batch.json"][..],
            "error: --timeline plugins/keel_tool_echo.wasm is a plugin; give the report a file of its own\n",
        ),
        (
            &["run", "--plugins", "plugins", "--trace", "./keel.lock", "batch.json"],
            "error: --trace ./keel.lock is the lock file; give the report a file of its own\n",
        ),
        (
            &["serve", "--plugins", "plugins", "--trace", "keel.lock"],
            "error: --trace keel.lock is the lock file; give the report a file of its own\n",
        ),
    ];
    for (args, said) in refused {
        let output = support::run(&mut support::keel(workspace.path(), &cache, args), KEEL_LIMIT);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&output.stderr), said, "{args:?}");
    }
    assert_eq!(std::fs::read(plugins.join("keel_tool_echo.wasm")).unwrap(), echo);
    assert_eq!(std::fs::read_to_string(workspace.path().join("keel.lock")).unwrap(), lock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_serve_keeps_each_call_in_its_trace_once_it_finished() {
    let workspace = workspace();
    let trace_path = workspace.path().join("serve.trace.json");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["serve", "--trace", trace_path.to_str().unwrap()])
        .current_dir(workspace.path())
        .env("KEEL_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache"))
        .env_remove("KEEL_LOG");
    let transport = rmcp::transport::TokioChildProcess::new(command).unwrap();
    let client = ().serve(transport).await.unwrap();
    for (tool, arguments) in
        [("grep", json!({ "pattern": "alpha" })), ("sleep", json!({ "ms": 10, "steps": 2 }))]
    {
        let Value::Object(arguments) = arguments else { unreachable!() };
        client.call_tool(CallToolRequestParams::new(tool).with_arguments(arguments)).await.unwrap();
    }
    // The file is written after each call, off the call's path.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let spans = loop {
        let trace: Value = serde_json::from_slice(&std::fs::read(&trace_path).unwrap()).unwrap();
        let spans: Vec<(String, String)> = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|event| event["cat"] == "tool")
            .map(|event| {
                (
                    event["name"].as_str().unwrap().into(),
                    event["args"]["tool_use_id"].as_str().unwrap().into(),
                )
            })
            .collect();
        if spans.len() == 2 || std::time::Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(
        spans,
        [("grep".to_string(), "mcp-0".to_string()), ("sleep".to_string(), "mcp-1".to_string())]
    );
    client.cancel().await.unwrap();
}
