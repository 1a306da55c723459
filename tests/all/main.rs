//! keel's integration tests: real guests, built once by `build.rs`, through
//! the real host. One module per topic.

mod batch;
mod budget;
mod cache;
mod fuzz;
mod grants;
mod hostile;
mod load;
mod malformed;
mod permissions;
mod pool;
mod queries;
mod scheduler;
mod soak;

use std::path::{Path, PathBuf};

use keel_host::{Host, HostBuilder};

/// Where `build.rs` put the example tools and the test guests.
pub fn guest(name: &str) -> PathBuf {
    let path = Path::new(env!("KEEL_TEST_GUESTS_DIR")).join(format!("{name}.wasm"));
    assert!(path.is_file(), "guest {} was not built", path.display());
    path
}

/// A host over `workspace` with the two example tools, sharing one compile
/// cache across the test run so each guest is compiled once.
pub fn example_host(workspace: &Path) -> HostBuilder {
    Host::builder()
        .workspace(workspace)
        .plugins(guest("keel_tool_grep"))
        .plugins(guest("keel_tool_write_file"))
        .cache_dir(Some(shared_cache()))
}

/// The compile cache shared by the tests of one run.
pub fn shared_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache")
}

/// A multi-threaded runtime, as the CLI uses.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(future)
}
