//! Capability grants: what each plugin may reach besides its input.
//!
//! A plugin gets, by default, the workspace and nothing else: read-write for
//! a call that is not read-only, read-only for one that is. The `[plugins]`
//! section of `keel.toml` changes that per plugin, by tool name or by a
//! namespace pattern:
//!
//! ```toml
//! [plugins.grep]
//! access = "read-only"          # never write the workspace, whatever the call
//!
//! [plugins."acme_*"]            # every tool whose name starts with `acme_`
//! env = ["ACME_REGION"]         # values come from the host's environment
//! dirs = [{ path = "/srv/reference", mount = "/reference" }]   # read-only unless `access` says
//! trusted = true                # its `max-result-size = none` is honoured
//! network = ["https://api.acme.dev"]   # where its calls may send HTTP requests
//!
//! [plugins."acme_*".secrets]    # headers the host adds; the guest never sees them
//! "https://api.acme.dev" = { header = "Authorization", value = "Bearer ${ACME_TOKEN}" }
//! ```
//!
//! One section applies to a tool: the one named exactly after it, else the
//! matching pattern with the most literal characters (the most specific), ties
//! going to the pattern that sorts first. Sections are never merged, so
//! adding a broad pattern never widens a plugin that has a section of its own.
//!
//! Whatever is granted, a call whose `plan` says it is read-only gets every
//! directory read-only, and a call whose `is-open-world` answer is false gets
//! no network: the claims are enforced, not trusted. The network grant's
//! syntax and rules are in `network`.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::contract::WORKSPACE_MOUNT;
use crate::error::{Error, Result};
use crate::load::network::{NetworkGrant, SecretConfig, TlsRoots};

/// Access to one directory.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read files and list directories; nothing can be created, changed,
    /// renamed, linked or removed.
    #[default]
    ReadOnly,
    /// Read and write.
    ReadWrite,
}

/// `[plugins.<name or pattern>]`: the grants of the plugins it matches.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, expecting = "a `[plugins.NAME]` table of grants")]
pub struct PluginConfig {
    /// The most the workspace is granted: `read-only` narrows the plugin so
    /// that no call of it writes. Default: `read-write` (for calls that are
    /// not read-only).
    pub access: Option<Access>,
    /// More directories to mount.
    #[serde(default)]
    pub dirs: Vec<DirConfig>,
    /// Names of host environment variables the plugin sees, with their
    /// host values. A name not set on the host is left out.
    #[serde(default)]
    pub env: Vec<String>,
    /// Whether the plugin is trusted: its `max-result-size = none` (it bounds
    /// its own output) is honoured instead of clamped.
    #[serde(default)]
    pub trusted: bool,
    /// Origins its calls may send HTTP requests to: `scheme://host[:port]`,
    /// with `*.` wildcards, addresses and networks. Default: none.
    #[serde(default)]
    pub network: Vec<String>,
    /// Headers the host adds to requests for one origin, by origin; values
    /// may read the host's environment as `${NAME}`.
    #[serde(default)]
    pub secrets: BTreeMap<String, SecretConfig>,
    /// The sha256 digest (lowercase hex) the tool's component must have:
    /// a pin of this one plugin without a lock. Only in a section named
    /// after one tool.
    pub sha256: Option<String>,
}

/// One extra directory of a `[plugins.*]` section.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(
    deny_unknown_fields,
    expecting = "a table of `path`, `mount` and optionally `access`, such as `{ path = \"data\", mount = \"/data\" }`"
)]
pub struct DirConfig {
    /// The directory on the host. A relative path is taken from the
    /// workspace and must lead to a directory inside it, links followed; an
    /// absolute path is taken as it is.
    pub path: PathBuf,
    /// Where the plugin sees it: an absolute path outside `/workspace`.
    pub mount: String,
    /// Default: `read-only`.
    #[serde(default)]
    pub access: Access,
}

/// The `[plugins]` section: grants by tool name or pattern.
pub type PluginsConfig = BTreeMap<String, PluginConfig>;

