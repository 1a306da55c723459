//! Outbound HTTP: the `net` guest drives `wasi:http` directly against real
//! servers on the loopback address, under grants that name them, and tries
//! every way around the list. Each refusal is a guest-visible error or an
//! error result; the host and the other calls go on.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_host::config::Config;
use keel_host::{Event, Host, ToolResult, ToolUse};
use keel_tests::http_server::{TestServer, percent_encode};
use serde_json::{Value, json};
use tracing_subscriber::fmt::format::FmtSpan;

use crate::{block_on, events_of, guest, shared_cache};

/// What the grant-reading environment holds: one token, for the secret tests.
const TOKEN: &str = "tok-7f3a9c1e5b";

fn host(workspace: &Path, config: &str) -> Host {
    host_with_token(workspace, config, TOKEN)
}

/// [`host`], with `token` as the value of `NET_TOKEN`.
fn host_with_token(workspace: &Path, config: &str, token: &'static str) -> Host {
    let config = Config::parse(config, Path::new("keel.toml")).unwrap();
    let builder = Host::builder()
        .workspace(workspace)
        .plugins(guest("keel_guest_net"))
        .config(config)
        .environment(Arc::new(move |name| (name == "NET_TOKEN").then(|| token.to_string())))
        .cache_dir(Some(shared_cache()));
    block_on(builder.build()).unwrap()
}

/// Config granting `origin` to `net` with the secret `Authorization:
/// Bearer ${NET_TOKEN}` for it, the test CA trusted.
fn grant_with_secret(origin: &str, more: &str) -> String {
    test_ca_trusted()
        + &grant(
            &[origin.to_string()],
            &format!(
                "[plugins.net.secrets]\n{origin:?} = {{ header = \"Authorization\", value = \"Bearer ${{NET_TOKEN}}\" }}\n{more}"
            ),
        )
}

/// Config that trusts the CA of the test servers' certificates,
/// `tests/certs/ca.pem`, beside the bundled roots.
fn test_ca_trusted() -> String {
    format!("[network]\nroots = [{:?}]\n", concat!(env!("CARGO_MANIFEST_DIR"), "/certs/ca.pem"))
}

/// A grant of `entries` to the `net` tool, and `more` config after it.
fn grant(entries: &[String], more: &str) -> String {
    let entries: Vec<String> = entries.iter().map(|entry| format!("{entry:?}")).collect();
    format!("[plugins.net]\nnetwork = [{}]\n{more}", entries.join(", "))
}

fn origin(server: &TestServer) -> String {
    format!("http://127.0.0.1:{}", server.port())
}

fn get(url: &str) -> Value {
    json!({ "method": "GET", "url": url })
}

/// One call of `net` with `input`: its outcome entries, the result, and the
/// events of the run.
fn call(host: &Host, input: Value) -> (Vec<Value>, ToolResult, Vec<Event>) {
    let (events, mut results, _) = events_of(host, vec![ToolUse::new("n", "net", input)]);
    let result = results.remove(0);
    assert!(!result.is_error, "the call itself succeeds: {}", result.content);
    (entries_of(host, &result), result, events)
}

/// The outcome entries of `net`'s result, read from the file it was
/// persisted to when it was too large to keep in the message.
fn entries_of(host: &Host, result: &ToolResult) -> Vec<Value> {
    let mut text = result.content.text().to_string();
    if text.starts_with("<persisted-output>") {
        let path = text.lines().find_map(|line| line.split("saved to: ").nth(1)).expect("a persisted path");
        text = std::fs::read_to_string(host.workspace().join(path.trim())).unwrap();
    }
    serde_json::from_str(&text)
        .unwrap_or_else(|error| panic!("net's output is a JSON array ({error}): {text}"))
}

/// [`call`] on a runtime of one thread, with the host's log captured: the
/// outcome entries, the result, the events and the log text.
fn call_logged(host: &Host, input: Value) -> (Vec<Value>, ToolResult, Vec<Event>, String) {
    let run = async {
        let mut run = host.start_batch(vec![ToolUse::new("n", "net", input)], keel_host::context::initial());
        let mut events = Vec::new();
        while let Some(event) = run.next_event().await {
            events.push(event);
        }
        (events, run.finish().await.results)
    };
    let ((events, mut results), text) = crate::logged(run, FmtSpan::NONE);
    let result = results.remove(0);
    let entries = entries_of(host, &result);
    (entries, result, events, text)
}

fn status(entry: &Value) -> Option<u64> {
    entry["status"].as_u64()
}

fn error(entry: &Value) -> &str {
    entry["error"].as_str().unwrap_or_else(|| panic!("expected an error, got {entry}"))
}

