//! `keel serve` asking a client's user for approval, with the client at the
//! other end of stdio writing JSON-RPC lines itself: the test must know
//! when the question was sent and what is written after it.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};
use support::bundled;

mod support;

/// A process killed when dropped, so that a failing test leaves none behind.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `keel serve` on stdio over `workspace`, where `write_file` asks for
/// approval, with a client that can ask its user: its stdin, the lines it
/// writes (each as JSON, read on a thread of their own), and the process.
fn serve_asking(workspace: &std::path::Path) -> (std::process::ChildStdin, mpsc::Receiver<Value>, Killed) {
    std::fs::write(workspace.join("keel.toml"), "[permissions]\nask = [\"write_file\"]\n").unwrap();
    let mut child = support::command(workspace, &[bundled("echo"), bundled("write_file")], &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines, read) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(serde_json::from_str(&line).expect("the server writes JSON lines")).is_err() {
                break;
            }
        }
    });
    let opening = [
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": { "elicitation": {} },
            "clientInfo": { "name": "t", "version": "1" } } }),
        json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }),
    ];
    for message in opening {
        writeln!(stdin, "{message}").unwrap();
    }
    (stdin, read, Killed(child))
}

/// The next line the server writes that `wanted` accepts, within 20 s.
fn next_line(read: &mpsc::Receiver<Value>, wanted: impl Fn(&Value) -> bool) -> Value {
    loop {
        let line = read.recv_timeout(Duration::from_secs(20)).expect("the server writes within 20 s");
        if wanted(&line) {
            return line;
        }
    }
}

#[test]
fn the_end_of_the_input_denies_a_pending_question_and_the_server_exits() {
    let workspace = tempfile::tempdir().unwrap();
    let (mut stdin, read, mut child) = serve_asking(workspace.path());
    let calls = [
        json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": { "name": "write_file", "arguments": { "file_path": "a.txt", "content": "x" } } }),
        json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": { "name": "echo", "arguments": { "text": "queued behind" } } }),
    ];
    for call in calls {
        writeln!(stdin, "{call}").unwrap();
    }
    let asked = next_line(&read, |line| line["method"] == "elicitation/create");
    assert_eq!(
        asked["params"]["message"],
        "Allow write_file on a.txt? the rule `write_file` asks for approval."
    );
    // The client goes before its user answers: no answer can come now.
    drop(stdin);
    let reply = |id: u64| next_line(&read, move |line| line["id"] == id && line.get("method").is_none());
    let (denied, echoed) = (reply(2), reply(3));
    assert_eq!(
        denied["result"]["content"][0]["text"],
        "Permission to use write_file denied by the user: the client failed to answer: its input ended",
        "{denied}"
    );
    assert_eq!(denied["result"]["isError"], true);
    assert_eq!(echoed["result"]["content"][0]["text"], "queued behind", "{echoed}");
    assert!(support::exit_within(&mut child.0, Duration::from_secs(10)).success());
    assert!(!workspace.path().join("a.txt").exists());
}
