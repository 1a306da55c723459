//! Whole batches through the host: one result per call, in order.

use keel_host::batch::parse_batch;
use keel_host::{ToolResult, ToolUse};
use serde_json::json;

use crate::{block_on, example_host};

#[test]
fn a_mixed_batch_gives_four_results_in_order() {
    let root = tempfile::tempdir().unwrap();
    let workspace = root.path().join("ws");
    std::fs::create_dir_all(workspace.join("src")).unwrap();
    std::fs::write(workspace.join("src/lib.rs"), "fn main() {}\n// needle here\n").unwrap();
    let host = block_on(example_host(&workspace).build()).unwrap();

    let batch = parse_batch(
        r#"[
            {"type":"tool_use","id":"toolu_1","name":"grep","input":{"pattern":"needle"}},
            {"type":"tool_use","id":"toolu_2","name":"write_file","input":{"file_path":"notes/todo.md","content":"- ship\n"}},
            {"type":"tool_use","id":"toolu_3","name":"fetch_url","input":{"url":"https://example.com"}},
            {"type":"tool_use","id":"toolu_4","name":"grep","input":{"pattern":"x","glob":7}}
        ]"#,
        "batch.json",
    )
    .unwrap();
    let outcome = block_on(host.run_batch(&batch));

    assert_eq!(
        outcome.results,
        [
            ToolResult::ok("toolu_1", "src/lib.rs:2:// needle here\n"),
            ToolResult::ok("toolu_2", "Wrote 7 bytes to notes/todo.md"),
            ToolResult::error("toolu_3", "No such tool: fetch_url"),
            ToolResult::error(
                "toolu_4",
                r#"Invalid input for grep: /glob: 7 is not of types "null", "string" (rule: type)"#
            ),
        ]
    );
    assert_eq!(std::fs::read_to_string(workspace.join("notes/todo.md")).unwrap(), "- ship\n");
    let beside: Vec<_> = std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(beside, ["ws"], "nothing was written outside the workspace");
    assert_eq!(
        outcome.context,
        json!({ "cwd": "/workspace", "files_written": { "notes/todo.md": { "bytes": 7 } } })
    );
}

#[test]
fn a_write_cannot_leave_the_workspace() {
    let root = tempfile::tempdir().unwrap();
    let workspace = root.path().join("ws");
    std::fs::create_dir(&workspace).unwrap();
    let host = block_on(example_host(&workspace).build()).unwrap();
    let batch = [
        ToolUse::new("a", "write_file", json!({ "file_path": "../escape.txt", "content": "x" })),
        ToolUse::new("b", "write_file", json!({ "file_path": "/tmp/escape.txt", "content": "x" })),
    ];
    let outcome = block_on(host.run_batch(&batch));
    for result in &outcome.results {
        assert!(result.is_error, "{result:?}");
        // The sandbox has no directory to put the file in, whatever the path says.
        assert!(result.content.text().starts_with("failed to "), "{}", result.content);
        assert!(result.content.text().contains("No such file or directory"), "{}", result.content);
    }
    let beside: Vec<_> = std::fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(beside, ["ws"]);
    assert_eq!(std::fs::read_dir(&workspace).unwrap().count(), 0);
}

#[test]
fn a_later_call_sees_what_an_earlier_one_wrote() {
    let workspace = tempfile::tempdir().unwrap();
    let host = block_on(example_host(workspace.path()).build()).unwrap();
    let batch = [
        ToolUse::new("w", "write_file", json!({ "file_path": "a.txt", "content": "first line\nsecond\n" })),
        ToolUse::new("g", "grep", json!({ "pattern": "second", "path": "a.txt" })),
        ToolUse::new("r", "Read", json!({ "file_path": "a.txt", "offset": 2 })),
    ];
    let outcome = block_on(host.run_batch(&batch));
    assert_eq!(outcome.results[1], ToolResult::ok("g", "a.txt:2:second\n"));
    assert_eq!(outcome.results[2], ToolResult::ok("r", "     2\tsecond\n"));
}

#[test]
fn broken_json_input_and_a_tool_error_fail_only_their_call() {
    let workspace = tempfile::tempdir().unwrap();
    let host = block_on(example_host(workspace.path()).build()).unwrap();
    let batch = parse_batch(
        r#"[
            {"id":"a","name":"grep","input":"{\"pattern\": "},
            {"id":"b","name":"grep","input":{"pattern":"("}},
            {"id":"c","name":"grep","input":{"pattern":"x","path":"missing"}},
            {"id":"d","name":"grep","input":{"pattern":"x"}}
        ]"#,
        "batch.json",
    )
    .unwrap();
    let results = block_on(host.run_batch(&batch)).results;
    assert!(results[0].content.text().starts_with("Invalid input for grep: the input is not valid JSON: "));
    assert!(
        results[1].content.text().starts_with("Invalid input for grep: `pattern` is not a valid regex: ")
    );
    assert!(results[2].content.text().starts_with("cannot search missing: "), "{}", results[2].content);
    assert!(results[..3].iter().all(|r| r.is_error));
    assert_eq!(results[3], ToolResult::ok("d", "No matches in 0 files"));
}

#[test]
fn an_input_built_in_code_is_held_to_the_input_cap_as_a_parsed_one_is() {
    let workspace = tempfile::tempdir().unwrap();
    let limits = keel_host::Limits { input: 1024, ..keel_host::Limits::default() };
    let host =
        block_on(crate::host_of(workspace.path(), &["keel_tool_echo"]).limits(limits).build()).unwrap();
    let text = "x".repeat(2000);
    let size = json!({ "text": text }).to_string().len();
    let batch = [
        ToolUse::new("big", "echo", json!({ "text": text })),
        ToolUse::new("small", "echo", json!({ "text": "hi" })),
    ];
    let outcome = block_on(host.run_batch(&batch));
    assert_eq!(
        outcome.results,
        [
            ToolResult::error(
                "big",
                format!(
                    "Invalid input for echo: input size limit of 1 KiB exceeded: the input is {size} bytes"
                )
            ),
            ToolResult::ok("small", "hi"),
        ]
    );
}

#[test]
fn grep_says_which_file_it_could_not_read_rather_than_finding_no_match_in_it() {
    let workspace = tempfile::tempdir().unwrap();
    // Larger than the sandbox's memory: the grep cannot read it whole.
    let mut big = b"needle in big\n".to_vec();
    big.resize(40 << 20, b'x');
    std::fs::write(workspace.path().join("big.log"), big).unwrap();
    std::fs::write(workspace.path().join("small.txt"), "needle small\n").unwrap();
    let limits = keel_host::Limits { memory: 32 << 20, ..keel_host::Limits::default() };
    let host =
        block_on(crate::host_of(workspace.path(), &["keel_tool_grep"]).limits(limits).build()).unwrap();
    let batch = [
        ToolUse::new("all", "grep", json!({ "pattern": "needle" })),
        ToolUse::new("named", "grep", json!({ "pattern": "needle", "path": "big.log" })),
    ];
    let results = block_on(host.run_batch(&batch)).results;
    let all = results[0].content.text();
    assert!(
        all.starts_with("small.txt:1:needle small\n(1 file that could not be read skipped: big.log: "),
        "{all}"
    );
    let named = results[1].content.text();
    assert!(
        named.starts_with("No matches in 0 files (1 file that could not be read skipped: big.log: "),
        "{named}"
    );
}