/// What one plugin may reach, resolved from the config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginGrant {
    /// The workspace on the host, mounted at [`WORKSPACE_MOUNT`].
    pub workspace: PathBuf,
    /// The most the workspace is granted.
    pub workspace_access: Access,
    /// Extra directories.
    pub dirs: Vec<DirGrant>,
    /// Environment variables and their values.
    pub env: Vec<(String, String)>,
    /// Whether the plugin is trusted to bound its own output.
    pub trusted: bool,
    /// Where its calls may send HTTP requests, and the secrets added to them.
    pub network: Arc<NetworkGrant>,
}

impl PluginGrant {
    /// The default grant: the workspace, and nothing else.
    pub fn workspace_only(workspace: &Path) -> Self {
        PluginGrant {
            workspace: workspace.to_path_buf(),
            workspace_access: Access::ReadWrite,
            dirs: Vec::new(),
            env: Vec::new(),
            trusted: false,
            network: Arc::default(),
        }
    }
}

/// One extra directory granted to a plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where the plugin sees it.
    pub mount: String,
    /// The most it is granted.
    pub access: Access,
}

/// Every section of `[plugins]`, checked and resolved against a workspace.
#[derive(Clone, Debug)]
pub struct Grants {
    workspace: PathBuf,
    sections: Vec<(String, PluginGrant)>,
}

impl Grants {
    /// No sections: every plugin gets [`PluginGrant::workspace_only`].
    pub fn none(workspace: &Path) -> Self {
        Grants { workspace: workspace.to_path_buf(), sections: Vec::new() }
    }

    /// Check `config` and resolve it for `workspace`, reading granted
    /// environment variables from the host's environment now.
    pub fn from_config(config: &PluginsConfig, workspace: &Path) -> Result<Self> {
        Grants::from_config_with_env(config, workspace, |name| std::env::var(name).ok())
    }

    /// [`Grants::from_config`] with `env` standing in for the host's environment.
    pub fn from_config_with_env(
        config: &PluginsConfig,
        workspace: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let invalid = |pattern: &str, reason: String| Error::Grant { pattern: pattern.to_string(), reason };
        let mut sections = Vec::new();
        for (pattern, section) in config {
            check_pattern(pattern).map_err(|reason| invalid(pattern, reason))?;
            let mut dirs = Vec::new();
            for dir in &section.dirs {
                check_mount(&dir.mount, dirs.iter().map(|d: &DirGrant| d.mount.as_str()))
                    .map_err(|reason| invalid(pattern, reason))?;
                let joined = workspace.join(&dir.path);
                let host = joined.canonicalize().map_err(|error| {
                    invalid(pattern, format!("cannot open directory {}: {error}", joined.display()))
                })?;
                if dir.path.is_relative() {
                    within_workspace(&dir.path, &host, workspace)
                        .map_err(|reason| invalid(pattern, reason))?;
                }
                if !host.is_dir() {
                    return Err(invalid(pattern, format!("{} is not a directory", host.display())));
                }
                dirs.push(DirGrant { host, mount: dir.mount.clone(), access: dir.access });
            }
            let mut vars = Vec::new();
            for name in &section.env {
                if name.is_empty() || name.contains('=') || name.contains('\0') {
                    return Err(invalid(pattern, format!("{name:?} is not an environment variable name")));
                }
                match env(name) {
                    Some(value) => vars.push((name.clone(), value)),
                    None => {
                        tracing::debug!(plugins = %pattern, "granted variable {name} is not set; left out")
                    }
                }
            }
            let secrets: Vec<_> =
                section.secrets.iter().map(|(origin, secret)| (origin.clone(), secret.clone())).collect();
            let network = NetworkGrant::parse(&section.network, &secrets, &env)
                .map_err(|reason| invalid(pattern, reason))?;
            let grant = PluginGrant {
                workspace: workspace.to_path_buf(),
                workspace_access: section.access.unwrap_or(Access::ReadWrite),
                dirs,
                env: vars,
                trusted: section.trusted,
                network: Arc::new(network),
            };
            sections.push((pattern.clone(), grant));
        }
        Ok(Grants { workspace: workspace.to_path_buf(), sections })
    }

