//! A real OCI registry on the loopback address: the CNCF distribution
//! registry (Debian's `docker-registry`), installed when missing.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's package puts the registry.
const BINARY: &str = "/usr/bin/docker-registry";

/// A registry process over a storage directory of its own; killed when
/// dropped.
pub struct Registry {
    child: Option<Child>,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The registry's storage, where its blobs are files.
    pub storage: tempfile::TempDir,
    config: PathBuf,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Install `package` with apt-get when `binary` is missing; fail, saying
/// so, when it cannot be. The tests of one binary that run side by side
/// install one at a time, and apt-get waits for a lock another process holds,
/// where two installs at once had one of them fail on the lock.
pub fn ensure_installed(binary: &str, package: &str) {
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _installing = INSTALLING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if Path::new(binary).exists() {
        return;
    }
    let install = |args: &[&str]| {
        Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=300"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if !install(&["install", "-y", package]) {
        install(&["update"]);
        install(&["install", "-y", package]);
    }
    assert!(
        Path::new(binary).exists(),
        "{binary} is missing and `apt-get install -y {package}` did not install it: \
         these tests need a real registry (run them as root, or install {package})"
    );
}

impl Registry {
    /// A registry with no authentication.
    pub fn start() -> Self {
        Registry::start_with_auth(None)
    }

    /// A registry that takes only `user` with `password` (HTTP basic, from
    /// an htpasswd file), when given.
    pub fn start_with_auth(auth: Option<(&str, &str)>) -> Self {
        ensure_installed(BINARY, "docker-registry");
        let storage = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}/data\nhttp:\n  addr: {addr}\n",
            storage.path().display()
        );
        if let Some((user, password)) = auth {
            ensure_installed("/usr/bin/htpasswd", "apache2-utils");
            let output = Command::new("htpasswd").args(["-Bbn", user, password]).output().unwrap();
            assert!(output.status.success(), "htpasswd failed: {}", String::from_utf8_lossy(&output.stderr));
            let file = storage.path().join("htpasswd");
            std::fs::write(&file, output.stdout).unwrap();
            config += &format!("auth:\n  htpasswd:\n    realm: keel-tests\n    path: {}\n", file.display());
        }
        let config_file = storage.path().join("config.yml");
        std::fs::write(&config_file, config).unwrap();
        let mut registry = Registry { child: None, addr, storage, config: config_file };
        registry.resume();
        registry
    }

    /// Stop the registry; its storage stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again over the same storage and address, and wait until it
    /// answers (at most 20 s).
    pub fn resume(&mut self) {
        let child = Command::new(BINARY)
            .arg("serve")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("failed to start {BINARY}: {error}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.answers() {
            assert!(Instant::now() < deadline, "the registry on {} did not answer within 20 s", self.addr);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether `GET /v2/` gets an HTTP answer (any status).
    fn answers(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(&self.addr) else { return false };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!("GET /v2/ HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.addr);
        if stream.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut head = [0; 12];
        stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 ")
    }

    /// The file holding the blob `sha256_hex` in the registry's storage.
    pub fn blob_file(&self, sha256_hex: &str) -> PathBuf {
        self.storage
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&sha256_hex[..2])
            .join(sha256_hex)
            .join("data")
    }
}
