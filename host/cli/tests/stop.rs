//! `keel serve` stopped by `SIGTERM` or `SIGINT`: it exits cleanly, and
//! nothing it keeps for later is lost: its trace file holds the calls it
//! served, and the spans still waiting for the OTLP exporter (which sends
//! them in batches, every few seconds) reach the collector before it exits.

use std::io::{BufRead as _, BufReader, Lines, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::http::stateless_call;
use support::otlp::{receiver, spans};
use support::{bundled, exit_within, signal_child};

mod support;

/// The tool spans of the trace file at `path`: each call's tool and id.
fn traced_calls(path: &Path) -> Vec<(String, String)> {
    let trace: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["cat"] == "tool")
        .map(|event| {
            (event["name"].as_str().unwrap().into(), event["args"]["tool_use_id"].as_str().unwrap().into())
        })
        .collect()
}

#[test]
fn sigterm_stops_the_http_server_with_its_trace_written_and_its_spans_sent() {
    let (collector, received) = receiver();
    let workspace = tempfile::tempdir().unwrap();
    let trace = workspace.path().join("serve.trace.json");
    let mut command = support::command(
        workspace.path(),
        &[bundled("echo")],
        &["--http", "127.0.0.1:0", "--trace", trace.to_str().unwrap()],
    );
    for (name, _) in std::env::vars() {
        if name.starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    command.env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector}"));
    let mut serving = support::start(&mut command);

    let reply = stateless_call(serving.addr, &[], "echo", &json!({ "text": "before the stop" }));
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.message()["result"]["content"][0]["text"], "before the stop", "{}", reply.body);
    // At once: the exporter sends its batch only seconds after the call.
    serving.signal("TERM");
    let status = serving.exit_within(Duration::from_secs(30));

    let stderr = serving.stderr();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("keel: stopping on SIGTERM"), "{stderr}");
    assert_eq!(traced_calls(&trace), [("echo".to_string(), "mcp-0".to_string())]);
    let spans = spans(&received);
    assert!(
        spans.iter().any(|span| span.name == "echo"),
        "the call's span was sent before keel exited: {:?}",
        spans.iter().map(|span| &span.name).collect::<Vec<_>>()
    );
}

