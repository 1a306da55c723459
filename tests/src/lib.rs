//! Integration tests of keel live in `all/`; this crate builds the guests
//! they load (see `build.rs`), tells other crates' tests where they are, and
//! serves the loopback HTTP their outbound requests reach ([`http_server`]).

use std::path::{Path, PathBuf};

pub mod http_server;

/// The component of the guest `name`, such as `keel_guest_hostile`, as
/// `build.rs` built it.
pub fn guest(name: &str) -> PathBuf {
    let path = Path::new(env!("KEEL_TEST_GUESTS_DIR")).join(format!("{name}.wasm"));
    assert!(path.is_file(), "guest {} was not built", path.display());
    path
}
