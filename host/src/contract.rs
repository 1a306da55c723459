//! The constants of the contract between the host and its tools, as the WIT
//! files under `wit/` state them. The guest SDK restates them; a test
//! (`tests/all/contract.rs`) holds both to the WIT text.
//!
//! Every released contract version is kept in `wit/v<version>/` and the host
//! loads components of each (README, "Contract versions").

use std::path::{Component, Path};

/// The newest contract version, the one the guest SDK builds against: the
/// version of the `keel:tool` package in `wit/v0.4.0/`.
pub const CONTRACT_VERSION: &str = "0.4.0";

/// Every contract version this host loads, oldest first.
pub const SUPPORTED_CONTRACT_VERSIONS: [&str; 3] = ["0.2.0", "0.3.0", "0.4.0"];

/// [`SUPPORTED_CONTRACT_VERSIONS`] as a sentence names them: "0.2.0, 0.3.0
/// and 0.4.0".
pub(crate) fn supported_versions() -> String {
    match SUPPORTED_CONTRACT_VERSIONS.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The name of the interface every tool exports, without its version.
pub(crate) const GUEST_INTERFACE: &str = "keel:tool/guest";

/// Where the workspace appears inside the sandbox.
pub const WORKSPACE_MOUNT: &str = "/workspace";

/// Characters of output before persisting, for a tool that does not say
/// (`max-result-size`'s fallback and the SDK's default).
pub const DEFAULT_MAX_RESULT_SIZE_CHARS: u64 = 50_000;

/// The working directory a context names (`cwd`), as the tool sees it; the
/// workspace root when it names none.
pub fn cwd(context: &serde_json::Value) -> &str {
    context.get("cwd").and_then(serde_json::Value::as_str).unwrap_or(WORKSPACE_MOUNT)
}

/// `path`, seen from the sandbox working directory `cwd`, named as a
/// permission subject: relative to the workspace root and normalized
/// lexically (`./a/../secrets/k.txt` is `secrets/k.txt`), `.` for the root,
/// and the absolute normalized path for one outside the workspace. The guest
/// SDK's `Context::workspace_relative` does the same for plugins.
pub fn workspace_relative(cwd: &str, path: &str) -> String {
    let joined = Path::new(cwd).join(path);
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for part in joined.components() {
        match part {
            Component::Normal(name) => parts.push(name),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let mount = WORKSPACE_MOUNT.trim_start_matches('/');
    let named = |parts: &[&std::ffi::OsStr]| {
        parts.iter().map(|part| part.to_string_lossy()).collect::<Vec<_>>().join("/")
    };
    match parts.split_first() {
        Some((first, rest)) if *first == mount => {
            if rest.is_empty() {
                ".".into()
            } else {
                named(rest)
            }
        }
        _ => format!("/{}", named(&parts)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_version_is_supported() {
        assert_eq!(SUPPORTED_CONTRACT_VERSIONS.last(), Some(&CONTRACT_VERSION));
    }

    #[test]
    fn subjects_are_workspace_relative_and_normalized() {
        assert_eq!(workspace_relative("/workspace/secrets", "k.txt"), "secrets/k.txt");
        assert_eq!(workspace_relative("/workspace", "./a/../secrets/k.txt"), "secrets/k.txt");
        assert_eq!(workspace_relative("/workspace/a", ".."), ".");
        assert_eq!(workspace_relative("/workspace", "../../etc/passwd"), "/etc/passwd");
        assert_eq!(workspace_relative("/workspace/a", "/workspace/b/c"), "b/c");
        assert_eq!(workspace_relative("/workspace", "/workspacex/y"), "/workspacex/y");
    }
}