fn refusals(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|event| match event {
            Event::NetworkRefused { url, reason, .. } => Some((url.clone(), reason.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn requests_are_allowed_and_refused_by_scheme_host_wildcard_and_port() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let port = server.port();
    let host =
        host(workspace.path(), &grant(&[origin(&server), format!("http://*.keel.invalid:{port}")], ""));
    let (entries, _, events) = call(
        &host,
        json!({ "requests": [
            get(&server.url("/hello")),
            get(&format!("https://127.0.0.1:{port}/hello")),
            get(&format!("http://127.0.0.1:{}/hello", port.wrapping_add(1).max(1))),
            get(&format!("http://localhost:{port}/hello")),
            get(&format!("http://keel.invalid:{port}/hello")),
            get(&format!("http://api.keel.invalid:{port}/hello")),
            get(&format!("http://api.keel.invalid:{}/hello", port.wrapping_add(1).max(1))),
        ]}),
    );
    assert_eq!(status(&entries[0]), Some(200), "{}", entries[0]);
    assert_eq!(entries[0]["body"], "hello from the test server");
    assert!(
        error(&entries[1]).contains(&format!("https://127.0.0.1:{port} is not granted")),
        "{}",
        entries[1]
    );
    assert!(error(&entries[2]).contains("is not granted"), "another port: {}", entries[2]);
    assert!(
        error(&entries[3]).contains(&format!("http://localhost:{port} is not granted")),
        "{}",
        entries[3]
    );
    assert!(error(&entries[4]).contains("is not granted"), "`*.` needs a label in front: {}", entries[4]);
    // A name the wildcard grants gets as far as resolving it, which fails.
    assert!(!error(&entries[5]).contains("not granted"), "the wildcard grants it: {}", entries[5]);
    assert!(error(&entries[6]).contains("is not granted"), "the wildcard's port: {}", entries[6]);
    let refused: Vec<_> = refusals(&events).into_iter().map(|(url, _)| url).collect();
    assert_eq!(refused.len(), 5, "each refusal is an event naming its URL: {refused:?}");
    assert!(refused[0].starts_with("https://127.0.0.1:"), "{refused:?}");
    assert_eq!(server.requests().len(), 1, "only the granted request reached the server");
}

#[test]
fn a_url_whose_port_is_not_a_number_is_refused_naming_it() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    // Port 80 is granted too: such a URL was judged as one without a port.
    let host = host(workspace.path(), &grant(&[origin(&server), "http://127.0.0.1".into()], ""));
    let urls =
        ["http://127.0.0.1:0x4721/", "http://127.0.0.1:99999/", "http://127.0.0.1:/", "http://127.0.0.1:0/"];
    let (entries, _, events) = call(&host, json!({ "requests": urls.map(get) }));
    for (url, entry) in urls.iter().zip(&entries) {
        assert_eq!(error(entry), format!("the port of {url} is not a number from 1 to 65535"), "{url}");
    }
    assert_eq!(refusals(&events).len(), urls.len());
    assert!(server.requests().is_empty());
}

#[test]
fn the_fetch_tool_asks_for_a_body_as_it_is() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let config = format!("[plugins.fetch]\nnetwork = [{:?}]\n", origin(&server));
    let config = Config::parse(&config, Path::new("keel.toml")).unwrap();
    let host =
        block_on(crate::host_of(workspace.path(), &["keel_tool_fetch"]).config(config).build()).unwrap();
    let (_, results, _) =
        events_of(&host, vec![ToolUse::new("f", "fetch", json!({ "url": server.url("/echo") }))]);
    assert!(!results[0].is_error, "{}", results[0].content);
    // A compressed body is one fetch cannot read: it asks for none.
    assert_eq!(server.requests()[0].header("accept-encoding"), Some("identity"));
}

#[test]
fn a_bad_entry_stops_the_host_naming_it() {
    let workspace = tempfile::tempdir().unwrap();
    let config =
        Config::parse(&grant(&["https://api.github.com/repos".into()], ""), Path::new("keel.toml")).unwrap();
    let error = block_on(Host::builder().workspace(workspace.path()).config(config).cache_dir(None).build())
        .err()
        .expect("the host refuses the grant")
        .to_string();
    assert_eq!(
        error,
        "invalid grant [plugins.\"net\"]: network entry \"https://api.github.com/repos\" has a path; \
         an entry is scheme://host[:port]"
    );
}

#[test]
fn a_redirect_is_a_response_and_its_next_hop_is_checked_like_any_request() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let elsewhere = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], ""));
    let target = elsewhere.url("/hello");
    let (entries, _, events) = call(
        &host,
        json!({ "requests": [get(&server.url(&format!("/redirect?to={}", percent_encode(&target)))), get(&target)] }),
    );
    assert_eq!(status(&entries[0]), Some(302), "the guest sees the redirect: {}", entries[0]);
    let location = entries[0]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|pair| pair[0].as_str().is_some_and(|name| name.eq_ignore_ascii_case("location")))
        .map(|pair| pair[1].as_str().unwrap().to_string());
    assert_eq!(location.as_deref(), Some(target.as_str()));
    assert!(error(&entries[1]).contains("is not granted"), "{}", entries[1]);
    assert_eq!(refusals(&events)[0].0, target);
    assert!(elsewhere.requests().is_empty(), "nothing reached the host that was not granted");
}

