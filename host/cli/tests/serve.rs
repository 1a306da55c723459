//! `keel serve` as an MCP client sees it: a real child process on stdio.
//!
//! Most tests drive it with the rmcp client. Those about the wire itself (a
//! burst of requests, the order calls arrive in) write JSON-RPC lines
//! themselves: a client library may reorder or pace what it sends, and these
//! tests must know the exact bytes and their order.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::time::Duration;

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, ClientRequest, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationCapability, ProgressNotificationParam, Request, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// The example tools bundled with keel, by tool name.
const TOOLS: [&str; 6] = ["cd", "echo", "grep", "hash", "sleep", "write_file"];

fn bundled(tool: &str) -> PathBuf {
    let path = Path::new(env!("KEEL_BUNDLED_TOOLS_DIR")).join(format!("keel_tool_{tool}.wasm"));
    assert!(path.is_file(), "{} was not built", path.display());
    path
}

/// `keel <command>` over the bundled tools and `extra` plugins.
fn keel_args(command: &str, extra: &[PathBuf], flags: &[&str]) -> Vec<OsString> {
    let mut args = vec![OsString::from(command)];
    for plugin in TOOLS.iter().map(|tool| bundled(tool)).chain(extra.iter().cloned()) {
        args.push("--plugins".into());
        args.push(plugin.into());
    }
    args.extend(flags.iter().map(OsString::from));
    args
}

fn keel_command(workspace: &Path, args: &[OsString]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(workspace)
        .env("KEEL_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache"))
        .env_remove("KEEL_MAX_TOOL_USE_CONCURRENCY")
        .env_remove("KEEL_LOG");
    command
}

/// Where a child's stderr goes: a file named after the workspace under the
/// target's temporary directory, to read when a test fails (beside the
/// workspace, in the system's, it would outlive it).
fn stderr_path(workspace: &Path) -> PathBuf {
    let name = workspace.file_name().expect("a workspace is a named directory");
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name).with_extension("stderr")
}

fn stderr_file(workspace: &Path) -> std::fs::File {
    std::fs::File::create(stderr_path(workspace)).unwrap()
}

/// `keel serve` on stdio with `flags`, its stdin and stdout piped to the
/// test and its stderr to [`stderr_path`].
fn spawn_serve(workspace: &Path, flags: &[&str]) -> std::process::Child {
    keel_command(workspace, &keel_args("serve", &[], flags))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr_file(workspace))
        .spawn()
        .unwrap()
}

/// Progress notifications, as the client received them.
#[derive(Clone)]
struct Recorder(mpsc::UnboundedSender<ProgressNotificationParam>);

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(params);
    }
}

type Client = RunningService<RoleClient, Recorder>;

/// `keel serve` in `workspace`, connected to an rmcp client.
async fn client(
    workspace: &Path,
    extra: &[PathBuf],
    flags: &[&str],
) -> (Client, mpsc::UnboundedReceiver<ProgressNotificationParam>) {
    let command = tokio::process::Command::from(keel_command(workspace, &keel_args("serve", extra, flags)));
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(stderr_file(workspace))
        .spawn()
        .expect("keel serve starts");
    let (sender, progress) = mpsc::unbounded_channel();
    let client = Recorder(sender).serve(transport).await.expect("the MCP session initializes");
    (client, progress)
}

async fn call(client: &Client, tool: &str, arguments: Value) -> CallToolResult {
    let Value::Object(arguments) = arguments else { panic!("arguments are an object") };
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(arguments))
        .await
        .unwrap_or_else(|error| panic!("{tool} got no result: {error}"))
}

/// The text of a result, and whether it is an error.
fn text(result: &CallToolResult) -> (&str, bool) {
    let [block] = result.content.as_slice() else { panic!("one content block: {result:?}") };
    (block.as_text().expect("a text block").text.as_str(), result.is_error == Some(true))
}

fn ok(text: &str) -> (&str, bool) {
    (text, false)
}

