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

/// The most links [`resolve_links`] follows for one subject: more than the
/// sandbox follows for one path (cap-std's 40), so that a name the sandbox
/// can open is followed to its end.
const MAX_LINKS: usize = 64;

/// One step of a path still to resolve.
enum Step {
    Name(std::ffi::OsString),
    Up,
}

/// The name a path subject (as [`workspace_relative`] names one) has once the
/// symbolic links of the workspace at `root` on the host are followed, as
/// the sandbox follows them, through the part of the path that exists:
/// `secrets/k.txt` for `pub/k.txt` where `pub` is a link to `secrets`. `None`
/// when that is the subject itself: no link on the way, a subject outside
/// the workspace (absolute), or a link the sandbox does not follow (to an
/// absolute target, out of the workspace, or past the links it follows for
/// one path), through which the call cannot open anything. One `readlink`
/// for each part of the path that exists, and one more for the first that
/// does not.
pub fn resolve_links(root: &Path, subject: &str) -> Option<String> {
    if subject.starts_with('/') {
        return None;
    }
    let steps = |path: &Path| -> Option<Vec<Step>> {
        let mut steps = Vec::new();
        for part in path.components().rev() {
            match part {
                Component::Normal(name) => steps.push(Step::Name(name.to_owned())),
                Component::ParentDir => steps.push(Step::Up),
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => return None,
            }
        }
        Some(steps)
    };
    let mut pending = steps(Path::new(subject))?;
    let mut real: Vec<std::ffi::OsString> = Vec::new();
    let mut host = root.to_path_buf();
    let mut links = 0;
    let mut exists = true;
    while let Some(step) = pending.pop() {
        let name = match step {
            // Above the workspace: the sandbox refuses the path.
            Step::Up => {
                real.pop()?;
                host.pop();
                continue;
            }
            Step::Name(name) if !exists => {
                real.push(name);
                continue;
            }
            Step::Name(name) => name,
        };
        host.push(&name);
        match std::fs::read_link(&host) {
            Ok(target) => {
                links += 1;
                if links > MAX_LINKS {
                    return None;
                }
                host.pop();
                pending.extend(steps(&target)?);
            }
            // There, and not a link.
            Err(error) if error.kind() == std::io::ErrorKind::InvalidInput => real.push(name),
            // Not there (or not to be read): the rest is as named.
            Err(_) => {
                host.pop();
                real.push(name);
                exists = false;
            }
        }
    }
    let resolved = if real.is_empty() {
        ".".to_owned()
    } else {
        real.iter().map(|part| part.to_string_lossy()).collect::<Vec<_>>().join("/")
    };
    (resolved != subject).then_some(resolved)
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

    #[test]
    fn links_inside_the_workspace_are_followed_where_the_path_exists() {
        use std::os::unix::fs::symlink;
        let root = tempfile::tempdir().unwrap();
        let (root, outside) = (root.path().join("ws"), root.path().join("outside"));
        std::fs::create_dir_all(root.join("secrets/deep")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(root.join("secrets/k.txt"), "k").unwrap();
        symlink("secrets", root.join("pub")).unwrap();
        symlink("../secrets/deep", root.join("secrets/down")).unwrap();
        symlink("pub/down/..", root.join("chain")).unwrap();
        symlink(".", root.join("here")).unwrap();
        symlink("../outside", root.join("out")).unwrap();
        symlink(&outside, root.join("absolute")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        let resolve = |subject: &str| resolve_links(&root, subject);
        assert_eq!(resolve("pub/k.txt").as_deref(), Some("secrets/k.txt"));
        assert_eq!(resolve("pub/new/file.txt").as_deref(), Some("secrets/new/file.txt"), "a missing tail");
        assert_eq!(resolve("pub").as_deref(), Some("secrets"));
        assert_eq!(resolve("pub/down/x").as_deref(), Some("secrets/deep/x"), "a link within a link");
        assert_eq!(resolve("chain/k.txt").as_deref(), Some("secrets/k.txt"), "`..` after a link is physical");
        assert_eq!(resolve("here/here/keel.toml").as_deref(), Some("keel.toml"));
        assert_eq!(resolve("here").as_deref(), Some("."));
        assert_eq!(resolve("./secrets/k.txt").as_deref(), Some("secrets/k.txt"), "normalized");
        assert_eq!(resolve("secrets/k.txt"), None, "no link on the way");
        assert_eq!(resolve("missing/pub/k.txt"), None, "nothing is followed past what is missing");
        assert_eq!(resolve("secrets/k.txt/x"), None);
        assert_eq!(resolve("out/secret.txt"), None, "the sandbox follows no link out");
        assert_eq!(resolve("absolute/secret.txt"), None, "nor a link to an absolute path");
        assert_eq!(resolve("loop/x"), None, "nor a loop");
        assert_eq!(resolve("/etc/passwd"), None, "outside the workspace already");
    }
}
