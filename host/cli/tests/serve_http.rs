//! `keel serve --http`: a real server process on a loopback port, spoken to
//! over real HTTP connections: sessions for older clients, the stateless
//! 2026-07-28 protocol, the bearer token, the Host and Origin checks, the
//! body cap, and the listing of rich results.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::http::{
    ACCEPT, JSON, initialize, request, stateless_body, stateless_call, stateless_call_with, stateless_headers,
};
use support::{Serving, bundled};

mod support;

/// The example tools bundled with keel that these tests load.
const TOOLS: [&str; 4] = ["echo", "grep", "wc", "write_file"];

/// Start `keel serve --http 127.0.0.1:0` over `workspace` with [`TOOLS`]
/// and `flags`.
fn serve(workspace: &Path, flags: &[&str]) -> Serving {
    support::serve_with(workspace, &TOOLS.map(bundled), flags)
}

/// [`serve`] behind the bearer `token`, given in a file of `workspace`.
fn serve_with_token(workspace: &Path, token: &str) -> Serving {
    let file = workspace.join("token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    serve(workspace, &["--token-file", file.to_str().unwrap()])
}

#[test]
fn an_older_client_gets_a_session_and_sees_rich_results_listed() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &[]);
    let reply = request(server.addr, "POST", "/mcp", &[ACCEPT, JSON], &initialize());
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.message()["result"]["serverInfo"]["name"], "keel");
    let session = reply.header("mcp-session-id").expect("a session for a 2025-06-18 client").to_string();
    let in_session =
        [ACCEPT, JSON, ("mcp-session-id", session.as_str()), ("mcp-protocol-version", "2025-06-18")];
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }).to_string();
    assert_eq!(request(server.addr, "POST", "/mcp", &in_session, &initialized).status, 202);

    let list = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list" }).to_string();
    let tools = request(server.addr, "POST", "/mcp", &in_session, &list).message();
    let tools = tools["result"]["tools"].as_array().unwrap().clone();
    let wc = tools.iter().find(|tool| tool["name"] == "wc").expect("wc is listed");
    assert_eq!(wc["outputSchema"]["type"], "object", "a structured tool lists its output schema: {wc}");
    assert!(wc["outputSchema"]["properties"]["lines"].is_object(), "{wc}");

    std::fs::write(workspace.path().join("notes.txt"), "one two\nthree\n").unwrap();
    let call = json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call",
                       "params": { "name": "wc", "arguments": { "file_path": "notes.txt" } } })
    .to_string();
    let result = request(server.addr, "POST", "/mcp", &in_session, &call).message();
    assert_eq!(result["result"]["structuredContent"]["words"], 3, "{result}");
    assert_eq!(result["result"]["isError"], false);
}

#[test]
fn the_server_runs_without_transparent_huge_pages() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &[]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.id())).unwrap();
    let enabled = status.lines().find_map(|line| line.strip_prefix("THP_enabled:"));
    assert_eq!(enabled.map(str::trim), Some("0"), "{status}");
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "served" }));
    assert_eq!(reply.message()["result"]["content"][0]["text"], "served", "{}", reply.body);
}

#[test]
fn a_stateless_client_calls_without_a_session() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &[]);
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "héllo" }));
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.header("mcp-session-id").is_none(), "no session on 2026-07-28");
    assert_eq!(reply.message()["result"]["content"], json!([{ "type": "text", "text": "héllo" }]));
    // An unknown tool is a result with an error, and the server goes on.
    let reply = stateless_call(server.addr, &[], "nope", &json!({}));
    assert_eq!(reply.message()["result"]["isError"], true, "{}", reply.body);
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "still here" }));
    assert_eq!(reply.message()["result"]["content"][0]["text"], "still here");
}