fn error(text: &str) -> (&str, bool) {
    (text, true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_the_pool_as_keel_list_does_with_the_annotations_keel_enforces() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("keel.toml"), "[plugins.grep]\naccess = \"read-only\"\n").unwrap();
    let listed = keel_command(workspace.path(), &keel_args("list", &[], &[])).output().unwrap();
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let definitions: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();

    let (client, _) = client(workspace.path(), &[], &[]).await;
    let server = client.peer_info().expect("the server introduced itself");
    assert_eq!(server.server_info.as_ref().map(|info| info.name.as_str()), Some("keel"));
    let tools: Vec<Value> = client
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|tool| serde_json::to_value(tool).unwrap())
        .collect();

    let names: Vec<&str> = tools.iter().map(|tool| tool["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Read", "cd", "echo", "grep", "hash", "sleep", "write_file"], "the pool's order");
    assert_eq!(tools.len(), definitions.len());
    for (tool, definition) in tools.iter().zip(&definitions) {
        assert_eq!(tool["name"], definition["name"]);
        assert_eq!(tool["description"], definition["description"], "{}", tool["name"]);
        assert_eq!(tool["inputSchema"], definition["input_schema"], "{}", tool["name"]);
    }
    let annotations: BTreeMap<&str, &Value> =
        tools.iter().map(|tool| (tool["name"].as_str().unwrap(), &tool["annotations"])).collect();
    assert_eq!(annotations["Read"], &Value::Null, "a built-in gets no hints it cannot enforce");
    assert_eq!(
        annotations["grep"],
        &json!({ "readOnlyHint": true, "destructiveHint": false, "openWorldHint": false }),
        "no write access and no network: it can destroy nothing"
    );
    assert_eq!(
        annotations["echo"],
        &json!({ "readOnlyHint": true, "destructiveHint": false, "openWorldHint": false }),
        "granted the workspace to write, but every call runs read-only: its plan is fixed read-only"
    );
    assert_eq!(annotations["write_file"], &json!({ "openWorldHint": false }));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_with_a_network_grant_is_listed_as_open_world() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(
        workspace.path().join("keel.toml"),
        "[plugins.fetch]\nnetwork = [\"https://example.org\"]\n",
    )
    .unwrap();
    let (client, _) = client(workspace.path(), &[bundled("fetch")], &[]).await;
    let tools = client.list_all_tools().await.unwrap();
    let hints = |name: &str| {
        let tool = tools.iter().find(|tool| tool.name == name).unwrap();
        serde_json::to_value(&tool.annotations).unwrap()
    };
    // Its plan is fixed read-only, so every call gets a read-only sandbox;
    // with the network open, nothing vouches that it destroys nothing.
    assert_eq!(hints("fetch"), json!({ "readOnlyHint": true, "openWorldHint": true }));
    assert_eq!(
        hints("echo"),
        json!({ "readOnlyHint": true, "destructiveHint": false, "openWorldHint": false }),
        "no grant, no network"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_each_example_tool_and_the_context_carries_from_call_to_call() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("a.txt"), "alpha\nbeta\n").unwrap();
    std::fs::create_dir(workspace.path().join("sub")).unwrap();
    let (client, _) = client(workspace.path(), &[], &[]).await;

    assert_eq!(text(&call(&client, "echo", json!({ "text": "héllo" })).await), ok("héllo"));
    assert_eq!(text(&call(&client, "grep", json!({ "pattern": "bet" })).await), ok("a.txt:2:beta\n"));
    assert_eq!(
        text(&call(&client, "hash", json!({ "text": "abc" })).await),
        ok("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    );
    assert_eq!(text(&call(&client, "sleep", json!({ "ms": 5 })).await), ok("Slept 5 ms"));
    assert_eq!(
        text(&call(&client, "cd", json!({ "path": "sub" })).await),
        ok("Working directory is now /sub")
    );
    assert_eq!(
        text(&call(&client, "write_file", json!({ "file_path": "x.txt", "content": "x" })).await),
        ok("Wrote 1 byte to sub/x.txt"),
        "the cd of the call before applies"
    );
    assert_eq!(std::fs::read_to_string(workspace.path().join("sub/x.txt")).unwrap(), "x");
    assert_eq!(text(&call(&client, "Read", json!({ "file_path": "x.txt" })).await), ok("     1\tx\n"));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_over_budget_is_persisted_in_a_session_directory_of_this_server() {
    let workspace = tempfile::tempdir().unwrap();
    let (client, _) = client(workspace.path(), &[], &[]).await;
    let long = "x".repeat(60_000);
    let result = call(&client, "echo", json!({ "text": long })).await;
    let (shown, is_error) = text(&result);
    assert!(!is_error);
    let prefix = "<persisted-output>\nOutput too large (60000 chars, 60000 bytes). Full output saved to: ";
    let path = shown.strip_prefix(prefix).unwrap_or_else(|| panic!("{}", &shown[..200]));
    let path = &path[..path.find('\n').unwrap()];
    let session = path.strip_prefix(".keel/session/mcp-").unwrap();
    assert!(session.ends_with("/tool-results/mcp-0.txt"), "{path}");
    assert_eq!(std::fs::read_to_string(workspace.path().join(path)).unwrap(), long);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_fails_is_an_error_result_and_the_server_goes_on() {
    let workspace = tempfile::tempdir().unwrap();
    let (client, _) = client(workspace.path(), &[], &[]).await;
    assert_eq!(
        text(&call(&client, "echo", json!({ "text": 5 })).await),
        error("Invalid input for echo: /text: 5 is not of type \"string\" (rule: type)")
    );
    assert_eq!(
        text(&call(&client, "sleep", json!({ "ms": 1, "steps": 0 })).await),
        error("Invalid input for sleep: `steps` must be at least 1")
    );
    assert_eq!(text(&call(&client, "ech", json!({})).await), error("No such tool: ech. Did you mean echo?"));
    assert_eq!(text(&call(&client, "echo", json!({ "text": "still here" })).await), ok("still here"));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_over_the_input_cap_is_refused_as_a_batch_refuses_it() {
    let workspace = tempfile::tempdir().unwrap();
    let (client, _) = client(workspace.path(), &[], &[]).await;
    let text_of = "x".repeat(12 << 20);
    let size = json!({ "text": text_of }).to_string().len();
    assert_eq!(
        text(&call(&client, "echo", json!({ "text": text_of })).await),
        error(&format!(
            "Invalid input for echo: input size limit of 4 MiB exceeded: the input is {size} bytes"
        ))
    );
    assert_eq!(text(&call(&client, "echo", json!({ "text": "still here" })).await), ok("still here"));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_plugin_fails_only_its_own_calls() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("keel.toml"), "[limits]\nfuel = 200_000_000\n").unwrap();
    let hostile = keel_tests::guest("keel_guest_hostile");
    let (client, _) = client(workspace.path(), &[hostile], &[]).await;

    let panicked = call(&client, "hostile", json!({ "act": "panic" })).await;
    let (panicked, is_error) = text(&panicked);
    assert!(is_error);
    assert!(
        panicked.starts_with("hostile failed: the tool crashed: ")
            && panicked.contains("hostile: panicking in call as asked"),
        "{panicked}"
    );
    assert_eq!(
        text(&call(&client, "hostile", json!({ "act": "loop" })).await),
        error("hostile failed: fuel limit of 200000000 units exceeded")
    );
    assert_eq!(text(&call(&client, "echo", json!({ "text": "fine" })).await), ok("fine"));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notifications_arrive_as_the_tool_reports_them() {
    let workspace = tempfile::tempdir().unwrap();
    let (client, mut progress) = client(workspace.path(), &[], &[]).await;
    let request = CallToolRequestParams::new("sleep")
        .with_arguments(json!({ "ms": 900, "steps": 3 }).as_object().unwrap().clone());
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(request)),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    let token = handle.progress_token.clone();
    let response = handle.await_response();
    tokio::pin!(response);
    let first = tokio::select! {
        first = progress.recv() => first.unwrap(),
        response = &mut response => panic!("the result came before any progress: {response:?}"),
    };
    let response = response.await.unwrap();
    let ServerResult::CallToolResult(result) = response else { panic!("a tool result: {response:?}") };
    assert_eq!(text(&result), ok("Slept 900 ms"));

    let mut reports = vec![first];
    while reports.len() < 3 {
        let next = tokio::time::timeout(Duration::from_secs(5), progress.recv()).await;
        reports.push(next.expect("three reports").unwrap());
    }
    let seen: Vec<(f64, Option<&str>)> =
        reports.iter().map(|report| (report.progress, report.message.as_deref())).collect();
    assert_eq!(
        seen,
        [
            (1.0, Some(r#"{"step":1,"steps":3}"#)),
            (2.0, Some(r#"{"step":2,"steps":3}"#)),
            (3.0, Some(r#"{"step":3,"steps":3}"#)),
        ]
    );
    assert!(reports.iter().all(|report| report.progress_token == token), "each names the request's token");
    client.cancel().await.unwrap();
}

/// Every event the server wrote to its `--events` file.
fn read_events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// The result keel gave call `id`, from its events.
fn result_of<'a>(events: &'a [Value], id: &str) -> &'a Value {
    let mut results =
        events.iter().filter(|event| event["type"] == "tool_result" && event["tool_use_id"] == id);
    let result = results.next().unwrap_or_else(|| panic!("no result for {id}"));
    assert!(results.next().is_none(), "one result for {id}");
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_stops_if_its_tool_allows_and_a_waiting_one_never_starts() {
    let workspace = tempfile::tempdir().unwrap();
    let events = workspace.path().join("events.jsonl");
    let hostile = keel_tests::guest("keel_guest_hostile");
    let events_flag = events.to_str().unwrap();
    let (client, mut progress) = client(workspace.path(), &[hostile], &["--events", events_flag]).await;
    let send = |tool: &str, arguments: Value| {
        let request = CallToolRequestParams::new(tool.to_string())
            .with_arguments(arguments.as_object().unwrap().clone());
        client.send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(request)),
            PeerRequestOptions::no_options(),
        )
    };

    // A running `cancel` tool stops: `sleep` would take 20 s.
    let sleeping = send("sleep", json!({ "ms": 20_000, "steps": 200 })).await.unwrap();
    progress.recv().await.expect("the sleep is running");
    sleeping.cancel(Some("changed my mind".into())).await.unwrap();
    // `write_file` is not concurrency-safe: it runs once the sleep has ended.
    let write = call(&client, "write_file", json!({ "file_path": "w", "content": "w" }));
    let written = tokio::time::timeout(Duration::from_secs(10), write).await;
    assert_eq!(text(&written.expect("the write does not wait out the 20 s")), ok("Wrote 1 byte to w"));

    // A call waiting for its turn never starts: `hostile` sleeps alone for a
    // second, `write_file` waits behind it and is cancelled while it waits.
    // The pauses keep the three messages in this order on the wire.
    let alone = send("hostile", json!({ "act": "sleep", "secs": 1 })).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = send("write_file", json!({ "file_path": "queued.txt", "content": "no" })).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    waiting.cancel(None).await.unwrap();
    let ServerResult::CallToolResult(slept) = alone.await_response().await.unwrap() else { panic!() };
    assert_eq!(text(&slept), ok("slept 1 s"));
    assert_eq!(text(&call(&client, "echo", json!({ "text": "after" })).await), ok("after"));
    client.cancel().await.unwrap();

    assert!(!workspace.path().join("queued.txt").exists(), "the cancelled call never ran");
    let events = read_events(&events);
    assert_eq!(
        result_of(&events, "mcp-0"),
        &json!({
            "type": "tool_result",
            "tool_use_id": "mcp-0",
            "content": "Interrupted: the call was stopped before it finished.",
            "is_error": true
        })
    );
    assert_eq!(
        result_of(&events, "mcp-3"),
        &json!({
            "type": "tool_result",
            "tool_use_id": "mcp-3",
            "content": "Interrupted: the call was not started.",
            "is_error": true
        })
    );
    let started: Vec<&str> = events
        .iter()
        .filter(|event| event["type"] == "call_started")
        .map(|event| event["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(started, ["mcp-0", "mcp-1", "mcp-2", "mcp-4"], "the waiting call never started");
}

/// `keel serve` spoken to in raw JSON-RPC lines.
struct Raw {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Raw {
    fn start(workspace: &Path, flags: &[&str]) -> Raw {
        let mut child = spawn_serve(workspace, flags);
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                if sender.send(line.unwrap()).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut raw = Raw { child, stdin, lines };
        raw.send_all(&[
            json!({ "jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": { "name": "raw", "version": "0" }
            }}),
            json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }),
        ]);
        let answer = raw.next();
        assert_eq!(answer["id"], "init", "{answer}");
        assert_eq!(answer["result"]["serverInfo"]["name"], "keel");
        raw
    }

    /// Write `messages` as one burst of lines.
    fn send_all(&mut self, messages: &[Value]) {
        let mut bytes = Vec::new();
        for message in messages {
            serde_json::to_writer(&mut bytes, message).unwrap();
            bytes.push(b'\n');
        }
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(&bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// The next line from stdout, which must be a JSON-RPC message.
    fn next(&self) -> Value {
        let line = self.lines.recv_timeout(Duration::from_secs(60)).expect("the server answers");
        let message: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert_eq!(message["jsonrpc"], "2.0", "stdout carries protocol only: {line}");
        message
    }

    /// Close stdin; the server must exit cleanly, saying nothing more.
    fn close(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "keel serve exited with {status}");
        assert!(self.lines.recv().is_err(), "nothing after the last answer");
    }
}

fn tools_call(id: usize, tool: &str, arguments: &Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": tool, "arguments": arguments } })
}

/// The result text of a `tools/call` answer, and whether it is an error.
fn raw_text(answer: &Value) -> (&str, bool) {
    let result = &answer["result"];
    (
        result["content"][0]["text"].as_str().unwrap_or_else(|| panic!("a result: {answer}")),
        result["isError"] == true,
    )
}

#[test]
fn a_thousand_requests_written_at_once_are_each_answered_exactly_once() {
    let workspace = tempfile::tempdir().unwrap();
    let mut raw = Raw::start(workspace.path(), &[]);
    let requests: Vec<Value> =
        (0..1000).map(|id| tools_call(id, "echo", &json!({ "text": format!("request {id}") }))).collect();
    raw.send_all(&requests);
    let mut answered = BTreeMap::new();
    while answered.len() < 1000 {
        let answer = raw.next();
        let id = answer["id"].as_u64().unwrap_or_else(|| panic!("an answer to a call: {answer}"));
        let text = raw_text(&answer);
        assert_eq!(text, (format!("request {id}").as_str(), false));
        assert!(answered.insert(id, ()).is_none(), "request {id} was answered twice");
    }
    assert_eq!(answered.keys().copied().collect::<Vec<_>>(), (0..1000).collect::<Vec<u64>>());
    raw.close();
}

#[test]
fn a_request_reusing_the_id_of_one_in_flight_is_refused_and_the_first_still_answered() {
    let workspace = tempfile::tempdir().unwrap();
    let mut raw = Raw::start(workspace.path(), &[]);
    raw.send_all(&[
        tools_call(7, "sleep", &json!({ "ms": 300 })),
        tools_call(7, "write_file", &json!({ "file_path": "second.txt", "content": "x" })),
    ]);
    let refusal = raw.next();
    assert_eq!(refusal["id"], 7, "{refusal}");
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    let message = refusal["error"]["message"].as_str().unwrap();
    assert!(message.contains("the id 7 is that of a request not yet answered"), "{message}");
    let answer = raw.next();
    assert_eq!(answer["id"], 7, "{answer}");
    assert!(!raw_text(&answer).1, "the first request ran: {answer}");
    assert!(!workspace.path().join("second.txt").exists(), "the refused request never ran");
    // Once answered, the id is free again.
    raw.send_all(&[tools_call(7, "echo", &json!({ "text": "third" }))]);
    assert_eq!(raw_text(&raw.next()), ("third", false));
    raw.close();
}

#[test]
fn a_request_with_bad_params_or_an_unknown_method_gets_the_error_that_says_which() {
    let workspace = tempfile::tempdir().unwrap();
    let mut raw = Raw::start(workspace.path(), &[]);
    raw.send_all(&[
        json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": "echo", "arguments": "hi" } }),
        json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": { "arguments": {} } }),
        json!({ "jsonrpc": "2.0", "id": 3, "method": "prompts/get", "params": { "title": 7 } }),
        json!({ "jsonrpc": "2.0", "id": 4, "method": "tools/explode", "params": {} }),
        tools_call(5, "echo", &json!({ "text": "after" })),
    ]);
    let mut answers = BTreeMap::new();
    while answers.len() < 5 {
        let answer = raw.next();
        answers.insert(answer["id"].as_u64().unwrap(), answer);
    }
    let error =
        |id: u64| (answers[&id]["error"]["code"].as_i64().unwrap(), answers[&id]["error"]["message"].clone());
    assert_eq!(
        error(1),
        (-32602, json!("invalid params of tools/call: invalid type: string \"hi\", expected a map"))
    );
    assert_eq!(error(2), (-32602, json!("invalid params of tools/call: missing field `name`")));
    assert_eq!(
        error(3),
        (-32602, json!("invalid params of prompts/get: they are not those MCP defines for it"))
    );
    assert_eq!(error(4), (-32601, json!("method not found: tools/explode")));
    assert_eq!(raw_text(&answers[&5]), ("after", false));
    raw.close();
}

/// A server's plugins run on the one engine that loaded them: its host,
/// given them loaded, makes no engine of its own, whose pools and epoch
/// thread would cost every start and wake an idle server.
#[cfg(target_os = "linux")]
#[test]
fn a_server_runs_its_plugins_on_one_engine() {
    let workspace = tempfile::tempdir().unwrap();
    let raw = Raw::start(workspace.path(), &[]);
    let threads = std::fs::read_dir(format!("/proc/{}/task", raw.child.id())).unwrap();
    let epoch_threads = threads
        .filter(|thread| {
            let comm = thread.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|name| name.trim_end() == "keel-epoch")
        })
        .count();
    assert_eq!(epoch_threads, 1, "one engine, one epoch thread");
    raw.close();
}

#[test]
fn fifty_concurrent_calls_overlap_under_the_cap_and_unsafe_ones_run_alone_in_arrival_order() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("keel.toml"), "max_tool_use_concurrency = 4\n").unwrap();
    let events = workspace.path().join("events.jsonl");
    let mut raw = Raw::start(workspace.path(), &["--events", events.to_str().unwrap()]);
    // Five sleeps (concurrency-safe), then a write (not), ten times over.
    let is_write = |id: usize| id % 6 == 5;
    let requests: Vec<Value> = (0..50)
        .map(|id| match is_write(id) {
            true => {
                tools_call(id, "write_file", &json!({ "file_path": "log.txt", "content": id.to_string() }))
            }
            false => tools_call(id, "sleep", &json!({ "ms": 300 })),
        })
        .collect();
    raw.send_all(&requests);
    for _ in 0..50 {
        let answer = raw.next();
        let id = answer["id"].as_u64().unwrap() as usize;
        let expected = if is_write(id) {
            format!("Wrote {} to log.txt", if id < 10 { "1 byte" } else { "2 bytes" })
        } else {
            "Slept 300 ms".into()
        };
        assert_eq!(raw_text(&answer), (expected.as_str(), false), "call {id}");
    }
    raw.close();
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("log.txt")).unwrap(),
        "47",
        "the writes in order"
    );

    // Tickets follow arrival: call `mcp-<n>` is request n.
    let (mut started, mut finished) = (BTreeMap::new(), BTreeMap::new());
    let (mut now, mut most) = (0, 0);
    for (at, event) in read_events(&events).iter().enumerate() {
        let id: usize = event["tool_use_id"].as_str().unwrap()["mcp-".len()..].parse().unwrap();
        match event["type"].as_str().unwrap() {
            "call_started" => {
                started.insert(id, at);
                now += 1;
                most = most.max(now);
            }
            "call_finished" => {
                finished.insert(id, at);
                now -= 1;
            }
            _ => {}
        }
    }
    assert_eq!((started.len(), finished.len()), (50, 50));
    assert_eq!(most, 4, "safe calls overlap, never more than the cap");
    for write in (0..50).filter(|&id| is_write(id)) {
        for before in 0..write {
            assert!(finished[&before] < started[&write], "call {before} ends before write {write} starts");
        }
        for after in write + 1..50 {
            assert!(finished[&write] < started[&after], "write {write} ends before call {after} starts");
        }
    }
}

#[test]
fn a_missing_plugin_path_is_refused_saying_what_to_pass() {
    let workspace = tempfile::tempdir().unwrap();
    let output =
        keel_command(workspace.path(), &["serve".into(), "--plugins".into(), "tools/nope.wasm".into()])
            .stdin(Stdio::null())
            .output()
            .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty(), "nothing but protocol on stdout");
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "error: no plugin at tools/nope.wasm; pass a tool's .wasm component or a directory of them \
         (cargo puts them in target/wasm32-wasip2/release/)\n"
    );
}