#[test]
fn a_name_granted_is_no_grant_of_the_loopback_address_it_resolves_to() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let port = server.port();
    let by_name = format!("http://localhost:{port}");
    let host = host(workspace.path(), &grant(std::slice::from_ref(&by_name), ""));
    let (entries, _, events) = call(&host, json!({ "requests": [get(&format!("{by_name}/hello"))] }));
    assert!(
        error(&entries[0]).contains("localhost resolves to ") && error(&entries[0]).contains("loopback"),
        "{}",
        entries[0]
    );
    assert!(refusals(&events)[0].1.contains("which no network entry names"), "{:?}", refusals(&events));
    assert!(server.requests().is_empty());

    // Named as an address too, the same request goes.
    let host = self::host(workspace.path(), &grant(&[by_name.clone(), origin(&server)], ""));
    let (entries, _, _) = call(&host, json!({ "requests": [get(&format!("{by_name}/hello"))] }));
    assert_eq!(status(&entries[0]), Some(200), "{}", entries[0]);
}

#[test]
fn cloud_metadata_and_mapped_ipv6_loopback_are_judged_as_what_they_are() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let port = server.port();
    let host =
        host(workspace.path(), &grant(&[format!("http://localhost:{port}"), "http://*.internal".into()], ""));
    let mapped = format!("http://[::ffff:127.0.0.1]:{port}/hello");
    let (entries, _, _) = call(
        &host,
        json!({ "requests": [get("http://169.254.169.254/latest/meta-data/"), get(&mapped), get("http://[::ffff:a9fe:a9fe]/")] }),
    );
    for entry in &entries {
        assert!(error(entry).contains("is not granted"), "{entry}");
    }
    assert!(server.requests().is_empty());

    // A grant of the IPv4 loopback address admits its mapped IPv6 form, as
    // the same address; a grant of everything still does not reach metadata
    // unless it names the link-local range.
    let host = self::host(workspace.path(), &grant(&[origin(&server), "http://0.0.0.0/1".into()], ""));
    let (entries, _, _) = call(&host, json!({ "requests": [get(&mapped), get("http://169.254.169.254/")] }));
    assert_eq!(status(&entries[0]), Some(200), "judged as 127.0.0.1: {}", entries[0]);
    assert!(error(&entries[1]).contains("is not granted"), "{}", entries[1]);
}

#[test]
fn a_body_past_the_download_cap_fails_naming_the_limit() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], "[limits]\nnetwork_received_mib = 1\n"));
    let (entries, _, _) = call(
        &host,
        json!({ "requests": [get(&server.url("/bytes?n=600000")), get(&server.url("/bytes?n=600000"))] }),
    );
    assert_eq!(status(&entries[0]), Some(200), "within the cap: {}", entries[0]);
    assert_eq!(entries[0]["body"].as_str().unwrap().len(), 600_000);
    assert!(
        error(&entries[1]).contains("network download limit (network_received_mib) of 1 MiB reached"),
        "the cap is per call, over all its requests: {}",
        entries[1]
    );
}

#[test]
fn a_request_body_past_the_upload_cap_fails_naming_the_limit() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], "[limits]\nnetwork_sent_mib = 1\n"));
    let body = "x".repeat(1_200_000);
    let (entries, _, _) =
        call(&host, json!({ "requests": [{ "method": "POST", "url": server.url("/echo"), "body": body }] }));
    assert!(
        error(&entries[0]).contains("network upload limit (network_sent_mib) of 1 MiB reached"),
        "{}",
        entries[0]
    );
}

#[test]
fn a_requests_url_and_headers_count_against_the_upload_cap() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], "[limits]\nnetwork_sent_mib = 1\n"));
    // No body at all: 50 KB a request in a header and 10 KB in the URL.
    let request = json!({
        "method": "GET",
        "url": server.url(&format!("/hello?pad={}", "u".repeat(10_000))),
        "headers": [["x-pad", "h".repeat(50_000)]],
    });
    let (entries, _, _) = call(&host, json!({ "requests": vec![request; 20] }));
    let sent = entries.iter().take_while(|entry| status(entry) == Some(200)).count();
    assert_eq!(sent, 17, "17 heads of 60 KB fit in 1 MiB, the 18th does not: {entries:?}");
    for entry in &entries[sent..] {
        assert!(error(entry).contains("network upload limit (network_sent_mib) of 1 MiB reached"), "{entry}");
    }
    assert_eq!(server.requests().len(), 17);
}

