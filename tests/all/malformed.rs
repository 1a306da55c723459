//! Malformed batches and inputs: each is refused with an exact error, only the
//! calls it touches fail, and nothing is fetched.

use std::io::Read as _;
use std::net::TcpListener;

use keel_host::batch::{parse_batch, parse_batch_bytes, parse_batch_with_limit};
use keel_host::pool::InputSchema;
use keel_host::{Host, ToolResult};
use serde_json::json;

use crate::{block_on, guest, shared_cache};

fn host(workspace: &std::path::Path) -> Host {
    let builder = Host::builder()
        .workspace(workspace)
        .plugins(guest("keel_guest_hostile"))
        .cache_dir(Some(shared_cache()));
    block_on(builder.build()).unwrap()
}

fn batch_error(text: &str) -> String {
    parse_batch(text, "b.json").unwrap_err().to_string()
}

#[test]
fn a_batch_that_is_not_json_is_refused() {
    assert_eq!(
        batch_error("<batch/>"),
        "failed to read batch b.json: not valid JSON: expected value at line 1 column 1"
    );
    assert_eq!(
        batch_error("[{\"id\":\"a\",\"name\":\"x\"}"),
        "failed to read batch b.json: not valid JSON: EOF while parsing a list at line 1 column 22"
    );
    assert_eq!(
        batch_error(""),
        "failed to read batch b.json: it is empty; expected an array of tool_use blocks or an assistant message"
    );
}

#[test]
fn invalid_utf8_is_refused_with_its_offset() {
    let bytes = b"[{\"id\":\"a\",\"name\":\"\xff\"}]";
    assert_eq!(
        parse_batch_bytes(bytes, "b.json", 1 << 20).unwrap_err().to_string(),
        "failed to read batch b.json: not UTF-8 text: invalid byte at offset 19"
    );
}

#[test]
fn nesting_10000_deep_is_refused_without_overflowing_the_stack() {
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert_eq!(batch_error(&deep), "failed to read batch b.json: [0]: expected a JSON object");
    let deep_object = format!("{}1{}", "{\"a\":".repeat(10_000), "}".repeat(10_000));
    let error = batch_error(&deep_object);
    assert_eq!(error, "failed to read batch b.json: the message has no `content` array nor `tool_calls`");

    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path());
    let text = format!(
        r#"[{{"id":"deep","name":"hostile","input":{{"act":{deep}}}}},{{"id":"ok","name":"hostile","input":{{"act":"ok"}}}}]"#
    );
    let uses = parse_batch(&text, "b.json").unwrap();
    let results = block_on(host.run_batch(&uses)).results;
    assert_eq!(
        results,
        [
            ToolResult::error(
                "deep",
                "Invalid input for hostile: the input is not valid JSON: recursion limit exceeded at line 1 column 134"
            ),
            ToolResult::ok("ok", "ok"),
        ]
    );
}

#[test]
fn a_50_mb_input_fails_its_call_before_it_is_parsed() {
    let workspace = tempfile::tempdir().unwrap();
    let host = host(workspace.path());
    let blob = "x".repeat(50_000_000);
    let text = format!(
        r#"[{{"id":"big","name":"hostile","input":{{"act":"ok","blob":"{blob}"}}}},{{"id":"ok","name":"hostile","input":{{"act":"ok"}}}}]"#
    );
    let uses = parse_batch(&text, "b.json").unwrap();
    let results = block_on(host.run_batch(&uses)).results;
    assert_eq!(
        results,
        [
            ToolResult::error(
                "big",
                "Invalid input for hostile: input size limit of 4 MiB exceeded: the input of [0] is 50000022 bytes"
            ),
            ToolResult::ok("ok", "ok"),
        ]
    );
    let raw = format!(r#"[{{"id":"big","name":"hostile","input":"{{\"act\":\"{}\"}}"}}]"#, "y".repeat(2_000));
    let uses = parse_batch_with_limit(&raw, "b.json", 1_000).unwrap();
    assert_eq!(
        uses[0].input,
        Err("input size limit of 1000 B exceeded: the input of [0] is 2016 bytes".into()),
        "an input given as JSON text is measured as given"
    );
}

#[test]
fn blocks_without_an_id_or_a_name_and_duplicate_ids_are_refused() {
    assert_eq!(
        batch_error(r#"[{"type":"tool_use","name":"hostile","input":{}}]"#),
        "failed to read batch b.json: [0]: `id` must be a non-empty string"
    );
    assert_eq!(
        batch_error(r#"[{"type":"tool_use","id":"","name":"hostile"}]"#),
        "failed to read batch b.json: [0]: `id` must be a non-empty string"
    );
    assert_eq!(
        batch_error(r#"[{"type":"tool_use","id":"a","input":{}}]"#),
        "failed to read batch b.json: [0]: `name` must be a string"
    );
    assert_eq!(
        batch_error(r#"[{"id":"a","name":"x"},{"id":"b","name":"x"},{"id":"a","name":"y"}]"#),
        "failed to read batch b.json: [2]: duplicate tool_use id `a`"
    );
}

#[test]
fn a_schema_ref_to_a_file_or_url_is_not_fetched() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("string.json");
    std::fs::write(&file, r#"{"type":"string"}"#).unwrap();
    let file_ref =
        json!({ "type": "object", "properties": { "a": { "$ref": format!("file://{}", file.display()) } } });
    let error = InputSchema::compile(&file_ref).err().expect("a file reference is not resolved");
    assert!(error.contains("file://"), "{error}");

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}/schema.json", listener.local_addr().unwrap());
    let url_ref = json!({ "type": "object", "properties": { "a": { "$ref": url } } });
    let error = InputSchema::compile(&url_ref).err().expect("a URL reference is not resolved");
    assert!(error.contains(&url), "{error}");
    match listener.accept() {
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((mut stream, _)) => {
            let mut request = String::new();
            let _ = stream.read_to_string(&mut request);
            panic!("the schema's reference was fetched: {request}");
        }
        Err(error) => panic!("{error}"),
    }
}
