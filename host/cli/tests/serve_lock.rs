//! `keel serve` under a lock: every version its reload finds is checked
//! against the pins, as at start.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

fn bundled(tool: &str) -> PathBuf {
    Path::new(env!("KEEL_BUNDLED_TOOLS_DIR")).join(format!("keel_tool_{tool}.wasm"))
}

/// Put `bytes` at `path` as a deployment does: beside it, then renamed over it.
fn put(path: &Path, bytes: &[u8]) {
    let temporary = path.with_extension("partial");
    std::fs::write(&temporary, bytes).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

fn keel(project: &Path, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(project)
        .env("KEEL_CACHE_DIR", project.join("cache"))
        .env_remove("KEEL_LOG");
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_version_that_breaks_the_lock_is_refused_and_the_pinned_one_serves_on() {
    let project = tempfile::tempdir().unwrap();
    let tools = project.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    std::fs::copy(bundled("echo"), tools.join("echo.wasm")).unwrap();
    let locked = keel(project.path(), &["lock", "--plugins", "tools"]).output().unwrap();
    assert!(locked.status.success(), "{}", String::from_utf8_lossy(&locked.stderr));

    let log = project.path().join("serve.stderr");
    let args: Vec<OsString> = ["serve", "--plugins", "tools", "--locked"].map(OsString::from).into();
    let mut command = keel(project.path(), &[]);
    command.args(&args);
    let (transport, _) = TokioChildProcess::builder(tokio::process::Command::from(command))
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let client = ().serve(transport).await.unwrap();
    let names = || async {
        let tools = client.list_all_tools().await.unwrap();
        tools.iter().map(|tool| tool.name.to_string()).collect::<Vec<_>>()
    };
    let echo = || async {
        let Value::Object(arguments) = json!({ "text": "pinned" }) else { unreachable!() };
        let result =
            client.call_tool(CallToolRequestParams::new("echo").with_arguments(arguments)).await.unwrap();
        result.content[0].as_text().unwrap().text.clone()
    };
    assert_eq!(names().await, ["Read", "echo"]);

    // Other bytes in echo's file, and a plugin the lock does not name.
    let mut tampered = std::fs::read(bundled("echo")).unwrap();
    tampered.extend_from_slice(&[0, 7, 5, b'x', b'-', b'k', b'e', b'l', 0]);
    put(&tools.join("echo.wasm"), &tampered);
    put(&tools.join("wc.wasm"), &std::fs::read(bundled("wc")).unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("wc.wasm") && text.contains("echo.wasm") {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "no reload was logged within 20 s:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        text.contains("refused plugin tools/echo.wasm")
            && text.contains("the version loaded before keeps serving"),
        "{text}"
    );
    assert!(
        text.contains("does not name its tool wc (--locked)") && text.contains("it is not served"),
        "{text}"
    );
    assert_eq!(names().await, ["Read", "echo"]);
    assert_eq!(echo().await, "pinned");
    client.cancel().await.unwrap();
}