/// Write `lines` to a `keel serve` on stdio as they are, and give its
/// replies by their `id` (as JSON text) once `count` have come.
fn replies_to_lines(lines: &[String], count: usize) -> std::collections::BTreeMap<String, Value> {
    use std::io::{BufRead as _, Write as _};
    let workspace = tempfile::tempdir().unwrap();
    let mut child = spawn_serve(workspace.path(), &[]);
    let mut stdin = child.stdin.take().unwrap();
    for line in lines {
        writeln!(stdin, "{line}").unwrap();
    }
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut replies = std::collections::BTreeMap::new();
    while replies.len() < count {
        let line = stdout.next().expect("a reply for every request").unwrap();
        let reply: Value = serde_json::from_str(&line).unwrap();
        assert!(!reply["id"].is_null(), "every reply names its request: {reply}");
        replies.insert(reply["id"].to_string(), reply);
    }
    let _ = child.kill();
    let _ = child.wait();
    replies
}

/// The lines that open a session on stdio.
fn handshake() -> [String; 2] {
    [
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } } })
        .to_string(),
        json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }).to_string(),
    ]
}

#[test]
fn a_request_too_large_to_read_gets_an_error_reply_to_its_id_and_the_server_goes_on() {
    let huge = "x".repeat(17 << 20);
    let calls = [
        json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": { "name": "echo", "arguments": { "text": huge } } }),
        json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": { "name": "echo", "arguments": { "text": "after" } } }),
    ];
    let lines: Vec<String> = handshake().into_iter().chain(calls.iter().map(Value::to_string)).collect();
    let replies = replies_to_lines(&lines, 3);
    let message = replies["2"]["error"]["message"].as_str().unwrap();
    assert!(message.contains("over the 16 MiB limit of one message"), "{message}");
    assert_eq!(replies["3"]["result"]["content"][0]["text"], "after");
}

