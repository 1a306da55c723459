//! `keel serve --http` spoken to by the official Python MCP SDK's client
//! (PyPI `mcp`), both ways it connects: the `initialize` handshake with a
//! session, and the stateless 2026-07-28 `server/discover`. The SDK is
//! installed into a virtualenv under the target directory on first use, so
//! this test needs `python3` and a reachable package index.

mod support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{bundled, run, run_ok, serve};

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
    let server = serve(workspace.path(), &TOOLS.map(bundled));
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