#[test]
fn a_stateless_result_comes_as_json_unless_progress_comes_first() {
    let workspace = tempfile::tempdir().unwrap();
    let server = support::serve_with(workspace.path(), &[bundled("echo"), bundled("sleep")], &[]);
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "plain" }));
    assert!(
        reply.header("content-type").is_some_and(|value| value.starts_with("application/json")),
        "{:?}",
        reply.headers
    );
    let message: Value = serde_json::from_str(&reply.body).expect("the body is the JSON-RPC reply itself");
    assert_eq!(message["result"]["content"][0]["text"], "plain");

    // A call that reports progress first gets a stream: nothing it reports is lost.
    let meta = json!({ "_meta": {
        "progressToken": "p1",
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": { "name": "test", "version": "1" }
    }});
    let reply =
        stateless_call_with(server.addr, &[], "sleep", &json!({ "ms": 20, "steps": 2 }), &json!({}), &meta);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(
        reply.header("content-type").is_some_and(|value| value.starts_with("text/event-stream")),
        "{:?}",
        reply.headers
    );
    assert!(reply.body.contains("notifications/progress"), "{}", reply.body);
    assert_eq!(reply.message()["result"]["isError"], false, "{}", reply.body);
}

#[test]
fn only_a_request_with_the_right_token_reaches_the_tools() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve_with_token(workspace.path(), "s3cret-token");
    let echo = json!({ "text": "in" });
    let required = ("a bearer token is required: Authorization: Bearer TOKEN\n", "Bearer realm=\"keel\"");
    let wrong = (
        "the bearer token is not the one this server was given\n",
        "Bearer realm=\"keel\", error=\"invalid_token\"",
    );
    for (authorization, (body, challenge)) in [
        (None, required),
        (Some("Basic s3cret-token"), required),
        (Some("Bearer wrong-token"), wrong),
        (Some("Bearer s3cret-toke"), wrong),
    ] {
        let extra: Vec<(&str, &str)> =
            authorization.map(|value| ("authorization", value)).into_iter().collect();
        let reply = stateless_call(server.addr, &extra, "echo", &echo);
        assert_eq!(reply.status, 401, "{authorization:?}: {}", reply.body);
        assert_eq!(reply.body, body, "{authorization:?}");
        assert_eq!(reply.header("www-authenticate"), Some(challenge), "{authorization:?}");
    }
    let reply = stateless_call(server.addr, &[("authorization", "Bearer s3cret-token")], "echo", &echo);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.message()["result"]["content"][0]["text"], "in");
}

#[test]
fn a_non_loopback_address_without_a_token_is_refused_at_start() {
    let workspace = tempfile::tempdir().unwrap();
    let output =
        support::command(workspace.path(), &TOOLS.map(bundled), &["--http", "0.0.0.0:0"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr
            .contains("refusing to serve on 0.0.0.0:0 without a bearer token: it is not a loopback address"),
        "{stderr}"
    );
}

#[test]
fn a_forged_host_or_origin_and_an_oversized_body_are_refused() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &["--max-body-kib", "1"]);
    let reply =
        request(server.addr, "POST", "/mcp", &[ACCEPT, JSON, ("host", "evil.example")], &initialize());
    assert_eq!(reply.status, 403, "a rebinding name: {}", reply.body);
    let reply = request(
        server.addr,
        "POST",
        "/mcp",
        &[ACCEPT, JSON, ("origin", "http://evil.example")],
        &initialize(),
    );
    assert_eq!(reply.status, 403, "a page of another origin: {}", reply.body);
    let local = format!("http://127.0.0.1:{}", server.addr.port());
    let reply =
        request(server.addr, "POST", "/mcp", &[ACCEPT, JSON, ("origin", local.as_str())], &initialize());
    assert_eq!(reply.status, 200, "a page of this machine: {}", reply.body);
    let big = json!({ "text": "x".repeat(4096) });
    let reply = stateless_call(server.addr, &[], "echo", &big);
    assert_eq!(reply.status, 413, "{}", reply.body);
    assert!(reply.body.contains("1024 bytes"), "the refusal names the cap: {}", reply.body);
    let reply = request(server.addr, "GET", "/elsewhere", &[], "");
    assert_eq!(reply.status, 404);
    assert!(reply.body.contains("/mcp"));
    // And the server still serves.
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "fine" }));
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[test]
fn a_page_the_server_answers_to_may_call_it_from_a_browser_and_no_other_page_may() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve_with_token(workspace.path(), "s3cret-token");
    let page = ("origin", "http://localhost:5173");
    let preflight = [
        page,
        ("access-control-request-method", "POST"),
        ("access-control-request-headers", "content-type, mcp-protocol-version, authorization"),
    ];
    // A browser asks first, without the token.
    let reply = request(server.addr, "OPTIONS", "/mcp", &preflight, "");
    assert_eq!(reply.status, 204, "{}", reply.body);
    assert_eq!(reply.header("access-control-allow-origin"), Some("http://localhost:5173"));
    assert!(reply.header("access-control-allow-methods").unwrap().contains("POST"));
    let allowed = reply.header("access-control-allow-headers").unwrap();
    for name in ["content-type", "mcp-protocol-version", "authorization", "mcp-session-id"] {
        assert!(allowed.contains(name), "{name} in {allowed}");
    }
    // Its call then gets a reply the page may read, session id and all.
    let bearer = ("authorization", "Bearer s3cret-token");
    let reply = request(server.addr, "POST", "/mcp", &[ACCEPT, JSON, page, bearer], &initialize());
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("access-control-allow-origin"), Some("http://localhost:5173"));
    assert!(reply.header("access-control-expose-headers").unwrap().contains("mcp-session-id"));
    // A page of another site is refused, and told nothing it could read.
    let evil = ("origin", "http://evil.example");
    let reply = request(server.addr, "OPTIONS", "/mcp", &[evil, preflight[1], preflight[2]], "");
    assert_ne!(reply.status, 204, "{}", reply.body);
    assert_eq!(reply.header("access-control-allow-origin"), None);
}