#[test]
fn a_requests_trailers_count_against_the_upload_cap() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], "[limits]\nnetwork_sent_mib = 1\n"));
    // A small head and body, and 15 KB a request in three trailers (which
    // HTTP/1.1 sends once the head declares them, and the server takes up
    // to 16 KiB of).
    let names = ["x-t0", "x-t1", "x-t2"];
    let request = json!({
        "method": "POST",
        "url": server.url("/echo"),
        "headers": [["trailer", names.join(", ")]],
        "body": "b",
        "trailers": names.map(|name| [name.to_string(), "t".repeat(5_000)]),
    });
    let (entries, _, _) = call(&host, json!({ "requests": vec![request; 75] }));
    let sent = entries.iter().take_while(|entry| status(entry) == Some(200)).count();
    assert_eq!(sent, 69, "69 requests of 15 KB fit in 1 MiB, the 70th does not: {entries:?}");
    for entry in &entries[sent..] {
        assert!(error(entry).contains("network upload limit (network_sent_mib) of 1 MiB reached"), "{entry}");
    }
}

#[test]
fn a_path_that_is_only_a_query_goes_out_as_slash_and_query() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], ""));
    let (entries, _, _) = call(
        &host,
        json!({ "requests": [{ "method": "GET", "url": origin(&server), "path": "?a=b" }, get(&server.url("/hello"))] }),
    );
    assert_eq!(status(&entries[0]), Some(404), "{}", entries[0]);
    assert_eq!(status(&entries[1]), Some(200), "the connection still serves: {}", entries[1]);
    assert_eq!(server.requests()[0].path, "/?a=b");

    // Over HTTP/2 too, where the path is the `:path` pseudo-header.
    let server = TestServer::start_tls();
    let origin = format!("https://127.0.0.1:{}", server.port());
    let host = self::host(workspace.path(), &(test_ca_trusted() + &grant(std::slice::from_ref(&origin), "")));
    let (entries, _, _) =
        call(&host, json!({ "requests": [{ "method": "GET", "url": origin, "path": "?a=b" }] }));
    assert_eq!(status(&entries[0]), Some(404), "{}", entries[0]);
    assert_eq!(server.requests()[0].path, "/?a=b");
}

#[test]
fn a_secret_echoed_in_a_trailer_is_masked_and_trailers_arrive_after_a_body() {
    let workspace = tempfile::tempdir().unwrap();
    for server in [TestServer::start(), TestServer::start_tls()] {
        let origin = server.url("").trim_end_matches('/').to_string();
        let config = test_ca_trusted()
            + &grant(
                std::slice::from_ref(&origin),
                &format!(
                    "[plugins.net.secrets]\n{origin:?} = {{ header = \"Authorization\", value = \"Bearer ${{NET_TOKEN}}\" }}\n"
                ),
            );
        let host = host(workspace.path(), &config);
        let te = json!([["te", "trailers"], ["x-probe", "abc"]]);
        let (entries, _, _) = call(
            &host,
            json!({ "requests": [
                { "method": "GET", "url": server.url("/trailer?name=authorization"), "headers": te },
                { "method": "GET", "url": server.url("/trailer?name=x-probe&body=some%20text"), "headers": te },
            ]}),
        );
        assert!(!format!("{entries:?}").contains(TOKEN), "the echoed secret is masked: {entries:?}");
        let trailer = |entry: &Value| entry["trailers"][0].clone();
        assert_eq!(trailer(&entries[0])[0], "x-echo", "{}", entries[0]);
        assert!(trailer(&entries[0])[1].as_str().unwrap().starts_with("*******"), "{}", entries[0]);
        assert_eq!(entries[1]["body"], "some text");
        assert_eq!(trailer(&entries[1]), json!(["x-echo", "abc"]), "kept after a body: {}", entries[1]);
    }
}

#[test]
fn a_secret_echoed_in_a_response_header_name_is_masked_whatever_its_case() {
    // HTTP hands header names over lowercase: a token with capitals comes
    // back in another case than it was sent in.
    const MIXED: &str = "Tok-7F3A9c1E5b";
    let workspace = tempfile::tempdir().unwrap();
    for server in [TestServer::start(), TestServer::start_tls()] {
        let origin = server.url("").trim_end_matches('/').to_string();
        let host = host_with_token(workspace.path(), &grant_with_secret(&origin, ""), MIXED);
        let (entries, _, _) =
            call(&host, json!({ "requests": [get(&server.url("/echo-header-name?name=authorization"))] }));
        assert_eq!(status(&entries[0]), Some(200), "{}", entries[0]);
        let names: Vec<&str> = entries[0]["headers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|pair| pair[1] == "x")
            .map(|pair| pair[0].as_str().unwrap())
            .collect();
        assert_eq!(names, ["bearer", "**************"], "the token's name is masked: {}", entries[0]);
        assert!(!entries[0].to_string().to_lowercase().contains(&MIXED.to_lowercase()), "{}", entries[0]);
    }
}

#[test]
fn a_server_that_never_answers_ends_inside_the_limits() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], "[limits]\nnetwork_response_ms = 300\n"));
    let started = Instant::now();
    let (entries, _, _) =
        call(&host, json!({ "requests": [get(&server.url("/never")), get(&server.url("/stall-body"))] }));
    assert!(
        error(&entries[0]).contains("network response timeout (network_response_ms) of 300ms reached"),
        "{}",
        entries[0]
    );
    assert!(error(&entries[1]).contains("stalled"), "a body that stops: {}", entries[1]);
    assert!(started.elapsed() < Duration::from_secs(20), "long before the default limits");

    // With a deadline shorter than the response limit, the deadline wins,
    // and the guest still hears why before its call ends.
    let host = self::host(workspace.path(), &grant(&[origin(&server)], "[limits]\ndeadline_ms = 1500\n"));
    let (entries, _, _) = call(&host, json!({ "requests": [get(&server.url("/never"))] }));
    assert!(error(&entries[0]).contains("the call's deadline is near"), "{}", entries[0]);
}

