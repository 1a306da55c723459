//! `GET /metrics` of `keel serve`: counters that move by exactly the calls a
//! client made, read back with a parser of the Prometheus text format; the
//! token on the MCP listener; `--metrics-addr` and its loopback rule.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use support::http::{request, stateless_call};
use support::{Serving, bundled};

mod support;

/// `keel serve --http 127.0.0.1:0` over `workspace` with `echo` and
/// `fetch`, and `flags`.
fn serve(workspace: &Path, flags: &[&str]) -> Serving {
    support::serve_with(workspace, &[bundled("echo"), bundled("fetch")], flags)
}

/// The samples of `/metrics` at `addr`, parsed; panics unless it is served.
fn scrape(addr: SocketAddr, headers: &[(&str, &str)]) -> prometheus_parse::Scrape {
    let reply = request(addr, "GET", "/metrics", headers, "");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        reply.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{:?}",
        reply.headers
    );
    let lines = reply.body.lines().map(|line| Ok(line.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("the text format")
}

/// The value of the sample `name` whose labels include `labels`; `None` when
/// there is none.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let sample = scrape.samples.iter().find(|sample| {
        sample.metric == name && labels.iter().all(|(key, want)| sample.labels.get(key) == Some(*want))
    })?;
    match &sample.value {
        prometheus_parse::Value::Counter(value)
        | prometheus_parse::Value::Gauge(value)
        | prometheus_parse::Value::Untyped(value) => Some(*value),
        prometheus_parse::Value::Histogram(buckets) => buckets.last().map(|bucket| bucket.count),
        other => panic!("{name}: a value of one number, not {other:?}"),
    }
}

#[test]
fn the_counters_move_by_exactly_the_calls_made() {
    let workspace = tempfile::tempdir().unwrap();
    // fetch may reach one loopback port, which nothing here asks for: its
    // request elsewhere is refused before anything is sent.
    std::fs::write(
        workspace.path().join("keel.toml"),
        "[plugins.fetch]\nnetwork = [\"http://127.0.0.1:9\"]\n",
    )
    .unwrap();
    let server = serve(workspace.path(), &[]);
    let before = scrape(server.addr, &[]);
    assert_eq!(value(&before, "keel_calls_total", &[]), None, "no call yet");
    assert_eq!(value(&before, "keel_plugins_loaded", &[]), Some(2.0));

    for text in ["one", "two", "three"] {
        let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": text }));
        assert_eq!(reply.message()["result"]["content"][0]["text"], text, "{}", reply.body);
    }
    // Over the per-tool budget of 50,000 chars: persisted, and previewed.
    let reply = stateless_call(server.addr, &[], "echo", &json!({ "text": "a".repeat(60_000) }));
    let text = reply.message()["result"]["content"][0]["text"].as_str().unwrap().to_string();
    assert!(text.starts_with("<persisted-output>"), "{text:.200}");
    let reply = stateless_call(server.addr, &[], "no_such_tool", &json!({}));
    assert_eq!(reply.message()["result"]["isError"], true, "{}", reply.body);
    let reply = stateless_call(server.addr, &[], "fetch", &json!({ "url": "http://127.0.0.2:9/" }));
    assert_eq!(reply.message()["result"]["isError"], true, "a refused request fails: {}", reply.body);

    let after = scrape(server.addr, &[]);
    let calls = |tool, outcome| value(&after, "keel_calls_total", &[("tool", tool), ("outcome", outcome)]);
    assert_eq!(calls("echo", "ok"), Some(4.0));
    assert_eq!(calls("(unknown)", "invalid"), Some(1.0), "a made-up name is not a label of its own");
    assert_eq!(calls("fetch", "error"), Some(1.0));
    let total: f64 = after
        .samples
        .iter()
        .filter(|sample| sample.metric == "keel_calls_total")
        .filter_map(|sample| match sample.value {
            prometheus_parse::Value::Counter(value) | prometheus_parse::Value::Untyped(value) => Some(value),
            _ => None,
        })
        .sum();
    assert_eq!(total, 6.0, "six calls, each counted once");
    // The histogram holds the calls that were planned: not the unknown tool.
    assert_eq!(value(&after, "keel_call_duration_seconds_count", &[("tool", "echo")]), Some(4.0));
    assert_eq!(value(&after, "keel_call_duration_seconds_count", &[("tool", "fetch")]), Some(1.0));
    assert!(value(&after, "keel_call_duration_seconds_sum", &[("tool", "echo")]).unwrap() > 0.0);
    assert!(value(&after, "keel_fuel_burned_total", &[("tool", "echo")]).unwrap() > 0.0);
    assert_eq!(value(&after, "keel_network_refused_total", &[("tool", "fetch")]), Some(1.0));
    // Every call has its result: none waits, none runs.
    assert_eq!(value(&after, "keel_calls_waiting", &[]), Some(0.0));
    assert_eq!(value(&after, "keel_calls_in_flight", &[]), Some(0.0));
    assert_eq!(value(&after, "keel_results_persisted_total", &[]), Some(1.0));
    assert_eq!(value(&after, "keel_plugin_reloads_total", &[]), Some(0.0));
    assert_eq!(value(&after, "keel_plugin_load_failures_total", &[]), Some(0.0));
}