#[test]
fn a_body_that_is_not_json_rpc_gets_a_bad_request_with_a_json_rpc_error() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &[]);
    let refused = |body: &str| {
        let reply = request(server.addr, "POST", "/mcp", &stateless_headers("echo"), body);
        assert_eq!(reply.status, 400, "{}", reply.body);
        let error: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(error["id"], Value::Null, "{error}");
        (error["error"]["code"].clone(), error["error"]["message"].as_str().unwrap().to_owned())
    };
    assert_eq!(
        refused(
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text": }}}"#
        ),
        (json!(-32700), "the request is not valid JSON: expected value at line 1 column 92".to_owned())
    );
    let (code, message) = refused(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":[]}"#);
    assert_eq!(code, json!(-32600));
    assert!(message.starts_with("the request is not a JSON-RPC 2.0 message: "), "{message}");
    // A body that is not JSON-typed is still refused as such.
    let reply = request(server.addr, "POST", "/mcp", &[ACCEPT, ("content-type", "text/plain")], "x");
    assert_eq!(reply.status, 415, "{}", reply.body);
    // And the server still serves.
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "fine" }));
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[test]
fn two_replicas_serve_one_stateless_client_alternately() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("notes.txt"), "one two\nthree\n").unwrap();
    let replicas = [serve(workspace.path(), &[]), serve(workspace.path(), &[])];
    assert_ne!(replicas[0].addr, replicas[1].addr);
    for round in 0..6 {
        let replica = &replicas[round % 2];
        let text = format!("round {round}");
        let reply = stateless_call(replica.addr, &[], "echo", &json!({ "text": text }));
        assert_eq!(reply.status, 200, "replica {}: {}", round % 2, reply.body);
        assert_eq!(reply.message()["result"]["content"][0]["text"], text.as_str());
        let reply = stateless_call(replica.addr, &[], "wc", &json!({ "file_path": "notes.txt" }));
        assert_eq!(reply.message()["result"]["structuredContent"]["lines"], 2, "{}", reply.body);
    }
}

