//! The compile cache: a second start does not recompile.

use std::path::{Path, PathBuf};

use keel_host::Host;

use crate::{block_on, guest};

/// The compiled components in `cache` (beside them, its index).
fn compiled(cache: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(cache).unwrap().map(|entry| entry.unwrap().path());
    entries.filter(|path| path.extension().is_some_and(|ext| ext == "cwasm")).collect()
}

fn start(workspace: &Path, cache: &Path) -> Host {
    let builder = Host::builder()
        .workspace(workspace)
        .plugins(guest("keel_tool_write_file"))
        .cache_dir(Some(cache.to_path_buf()));
    block_on(builder.build()).unwrap()
}

#[test]
fn a_second_start_loads_from_the_compile_cache() {
    let workspace = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let start = || start(workspace.path(), cache.path());
    let first = start();
    assert!(!first.load_reports()[0].1.from_cache, "a cold cache compiles");
    assert_eq!(compiled(cache.path()).len(), 1, "one compiled component was cached");

    let second = start();
    assert_eq!(second.load_reports()[0].0, "write_file");
    assert!(second.load_reports()[0].1.from_cache, "a warm cache is used");
    let size = std::fs::metadata(guest("keel_tool_write_file")).unwrap().len();
    assert_eq!(second.load_reports()[0].1.size, size, "the size of the file, read or not");
}

#[test]
fn a_corrupt_cache_entry_is_recompiled_and_replaced() {
    let workspace = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let start = || start(workspace.path(), cache.path());
    start();
    let entry = compiled(cache.path()).remove(0);
    std::fs::write(&entry, b"garbage").unwrap();
    assert!(!start().load_reports()[0].1.from_cache, "the corrupt entry is not trusted");
    assert!(start().load_reports()[0].1.from_cache, "and it was replaced");
}