#[test]
fn metrics_on_the_mcp_listener_need_its_token() {
    let workspace = tempfile::tempdir().unwrap();
    let server = serve(workspace.path(), &["--token-file", &token_file(workspace.path())]);
    let reply = request(server.addr, "GET", "/metrics", &[], "");
    assert_eq!(reply.status, 401, "{}", reply.body);
    let reply = request(server.addr, "GET", "/metrics", &[("authorization", "Bearer wrong")], "");
    assert_eq!(reply.status, 401, "{}", reply.body);
    let scraped = scrape(server.addr, &[("authorization", "Bearer s3cret")]);
    assert_eq!(value(&scraped, "keel_plugins_loaded", &[]), Some(2.0));
    // A page that rebinds a name of its own to loopback reads nothing.
    let forged = [("authorization", "Bearer s3cret"), ("host", "attacker.example:80")];
    assert_eq!(request(server.addr, "GET", "/metrics", &forged, "").status, 403);
}

/// A file in `workspace` holding the token the tests use, as a flag.
fn token_file(workspace: &Path) -> String {
    let path = workspace.join("token");
    std::fs::write(&path, "s3cret\n").unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_metrics_address_serves_them_alone_without_the_token() {
    let workspace = tempfile::tempdir().unwrap();
    let token = token_file(workspace.path());
    let server = serve(workspace.path(), &["--token-file", &token, "--metrics-addr", "127.0.0.1:0"]);
    let metrics = server.metrics.expect("keel serve names the metrics address");
    assert_ne!(metrics, server.addr);
    let reply =
        stateless_call(server.addr, &[("authorization", "Bearer s3cret")], "echo", &json!({ "text": "hi" }));
    assert_eq!(reply.status, 200, "{}", reply.body);
    let scraped = scrape(metrics, &[]);
    assert_eq!(value(&scraped, "keel_calls_total", &[("tool", "echo"), ("outcome", "ok")]), Some(1.0));
    // Served there only: the MCP listener has no /metrics, and the metrics
    // listener no /mcp.
    let bearer = [("authorization", "Bearer s3cret")];
    assert_eq!(request(server.addr, "GET", "/metrics", &bearer, "").status, 404);
    assert_eq!(request(metrics, "POST", "/mcp", &[], "{}").status, 404);
}

#[test]
fn a_metrics_address_that_is_not_loopback_is_refused() {
    let workspace = tempfile::tempdir().unwrap();
    let mut command = support::command(
        workspace.path(),
        &[bundled("echo")],
        &["--http", "127.0.0.1:0", "--metrics-addr", "0.0.0.0:9464"],
    );
    let output = support::run(&mut command, Duration::from_secs(60));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("0.0.0.0:9464 is not a loopback address: metrics served there would ask no token"),
        "{stderr}"
    );
}