#[test]
fn requests_and_connections_past_their_caps_are_refused_naming_the_limit() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], "[limits]\nnetwork_requests = 3\n"));
    let hello = get(&server.url("/hello"));
    let (entries, _, events) = call(&host, json!({ "requests": vec![hello; 8] }));
    assert!(entries[..3].iter().all(|entry| status(entry) == Some(200)), "{entries:?}");
    for entry in &entries[3..] {
        assert!(
            error(entry).contains("network request limit (network_requests) of 3 requests reached"),
            "{entry}"
        );
    }
    // Past the cap the refusals are reported once, not once a request.
    assert_eq!(refusals(&events).len(), 1);
    assert_eq!(server.requests().len(), 3);

    // Refused requests count too: a guest looping on a host it may not
    // reach is stopped by the cap, and reports no more than it allows.
    let refused = get("http://169.254.169.254/");
    let (entries, _, events) = call(&host, json!({ "requests": vec![refused; 50] }));
    assert!(entries[..3].iter().all(|entry| error(entry).contains("is not granted")), "{entries:?}");
    assert!(entries[3..].iter().all(|entry| error(entry).contains("(network_requests) of 3")), "{entries:?}");
    assert_eq!(refusals(&events).len(), 4, "three refused by the grant, then the cap once");

    let limits = "[limits]\nnetwork_connections = 2\nnetwork_response_ms = 300\n";
    let host = self::host(workspace.path(), &grant(&[origin(&server)], limits));
    let (entries, _, _) =
        call(&host, json!({ "concurrent": true, "requests": vec![get(&server.url("/never")); 3] }));
    assert!(entries[..2].iter().all(|entry| error(entry).contains("network_response_ms")), "{entries:?}");
    assert!(
        error(&entries[2])
            .contains("network connection limit (network_connections) of 2 connections reached"),
        "{entries:?}"
    );
}

#[test]
fn a_calls_requests_to_one_origin_share_a_connection_and_calls_do_not() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], ""));
    let requests = json!([
        get(&server.url("/hello")),
        { "method": "POST", "url": server.url("/echo"), "body": "second" },
        get(&server.url("/bytes?n=10000")),
        get(&server.url("/status?code=404")),
        get(&server.url("/hello")),
    ]);
    let (entries, _, _) = call(&host, json!({ "requests": requests }));
    let statuses: Vec<Option<u64>> = entries.iter().map(status).collect();
    assert_eq!(statuses, [Some(200), Some(200), Some(200), Some(404), Some(200)]);
    assert!(entries[1]["body"].as_str().unwrap().contains("second"), "{}", entries[1]);
    assert_eq!(server.requests().len(), 5);
    assert_eq!(server.connections(), 1, "each request after the first went over the first's connection");

    // The next call opens its own: nothing of one call's network outlives it.
    let (entries, _, _) = call(&host, json!({ "requests": [get(&server.url("/hello"))] }));
    assert_eq!(status(&entries[0]), Some(200), "{}", entries[0]);
    assert_eq!(server.connections(), 2);

    // Requests sent at once each get a connection: none waits behind another.
    let (entries, _, _) =
        call(&host, json!({ "concurrent": true, "requests": vec![get(&server.url("/hello")); 3] }));
    let statuses: Vec<Option<u64>> = entries.iter().map(status).collect();
    assert_eq!(statuses, [Some(200); 3]);
    assert_eq!(server.connections(), 5);
}

#[test]
fn idle_connections_give_their_places_to_new_ones_under_the_connection_cap() {
    let workspace = tempfile::tempdir().unwrap();
    let servers = [TestServer::start(), TestServer::start(), TestServer::start()];
    let origins: Vec<String> = servers.iter().map(origin).collect();
    let host = host(workspace.path(), &grant(&origins, "[limits]\nnetwork_connections = 2\n"));
    // Three origins one after another, then the second again: at most two
    // connections are open at once, so the third closes the first's, and
    // the second's is still there to go over.
    let requests: Vec<Value> =
        servers.iter().chain([&servers[1]]).map(|server| get(&server.url("/hello"))).collect();
    let (entries, _, _) = call(&host, json!({ "requests": requests }));
    let statuses: Vec<Option<u64>> = entries.iter().map(status).collect();
    assert_eq!(statuses, [Some(200); 4]);
    let connections: Vec<usize> = servers.iter().map(TestServer::connections).collect();
    assert_eq!(connections, [1, 1, 1]);
}

