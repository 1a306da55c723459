//! Files a guest may not open: a named pipe, a socket or a device in a
//! granted directory, or a link to one, is refused at once, where opening it
//! could hold the host's thread past the call's deadline.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use keel_host::config::Config;
use keel_host::{ToolResult, ToolUse};
use serde_json::json;

use crate::{block_on, host_of};

/// Far past the deadline of the calls below: a batch that takes this long
/// was held by an open, not stopped by its deadline.
const PATIENCE: Duration = Duration::from_secs(20);

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {} failed", path.display());
}

#[test]
fn a_named_pipe_in_the_workspace_is_refused_and_the_batch_goes_on() {
    let workspace = tempfile::tempdir().unwrap();
    mkfifo(&workspace.path().join("fifo"));
    let _socket = std::os::unix::net::UnixListener::bind(workspace.path().join("socket")).unwrap();
    std::os::unix::fs::symlink("fifo", workspace.path().join("pipe-link")).unwrap();
    std::fs::write(workspace.path().join("a.txt"), "one two\nthree\n").unwrap();
    let config = Config::parse("[limits]\ndeadline_ms = 2000\n", Path::new("keel.toml")).unwrap();
    let host = block_on(host_of(workspace.path(), &["keel_tool_wc"]).config(config).build()).unwrap();
    let uses = vec![
        ToolUse::new("w1", "wc", json!({ "file_path": "fifo" })),
        ToolUse::new("w2", "wc", json!({ "file_path": "a.txt" })),
        ToolUse::new("w3", "wc", json!({ "file_path": "socket" })),
        ToolUse::new("w4", "wc", json!({ "file_path": "pipe-link" })),
    ];

    let (sent, results) = mpsc::channel();
    std::thread::spawn(move || sent.send(block_on(host.run_batch(&uses)).results));
    let results = results.recv_timeout(PATIENCE).unwrap_or_else(|_| {
        // A writer for each open of the pipe lets it return, and the batch end.
        let fifo = workspace.path().join("fifo");
        std::thread::spawn(move || while std::fs::OpenOptions::new().write(true).open(&fifo).is_ok() {});
        panic!("no results {PATIENCE:?} after a batch with a deadline of 2 s");
    });

    assert_eq!(results[0], ToolResult::error("w1", "cannot read fifo: Not supported"));
    assert!(!results[1].is_error, "{}", results[1].content);
    assert_eq!(results[1].structured, Some(json!({ "path": "a.txt", "lines": 2, "words": 3, "bytes": 14 })));
    assert_eq!(results[2], ToolResult::error("w3", "cannot read socket: Not supported"));
    assert_eq!(results[3], ToolResult::error("w4", "cannot read pipe-link: Not supported"));
}