#[test]
fn a_request_that_is_not_json_rpc_or_not_served_gets_an_error_reply_to_its_id_and_the_server_goes_on() {
    let lines = [
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text": }}}"#,
        r#"{"jsonrpc":"2.0","id":"three","method":"tools/list","params":[]}"#,
        r#"{"id":4,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}"#,
        r#"{"jsonrpc":"2.0","id":6,"method":"resources/list"}"#,
    ];
    let lines: Vec<String> = handshake().into_iter().chain(lines.map(String::from)).collect();
    let replies = replies_to_lines(&lines, 6);
    let error = |id: &str| (replies[id]["error"]["code"].clone(), replies[id]["error"]["message"].clone());
    assert_eq!(
        error("2"),
        (json!(-32700), json!("the request is not valid JSON: expected value at line 1 column 92"))
    );
    assert_eq!(
        error("\"three\""),
        (json!(-32600), json!("the request is not a JSON-RPC 2.0 request: `params` must be an object"))
    );
    assert_eq!(
        error("4"),
        (json!(-32600), json!("the request is not a JSON-RPC 2.0 request: `jsonrpc` must be \"2.0\""))
    );
    assert_eq!(replies["5"]["result"]["content"][0]["text"], "after");
    assert_eq!(
        error("6"),
        (json!(-32601), json!("method not found: resources/list (keel serves tools only)"))
    );
}