#[test]
fn a_client_that_sends_nothing_is_cut_off_after_the_idle_timeout() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &["--idle-timeout-secs", "1"]);
    let mut silent = TcpStream::connect(server.addr).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let started = std::time::Instant::now();
    let mut byte = [0u8; 1];
    // The server closes the connection (a read of 0 bytes, or a reset);
    // a read that timed out would mean it never did.
    match silent.read(&mut byte) {
        Ok(0) => {}
        Ok(_) => {}
        Err(error) => assert!(
            !matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            "the idle connection was never cut off: {error}"
        ),
    }
    assert!(started.elapsed() < Duration::from_secs(15));
    // A slow client's head, sent a byte at a time past the timeout, is cut off too.
    let mut slow = TcpStream::connect(server.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    slow.write_all(b"POST /mcp HTTP/1.1\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let _ = slow.write_all(b"host: 127.0.0.1\r\n");
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    let text = String::from_utf8_lossy(&rest);
    assert!(!text.contains("200 OK"), "a head sent slower than the timeout is not served: {text}");
    // The server goes on.
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "after" }));
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[test]
fn a_stateless_client_is_asked_for_approval_by_an_input_required_result() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("keel.toml"), "[permissions]\nask = [\"write_file\"]\n").unwrap();
    let server = serve(workspace.path(), &[]);
    let elicits = json!({ "elicitation": {} });
    let write = json!({ "file_path": "a.txt", "content": "x" });
    let first = stateless_call_with(server.addr, &[], "write_file", &write, &elicits, &json!({})).message();
    let result = &first["result"];
    assert_eq!(result["resultType"], "input_required", "{first}");
    let asked = &result["inputRequests"]["approval"];
    assert_eq!(asked["method"], "elicitation/create", "{first}");
    assert_eq!(
        asked["params"]["message"],
        "Allow write_file on a.txt? the rule `write_file` asks for approval."
    );
    assert_eq!(asked["params"]["requestedSchema"]["properties"]["approve"]["type"], "boolean");
    let state = result["requestState"].as_str().expect("a request state").to_string();
    assert!(!workspace.path().join("a.txt").exists(), "nothing ran before the answer");

    let answer = |action: &str, state: &str| {
        json!({
            "inputResponses": { "approval": { "action": action, "content": { "approve": true } } },
            "requestState": state,
        })
    };
    // An answer bound to another call does not count: the question comes again.
    let forged = stateless_call_with(
        server.addr,
        &[],
        "write_file",
        &json!({ "file_path": "b.txt", "content": "x" }),
        &elicits,
        &answer("accept", &state),
    )
    .message();
    assert_eq!(forged["result"]["resultType"], "input_required", "{forged}");
    assert!(!workspace.path().join("b.txt").exists());

    let declined =
        stateless_call_with(server.addr, &[], "write_file", &write, &elicits, &answer("decline", &state))
            .message();
    assert_eq!(declined["result"]["isError"], true, "{declined}");
    assert_eq!(declined["result"]["content"][0]["text"], "Permission to use write_file denied by the user");
    assert!(!workspace.path().join("a.txt").exists());

    let accepted =
        stateless_call_with(server.addr, &[], "write_file", &write, &elicits, &answer("accept", &state))
            .message();
    assert_eq!(accepted["result"]["isError"], false, "{accepted}");
    assert_eq!(std::fs::read_to_string(workspace.path().join("a.txt")).unwrap(), "x");

    // A client without elicitation gets the denial of a run with no one to ask.
    let plain = stateless_call(server.addr, &[], "write_file", &write).message();
    let text = plain["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("write_file requires approval, and no one can be asked in this run"), "{text}");
}

#[test]
fn an_http2_client_runs_calls_at_once_on_one_connection() {
    use http_body_util::{BodyExt as _, Full};
    let workspace = tempfile::tempdir().unwrap();
    let server = support::serve_with(workspace.path(), &[bundled("sleep")], &[]);
    let addr = server.addr;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let started = std::time::Instant::now();
    let replies: Vec<Value> = runtime.block_on(async move {
        // HTTP/2 with prior knowledge, as a proxy in front of a server speaks it.
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap();
        tokio::spawn(connection);
        let calls = (0..4).map(|id| {
            let mut send = send.clone();
            async move {
                let body = stateless_body(id, "sleep", &json!({ "ms": 500 }), &json!({}), &json!({}));
                let mut request = hyper::Request::post(format!("http://{addr}/mcp"));
                for (name, value) in stateless_headers("sleep") {
                    request = request.header(name, value);
                }
                let request = request.body(Full::new(bytes::Bytes::from(body))).unwrap();
                let response = send.send_request(request).await.unwrap();
                assert_eq!(response.status(), 200);
                let body = response.into_body().collect().await.unwrap().to_bytes();
                serde_json::from_slice::<Value>(&body).unwrap()
            }
        });
        futures::future::join_all(calls).await
    });
    for (id, reply) in replies.iter().enumerate() {
        assert_eq!(reply["id"], id, "{reply}");
        assert_eq!(reply["result"]["content"][0]["text"], "Slept 500 ms", "{reply}");
    }
    // Four sleeps of half a second each, run one after another, would take two.
    assert!(started.elapsed() < Duration::from_millis(1500), "{:?}", started.elapsed());
}

