//! OTLP export: `keel run` with `OTEL_EXPORTER_OTLP_ENDPOINT` sends the
//! library's spans to a receiver this test runs on loopback, as protobuf or
//! JSON, all of them before it exits; a collector that is not there costs a
//! logged error, not the run.

use std::path::Path;
use std::process::Command;

use support::otlp::{attribute, exports, receiver, spans};
use support::{bundled, keel_ok};

mod support;

/// `keel run` of two `echo` calls in `dir`, with every OpenTelemetry
/// variable of the environment left out but `otel`.
fn run_batch(dir: &Path, otel: &[(&str, String)]) -> Command {
    let batch = dir.join("batch.json");
    std::fs::write(
        &batch,
        r#"[{"type":"tool_use","id":"toolu_1","name":"echo","input":{"text":"one"}},
            {"type":"tool_use","id":"toolu_2","name":"echo","input":{"text":"two"}}]"#,
    )
    .unwrap();
    let echo = bundled("echo");
    let args = ["run", "--plugins", echo.to_str().unwrap(), batch.to_str().unwrap()];
    let mut command = support::keel(dir, &Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache"), &args);
    for (name, _) in std::env::vars() {
        if name.starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    for (name, value) in otel {
        command.env(name, value);
    }
    command
}

#[test]
fn a_run_exports_a_span_per_call_named_after_its_tool_with_a_child_per_step() {
    let (addr, received) = receiver();
    let dir = tempfile::tempdir().unwrap();
    let stdout =
        keel_ok(&mut run_batch(dir.path(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))]));
    assert!(stdout.contains("\"toolu_2\""), "{stdout}");

    // keel has exited: whatever it sent has arrived.
    let exports = exports(&received);
    assert!(!exports.is_empty(), "spans were sent before keel exited");
    for resource in exports.iter().flat_map(|request| &request.resource_spans) {
        let attributes = resource.resource.as_ref().map_or(&[][..], |resource| &resource.attributes[..]);
        assert_eq!(attribute(attributes, "service.name"), Some("keel"));
    }
    let spans = spans(&received);
    for id in ["toolu_1", "toolu_2"] {
        let call = spans
            .iter()
            .find(|span| attribute(&span.attributes, "tool_use_id") == Some(id))
            .unwrap_or_else(|| {
                panic!("a span of {id} among {:?}", spans.iter().map(|span| &span.name).collect::<Vec<_>>())
            });
        assert_eq!(call.name, "echo", "a call's span is named after its tool");
        assert_eq!(attribute(&call.attributes, "tool"), Some("echo"));
        let mut steps: Vec<&str> = spans
            .iter()
            .filter(|span| span.parent_span_id == call.span_id)
            .map(|span| span.name.as_str())
            .collect();
        steps.sort_unstable();
        steps.dedup();
        assert_eq!(
            steps,
            ["budget", "permission", "questions", "tool_call"],
            "{id}: the steps under its call"
        );
        // A sandbox set up while the tool was asked about its input is cut
        // out of that step: a child of it, in the same trace.
        let in_trace: Vec<&str> = spans
            .iter()
            .filter(|span| span.trace_id == call.trace_id)
            .map(|span| span.name.as_str())
            .collect();
        assert!(in_trace.contains(&"setup"), "{id}: {in_trace:?}");
    }
}

#[test]
fn json_is_sent_when_the_protocol_asks_for_it() {
    let (addr, received) = receiver();
    let dir = tempfile::tempdir().unwrap();
    keel_ok(&mut run_batch(
        dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json".into()),
            ("OTEL_SERVICE_NAME", "agent-tools".into()),
        ],
    ));
    let received = received.lock().unwrap().clone();
    let mut names = Vec::new();
    for (content_type, body) in &received {
        assert_eq!(content_type, "application/json");
        let request: serde_json::Value = serde_json::from_slice(body).expect("a JSON export");
        for resource in request["resourceSpans"].as_array().unwrap() {
            let service = resource["resource"]["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|pair| pair["key"] == "service.name")
                .map(|pair| pair["value"]["stringValue"].clone());
            assert_eq!(service, Some("agent-tools".into()), "OTEL_SERVICE_NAME is kept");
            for scope in resource["scopeSpans"].as_array().unwrap() {
                names.extend(scope["spans"].as_array().unwrap().iter().map(|span| span["name"].to_string()));
            }
        }
    }
    assert_eq!(names.iter().filter(|name| *name == "\"echo\"").count(), 2, "{names:?}");
}

#[test]
fn a_collector_that_is_not_there_does_not_fail_the_run() {
    // A port nothing listens on: bound, then let go.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut command = run_batch(dir.path(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))]);
    let output = support::run(&mut command, std::time::Duration::from_secs(120));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("\"toolu_1\"") && stdout.contains("\"toolu_2\""), "{stdout}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("ExportError") || stderr.contains("failed to send the last spans"), "{stderr}");
}

#[test]
fn nothing_is_sent_when_the_sdk_is_disabled() {
    let (addr, received) = receiver();
    let dir = tempfile::tempdir().unwrap();
    keel_ok(&mut run_batch(
        dir.path(),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")), ("OTEL_SDK_DISABLED", "true".into())],
    ));
    assert!(received.lock().unwrap().is_empty(), "keel has exited, having sent nothing");
}
