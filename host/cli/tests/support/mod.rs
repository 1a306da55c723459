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
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
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
    /// What it wrote to stderr after naming its address, as it comes.
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Serving {
    /// Send it `signal` (`TERM`, `INT`).
    pub fn signal(&self, signal: &str) {
        signal_child(&self.child, signal);
    }

    /// Wait for it to exit, for at most `limit`; panics if it does not.
    pub fn exit_within(&mut self, limit: Duration) -> ExitStatus {
        exit_within(&mut self.child, limit)
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// What it wrote to stderr after naming its address, so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }
}

/// Send `signal` (`TERM`, `INT`) to `child`.
pub fn signal_child(child: &Child, signal: &str) {
    let sent = Command::new("kill").arg(format!("-{signal}")).arg(child.id().to_string()).status();
    assert!(sent.unwrap().success(), "kill -{signal} {}", child.id());
}

/// Wait for `child` to exit, for at most `limit`; kills it and panics if it
/// does not.
pub fn exit_within(child: &mut Child, limit: Duration) -> ExitStatus {
    wait_within(child, limit).unwrap_or_else(|| panic!("the process did not exit within {limit:?}"))
}

/// How `child` exited, if it did within `limit`; killed and reaped if not.
fn wait_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
    start(&mut command(workspace, plugins, &[&["--http", "127.0.0.1:0"], flags].concat()))
}

/// Start `command`, a `keel serve --http` on a loopback port 0, and wait for
/// the line that names the URL it serves.
pub fn start(command: &mut Command) -> Serving {
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
    // Read the rest as it comes, so the child never blocks on a full pipe.
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let kept = stderr.clone();
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(|line| kept.lock().unwrap().push(line)));
    Serving { child, url, addr, metrics, stderr }
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
    let Some(status) = wait_within(&mut child, limit) else {
        let stderr = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
        panic!("{command:?} did not finish within {limit:?}; its stderr:\n{stderr}");
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