/// A server on loopback that answers every request on a connection with
/// `body`, writing its head and its body apart with Nagle's algorithm on,
/// as some servers do: the body waits until the client acknowledges the
/// head, over TLS when `tls` is set. It takes `connections` connections at
/// most, each until the client closes it (closing would send what Nagle's
/// algorithm holds).
fn two_write_server(body: &'static str, tls: bool, connections: usize) -> (std::net::SocketAddr, Arc<Seen>) {
    pieces_server(body, body.len(), Duration::ZERO, tls, connections)
}

/// What a [`pieces_server`] saw.
#[derive(Default)]
struct Seen {
    /// The connections it took.
    connections: std::sync::atomic::AtomicUsize,
    /// Of those over TLS, the ones whose client resumed an earlier session.
    resumed: std::sync::atomic::AtomicUsize,
    /// For each request after a connection's first, how long after the
    /// last write of the response before it the request had come in whole.
    gaps: std::sync::Mutex<Vec<Duration>>,
}

impl Seen {
    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn resumed(&self) -> usize {
        self.resumed.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// [`two_write_server`] writing the body in writes of `piece` bytes,
/// `pause` apart, as a server that sends a body as it makes it: over TLS
/// each write is a record of its own, and with Nagle's algorithm on each
/// waits until the one before it is acknowledged.
fn pieces_server(
    body: &'static str,
    piece: usize,
    pause: Duration,
    tls: bool,
    connections: usize,
) -> (std::net::SocketAddr, Arc<Seen>) {
    use std::io::{Read, Write};
    trait Stream: Read + Write {}
    impl<S: Read + Write> Stream for S {}
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let config = keel_tests::http_server::tls_config(&[b"http/1.1"]);
    let server_seen = seen.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming().map_while(Result::ok).take(connections) {
            server_seen.connections.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (config, seen) = (config.clone(), server_seen.clone());
            std::thread::spawn(move || {
                let mut stream: Box<dyn Stream> = if tls {
                    let (mut server, mut tcp) = (rustls::ServerConnection::new(config).unwrap(), tcp);
                    while server.is_handshaking() {
                        if server.complete_io(&mut tcp).is_err() {
                            return;
                        }
                    }
                    if server.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                        seen.resumed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Box::new(rustls::StreamOwned::new(server, tcp))
                } else {
                    Box::new(tcp)
                };
                let mut request = Vec::new();
                let mut buffer = [0; 4096];
                let mut answered = None;
                while let Ok(read @ 1..) = stream.read(&mut buffer) {
                    request.extend_from_slice(&buffer[..read]);
                    // A GET ends with its head; answer each as it arrives.
                    while let Some(end) = request.windows(4).position(|window| window == b"\r\n\r\n") {
                        request.drain(..end + 4);
                        if let Some(answered) = answered {
                            seen.gaps.lock().unwrap().push(Instant::now().duration_since(answered));
                        }
                        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                        let written = stream.write_all(head.as_bytes()).and_then(|()| {
                            body.as_bytes().chunks(piece).try_for_each(|piece| {
                                std::thread::sleep(pause);
                                stream.write_all(piece)
                            })
                        });
                        if written.is_err() {
                            return;
                        }
                        answered = Some(Instant::now());
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[test]
fn a_kept_open_connection_does_not_wait_on_delayed_acknowledgements() {
    let workspace = tempfile::tempdir().unwrap();
    let (addr, seen) = two_write_server("a body in a write of its own", false, 4);
    let url = format!("http://{addr}/");
    let host = host(workspace.path(), &grant(&[format!("http://{addr}")], ""));
    let started = std::time::Instant::now();
    let (entries, _, _) = call(&host, json!({ "requests": vec![get(&url); 20] }));
    let took = started.elapsed();
    let statuses: Vec<Option<u64>> = entries.iter().map(status).collect();
    assert_eq!(statuses, [Some(200); 20]);
    assert_eq!(entries[19]["body"], "a body in a write of its own");
    assert_eq!(seen.connections(), 1);
    // Each request after the first would wait 40 ms for the kernel's
    // delayed acknowledgement of the head: 760 ms in all.
    assert!(took < std::time::Duration::from_millis(400), "20 requests took {took:?}");
}

#[test]
fn a_new_tls_connection_does_not_wait_on_delayed_acknowledgements() {
    let workspace = tempfile::tempdir().unwrap();
    let (addr, seen) = two_write_server("a body in a record of its own", true, 5);
    let url = format!("https://{addr}/");
    let host = host(workspace.path(), &(test_ca_trusted() + &grant(&[format!("https://{addr}")], "")));
    let started = std::time::Instant::now();
    // Each call opens a connection of its own.
    for _ in 0..5 {
        let (entries, _, _) = call(&host, json!({ "requests": [get(&url), get(&url)] }));
        let statuses: Vec<Option<u64>> = entries.iter().map(status).collect();
        assert_eq!(statuses, [Some(200); 2], "{entries:?}");
        assert_eq!(entries[1]["body"], "a body in a record of its own");
    }
    let took = started.elapsed();
    assert_eq!(seen.connections(), 5);
    // The first request after each handshake would wait 40 ms for the
    // kernel's delayed acknowledgement of the response's head: 200 ms in all.
    assert!(took < std::time::Duration::from_millis(120), "5 calls took {took:?}");
}

#[test]
fn a_call_resumes_no_tls_session_of_an_earlier_call() {
    let workspace = tempfile::tempdir().unwrap();
    let (addr, seen) = two_write_server("one call's answer", true, 3);
    let url = format!("https://{addr}/");
    let host = host(workspace.path(), &(test_ca_trusted() + &grant(&[format!("https://{addr}")], "")));
    for _ in 0..3 {
        let (entries, _, _) = call(&host, json!({ "requests": [get(&url)] }));
        assert_eq!(status(&entries[0]), Some(200), "{}", entries[0]);
    }
    assert_eq!(seen.connections(), 3);
    // A resumed session would tell the server the calls are one client's.
    assert_eq!(seen.resumed(), 0, "each call's handshake is a full one");
}

#[test]
fn a_body_in_pieces_does_not_wait_on_delayed_acknowledgements() {
    let workspace = tempfile::tempdir().unwrap();
    let body: &'static str = "x".repeat(200_000).leak();
    let (addr, seen) = pieces_server(body, 16 * 1024, Duration::from_micros(100), true, 1);
    let url = format!("https://{addr}/");
    let host = host(workspace.path(), &(test_ca_trusted() + &grant(&[format!("https://{addr}")], "")));
    let (entries, _, _) = call(&host, json!({ "requests": vec![get(&url); 40] }));
    let statuses: Vec<Option<u64>> = entries.iter().map(status).collect();
    assert_eq!(statuses, [Some(200); 40]);
    assert_eq!(entries[39]["body"].as_str().map(str::len), Some(body.len()));
    assert_eq!(seen.connections(), 1);
    // A piece held for the kernel's delayed acknowledgement of the one
    // before it holds the next request back 40 ms or more; a request
    // otherwise follows its response within a few. Once the connection
    // goes back and forth, most responses of this size met such a wait
    // when the client acknowledged only after writing. One slow gap is
    // allowed for a busy machine.
    let gaps = seen.gaps.lock().unwrap().clone();
    let held = gaps.iter().filter(|gap| **gap >= Duration::from_millis(40)).count();
    assert!(
        held <= 1,
        "{held} of {} requests came 40 ms or more after the response before: {gaps:?}",
        gaps.len()
    );
}

#[test]
fn a_call_that_is_not_open_world_gets_no_network_nor_do_questions() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], ""));
    let (entries, _, events) =
        call(&host, json!({ "open_world": false, "requests": [get(&server.url("/hello"))] }));
    assert!(error(&entries[0]).contains("not open-world"), "{}", entries[0]);
    assert!(refusals(&events)[0].1.contains("is-open-world"));

    // A question that reaches for the network is refused: the call goes on.
    let (entries, _, _) = call(
        &host,
        json!({ "request_in_question": server.url("/hello"), "requests": [get(&server.url("/hello"))] }),
    );
    assert_eq!(status(&entries[0]), Some(200), "{}", entries[0]);
    assert_eq!(server.requests().len(), 1, "only the call's own request arrived");

    // A plugin with no grant has no network at all.
    let host = self::host(workspace.path(), "");
    let (entries, _, _) = call(&host, json!({ "requests": [get(&server.url("/hello"))] }));
    assert!(error(&entries[0]).contains("no network grant"), "{}", entries[0]);
}

#[test]
fn a_secret_reaches_the_server_and_never_the_guest_the_result_or_the_log() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let config = grant(
        &[origin(&server)],
        &format!(
            "[plugins.net.secrets]\n{:?} = {{ header = \"Authorization\", value = \"Bearer ${{NET_TOKEN}}\" }}\n",
            origin(&server)
        ),
    );
    let host = host(workspace.path(), &config);
    let (entries, result, events, log) = call_logged(
        &host,
        json!({ "requests": [
            get(&server.url("/echo")),
            get(&server.url("/echo-header?name=authorization")),
            // The guest's own Authorization header is replaced, not sent beside it.
            { "method": "GET", "url": server.url("/echo"), "headers": [["authorization", "Basic guest"]] },
            // A refusal is logged with its URL, never with a header.
            get("http://169.254.169.254/"),
        ]}),
    );
    let seen = server.requests();
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(seen[0].header("authorization"), Some(bearer.as_str()), "the server got it");
    assert_eq!(seen[2].header("authorization"), Some(bearer.as_str()));
    assert_eq!(seen[2].headers.iter().filter(|(name, _)| name == "authorization").count(), 1);
    let everything = format!("{entries:?} {result:?} {events:?}");
    assert!(!everything.contains(TOKEN), "the echoed secret is masked: {everything}");
    assert!(entries[0]["body"].as_str().unwrap().contains("*****"), "{}", entries[0]);
    assert!(entries[1]["body"].as_str().unwrap().starts_with("******"), "{}", entries[1]);
    let echoed = entries[1]["headers"].to_string();
    assert!(echoed.contains("x-echo") && !echoed.contains(TOKEN), "in headers too: {echoed}");
    assert!(log.contains("network request refused"), "the log has the refusal: {log}");
    assert!(!log.contains(TOKEN), "the host's log never shows it: {log}");

    // A secret for an origin the grant does not name stops the host.
    let config = Config::parse(
        &grant(
            &[origin(&server)],
            "[plugins.net.secrets]\n\"https://api.github.com\" = { header = \"Authorization\", value = \"x\" }\n",
        ),
        Path::new("keel.toml"),
    )
    .unwrap();
    let error = block_on(Host::builder().workspace(workspace.path()).config(config).cache_dir(None).build())
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("its origin is not granted by `network`"), "{error}");
    // And so does a variable that is not set, named.
    let config = Config::parse(
        &grant(
            &[origin(&server)],
            &format!(
                "[plugins.net.secrets]\n{:?} = {{ header = \"Authorization\", value = \"${{KEEL_TEST_UNSET_VAR}}\" }}\n",
                origin(&server)
            ),
        ),
        Path::new("keel.toml"),
    )
    .unwrap();
    let error = block_on(
        Host::builder()
            .workspace(workspace.path())
            .config(config)
            .environment(Arc::new(|_| None))
            .cache_dir(None)
            .build(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(error.ends_with("environment variable KEEL_TEST_UNSET_VAR is not set"), "{error}");
}

#[test]
fn raw_sockets_and_name_lookups_stay_closed() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], ""));
    let (entries, _, _) =
        call(&host, json!({ "requests": [], "socket": server.addr().to_string(), "lookup": "localhost" }));
    let socket = entries.iter().find_map(|entry| entry["socket"].as_str()).expect("a socket outcome");
    let lookup = entries.iter().find_map(|entry| entry["lookup"].as_str()).expect("a lookup outcome");
    assert_ne!(socket, "ok", "a raw connect is refused even to a granted address");
    assert!(!lookup.contains("127.0.0.1"), "no name lookup: {lookup}");
    assert!(server.requests().is_empty());
}