#[test]
fn a_server_out_of_descriptors_says_so_once_a_time_and_serves_again_once_some_are_freed() {
    use std::os::unix::process::CommandExt as _;

    let workspace = tempfile::tempdir().unwrap();
    let mut command = support::command(workspace.path(), &TOOLS.map(bundled), &["--http", "127.0.0.1:0"]);
    // SAFETY: one setrlimit system call between fork and exec, which
    // allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 128, rlim_max: 128 };
            match libc::setrlimit(libc::RLIMIT_NOFILE, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let server = support::start(&mut command);
    // More connections than the server has descriptors left: the rest wait
    // in the listener's backlog.
    let held: Vec<TcpStream> = (0..200).map(|_| TcpStream::connect(server.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_secs(1));
    let failures = |stderr: &str| stderr.lines().filter(|line| line.contains("failed to accept")).count();
    // Once each time it runs short (a descriptor freed meanwhile ends one),
    // not once for each failed accept.
    let stderr = server.stderr();
    assert!((1..=10).contains(&failures(&stderr)), "{stderr}");
    assert!(
        stderr.contains("Too many open files") && stderr.contains("trying again every 100 ms"),
        "{stderr}"
    );
    // Closed, they give their descriptors back, and a client is served.
    drop(held);
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "room again" }));
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.message()["result"]["content"][0]["text"], "room again");
    // Said as the failure was; the line reaches the test's reader in a moment.
    let said = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        server.stderr().contains("WARN accepting a connection again")
    });
    assert!(said, "{}", server.stderr());
}

/// The CPU time, user and system, process `pid` has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

#[test]
fn a_half_sent_http2_preface_costs_the_server_nothing_while_it_waits() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &[]);
    // Openings cut short, more of each than decides nothing, and fewer.
    let stalled: Vec<TcpStream> = (0..300)
        .map(|n| {
            let mut stream = TcpStream::connect(server.addr).unwrap();
            let sent: &[u8] = if n % 2 == 0 { b"PRI * HTTP/2.0\r\n" } else { b"PR" };
            stream.write_all(sent).unwrap();
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_time(server.id());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_time(server.id()) - before;
    assert!(used < Duration::from_millis(200), "300 stalled openings used {used:?} of CPU in 2 s");
    drop(stalled);

    // An opening sent in pieces is still read as HTTP/2 once it is whole:
    // the server answers the preface with its SETTINGS frame.
    let mut pieces = TcpStream::connect(server.addr).unwrap();
    pieces.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    pieces.write_all(b"P").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    pieces.write_all(b"RI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    pieces.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    let mut frame = [0u8; 9];
    pieces.read_exact(&mut frame).unwrap();
    assert_eq!(frame[3], 4, "a SETTINGS frame first: {frame:?}");
}

/// A `GET` of `path` over HTTP/2 (with prior knowledge) naming `authority`,
/// as a proxy in front sends it: its status and body.
fn http2_get(addr: std::net::SocketAddr, authority: &str, path: &str) -> (u16, String) {
    use http_body_util::{BodyExt as _, Empty};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let uri = format!("http://{authority}{path}");
    runtime.block_on(async move {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut send, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap();
        tokio::spawn(connection);
        let request = hyper::Request::get(uri).body(Empty::<bytes::Bytes>::new()).unwrap();
        let response =
            tokio::time::timeout(Duration::from_secs(10), send.send_request(request)).await.unwrap().unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    })
}

#[test]
fn metrics_over_http2_are_served_to_an_allowed_authority_only() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &[]);
    let local = format!("127.0.0.1:{}", server.addr.port());
    let (status, body) = http2_get(server.addr, &local, "/metrics");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("keel_plugins_loaded"), "{body}");
    let (status, body) = http2_get(server.addr, "evil.example", "/metrics");
    assert_eq!(status, 403, "{body}");
}