/// A stdio `keel serve` of `plugins` with `flags`, whose stderr is `stderr`,
/// once a client initialized its session: the child, its stdin (open) and
/// the lines of its stdout.
fn stdio_session(
    workspace: &Path,
    plugins: &[&str],
    flags: &[&str],
    stderr: Stdio,
) -> (Child, ChildStdin, Lines<BufReader<ChildStdout>>) {
    let plugins: Vec<_> = plugins.iter().map(|plugin| bundled(plugin)).collect();
    let mut child = support::command(workspace, &plugins, flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    send(
        &mut stdin,
        &json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": { "name": "test", "version": "1" } } }),
    );
    send(&mut stdin, &json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
    (child, stdin, stdout)
}

/// Write `message` as one line to the server.
fn send(stdin: &mut ChildStdin, message: &Value) {
    writeln!(stdin, "{message}").unwrap();
    stdin.flush().unwrap();
}

/// The first message the server writes that `wanted` picks; `what` says
/// what it is, should stdout close first.
fn first(stdout: &mut Lines<BufReader<ChildStdout>>, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    loop {
        let line = stdout.next().unwrap_or_else(|| panic!("{what} before stdout closes")).unwrap();
        let message: Value = serde_json::from_str(&line).unwrap();
        if wanted(&message) {
            return message;
        }
    }
}

/// A stdio `keel serve` of `echo` keeping its calls in `trace`, whose
/// stderr is `stderr`, after one call it answered: the child, and its stdin,
/// still open.
fn stdio_server_after_one_call(workspace: &Path, trace: &Path, stderr: Stdio) -> (Child, ChildStdin) {
    let (child, mut stdin, mut stdout) =
        stdio_session(workspace, &["echo"], &["--trace", trace.to_str().unwrap()], stderr);
    send(
        &mut stdin,
        &json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": { "name": "echo", "arguments": { "text": "hello" } } }),
    );
    let reply = first(&mut stdout, "a reply to the call", |message| message["id"] == 2);
    assert_eq!(reply["result"]["content"][0]["text"], "hello", "{reply}");
    (child, stdin)
}

#[test]
fn sigint_stops_the_stdio_server_while_its_client_keeps_stdin_open() {
    let workspace = tempfile::tempdir().unwrap();
    let trace = workspace.path().join("serve.trace.json");
    let (mut child, stdin) = stdio_server_after_one_call(workspace.path(), &trace, Stdio::piped());

    // The client is still there: stdin stays open while the server stops.
    signal_child(&child, "INT");
    let status = exit_within(&mut child, Duration::from_secs(30));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("keel: stopping on SIGINT"), "{stderr}");
    assert_eq!(traced_calls(&trace), [("echo".to_string(), "mcp-0".to_string())]);
    drop(stdin);
}

#[test]
fn a_server_whose_stderr_is_gone_still_stops_cleanly() {
    let workspace = tempfile::tempdir().unwrap();
    let trace = workspace.path().join("serve.trace.json");
    let (mut child, stdin) = stdio_server_after_one_call(workspace.path(), &trace, Stdio::piped());
    // Whoever read its stderr went away: what it says there cannot be
    // written, and it must not stop it.
    drop(child.stderr.take());

    signal_child(&child, "TERM");
    let status = exit_within(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status}");
    assert_eq!(traced_calls(&trace), [("echo".to_string(), "mcp-0".to_string())]);
    drop(stdin);
}

/// Wait until the server at `addr` runs a call: its `/metrics` count one
/// in flight.
fn wait_until_running(addr: std::net::SocketAddr) {
    let started = std::time::Instant::now();
    while !support::http::request(addr, "GET", "/metrics", &[], "").body.contains("keel_calls_in_flight 1") {
        assert!(started.elapsed() < Duration::from_secs(30), "the call did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_answers_the_http_call_in_flight_before_the_server_exits() {
    let workspace = tempfile::tempdir().unwrap();
    let mut serving = support::serve(workspace.path(), &[bundled("sleep")]);
    let addr = serving.addr;
    let call = std::thread::spawn(move || stateless_call(addr, &[], "sleep", &json!({ "ms": 60000 })));
    wait_until_running(addr);

    serving.signal("TERM");
    let reply = call.join().expect("the call in flight is answered");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let result = &reply.message()["result"];
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(
        result["content"][0]["text"], "Interrupted: the call was stopped before it finished.",
        "{result}"
    );
    let status = serving.exit_within(Duration::from_secs(30));
    let stderr = serving.stderr();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("keel: stopping on SIGTERM"), "{stderr}");
}

#[test]
fn sigint_answers_the_stdio_call_in_flight_before_the_server_exits() {
    let workspace = tempfile::tempdir().unwrap();
    let (mut child, mut stdin, mut stdout) = stdio_session(workspace.path(), &["sleep"], &[], Stdio::piped());
    // A call of a minute, reporting progress every millisecond: the first
    // report says it runs, and when the signal comes a report is most likely
    // on its way, which a stopped session no longer sends.
    sleep_running(&mut stdin, &mut stdout, 60000, 60000);

    signal_child(&child, "INT");
    let reply = first(&mut stdout, "a reply to the call", |message| message["id"] == 2);
    let result = &reply["result"];
    assert_eq!(result["isError"], true, "{reply}");
    assert_eq!(
        result["content"][0]["text"], "Interrupted: the call was stopped before it finished.",
        "{reply}"
    );
    let status = exit_within(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status}");
    drop(stdin);
}

/// Sends request 2, a `sleep` of `ms` milliseconds reporting progress
/// `steps` times, and returns once its first progress report has come: the
/// call is running.
fn sleep_running(stdin: &mut ChildStdin, stdout: &mut Lines<BufReader<ChildStdout>>, ms: u64, steps: u64) {
    send(
        stdin,
        &json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "sleep", "arguments": { "ms": ms, "steps": steps },
        "_meta": { "progressToken": "p" } } }),
    );
    first(stdout, "a progress report", |message| message["method"] == "notifications/progress");
}

