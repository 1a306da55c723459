//! What the tests that drive `keel serve --http` with another project's
//! client share: a server process, commands run to a bound, and the bundled
//! tools.

#![allow(dead_code, reason = "each test binary uses part of it")]

pub mod http;
pub mod otlp;
pub mod registry;

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The bundled example tool `name`.
pub fn bundled(name: &str) -> PathBuf {
    Path::new(env!("KEEL_BUNDLED_TOOLS_DIR")).join(format!("keel_tool_{name}.wasm"))
}

/// A `keel serve --http` process; killed when dropped.
pub struct Serving {
    child: Child,
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    /// `127.0.0.1:PORT`.
    pub addr: SocketAddr,
    /// Where it serves `/metrics` alone, with `--metrics-addr`.
    pub metrics: Option<SocketAddr>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `keel serve` over `workspace` with `plugins` and `flags`, not started.
pub fn command(workspace: &Path, plugins: &[PathBuf], flags: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command.arg("serve");
    for plugin in plugins {
        command.arg("--plugins").arg(plugin);
    }
    command
        .args(flags)
        .current_dir(workspace)
        .env("KEEL_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache"))
        .env_remove("KEEL_LOG");
    command
}

/// Start `keel serve --http 127.0.0.1:0` over `workspace` with `plugins`,
/// and wait for the line that names the URL it serves.
pub fn serve(workspace: &Path, plugins: &[PathBuf]) -> Serving {
    serve_with(workspace, plugins, &[])
}

/// [`serve`] with `flags` too.
pub fn serve_with(workspace: &Path, plugins: &[PathBuf], flags: &[&str]) -> Serving {
    let mut command = command(workspace, plugins, &[&["--http", "127.0.0.1:0"], flags].concat());
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut metrics = None;
    let url = loop {
        let line = lines.next().expect("keel serve names its address before it stops").unwrap();
        if let Some(rest) = line.strip_prefix("keel: serving metrics on ") {
            let addr = rest.trim_start_matches("http://").trim_end_matches("/metrics");
            metrics = Some(addr.parse().expect("an address in the metrics URL"));
        }
        if let Some(rest) = line.strip_prefix("keel: serving MCP on ") {
            break rest.to_string();
        }
    };
    let addr =
        url.trim_start_matches("http://").trim_end_matches("/mcp").parse().expect("an address in the URL");
    // Drain the rest, so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Serving { child, url, addr, metrics }
}

/// Run `command` to its end, killing it after `limit`; a failure to start
/// or to finish in time panics naming the command.
pub fn run(command: &mut Command, limit: Duration) -> Output {
    run_with_input(command, "", limit)
}

/// [`run`], with `input` on the command's standard input.
pub fn run_with_input(command: &mut Command, input: &str, limit: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("failed to start {command:?}: {error}"));
    // Written on a thread of its own, so a command that reads none of it
    // cannot stall the test; dropped then, so the command sees its end.
    let (mut stdin, input) = (child.stdin.take().unwrap(), input.to_owned());
    std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut stdin, input.as_bytes());
    });
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
pub fn run_ok(command: &mut Command, limit: Duration) {
    let output = run(command, limit);
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}

/// `keel args` in `dir`, its compile cache in `cache`, its log level left
/// at the default whatever the environment says.
pub fn keel(dir: &Path, cache: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command.args(args).current_dir(dir).env("KEEL_CACHE_DIR", cache).env_remove("KEEL_LOG");
    command
}

/// How long one `keel` command of these tests may take.
const KEEL_LIMIT: Duration = Duration::from_secs(120);

/// Run a `keel` command and give its stdout; panic with its stderr unless
/// it succeeded.
pub fn keel_ok(command: &mut Command) -> String {
    let output = run(command, KEEL_LIMIT);
    assert!(output.status.success(), "{command:?} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// Run a `keel` command and give its stderr; panic with its stdout unless
/// it failed.
pub fn keel_fails(command: &mut Command) -> String {
    let output = run(command, KEEL_LIMIT);
    assert!(!output.status.success(), "{command:?} succeeded:\n{}", String::from_utf8_lossy(&output.stdout));
    String::from_utf8(output.stderr).unwrap()
}