/// A client whose user answers every approval question with `answer`,
/// recording the questions.
#[derive(Clone)]
struct Approver {
    answer: ElicitationAction,
    asked: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ClientHandler for Approver {
    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.capabilities.elicitation = Some(ElicitationCapability::new());
        info
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        if let ElicitRequestParams::FormElicitationParams { message, .. } = &request {
            self.asked.lock().unwrap().push(message.clone());
        }
        let result = ElicitResult::new(self.answer.clone());
        Ok(if self.answer == ElicitationAction::Accept {
            result.with_content(json!({ "approve": true }))
        } else {
            result
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_needs_approval_asks_the_clients_user() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("keel.toml"), "[permissions]\nask = [\"write_file\"]\n").unwrap();
    let write = |name: &str| json!({ "file_path": name, "content": "x" });
    for (answer, file, expected) in [
        (ElicitationAction::Accept, "yes.txt", ok("Wrote 1 byte to")),
        (ElicitationAction::Decline, "no.txt", error("Permission to use write_file denied by the user")),
        (
            ElicitationAction::Cancel,
            "cancelled.txt",
            error("Permission to use write_file denied by the user: the user cancelled the request"),
        ),
    ] {
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let approver = Approver { answer: answer.clone(), asked: asked.clone() };
        let command =
            tokio::process::Command::from(keel_command(workspace.path(), &keel_args("serve", &[], &[])));
        let (transport, _) =
            TokioChildProcess::builder(command).stderr(stderr_file(workspace.path())).spawn().unwrap();
        let client = approver.serve(transport).await.expect("the MCP session initializes");
        let Value::Object(arguments) = write(file) else { unreachable!() };
        let result = client
            .call_tool(CallToolRequestParams::new("write_file").with_arguments(arguments))
            .await
            .unwrap();
        let (text, is_error) = text(&result);
        assert!(text.starts_with(expected.0) && is_error == expected.1, "{answer:?}: {text}");
        assert_eq!(
            *asked.lock().unwrap(),
            [format!("Allow write_file on {file}? the rule `write_file` asks for approval.")],
            "the user is shown the tool, the subject and the reason"
        );
        assert_eq!(workspace.path().join(file).exists(), answer == ElicitationAction::Accept);
        client.cancel().await.unwrap();
    }

    // A client that cannot ask its user gets the denial of a run with no one to ask.
    let (client, _) = client(workspace.path(), &[], &[]).await;
    let result = call(&client, "write_file", write("plain.txt")).await;
    let (text, is_error) = text(&result);
    assert!(is_error);
    assert!(text.starts_with("write_file requires approval, and no one can be asked in this run"), "{text}");
    assert!(!workspace.path().join("plain.txt").exists());
    client.cancel().await.unwrap();
}

/// A client that records the log messages it is sent.
#[derive(Clone, Default)]
struct LogReader(Arc<std::sync::Mutex<Vec<Value>>>);

#[allow(deprecated, reason = "logging is what older clients use")]
impl ClientHandler for LogReader {
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.0.lock().unwrap().push(serde_json::to_value(&params).unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(deprecated, reason = "logging is what older clients use")]
async fn tool_log_lines_reach_the_client_at_the_level_it_asked_for() {
    let workspace = tempfile::tempdir().unwrap();
    let hostile = keel_tests::guest("keel_guest_hostile");
    let reader = LogReader::default();
    let command =
        tokio::process::Command::from(keel_command(workspace.path(), &keel_args("serve", &[hostile], &[])));
    let (transport, _) =
        TokioChildProcess::builder(command).stderr(stderr_file(workspace.path())).spawn().unwrap();
    let client = reader.clone().serve(transport).await.unwrap();
    let log = json!({ "act": "log" });
    let Value::Object(arguments) = log else { unreachable!() };
    let call = || client.call_tool(CallToolRequestParams::new("hostile").with_arguments(arguments.clone()));
    call().await.unwrap();
    assert_eq!(reader.0.lock().unwrap().len(), 0, "nothing is sent before the client asks");

    client.set_level(rmcp::model::SetLevelRequestParams::new(rmcp::model::LoggingLevel::Info)).await.unwrap();
    call().await.unwrap();
    // The server sends them before the result; the client library hands
    // notifications to its handler on tasks of their own, so they may be
    // seen a moment after the result.
    for _ in 0..100 {
        if reader.0.lock().unwrap().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut sent = reader.0.lock().unwrap().clone();
    sent.sort_by_key(|message| message["data"].as_str().unwrap().to_string());
    assert_eq!(
        sent,
        [
            json!({ "level": "error", "logger": "hostile", "data": "hostile: an error line" }),
            json!({ "level": "info", "logger": "hostile", "data": "hostile: an info line" }),
        ],
        "info and above, and nothing below"
    );
    client.cancel().await.unwrap();
}

/// A client that counts `notifications/tools/list_changed`.
#[derive(Clone, Default)]
struct ListWatcher(Arc<std::sync::atomic::AtomicUsize>);

impl ClientHandler for ListWatcher {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Put `bytes` at `path` the way a deployment does: written beside it, then
/// renamed over it, so no one reads a half-written file.
fn put(path: &Path, bytes: &[u8]) {
    let temporary = path.with_extension("partial");
    std::fs::write(&temporary, bytes).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_added_changed_removed_or_broken_reload_while_a_call_is_in_flight() {
    let workspace = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    for tool in ["echo", "sleep"] {
        std::fs::copy(bundled(tool), plugins.path().join(format!("{tool}.wasm"))).unwrap();
    }
    let mut args = vec![OsString::from("serve"), "--plugins".into(), plugins.path().into()];
    args.push("--workspace".into());
    args.push(workspace.path().into());
    let command = tokio::process::Command::from(keel_command(workspace.path(), &args));
    let (transport, _) =
        TokioChildProcess::builder(command).stderr(stderr_file(workspace.path())).spawn().unwrap();
    let watcher = ListWatcher::default();
    let client = Arc::new(watcher.clone().serve(transport).await.unwrap());
    let names = || {
        let client = client.clone();
        async move {
            let tools = client.list_all_tools().await.unwrap();
            tools.iter().map(|tool| tool.name.to_string()).collect::<Vec<_>>()
        }
    };
    assert_eq!(names().await, ["Read", "echo", "sleep"]);
    // Waits for the `n`th change, within a bound.
    let changed = |n: usize| {
        let counter = watcher.0.clone();
        async move {
            for _ in 0..200 {
                if counter.load(std::sync::atomic::Ordering::SeqCst) >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("no tools/list_changed number {n} within 10 s");
        }
    };
    let slow = |ms: u64| {
        let client = client.clone();
        tokio::spawn(async move {
            let Value::Object(arguments) = json!({ "ms": ms }) else { unreachable!() };
            client.call_tool(CallToolRequestParams::new("sleep").with_arguments(arguments)).await.unwrap()
        })
    };

    // Added, while a call is in flight.
    let in_flight = slow(1500);
    tokio::time::sleep(Duration::from_millis(200)).await;
    put(&plugins.path().join("wc.wasm"), &std::fs::read(bundled("wc")).unwrap());
    changed(1).await;
    assert_eq!(names().await, ["Read", "echo", "sleep", "wc"]);
    assert_eq!(text(&in_flight.await.unwrap()), ok("Slept 1500 ms"), "it finished on the pool it began in");

    // Changed: another component in sleep's file, while sleep runs.
    let in_flight = slow(1500);
    tokio::time::sleep(Duration::from_millis(200)).await;
    put(&plugins.path().join("sleep.wasm"), &std::fs::read(bundled("hash")).unwrap());
    changed(2).await;
    assert_eq!(names().await, ["Read", "echo", "hash", "wc"]);
    assert_eq!(text(&in_flight.await.unwrap()), ok("Slept 1500 ms"), "the old version finished its call");

    // Broken: echo's file no longer holds a component; the old echo serves on.
    put(&plugins.path().join("echo.wasm"), b"not a component");
    tokio::time::sleep(reload_settle()).await;
    let call = |tool: &'static str, arguments: Value| {
        let client = client.clone();
        async move {
            let Value::Object(arguments) = arguments else { unreachable!() };
            client.call_tool(CallToolRequestParams::new(tool).with_arguments(arguments)).await.unwrap()
        }
    };
    assert_eq!(text(&call("echo", json!({ "text": "still" })).await), ok("still"));
    let log = std::fs::read_to_string(stderr_path(workspace.path())).unwrap();
    assert!(log.contains("echo.wasm") && log.contains("the version loaded before keeps serving"), "{log}");

    // Removed.
    std::fs::remove_file(plugins.path().join("wc.wasm")).unwrap();
    changed(3).await;
    assert_eq!(names().await, ["Read", "echo", "hash"]);
    let result = call("wc", json!({ "file_path": "x" })).await;
    let (text, is_error) = text(&result);
    assert!(is_error && text.starts_with("No such tool: wc"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_persisted_after_a_reload_does_not_replace_one_persisted_before() {
    let workspace = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(bundled("echo"), plugins.path().join("echo.wasm")).unwrap();
    let mut args = vec![OsString::from("serve"), "--plugins".into(), plugins.path().into()];
    args.push("--workspace".into());
    args.push(workspace.path().into());
    let command = tokio::process::Command::from(keel_command(workspace.path(), &args));
    let (transport, _) =
        TokioChildProcess::builder(command).stderr(stderr_file(workspace.path())).spawn().unwrap();
    let watcher = ListWatcher::default();
    let client = watcher.clone().serve(transport).await.unwrap();
    // Over the per-result budget, so each is persisted; returns the file.
    let persisted = |fill: char| {
        let client = &client;
        async move {
            let Value::Object(arguments) = json!({ "text": fill.to_string().repeat(60_000) }) else {
                unreachable!()
            };
            let result =
                client.call_tool(CallToolRequestParams::new("echo").with_arguments(arguments)).await.unwrap();
            let (shown, is_error) = text(&result);
            assert!(!is_error, "{shown}");
            let path = &shown[shown.find(".keel/").unwrap_or_else(|| panic!("{shown}"))..];
            path[..path.find('\n').unwrap()].to_owned()
        }
    };
    let before = persisted('x').await;
    put(&plugins.path().join("wc.wasm"), &std::fs::read(bundled("wc")).unwrap());
    for _ in 0..200 {
        if watcher.0.load(std::sync::atomic::Ordering::SeqCst) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(watcher.0.load(std::sync::atomic::Ordering::SeqCst), 1, "no reload within 10 s");
    let after = persisted('y').await;
    assert_ne!(before, after, "two calls named one file");
    assert_eq!(std::fs::read_to_string(workspace.path().join(&before)).unwrap(), "x".repeat(60_000));
    assert_eq!(std::fs::read_to_string(workspace.path().join(&after)).unwrap(), "y".repeat(60_000));
    client.cancel().await.unwrap();
}

/// Long enough for the server to look at its plugins twice over.
fn reload_settle() -> Duration {
    Duration::from_millis(2000)
}

#[test]
fn a_client_that_closed_its_end_of_the_output_has_no_further_request_run() {
    let workspace = tempfile::tempdir().unwrap();
    let mut child = spawn_serve(workspace.path(), &[]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let [initialize, initialized] = handshake();
    writeln!(stdin, "{initialize}").unwrap();
    let mut reply = String::new();
    stdout.read_line(&mut reply).unwrap();
    assert!(reply.contains("protocolVersion"), "{reply}");
    writeln!(stdin, "{initialized}").unwrap();
    // Calls in flight when the client stops reading.
    for id in 10..14 {
        writeln!(stdin, "{}", tools_call(id, "sleep", &json!({ "ms": 500 }))).unwrap();
    }
    // Nobody reads the replies any more: the first call's cannot be written.
    drop(stdout);
    writeln!(stdin, "{}", tools_call(2, "echo", &json!({ "text": "unread" }))).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    // A write asked for after that is never run, and the server ends.
    let late = json!({ "file_path": "late.txt", "content": "written for nobody" });
    let _ = writeln!(stdin, "{}", tools_call(3, "write_file", &late));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server went on serving a client that reads nothing"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    assert!(!workspace.path().join("late.txt").exists());
    let stderr = std::fs::read_to_string(stderr_path(workspace.path())).unwrap();
    // Said once, not once more for each reply in flight.
    assert_eq!(stderr.matches("the client closed its end of the output").count(), 1, "{stderr}");
    assert!(!stderr.contains("ERROR"), "{stderr}");
}

#[test]
fn an_error_reply_is_the_clients_to_read_not_a_warning_in_the_servers_log() {
    let workspace = tempfile::tempdir().unwrap();
    let mut child = spawn_serve(workspace.path(), &[]);
    let mut stdin = child.stdin.take().unwrap();
    let [initialize, initialized] = handshake();
    // Asked by clients as they connect, of a server that serves tools only.
    let asked = json!({ "jsonrpc": "2.0", "id": 2, "method": "resources/list", "params": {} });
    writeln!(stdin, "{initialize}\n{initialized}\n{asked}").unwrap();
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    let replies = String::from_utf8(output.stdout).unwrap();
    assert!(replies.contains("method not found: resources/list"), "{replies}");
    let stderr = std::fs::read_to_string(stderr_path(workspace.path())).unwrap();
    assert_eq!(stderr, "", "the server's log");
}

impl Raw {
    /// Write `bytes` to the server as they are.
    fn send_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// The next reply, passing over notifications.
    fn next_reply(&self) -> Value {
        loop {
            let message = self.next();
            if message.get("result").is_some() || message.get("error").is_some() {
                return message;
            }
        }
    }
}

/// The error code and message of `reply`.
fn raw_error(reply: &Value) -> (i64, &str) {
    let error = &reply["error"];
    (
        error["code"].as_i64().unwrap_or_else(|| panic!("an error: {reply}")),
        error["message"].as_str().unwrap_or_else(|| panic!("an error message: {reply}")),
    )
}

#[test]
fn a_cancelled_requests_id_stays_taken_until_its_call_ends_and_its_reply_goes_to_no_later_request() {
    let workspace = tempfile::tempdir().unwrap();
    let mut raw = Raw::start(workspace.path(), &[]);
    let mut sleeping = tools_call(5, "sleep", &json!({ "ms": 20_000, "steps": 20_000 }));
    sleeping["params"]["_meta"] = json!({ "progressToken": "p" });
    raw.send_all(&[sleeping]);
    let report = raw.next();
    assert_eq!(report["method"], "notifications/progress", "the sleep runs: {report}");
    // Cancelled, and its id reused at once: the cancelled call has not
    // ended yet, so the id is still taken.
    let cancel =
        json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 5 } });
    let again = tools_call(5, "sleep", &json!({ "ms": 300 }));
    raw.send_all(&[cancel, again.clone()]);
    let refusal = raw.next_reply();
    assert_eq!(refusal["id"], 5, "{refusal}");
    let (code, message) = raw_error(&refusal);
    assert_eq!(code, -32600, "{refusal}");
    assert!(message.contains("the id 5 is that of a request not yet answered"), "{message}");
    // Once the cancelled call has ended, the id is free; its own reply is
    // never given, to it or to the request that reuses its id.
    let mut tries = 0;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        raw.send_all(std::slice::from_ref(&again));
        let reply = raw.next_reply();
        assert_eq!(reply["id"], 5, "{reply}");
        if reply.get("result").is_some() {
            assert_eq!(
                raw_text(&reply),
                ("Slept 300 ms", false),
                "the reply of the request that reused the id"
            );
            break;
        }
        assert_eq!(raw_error(&reply).0, -32600, "{reply}");
        tries += 1;
        assert!(tries < 100, "the cancelled call's id was never free again");
    }
    raw.send_all(&[tools_call(6, "echo", &json!({ "text": "after" }))]);
    let after = raw.next_reply();
    assert_eq!((&after["id"], raw_text(&after)), (&json!(6), ("after", false)), "no other reply to 5");
    raw.close();
}

#[test]
fn a_request_serde_cannot_read_or_whose_id_cannot_be_read_is_still_answered() {
    let workspace = tempfile::tempdir().unwrap();
    let mut raw = Raw::start(workspace.path(), &[]);
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"x","d":{}{}}}}}}}"#,
        "[".repeat(130),
        "]".repeat(130)
    );
    let lines = [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a\ud800b"}}}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":2,"method":"ping","params":{"x":"\udc00"}}"#.to_string(),
        deep,
        format!(r#"{{"jsonrpc":"2.0","id":{},"method":"ping"}}"#, "1".repeat(401)),
        r#"{"jsonrpc":"2.0","id":1x,"method":"ping"}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#.to_string(),
    ];
    raw.send_bytes(format!("{}\n", lines.join("\n")).as_bytes());
    let (mut by_id, mut without_id) = (BTreeMap::new(), Vec::new());
    while by_id.len() + without_id.len() < 6 {
        let reply = raw.next_reply();
        match reply.get("id") {
            Some(id) => assert!(by_id.insert(id.to_string(), reply.clone()).is_none(), "{reply}"),
            None => without_id.push(reply),
        }
    }
    let error = |id: &str| raw_error(&by_id[id]);
    assert_eq!(error("1").0, -32700, "a lone surrogate");
    assert!(error("1").1.starts_with("the request is not valid JSON: "), "{:?}", error("1"));
    assert_eq!(
        error("2"),
        (-32700, "the request is not valid JSON: lone leading surrogate in hex escape at line 1 column 61")
    );
    assert_eq!(error("3").0, -32600, "{:?}", error("3"));
    assert!(error("3").1.starts_with("the request is nested too deeply to read: "), "{:?}", error("3"));
    assert_eq!(by_id["9"]["result"], json!({}), "the server goes on");
    let mut messages: Vec<(i64, &str)> = without_id.iter().map(raw_error).collect();
    messages.sort();
    let why = "cannot be read: an id must be a string or an integer from -9223372036854775808 to \
               9223372036854775807";
    assert_eq!(
        messages,
        [
            (-32600, format!("the request's id {}… (401 bytes) {why}", "1".repeat(64)).as_str()),
            (-32600, format!("the request's id 1x {why}").as_str()),
        ]
    );
    raw.close();
}