#[test]
fn a_refused_request_leaves_the_other_calls_and_the_host_going() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start();
    let host = host(workspace.path(), &grant(&[origin(&server)], ""));
    let uses = vec![
        ToolUse::new("a", "net", json!({ "requests": [get("http://169.254.169.254/")] })),
        ToolUse::new("b", "net", json!({ "requests": [get(&server.url("/hello"))] })),
        ToolUse::new("c", "net", json!({ "requests": [get(&server.url("/never"))], "open_world": false })),
    ];
    let (_, results, _) = events_of(&host, uses);
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|result| !result.is_error), "{results:?}");
    assert!(results[1].content.text().contains("hello from the test server"));
}

#[test]
fn https_is_verified_and_speaks_http2_when_the_server_offers_it() {
    let workspace = tempfile::tempdir().unwrap();
    let server = TestServer::start_tls();
    let origin = format!("https://127.0.0.1:{}", server.port());

    // With the bundled roots only, the test CA is nobody: the handshake
    // fails, and the tool hears why.
    let host = host(workspace.path(), &grant(std::slice::from_ref(&origin), ""));
    let (entries, _, _) = call(&host, json!({ "requests": [get(&server.url("/hello"))] }));
    assert_eq!(
        error(&entries[0]),
        "the TLS handshake failed: invalid peer certificate: UnknownIssuer",
        "{}",
        entries[0]
    );
    assert!(server.requests().is_empty());

    // Trusted through `[network] roots`, the same request goes, over HTTP/2.
    let config = test_ca_trusted() + &grant(std::slice::from_ref(&origin), "");
    let host = self::host(workspace.path(), &config);
    let (entries, _, _) = call(
        &host,
        json!({ "requests": [get(&server.url("/hello")), { "method": "POST", "url": server.url("/echo"), "body": "over h2" }] }),
    );
    assert_eq!(status(&entries[0]), Some(200), "{}", entries[0]);
    assert_eq!(entries[0]["body"], "hello from the test server");
    assert!(entries[1]["body"].as_str().unwrap().contains("over h2"), "{}", entries[1]);
    let seen = server.requests();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|request| request.version == "HTTP/2.0"), "{seen:?}");
    // The first call's handshake failed; the second call's two requests
    // went over one connection.
    assert_eq!(server.connections(), 2);
}
