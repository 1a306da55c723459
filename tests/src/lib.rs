//! Integration tests of keel live in `all/`; this crate builds the guests
//! they load (see `build.rs`), tells other crates' tests where they are, and
//! serves the loopback HTTP their outbound requests reach ([`http_server`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub mod http_server;

/// The component of the guest `name`, such as `keel_guest_hostile`, as
/// `build.rs` built it.
pub fn guest(name: &str) -> PathBuf {
    let path = Path::new(env!("KEEL_TEST_GUESTS_DIR")).join(format!("{name}.wasm"));
    assert!(path.is_file(), "guest {} was not built", path.display());
    path
}

/// A writer for a tracing subscriber that keeps what is written, shared by
/// its clones: give the subscriber a clone, read the text from another.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Run `f` with a subscriber on this thread that writes its events
    /// (`INFO` and above) here as plain text: no time, target or colour,
    /// with the spans they are in.
    pub fn capture<T>(&self, f: impl FnOnce() -> T) -> T {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f)
    }
}

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