    /// Verify every plugin's TLS against `tls`.
    pub fn trust(&mut self, tls: &TlsRoots) {
        for (_, grant) in &mut self.sections {
            Arc::make_mut(&mut grant.network).trust(tls.clone());
        }
    }

    /// The workspace the grants were resolved for.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The sections (`[plugins.PATTERN]`) that apply to none of `names`.
    pub fn unmatched<'a>(&'a self, names: &[&str]) -> Vec<&'a str> {
        let applies = |pattern: &str, name: &str| pattern == name || glob_matches(pattern, name);
        self.sections
            .iter()
            .map(|(pattern, _)| pattern.as_str())
            .filter(|pattern| !names.iter().any(|name| applies(pattern, name)))
            .collect()
    }

    /// The grant of the tool called `name`.
    pub fn for_tool(&self, name: &str) -> PluginGrant {
        if let Some((_, grant)) = self.sections.iter().find(|(pattern, _)| pattern == name) {
            return grant.clone();
        }
        let best = self
            .sections
            .iter()
            .filter(|(pattern, _)| pattern.contains('*') && glob_matches(pattern, name))
            // `sections` is sorted by pattern, and `max_by_key` keeps the
            // last of equals: reverse so that ties go to the first.
            .rev()
            .max_by_key(|(pattern, _)| pattern.chars().filter(|&c| c != '*').count());
        match best {
            Some((_, grant)) => grant.clone(),
            None => PluginGrant::workspace_only(&self.workspace),
        }
    }
}

/// A relative `dirs` path, resolved to `host`, must stay in the workspace:
/// a tool may write the workspace, and a link it leaves there (`build/out ->
/// ../../elsewhere`) must not become a grant of where it leads at the next
/// start. An absolute path is the way to grant a directory outside.
fn within_workspace(path: &Path, host: &Path, workspace: &Path) -> Result<(), String> {
    let root = workspace
        .canonicalize()
        .map_err(|error| format!("cannot open workspace {}: {error}", workspace.display()))?;
    if host.starts_with(&root) {
        return Ok(());
    }
    Err(format!(
        "dirs entry {:?} leads outside the workspace, to {}; a relative path grants a directory of the \
         workspace: to grant one outside it on purpose, write its absolute path",
        path.display().to_string(),
        host.display()
    ))
}

/// A section key is a tool name, or a pattern of name characters and `*`.
fn check_pattern(pattern: &str) -> Result<(), String> {
    let ok = !pattern.is_empty()
        && pattern.len() <= 64
        && pattern.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'*');
    if ok { Ok(()) } else { Err("a section is named by a tool name, or a pattern of one with `*`".into()) }
}