#[test]
fn a_last_request_without_a_newline_is_answered_at_the_end_of_the_input() {
    let workspace = tempfile::tempdir().unwrap();
    let mut raw = Raw::start(workspace.path(), &[]);
    raw.send_bytes(br#"{"jsonrpc":"2.0","id":"last","method":"tools/list"}"#);
    drop(raw.stdin.take());
    let reply = raw.next_reply();
    assert_eq!(reply["id"], "last", "{reply}");
    assert!(reply["result"]["tools"].as_array().is_some_and(|tools| !tools.is_empty()), "{reply}");
    raw.close();
}

#[test]
fn a_client_that_reads_no_replies_stalls_its_requests_rather_than_growing_the_server() {
    const REQUESTS: usize = 2000;
    let workspace = tempfile::tempdir().unwrap();
    let mut child = spawn_serve(workspace.path(), &[]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let [initialize, initialized] = handshake();
    writeln!(stdin, "{initialize}\n{initialized}").unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("protocolVersion"), "{line}");
    // Requests of 8 KB whose replies are as long, none of them read.
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let written = written.clone();
        let text = "x".repeat(8 << 10);
        std::thread::spawn(move || {
            for id in 0..REQUESTS {
                let request = tools_call(id, "echo", &json!({ "text": text }));
                writeln!(stdin, "{request}").unwrap();
                written.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            // Kept open: the end of the input would interrupt the calls.
            stdin
        })
    };
    let count = || written.load(std::sync::atomic::Ordering::SeqCst);
    // The writer stalls once the server stops reading: nothing written for a
    // second and a half.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (mut last, mut still_since) = (count(), std::time::Instant::now());
    while count() < REQUESTS && still_since.elapsed() < Duration::from_millis(1500) {
        assert!(std::time::Instant::now() < deadline, "the writer neither stalled nor finished");
        std::thread::sleep(Duration::from_millis(50));
        if count() != last {
            (last, still_since) = (count(), std::time::Instant::now());
        }
    }
    assert!(
        count() < REQUESTS / 2,
        "the server read {} of {REQUESTS} requests whose replies nobody read",
        count()
    );
    // Once the client reads, every request is answered.
    let mut answered = 0;
    while answered < REQUESTS {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "stdout closed after {answered} replies");
        let reply: Value = serde_json::from_str(&line).unwrap();
        assert!(!raw_text(&reply).1, "{}", &line[..200.min(line.len())]);
        answered += 1;
    }
    drop(writer.join().unwrap());
    let _ = child.kill();
    let _ = child.wait();
}