/// Wait until process `pid` has a handler for `SIGTERM`: its
/// `/proc/<pid>/status` counts the signal among those it catches.
fn wait_for_sigterm_handler(pid: u32) {
    let started = std::time::Instant::now();
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let caught = status.lines().find_map(|line| line.strip_prefix("SigCgt:")).unwrap();
        if u64::from_str_radix(caught.trim(), 16).unwrap() & (1 << (15 - 1)) != 0 {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "keel never caught SIGTERM");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_server_stopped_before_its_session_began_exits_at_once() {
    let workspace = tempfile::tempdir().unwrap();
    let mut child = support::command(workspace.path(), &[bundled("echo")], &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Its client never sends `initialize`: there is nothing to answer, so
    // there is no drain to wait for (it lasts up to 10 s).
    wait_for_sigterm_handler(child.id());
    let signalled = std::time::Instant::now();
    signal_child(&child, "TERM");
    let status = exit_within(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status}");
    assert!(signalled.elapsed() < Duration::from_secs(5), "it took {:?}", signalled.elapsed());
}

#[test]
fn the_end_of_its_input_lets_every_stdio_call_in_flight_run_to_its_end_and_answers_it() {
    let workspace = tempfile::tempdir().unwrap();
    let (mut child, mut stdin, mut stdout) =
        stdio_session(workspace.path(), &["sleep", "write_file"], &[], Stdio::null());
    // A call of six seconds, running, and a write waiting behind it (it is
    // not concurrency-safe), when the client closes its input, as a client
    // that writes its requests and closes stdin does: both run to their ends
    // and are answered, though they take longer than rmcp's own drain (5 s).
    sleep_running(&mut stdin, &mut stdout, 6000, 60);
    send(
        &mut stdin,
        &json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "write_file", "arguments": { "file_path": "after.txt", "content": "x" } } }),
    );
    drop(stdin);

    // Every reply until stdout ends, as the server exits.
    let (sender, replies) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout {
            let message: Value = serde_json::from_str(&line.unwrap()).unwrap();
            if message.get("id").is_some() && sender.send(message).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut answered = std::collections::BTreeMap::new();
    loop {
        match replies.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(reply) => {
                let id = reply["id"].as_u64().unwrap();
                assert!(answered.insert(id, reply).is_none(), "request {id} was answered twice");
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("stdout still open after 30 s"),
        }
    }
    let text = |id: u64| {
        let result = &answered.get(&id).unwrap_or_else(|| panic!("no reply to {id}: {answered:?}"))["result"];
        (result["content"][0]["text"].as_str().unwrap().to_owned(), result["isError"] == true)
    };
    assert!(!text(2).1 && !text(2).0.starts_with("Interrupted"), "{answered:?}");
    assert!(!text(3).1, "{answered:?}");
    let status = exit_within(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status}");
    assert_eq!(std::fs::read_to_string(workspace.path().join("after.txt")).unwrap(), "x");
}

#[test]
fn a_stop_answers_the_calls_waiting_their_turn_as_not_started_and_runs_none_of_them() {
    let workspace = tempfile::tempdir().unwrap();
    let (mut child, mut stdin, mut stdout) =
        stdio_session(workspace.path(), &["sleep", "write_file"], &[], Stdio::null());
    sleep_running(&mut stdin, &mut stdout, 60000, 60);
    // Writes waiting behind the sleep (they are not concurrency-safe). The
    // stop interrupts the sleep, which gives its turn to the first of them:
    // that one must find itself stopped too, not start.
    const WRITES: u64 = 30;
    for n in 0..WRITES {
        send(
            &mut stdin,
            &json!({ "jsonrpc": "2.0", "id": 10 + n, "method": "tools/call", "params": {
            "name": "write_file", "arguments": { "file_path": format!("w{n}.txt"), "content": "x" } } }),
        );
    }
    // Answered once every request before it was read.
    send(&mut stdin, &json!({ "jsonrpc": "2.0", "id": 3, "method": "ping" }));
    first(&mut stdout, "the ping's reply", |message| message["id"] == 3);
    signal_child(&child, "TERM");
    let mut not_started = 0;
    for line in stdout {
        let message: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if message["id"].as_u64().is_some_and(|id| id >= 10) {
            assert_eq!(
                message["result"]["content"][0]["text"], "Interrupted: the call was not started.",
                "{message}"
            );
            not_started += 1;
        }
    }
    assert_eq!(not_started, WRITES);
    let status = exit_within(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status}");
    let written: Vec<_> =
        std::fs::read_dir(workspace.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert!(written.iter().all(|name| !name.to_string_lossy().starts_with('w')), "{written:?}");
    drop(stdin);
}
