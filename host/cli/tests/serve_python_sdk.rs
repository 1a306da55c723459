//! `keel serve --http` spoken to by the official Python MCP SDK's client
//! (PyPI `mcp`), both ways it connects: the `initialize` handshake with a
//! session, and the stateless 2026-07-28 `server/discover`. The SDK is
//! installed into a virtualenv under the target directory on first use, so
//! this test needs `python3` and a reachable package index.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The SDK the client script is written against: 2.3 brought the
/// `server/discover` handshake of 2026-07-28 it uses.
const SDK: &str = "mcp>=2.3,<3";
/// Whether a virtualenv's `mcp` satisfies [`SDK`].
const SDK_PROBE: &str = "import importlib.metadata as m, mcp\n\
                         assert (2, 3) <= tuple(map(int, m.version('mcp').split('.')[:2])) < (3, 0)";
/// Making the virtualenv and installing the SDK downloads a few megabytes.
const INSTALL_LIMIT: Duration = Duration::from_secs(300);
/// The client's whole run: two connections and a handful of calls each.
const CLIENT_LIMIT: Duration = Duration::from_secs(60);

/// The example tools bundled with keel that the client calls.
const TOOLS: [&str; 2] = ["echo", "wc"];

/// A `keel serve --http` process; killed when dropped.
struct Serving {
    child: Child,
    url: String,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `keel serve --http 127.0.0.1:0` over `workspace`, and wait for the
/// line that names the URL it serves.
fn serve(workspace: &Path) -> Serving {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command.arg("serve");
    for tool in TOOLS {
        command
            .arg("--plugins")
            .arg(Path::new(env!("KEEL_BUNDLED_TOOLS_DIR")).join(format!("keel_tool_{tool}.wasm")));
    }
    command
        .args(["--http", "127.0.0.1:0"])
        .current_dir(workspace)
        .env("KEEL_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache"))
        .env_remove("KEEL_LOG");
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("keel serve names its address before it stops").unwrap();
        if let Some(rest) = line.strip_prefix("keel: serving MCP on ") {
            break rest.to_string();
        }
    };
    // Drain the rest, so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Serving { child, url }
}

/// Run `command` to its end, killing it after `limit`; a failure to start
/// or to finish in time panics naming the command.
fn run(command: &mut Command, limit: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("failed to start {command:?}: {error}"));
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
            panic!("{command:?} did not finish within {limit:?}; its stderr:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

/// Run `command`, panicking with its output unless it succeeds.
fn run_ok(command: &mut Command, limit: Duration) {
    let output = run(command, limit);
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}

/// The Python of a virtualenv holding [`SDK`], made on first use. A lock
/// file keeps two test processes from building it at once; a virtualenv an
/// interrupted run left half made fails the probe and is made again.
fn python_with_sdk() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-mcp");
    let python = venv.join("bin").join("python");
    let lock = File::create(venv.with_extension("lock")).unwrap();
    lock.lock().unwrap();
    let has_sdk = || {
        Command::new(&python)
            .args(["-c", SDK_PROBE])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if !has_sdk() {
        run_ok(Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv), INSTALL_LIMIT);
        run_ok(Command::new(&python).args(["-m", "pip", "install", "--quiet", SDK]), INSTALL_LIMIT);
        assert!(has_sdk(), "{} still cannot import {SDK} after installing it", python.display());
    }
    python
}

#[test]
fn the_python_sdk_client_lists_and_calls_tools_over_a_session_and_stateless() {
    let python = python_with_sdk();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("notes.txt"), "one two\nthree\n").unwrap();
    let server = serve(workspace.path());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/python_client.py");
    let output = run(Command::new(&python).arg(&script).args([&server.url, "notes.txt"]), CLIENT_LIMIT);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "the Python client failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|error| panic!("the client prints one JSON line ({error}): {stdout}"));
    assert_eq!(seen["initialize"]["protocol_version"], "2025-11-25", "{seen}");
    assert_eq!(seen["discover"]["protocol_version"], "2026-07-28", "{seen}");
}
