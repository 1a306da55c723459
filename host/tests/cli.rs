//! The `keel` binary as a user runs it.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn keel(args: &[&str], cwd: &std::path::Path, stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .current_dir(cwd)
        .env("KEEL_CACHE_DIR", std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn runs_a_batch_from_stdin_with_the_bundled_tools_from_any_directory() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("a.txt"), "alpha\nbeta\n").unwrap();
    let batch = r#"[
        {"type":"tool_use","id":"1","name":"grep","input":{"pattern":"bet"}},
        {"type":"tool_use","id":"2","name":"write_file","input":{"file_path":"b.txt","content":"x"}},
        {"type":"tool_use","id":"3","name":"nope","input":{}}
    ]"#;
    let output = keel(&["run", "-"], workspace.path(), batch);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let message: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        message,
        serde_json::json!({
            "role": "user",
            "content": [
                { "type": "tool_result", "tool_use_id": "1", "content": "a.txt:2:beta\n" },
                { "type": "tool_result", "tool_use_id": "2", "content": "Wrote 1 byte to b.txt" },
                { "type": "tool_result", "tool_use_id": "3", "content": "No such tool: nope", "is_error": true }
            ]
        })
    );
    assert_eq!(std::fs::read_to_string(workspace.path().join("b.txt")).unwrap(), "x");
}

#[test]
fn a_bad_batch_file_fails_naming_the_file_and_block_with_nothing_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("batch.json"), r#"[{"id":"a","name":"grep"},{"id":7,"name":"grep"}]"#)
        .unwrap();
    let output = keel(&["run", "batch.json"], dir.path(), "");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: failed to read batch batch.json: content[1]: `id` must be a non-empty string\n"
    );
}

#[test]
fn a_bad_plugin_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("evil.wasm"), b"MZ\x90\x00").unwrap();
    let output = keel(&["run", "--plugins", "evil.wasm", "-"], dir.path(), "[]");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("error: failed to load plugin evil.wasm: not a WebAssembly file"), "{stderr}");
}