/// A mount is absolute, plain (no `.` or `..`), not the root, not the
/// workspace nor inside or above it, and not taken twice.
fn check_mount<'a>(mount: &str, taken: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
    let path = Path::new(mount);
    let plain = path.is_absolute()
        && path.components().skip(1).all(|part| matches!(part, Component::Normal(_)))
        && path.components().count() > 1;
    if !plain {
        return Err(format!("mount {mount:?} must be an absolute path such as \"/reference\""));
    }
    let workspace = Path::new(WORKSPACE_MOUNT);
    if path.starts_with(workspace) || workspace.starts_with(path) {
        return Err(format!("mount {mount:?} overlaps the workspace at {WORKSPACE_MOUNT}"));
    }
    for other in taken {
        let other = Path::new(other);
        if path.starts_with(other) || other.starts_with(path) {
            return Err(format!("mount {mount:?} overlaps mount {:?}", other.display()));
        }
    }
    Ok(())
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (none included) and every other character for itself.
fn glob_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> PluginsConfig {
        toml::from_str(text).unwrap()
    }

    fn grants(text: &str) -> Grants {
        Grants::from_config_with_env(&config(text), Path::new("/ws"), |name| {
            (name == "REGION").then(|| "eu".to_string())
        })
        .unwrap()
    }

    #[test]
    fn globs_match_any_run_of_characters() {
        assert!(glob_matches("acme_*", "acme_fetch"));
        assert!(glob_matches("acme_*", "acme_"));
        assert!(!glob_matches("acme_*", "acm_fetch"));
        assert!(glob_matches("*_fetch", "acme_fetch"));
        assert!(glob_matches("a*b*c", "abc"));
        assert!(glob_matches("a*b*c", "axxbyyc"));
        assert!(!glob_matches("a*b*c", "axxcyyb"));
        assert!(!glob_matches("ab*ba", "aba"), "the prefix and suffix cannot share characters");
        assert!(glob_matches("*", "anything"));
        assert!(!glob_matches("grep", "grep2"));
    }

    #[test]
    fn an_unlisted_tool_gets_the_workspace_only() {
        let grant = grants("[acme_fetch]\naccess = \"read-only\"\n").for_tool("grep");
        assert_eq!(grant, PluginGrant::workspace_only(Path::new("/ws")));
        assert_eq!(grant.workspace_access, Access::ReadWrite);
    }

    #[test]
    fn the_exact_name_wins_over_patterns_and_sections_never_merge() {
        let grants = grants(
            "[\"acme_*\"]\nenv = [\"REGION\"]\ntrusted = true\n\
             [acme_fetch]\naccess = \"read-only\"\n",
        );
        let fetch = grants.for_tool("acme_fetch");
        assert_eq!(fetch.workspace_access, Access::ReadOnly);
        assert_eq!(fetch.env, [] as [(String, String); 0], "the pattern's env is not merged in");
        assert!(!fetch.trusted);
        let other = grants.for_tool("acme_put");
        assert_eq!(other.env, [("REGION".to_string(), "eu".to_string())]);
        assert!(other.trusted);
    }

    #[test]
    fn the_most_specific_pattern_wins() {
        let grants = grants("[\"*\"]\ntrusted = true\n[\"acme_*\"]\naccess = \"read-only\"\n");
        assert_eq!(grants.for_tool("acme_x").workspace_access, Access::ReadOnly);
        assert!(!grants.for_tool("acme_x").trusted);
        assert!(grants.for_tool("grep").trusted);
    }

    #[test]
    fn unset_variables_are_left_out() {
        let grant = grants("[t]\nenv = [\"REGION\", \"MISSING\"]\n").for_tool("t");
        assert_eq!(grant.env, [("REGION".to_string(), "eu".to_string())]);
    }

    fn error(text: &str) -> String {
        Grants::from_config_with_env(&config(text), Path::new("/"), |_| None).unwrap_err().to_string()
    }

    #[test]
    fn bad_sections_are_refused_naming_the_section() {
        assert_eq!(
            error("[\"acme/*\"]\n"),
            "invalid grant [plugins.\"acme/*\"]: a section is named by a tool name, or a pattern of one with `*`"
        );
        assert_eq!(
            error("[t]\ndirs = [{ path = \"/tmp\", mount = \"/workspace/x\" }]\n"),
            "invalid grant [plugins.\"t\"]: mount \"/workspace/x\" overlaps the workspace at /workspace"
        );
        assert_eq!(
            error("[t]\ndirs = [{ path = \"/tmp\", mount = \"ref\" }]\n"),
            "invalid grant [plugins.\"t\"]: mount \"ref\" must be an absolute path such as \"/reference\""
        );
        assert_eq!(
            error("[t]\ndirs = [{ path = \"/tmp\", mount = \"/a/../b\" }]\n"),
            "invalid grant [plugins.\"t\"]: mount \"/a/../b\" must be an absolute path such as \"/reference\""
        );
        assert_eq!(
            error(
                "[t]\ndirs = [{ path = \"/tmp\", mount = \"/r\" }, { path = \"/tmp\", mount = \"/r/s\" }]\n"
            ),
            "invalid grant [plugins.\"t\"]: mount \"/r/s\" overlaps mount \"/r\""
        );
        assert_eq!(
            error("[t]\nenv = [\"A=B\"]\n"),
            "invalid grant [plugins.\"t\"]: \"A=B\" is not an environment variable name"
        );
        assert!(
            error("[t]\ndirs = [{ path = \"/no/such/dir\", mount = \"/r\" }]\n")
                .starts_with("invalid grant [plugins.\"t\"]: cannot open directory /no/such/dir: ")
        );
    }
}
