//! The library's error type.

use std::path::PathBuf;

/// What can go wrong while building a host, loading plugins or reading a batch.
///
/// Failures of single calls are not errors: they become `tool_result` blocks
/// with `is_error` set, and the batch goes on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory could not be read or written. The I/O error's
    /// text ends the message; it is not also the error's `source`, which a
    /// report of the whole chain would print a second time.
    #[error("failed to {action} {}: {error}", path.display())]
    Io {
        /// What was being done, as a verb phrase: "read", "create".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
    /// A plugin file could not be loaded.
    #[error("failed to load plugin {}: {reason}", path.display())]
    Plugin {
        /// The plugin file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// The configuration file is invalid.
    #[error("invalid config {}: {reason}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        reason: String,
    },
    /// The lock file is invalid.
    #[error("invalid lock {}: {reason}", path.display())]
    Lock {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        reason: String,
    },
    /// A `[plugins]` section of the configuration grants something invalid.
    #[error("invalid grant [plugins.{pattern:?}]: {reason}")]
    Grant {
        /// The section: a tool name or pattern.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A plugin is not the one its pins (`keel.lock`, a `sha256` key) name.
    #[error("refused plugin {}: {reason}", path.display())]
    Pin {
        /// The plugin file, or the `oci://` reference it was pulled by.
        path: PathBuf,
        /// Which pin it breaks, with both digests.
        reason: String,
    },
    /// With `--locked`, a lock entry whose plugin the run does not load.
    #[error("{} pins {name} (from {source_of}), which this run does not load (--locked)", lock.display())]
    Unanswered {
        /// The lock.
        lock: PathBuf,
        /// The entry's tool name.
        name: String,
        /// Where the entry says it came from.
        source_of: String,
    },
    /// `--locked` was asked for, and there is no lock.
    #[error("--locked needs a lock, and there is none at {}; run `keel lock` to write one", lock.display())]
    NoLock {
        /// Where the lock was looked for.
        lock: PathBuf,
    },
    /// A plugin could not be pulled from an OCI registry, or pushed to one.
    #[error("failed to {action} {reference}: {reason}")]
    Registry {
        /// What was being done: "pull" or "push".
        action: &'static str,
        /// The `oci://` reference.
        reference: String,
        /// What went wrong.
        reason: String,
    },
    /// The wasmtime engine could not be set up.
    #[error("failed to set up the WebAssembly engine: {0}")]
    Engine(String),
    /// A batch of tool calls could not be read.
    #[error("failed to read batch {origin}: {reason}")]
    Batch {
        /// Where the batch came from: a file path or `<stdin>`.
        origin: String,
        /// What was wrong with it.
        reason: String,
    },
}

/// The result type of `keel-host`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The error of doing `action` (a verb: "read", "create") to `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Io { action, path: path.into(), error }
    }

    pub(crate) fn plugin(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Plugin { path: path.into(), reason: reason.into() }
    }
}