#[test]
fn a_request_refused_for_its_host_or_origin_is_logged_only_from_debug() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &[]);
    for _ in 0..3 {
        let reply =
            request(server.addr, "POST", "/mcp", &[ACCEPT, JSON, ("host", "evil.example")], &initialize());
        assert_eq!(reply.status, 403, "{}", reply.body);
        let origin = ("origin", "http://evil.example");
        let reply = request(server.addr, "POST", "/mcp", &[ACCEPT, JSON, origin], &initialize());
        assert_eq!(reply.status, 403, "{}", reply.body);
    }
    // Lines written by now have reached the test's reader.
    std::thread::sleep(Duration::from_millis(500));
    let stderr = server.stderr();
    assert!(!stderr.contains("WARN"), "{stderr}");
}

/// What the server first answers to `head`, sent alone on a connection of
/// its own, within five seconds.
fn first_answer(addr: std::net::SocketAddr, head: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = [0u8; 512];
    let read = stream.read(&mut answer).unwrap_or_else(|error| panic!("no answer to {head:?}: {error}"));
    String::from_utf8_lossy(&answer[..read]).into_owned()
}

#[test]
fn a_declared_body_over_the_cap_is_refused_before_it_is_sent() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &["--max-body-kib", "1"]);
    let post = |more: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{}\r\naccept: application/json, text/event-stream\r\n\
             content-type: application/json\r\n{more}\r\n",
            server.addr.port()
        )
    };
    let answer = first_answer(server.addr, &post("content-length: 99999999999\r\n"));
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(answer.contains("request body exceeds 1024 bytes"), "{answer}");
    // Not invited to send it.
    let answer = first_answer(server.addr, &post("content-length: 52428800\r\nexpect: 100-continue\r\n"));
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    // A body under the cap is still invited.
    let answer = first_answer(server.addr, &post("content-length: 100\r\nexpect: 100-continue\r\n"));
    assert!(answer.starts_with("HTTP/1.1 100 "), "{answer}");
}

#[test]
fn a_body_that_stalls_ends_its_request_after_the_idle_timeout() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &["--idle-timeout-secs", "1"]);
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{}\r\naccept: application/json, text/event-stream\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"jsonrpc\"",
        server.addr.port()
    );
    stream.write_all(head.as_bytes()).unwrap();
    let started = std::time::Instant::now();
    let mut reply = Vec::new();
    let read = stream.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    assert!(read.is_ok(), "the connection was neither answered nor closed: {read:?} {reply}");
    assert!(reply.starts_with("HTTP/1.1 408 "), "{reply}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // The server goes on.
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "after" }));
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[test]
fn deleting_a_session_the_server_does_not_hold_is_not_found() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &[]);
    let reply = request(server.addr, "POST", "/mcp", &[ACCEPT, JSON], &initialize());
    let session = reply.header("mcp-session-id").expect("a session").to_string();
    let delete = |session: &str| {
        let headers = [("mcp-session-id", session), ("mcp-protocol-version", "2025-06-18")];
        request(server.addr, "DELETE", "/mcp", &headers, "")
    };
    assert_eq!(delete(&session).status, 202);
    let again = delete(&session);
    assert_eq!((again.status, again.body.as_str()), (404, "Not Found: Session not found"));
    assert_eq!(delete("no-such-session").status, 404);
}

#[test]
fn past_its_maximum_of_sessions_the_server_refuses_another() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &["--max-sessions", "2"]);
    let open = || request(server.addr, "POST", "/mcp", &[ACCEPT, JSON], &initialize());
    let first = open();
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(open().status, 200);
    let refused = open();
    assert_eq!(refused.status, 503, "{}", refused.body);
    let error = refused.message();
    assert_eq!(error["id"], 1, "{error}");
    assert_eq!(
        error["error"]["message"],
        "the server holds its maximum of 2 sessions (--max-sessions): end one with DELETE, or use the \
         stateless 2026-07-28 protocol, which needs none",
    );
    // A stateless client is served all the same.
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "still" }));
    assert_eq!(reply.status, 200, "{}", reply.body);
    // A session ended makes room for another.
    let session = first.header("mcp-session-id").unwrap();
    let headers = [("mcp-session-id", session), ("mcp-protocol-version", "2025-06-18")];
    assert_eq!(request(server.addr, "DELETE", "/mcp", &headers, "").status, 202);
    let reply = open();
    assert_eq!(reply.status, 200, "{}", reply.body);
}