#[test]
fn a_stdio_server_serves_metrics_only_on_a_metrics_address() {
    let workspace = tempfile::tempdir().unwrap();
    let mut command =
        support::command(workspace.path(), &[bundled("echo")], &["--metrics-addr", "127.0.0.1:0"]);
    let mut child =
        command.stdin(Stdio::piped()).stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr: SocketAddr = loop {
        let line = lines.next().expect("keel serve names the metrics address").unwrap();
        if let Some(rest) = line.strip_prefix("keel: serving metrics on http://") {
            break rest.trim_end_matches("/metrics").parse().unwrap();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    let scraped = scrape(addr, &[]);
    assert_eq!(value(&scraped, "keel_plugins_loaded", &[]), Some(1.0));
    // Closing stdin ends the server.
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
}

/// Scrape `addr` until `ready` holds of what it shows, for at most 30 s
/// (a reload takes two looks at the plugin paths, 500 ms apart).
fn scrape_until(
    addr: SocketAddr,
    ready: impl Fn(&prometheus_parse::Scrape) -> bool,
) -> prometheus_parse::Scrape {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let scraped = scrape(addr, &[]);
        if ready(&scraped) || std::time::Instant::now() >= deadline {
            return scraped;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn reloads_and_load_failures_are_counted() {
    let workspace = tempfile::tempdir().unwrap();
    let plugins = workspace.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::copy(bundled("echo"), plugins.join("echo.wasm")).unwrap();
    let server = support::serve_with(workspace.path(), std::slice::from_ref(&plugins), &[]);
    assert_eq!(value(&scrape(server.addr, &[]), "keel_plugins_loaded", &[]), Some(1.0));

    std::fs::write(plugins.join("broken.wasm"), b"not a component").unwrap();
    let scraped = scrape_until(server.addr, |scraped| {
        value(scraped, "keel_plugin_load_failures_total", &[]) == Some(1.0)
    });
    assert_eq!(value(&scraped, "keel_plugin_load_failures_total", &[]), Some(1.0));
    assert_eq!(value(&scraped, "keel_plugin_reloads_total", &[]), Some(0.0), "nothing new is served");

    std::fs::copy(bundled("wc"), plugins.join("wc.wasm")).unwrap();
    let scraped =
        scrape_until(server.addr, |scraped| value(scraped, "keel_plugin_reloads_total", &[]) == Some(1.0));
    assert_eq!(value(&scraped, "keel_plugin_reloads_total", &[]), Some(1.0));
    assert_eq!(value(&scraped, "keel_plugins_loaded", &[]), Some(2.0));
    assert_eq!(
        value(&scraped, "keel_plugin_load_failures_total", &[]),
        Some(1.0),
        "the broken file is not tried again"
    );
}

#[test]
fn a_running_call_is_in_flight_and_a_call_behind_it_waits() {
    let workspace = tempfile::tempdir().unwrap();
    let tools = [bundled("sleep"), bundled("write_file")];
    let server = support::serve_with(workspace.path(), &tools, &[]);
    let addr = server.addr;
    let sleeping = std::thread::spawn(move || stateless_call(addr, &[], "sleep", &json!({ "ms": 5000 })));
    let gauges = |scraped: &prometheus_parse::Scrape| {
        (value(scraped, "keel_calls_in_flight", &[]), value(scraped, "keel_calls_waiting", &[]))
    };
    let scraped = scrape_until(addr, |scraped| gauges(scraped) == (Some(1.0), Some(0.0)));
    assert_eq!(gauges(&scraped), (Some(1.0), Some(0.0)), "the sleep runs");
    // A call that is not concurrency-safe waits for the calls before it.
    let writing = std::thread::spawn(move || {
        stateless_call(addr, &[], "write_file", &json!({ "file_path": "out.txt", "content": "x" }))
    });
    let scraped = scrape_until(addr, |scraped| gauges(scraped) == (Some(1.0), Some(1.0)));
    assert_eq!(gauges(&scraped), (Some(1.0), Some(1.0)), "the write waits its turn");
    assert_eq!(sleeping.join().unwrap().status, 200);
    assert_eq!(writing.join().unwrap().status, 200);
    let scraped = scrape(addr, &[]);
    assert_eq!(gauges(&scraped), (Some(0.0), Some(0.0)), "every call has its result");
    assert_eq!(value(&scraped, "keel_calls_total", &[("tool", "sleep"), ("outcome", "ok")]), Some(1.0));
}
