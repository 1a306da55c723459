//! Permission rules: the host's say on a call, after the tool's own.
//!
//! A call that passed its schema and the tool's own validation is first
//! judged by the tool (both are its `check` export), then by the rules of the
//! `[permissions]` section of `keel.toml`:
//!
//! ```toml
//! [permissions]
//! allow = ["grep", "write_file(docs/**)"]
//! ask = ["write_file"]
//! deny = ["write_file(**/*.lock)", "acme__*"]
//! default = "allow"   # what a call no rule matches gets: "allow", "ask" or "deny"
//! mode = "full"       # "simple" offers only the core built-ins
//! ```
//!
//! # Rules
//!
//! A rule is `Tool` or `Tool(pattern)`. `Tool` is a tool's name, or a glob
//! over names where `*` stands for any run of characters. A `deny` rule
//! matches a tool by its name or by any of its aliases, so renaming a tool
//! never slips it past an old rule. An `allow` or `ask` rule matches a
//! plugin by its name only: its aliases are the plugin's own claim, and a
//! plugin declaring another tool's name as an alias must not get that tool's
//! `allow` (nor an `ask` where the default denies). A built-in or native tool
//! is the host's own, so any rule matches it by an alias too. `pattern` is a glob matched against the tool's
//! `permission-subject` for the call's input (a path, a command line): `*`
//! matches any run of characters, `/` included, so a rule never misses a
//! subject for having more path segments than its author thought of; `**`
//! reads the same (`docs/**`, `**/*.lock`), `?` matches one character,
//! `[abc]` a class, `{a,b}` either, and `\` escapes. Every glob is compiled
//! once, when the configuration is read.
//!
//! A tool that gives no subject for a call cannot be proved outside a
//! pattern: a `deny` or `ask` rule with a pattern applies to it, an `allow`
//! rule with a pattern does not.
//!
//! # Links
//!
//! A path subject names a file as the tool was asked for it, but the call
//! opens it through the workspace's symbolic links: with `pub` a link to
//! `secrets`, `pub/k.txt` is `secrets/k.txt`. In a host that knows its
//! workspace ([`Permissions::in_workspace`]), a subject a pattern rule is
//! matched against is also resolved through the links of its part that
//! exists, inside the workspace only ([`crate::contract::resolve_links`]),
//! and the call gets the stricter of the answers for its two names: a `deny`
//! or `ask` rule takes it by either, and an `allow` holds only when both
//! names are allowed. This costs a `readlink` per existing part of the path,
//! and only calls whose tool a pattern rule names, or that keel's own files
//! need guarding from, pay it.
//!
//! # keel's own files
//!
//! The configuration, the lock file, the plugins and the compile cache keel
//! started with ([`KeelFile`]) decide what every tool may do at its next
//! start. Where they lie in the workspace ([`Permissions::guarding`]), every
//! call that names one of them, or a path inside a folder of them, by either
//! name, is refused whatever the rules say, unless every call of its tool is
//! read-only (the sandbox holds such a call to reading). A plugin that writes
//! there without naming the path is seen by no rule: only keeping those files
//! where no plugin may write stops it.
//!
//! # Plugin namespaces
//!
//! The namespace of a tool is the part of its name before its first `__`
//! ([`NAMESPACE_SEPARATOR`]): `acme__search` and `acme__fetch` are the
//! namespace `acme`, as MCP clients name a server's tools
//! `mcp__<server>__<tool>`. The rule `acme__*` names every tool of the
//! namespace; as a `deny` rule it removes them all from the pool before the
//! model sees it. Any other name glob works the same way (`acme_*` for a
//! family that uses one underscore).
//!
//! # Deciding
//!
//! Deny beats ask beats allow: the first `deny` rule that matches decides,
//! else the first `ask` rule, else the first `allow` rule, else the
//! configured `default` (allow, unless set). The tool's own answer is then
//! combined with the host's, and the stricter wins: rules can tighten what a
//! tool decided, never loosen it. An `ask` goes to the [`Prompter`] the
//! embedding agent supplied; without one it is a denial saying the call
//! requires approval.
//!
//! The same matcher decides which tools the model sees at all: a `deny`
//! rule without a pattern covers every call of the tools it names, so those
//! tools are left out of the pool (see the pool's assembly) instead of failing
//! at call time.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use serde::Deserialize;
use serde_json::Value;

use crate::tool::{ToolOrigin, ToolSpec};

/// What separates a plugin namespace from the rest of a tool's name.
pub const NAMESPACE_SEPARATOR: &str = "__";

/// The namespace of a tool name: the part before its first `__`, if it has one.
///
/// ```
/// use keel_host::permissions::namespace;
/// assert_eq!(namespace("acme__search"), Some("acme"));
/// assert_eq!(namespace("mcp__github__create_issue"), Some("mcp"));
/// assert_eq!(namespace("grep"), None);
/// ```
pub fn namespace(tool: &str) -> Option<&str> {
    tool.split_once(NAMESPACE_SEPARATOR).map(|(namespace, _)| namespace).filter(|ns| !ns.is_empty())
}

/// What a rule, or the default, says about a call. Ordered from the loosest
/// to the strictest, so the stricter of two answers is their maximum.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Behavior {
    /// Run the call.
    #[default]
    Allow,
    /// Ask a person first.
    Ask,
    /// Refuse the call.
    Deny,
}

impl fmt::Display for Behavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Behavior::Allow => "allow",
            Behavior::Ask => "ask",
            Behavior::Deny => "deny",
        })
    }
}

/// Which tools are offered at all, before any rule is looked at.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every enabled tool. The default.
    #[default]
    Full,
    /// Only the core built-ins (the pool's `CORE_BUILTINS`): no plugins,
    /// no native tools of the embedding agent.
    Simple,
}

/// `[permissions]`: rules, the default for calls no rule matches, and the
/// mode. Every key is optional; the defaults allow every call the tool
/// itself allows.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, expecting = "the `[permissions]` table")]
pub struct PermissionsConfig {
    /// Calls that run without asking.
    #[serde(default)]
    pub allow: Vec<Rule>,
    /// Calls that need a person's approval.
    #[serde(default)]
    pub ask: Vec<Rule>,
    /// Calls that never run; a rule without a pattern also removes the tools
    /// it names from the pool.
    #[serde(default)]
    pub deny: Vec<Rule>,
    /// What a call no rule matches gets. Default: allow.
    #[serde(default)]
    pub default: Behavior,
    /// Which tools are offered. Default: all of them.
    #[serde(default)]
    pub mode: Mode,
}

/// A rule could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid permission rule {rule:?}: {reason}")]
pub struct RuleError {
    /// The rule as written.
    pub rule: String,
    /// What is wrong with it.
    pub reason: String,
}

/// One permission rule, `Tool` or `Tool(pattern)`, compiled once.
#[derive(Clone)]
pub struct Rule {
    text: String,
    tool: GlobMatcher,
    subject: Option<GlobMatcher>,
}

impl Rule {
    /// Read and compile a rule.
    ///
    /// ```
    /// use keel_host::permissions::Rule;
    /// let rule = Rule::parse("write_file(docs/**)").unwrap();
    /// assert_eq!(rule.as_str(), "write_file(docs/**)");
    /// assert_eq!(
    ///     Rule::parse("write_file(docs/**").unwrap_err().to_string(),
    ///     r#"invalid permission rule "write_file(docs/**": the pattern is not closed with `)`"#
    /// );
    /// ```
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let invalid = |reason: &str| RuleError { rule: text.to_string(), reason: reason.to_string() };
        let (tool, pattern) = match text.split_once('(') {
            None => (text, None),
            Some((tool, rest)) => {
                let pattern =
                    rest.strip_suffix(')').ok_or_else(|| invalid("the pattern is not closed with `)`"))?;
                if pattern.is_empty() {
                    return Err(invalid(
                        "the pattern in `()` is empty; write the tool alone to match every call",
                    ));
                }
                (tool, Some(pattern))
            }
        };
        if tool.is_empty() {
            return Err(invalid("a rule starts with a tool name, as in `Tool` or `Tool(pattern)`"));
        }
        if !tool.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'*') {
            return Err(invalid(
                "a tool name holds only letters, digits, `_`, `-`, and `*` for any run of them",
            ));
        }
        let compile = |glob: &str| {
            GlobBuilder::new(glob)
                .literal_separator(false)
                .backslash_escape(true)
                .build()
                .map(|glob| glob.compile_matcher())
                .map_err(|error| invalid(&error.kind().to_string()))
        };
        Ok(Rule { text: text.to_string(), tool: compile(tool)?, subject: pattern.map(compile).transpose()? })
    }

    /// The rule as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the rule has a pattern, so that it covers only some calls.
    pub fn has_pattern(&self) -> bool {
        self.subject.is_some()
    }

    /// Whether the rule, as a rule of the list `behavior`, names this tool:
    /// by its name, or by one of its aliases where an alias can only tighten
    /// (see [`Rule::names_by_alias`]).
    pub fn names(&self, spec: &ToolSpec, behavior: Behavior) -> bool {
        self.names_tool(&spec.name)
            || (aliases_count(spec, behavior) && spec.aliases.iter().any(|alias| self.names_tool(alias)))
    }

    /// Whether the rule's tool part matches one of the aliases of `spec`,
    /// whoever declared them: for the rules [`Rule::names`] does not take
    /// by an alias, so that a start-up warning can say why.
    pub fn names_by_alias(&self, spec: &ToolSpec) -> bool {
        spec.aliases.iter().any(|alias| self.names_tool(alias))
    }

    /// Whether the rule's tool part matches `name`.
    pub fn names_tool(&self, name: &str) -> bool {
        self.tool.is_match(name)
    }

    /// The rule's tool part as written: a name, or a glob of names.
    pub fn tool(&self) -> &str {
        self.tool.glob().glob()
    }

    /// The matcher, for the pool filter and the call check alike.
    fn matches(&self, spec: &ToolSpec, subject: Subject<'_>, behavior: Behavior) -> bool {
        if !self.names(spec, behavior) {
            return false;
        }
        match (&self.subject, subject) {
            (None, _) => true,
            (Some(_), Subject::EveryCall) => false,
            (Some(pattern), Subject::Known(subject)) => pattern.is_match(subject),
            // A pattern cannot be ruled out for a call that says nothing
            // about what it touches: the safe side is to apply a deny or an
            // ask, and not an allow.
            (Some(_), Subject::Unknown) => behavior != Behavior::Allow,
        }
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Rule").field(&self.text).finish()
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq for Rule {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl std::str::FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Rule::parse(text)
    }
}

impl<'de> Deserialize<'de> for Rule {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Rule::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// `path` on the host, named as a subject names a path of the workspace at
/// `root` (canonical): relative to it, `.` for the root, its links followed
/// where it exists. `None` outside the workspace.
fn subject_in(root: &Path, path: &Path) -> Option<String> {
    let path = std::path::absolute(path).ok()?;
    // The deepest part that exists, canonical, and the rest as named.
    let mut rest = Vec::new();
    let mut at = path.as_path();
    let real = loop {
        match at.canonicalize() {
            Ok(real) => break real,
            Err(_) => {
                rest.push(at.file_name()?);
                at = at.parent()?;
            }
        }
    };
    let full = rest.iter().rev().fold(real, |full, part| full.join(part));
    let relative = full.strip_prefix(root).ok()?;
    let parts: Vec<_> = relative.components().map(|part| part.as_os_str().to_string_lossy()).collect();
    Some(if parts.is_empty() { ".".to_owned() } else { parts.join("/") })
}

/// Whether a rule of the list `behavior` may name `spec` by an alias: a
/// `deny` rule may (an alias can only take calls away), and so may any rule
/// of a built-in or native tool, whose aliases are the host's own. An
/// `allow` or `ask` rule names a plugin by its name only: the plugin chose
/// its aliases, and the answers a plugin gives about itself never loosen
/// anything.
fn aliases_count(spec: &ToolSpec, behavior: Behavior) -> bool {
    behavior == Behavior::Deny || spec.origin == ToolOrigin::BuiltIn
}

/// What a rule is matched against.
#[derive(Clone, Copy, Debug)]
enum Subject<'a> {
    /// Every call of the tool, whatever its input: the pool filter.
    EveryCall,
    /// One call whose tool gave this subject.
    Known(&'a str),
    /// One call whose tool gave no subject.
    Unknown,
}

/// The host's answer from its rules alone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RuleDecision<'a> {
    /// A rule matched.
    Rule {
        /// The list it came from.
        behavior: Behavior,
        /// The rule.
        rule: &'a Rule,
    },
    /// No rule matched; the configured default applies.
    Default(Behavior),
}

impl RuleDecision<'_> {
    /// What the decision says.
    pub fn behavior(&self) -> Behavior {
        match *self {
            RuleDecision::Rule { behavior, .. } | RuleDecision::Default(behavior) => behavior,
        }
    }
}

/// A call waiting for a person's approval.
#[derive(Clone, Debug, PartialEq)]
pub struct ApprovalRequest {
    /// The call's `tool_use` id.
    pub tool_use_id: String,
    /// The tool's name.
    pub tool: String,
    /// The input the call would run with.
    pub input: Value,
    /// The tool's permission subject for that input, if it gave one.
    pub subject: Option<String>,
    /// Why approval is needed: the tool's message, the rule that asks, or
    /// the default. Never empty.
    pub reasons: Vec<String>,
}

/// A person's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Approval {
    /// Run the call.
    Allow,
    /// Refuse it, optionally saying why or what to do instead; the model
    /// reads this.
    Deny(Option<String>),
}

/// Asks a person whether a call may run. The embedding agent supplies one
/// (a dialog, a chat message, a terminal prompt); calls of a concurrent run
/// may ask at the same time, so an implementation that can show only one
/// question at a time must queue them.
#[async_trait]
pub trait Prompter: Send + Sync {
    /// Ask about one call.
    async fn ask(&self, request: &ApprovalRequest) -> Approval;

    /// Whether a person can be asked about the call `tool_use_id` at all.
    /// A prompter that serves several clients (`keel serve`) answers per
    /// call: only some clients can ask their user. Where it is false, a call
    /// that needs approval is refused as in a run with no prompter, and so is
    /// a tool that needs a person. Default: always.
    fn can_ask(&self, tool_use_id: &str) -> bool {
        let _ = tool_use_id;
        true
    }
}

/// A call about to run, as the permission check sees it.
pub struct PendingCall<'a> {
    /// The call's `tool_use` id.
    pub tool_use_id: &'a str,
    /// The tool.
    pub spec: &'a ToolSpec,
    /// The input it would run with (after any update by the tool's check).
    pub input: &'a Value,
    /// The tool's permission subject for that input; `None` when it gave
    /// none, or when [`Permissions::wants_subject`] said no.
    pub subject: Option<String>,
    /// The tool's own `ask` message, when its check asked.
    pub tool_asks: Option<String>,
}

/// One of keel's own files, read when keel starts: a call that changed it
/// would change what keel lets every tool do from its next start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeelFile {
    /// The configuration (`keel.toml`): grants, rules and limits.
    Config,
    /// The lock file (`keel.lock`): the plugins keel may run.
    Lock,
    /// A plugin, or a folder keel loads every plugin of.
    Plugins,
    /// The compile cache: the native code keel runs for plugins.
    Cache,
}

impl KeelFile {
    /// What the file is, and why no call may change it.
    fn said(self, folder: bool) -> &'static str {
        match (self, folder) {
            (KeelFile::Config, _) => "keel's configuration, which grants what every tool may do",
            (KeelFile::Lock, _) => "keel's lock file, which pins the plugins keel runs",
            (KeelFile::Plugins, true) => "a folder keel loads its plugins from",
            (KeelFile::Plugins, false) => "a plugin keel loads",
            (KeelFile::Cache, _) => "keel's compile cache, whose code keel runs",
        }
    }

    /// What the file is, in a warning.
    pub fn what(self) -> &'static str {
        match self {
            KeelFile::Config => "keel's configuration",
            KeelFile::Lock => "keel's lock file",
            KeelFile::Plugins => "a plugin keel loads",
            KeelFile::Cache => "keel's compile cache",
        }
    }
}

/// One of keel's own files inside the workspace, named as a subject names it.
#[derive(Clone, Debug)]
struct Guarded {
    subject: String,
    kind: KeelFile,
    folder: bool,
}

impl Guarded {
    /// Whether `subject` is this file, or inside this folder.
    fn covers(&self, subject: &str) -> bool {
        subject == self.subject
            || (self.folder
                && (self.subject == "."
                    || subject.strip_prefix(self.subject.as_str()).is_some_and(|rest| rest.starts_with('/'))))
    }
}

/// The workspace on the host, as the rules see it.
#[derive(Clone, Debug, Default)]
struct Workspace {
    /// Its canonical path, where subjects' links are followed.
    root: PathBuf,
    /// keel's own files inside it.
    guarded: Vec<Guarded>,
    /// Tools every call of which is read-only, sorted: they cannot change
    /// keel's files, and are not asked for a subject to guard them.
    read_only: Vec<String>,
}

/// The host's permission rules, its default, its mode, and who to ask.
#[derive(Clone, Default)]
pub struct Permissions {
    config: PermissionsConfig,
    prompter: Option<Arc<dyn Prompter>>,
    workspace: Option<Arc<Workspace>>,
}

impl fmt::Debug for Permissions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permissions")
            .field("config", &self.config)
            .field("prompter", &self.prompter.as_ref().map(|_| "..."))
            .finish()
    }
}

impl Permissions {
    /// The rules of `config`, with no one to ask: an `ask` is a denial.
    pub fn new(config: PermissionsConfig) -> Self {
        Permissions { config, prompter: None, workspace: None }
    }

    /// Match path subjects also by where the links of the workspace at
    /// `root` (on the host) lead (see [Links](self#links)). Without it,
    /// subjects are matched as the tools named them.
    pub fn in_workspace(mut self, root: &Path) -> Self {
        let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        self.workspace = Some(Arc::new(Workspace { root, ..Workspace::default() }));
        self
    }

    /// Refuse every call that names one of keel's own `files` inside the
    /// workspace, or a path inside one that is a folder, unless its tool is
    /// one of `read_only_tools`, whose every call is read-only (see [keel's
    /// own files](self#keels-own-files)). A file need not exist yet: one a
    /// call creates is read at the next start all the same. Needs
    /// [`Permissions::in_workspace`] first; files outside the workspace are
    /// left to the grants.
    pub fn guarding(
        mut self,
        files: impl IntoIterator<Item = (KeelFile, PathBuf)>,
        read_only_tools: impl IntoIterator<Item = String>,
    ) -> Self {
        let Some(workspace) = &mut self.workspace else { return self };
        let workspace = Arc::make_mut(workspace);
        for (kind, path) in files {
            if let Some(subject) = subject_in(&workspace.root, &path)
                && !workspace.guarded.iter().any(|guarded| guarded.subject == subject)
            {
                workspace.guarded.push(Guarded { subject, kind, folder: path.is_dir() });
            }
        }
        workspace.read_only.extend(read_only_tools);
        workspace.read_only.sort();
        self
    }

    /// Send `ask` decisions to `prompter`.
    pub fn with_prompter(mut self, prompter: Arc<dyn Prompter>) -> Self {
        self.prompter = Some(prompter);
        self
    }

    /// Whether someone can be asked: a prompter was given. A run without
    /// one is not interactive, and refuses the tools that need a person.
    pub fn is_interactive(&self) -> bool {
        self.prompter.is_some()
    }

    /// Whether someone can be asked about the call `tool_use_id`: there is
    /// a prompter, and it can ask about that call.
    pub fn is_interactive_for(&self, tool_use_id: &str) -> bool {
        self.prompter.as_ref().is_some_and(|prompter| prompter.can_ask(tool_use_id))
    }

    /// The configuration the rules came from.
    pub fn config(&self) -> &PermissionsConfig {
        &self.config
    }

    /// Which tools are offered at all.
    pub fn mode(&self) -> Mode {
        self.config.mode
    }

    /// The `deny` rule that covers every call of this tool, if any: such a
    /// tool is left out of the pool.
    pub fn blanket_deny(&self, spec: &ToolSpec) -> Option<&Rule> {
        self.config.deny.iter().find(|rule| rule.matches(spec, Subject::EveryCall, Behavior::Deny))
    }

    /// Whether a call of this tool must say its permission subject: a rule
    /// about the tool has a pattern, or a person may be asked about the call
    /// (the prompter shows the subject). Otherwise the host does not ask the
    /// tool for it, which saves a guest call per call.
    pub fn wants_subject(&self, spec: &ToolSpec, tool_asks: bool) -> bool {
        let pattern = self.matches_subjects(spec);
        let may_ask = tool_asks
            || self.config.default == Behavior::Ask
            || self.config.ask.iter().any(|rule| rule.names(spec, Behavior::Ask));
        pattern || (self.prompter.is_some() && may_ask) || self.guards(spec)
    }

    /// Whether calls of this tool are kept from keel's own files: some lie
    /// in the workspace, and the tool's calls are not all read-only.
    fn guards(&self, spec: &ToolSpec) -> bool {
        self.workspace.as_ref().is_some_and(|workspace| {
            !workspace.guarded.is_empty() && workspace.read_only.binary_search(&spec.name).is_err()
        })
    }

    /// Whether a rule with a pattern names this tool, so that its subject
    /// decides.
    fn matches_subjects(&self, spec: &ToolSpec) -> bool {
        self.lists().any(|(behavior, rules)| {
            rules.iter().any(|rule| rule.has_pattern() && rule.names(spec, behavior))
        })
    }

    /// The other name of `subject`, through the workspace's links, when it
    /// has one and it matters: a pattern rule names the tool, or keel's own
    /// files are guarded from it.
    fn resolve(&self, spec: &ToolSpec, subject: Option<&str>) -> Option<String> {
        let (workspace, subject) = (self.workspace.as_ref()?, subject?);
        if !(self.guards(spec) || self.matches_subjects(spec)) {
            return None;
        }
        crate::contract::resolve_links(&workspace.root, subject)
    }

    /// The refusal of a call that names one of keel's own files, by its
    /// subject or where its links lead.
    fn guarded(&self, spec: &ToolSpec, subject: Option<&str>, resolved: Option<&str>) -> Option<String> {
        if !self.guards(spec) {
            return None;
        }
        let workspace = self.workspace.as_ref()?;
        let subject = subject?;
        let (named, guarded) = [Some(subject), resolved].into_iter().flatten().find_map(|named| {
            workspace.guarded.iter().find(|guarded| guarded.covers(named)).map(|guarded| (named, guarded))
        })?;
        let place =
            if named == guarded.subject { String::new() } else { format!("inside {}, ", guarded.subject) };
        let what = guarded.kind.said(guarded.folder);
        let said = if named == subject {
            format!("{subject} is {place}{what}")
        } else {
            format!("{subject} leads to {named}, {place}{what}")
        };
        Some(format!(
            "Permission to use {} denied: {said}; no call may change keel's own files, whatever the rules say",
            spec.name
        ))
    }

    /// The rules' answer for a call by both names of its subject, the one
    /// the tool gave and the one its links lead to: the stricter of the two,
    /// and whether it came from the second.
    fn decide(
        &self,
        spec: &ToolSpec,
        subject: Option<&str>,
        resolved: Option<&str>,
    ) -> (RuleDecision<'_>, bool) {
        let named = self.rule_decision(spec, subject);
        match resolved.map(|resolved| self.rule_decision(spec, Some(resolved))) {
            // At the same answer, a rule says more than the default.
            Some(linked)
                if linked.behavior() > named.behavior()
                    || (linked.behavior() == named.behavior()
                        && matches!(
                            (named, linked),
                            (RuleDecision::Default(_), RuleDecision::Rule { .. })
                        )) =>
            {
                (linked, true)
            }
            _ => (named, false),
        }
    }

    /// The rules' answer for one call of `spec` whose permission subject is
    /// `subject`: the first matching `deny` rule, else `ask`, else `allow`,
    /// else the default.
    pub fn rule_decision(&self, spec: &ToolSpec, subject: Option<&str>) -> RuleDecision<'_> {
        let subject = subject.map_or(Subject::Unknown, Subject::Known);
        for (behavior, rules) in self.lists() {
            if let Some(rule) = rules.iter().find(|rule| rule.matches(spec, subject, behavior)) {
                return RuleDecision::Rule { behavior, rule };
            }
        }
        RuleDecision::Default(self.config.default)
    }

    /// Decide one call whose tool allowed it or asked: `Ok` to run it, or
    /// the message of its error result. The stricter of the tool's answer
    /// and the rules' wins; an `ask` goes to the prompter.
    pub async fn authorize(&self, call: PendingCall<'_>) -> Result<(), String> {
        let name = &call.spec.name;
        let subject = call.subject.as_deref();
        let resolved = self.resolve(call.spec, subject);
        if let Some(refusal) = self.guarded(call.spec, subject, resolved.as_deref()) {
            return Err(refusal);
        }
        let (decision, by_link) = self.decide(call.spec, subject, resolved.as_deref());
        // A decision made by where the subject's links lead says so.
        let through = match (by_link, subject, &resolved) {
            (true, Some(subject), Some(resolved)) => format!(" ({subject} leads to {resolved})"),
            _ => String::new(),
        };
        let tool_behavior = if call.tool_asks.is_some() { Behavior::Ask } else { Behavior::Allow };
        match decision.behavior().max(tool_behavior) {
            Behavior::Allow => Ok(()),
            Behavior::Deny => Err(match decision {
                RuleDecision::Rule { rule, .. } if rule.has_pattern() && call.subject.is_none() => format!(
                    "Permission to use {name} denied: the rule `{rule}` forbids it, and the tool does not \
                     say what this call touches"
                ),
                RuleDecision::Rule { rule, .. } => {
                    format!("Permission to use {name} denied: the rule `{rule}` forbids it{through}")
                }
                RuleDecision::Default(_) => {
                    format!("Permission to use {name} denied: no permission rule allows it{through}")
                }
            }),
            Behavior::Ask => {
                let mut reasons: Vec<String> = call.tool_asks.into_iter().collect();
                match decision {
                    RuleDecision::Rule { behavior: Behavior::Ask, rule } => {
                        reasons.push(format!("the rule `{rule}` asks for approval{through}"));
                    }
                    RuleDecision::Default(Behavior::Ask) => {
                        reasons.push(format!("no permission rule allows it{through}"))
                    }
                    _ => {}
                }
                let Some(prompter) =
                    self.prompter.as_ref().filter(|prompter| prompter.can_ask(call.tool_use_id))
                else {
                    return Err(format!(
                        "{name} requires approval, and no one can be asked in this run: {}",
                        reasons.join("; ")
                    ));
                };
                let request = ApprovalRequest {
                    tool_use_id: call.tool_use_id.to_owned(),
                    tool: name.clone(),
                    input: call.input.clone(),
                    subject: call.subject,
                    reasons,
                };
                match prompter.ask(&request).await {
                    Approval::Allow => Ok(()),
                    Approval::Deny(None) => Err(format!("Permission to use {name} denied by the user")),
                    Approval::Deny(Some(why)) => {
                        Err(format!("Permission to use {name} denied by the user: {why}"))
                    }
                }
            }
        }
    }

    /// The rule lists, strictest first.
    fn lists(&self) -> impl Iterator<Item = (Behavior, &[Rule])> {
        [
            (Behavior::Deny, self.config.deny.as_slice()),
            (Behavior::Ask, self.config.ask.as_slice()),
            (Behavior::Allow, self.config.allow.as_slice()),
        ]
        .into_iter()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(name: &str, aliases: &[&str]) -> ToolSpec {
        ToolSpec {
            aliases: aliases.iter().map(|alias| alias.to_string()).collect(),
            ..ToolSpec::native(name, "", json!({ "type": "object" }))
        }
    }

    fn rules(toml_text: &str) -> Permissions {
        #[derive(Deserialize)]
        struct Wrapper {
            permissions: PermissionsConfig,
        }
        let wrapper: Wrapper = toml::from_str(toml_text).unwrap();
        Permissions::new(wrapper.permissions)
    }

    fn rule(text: &str) -> Rule {
        Rule::parse(text).unwrap()
    }

    fn call_matches(rule: &Rule, tool: &ToolSpec, subject: Option<&str>, behavior: Behavior) -> bool {
        rule.matches(tool, subject.map_or(Subject::Unknown, Subject::Known), behavior)
    }

    #[test]
    fn a_bare_rule_matches_every_call_of_the_tool_and_its_aliases() {
        let write = spec("write_file", &["create_file"]);
        for text in ["write_file", "create_file", "write_*", "*"] {
            let rule = rule(text);
            assert!(rule.matches(&write, Subject::EveryCall, Behavior::Deny), "{text}");
            assert!(call_matches(&rule, &write, Some("a.txt"), Behavior::Allow), "{text}");
            assert!(call_matches(&rule, &write, None, Behavior::Allow), "{text}");
        }
        assert!(!rule("write").matches(&write, Subject::EveryCall, Behavior::Deny));
        assert!(!rule("grep").matches(&write, Subject::EveryCall, Behavior::Deny));
    }

    #[test]
    fn a_pattern_is_a_glob_over_the_subject_where_star_crosses_slashes() {
        let write = spec("write_file", &[]);
        let docs = rule("write_file(docs/**)");
        assert!(call_matches(&docs, &write, Some("docs/a.md"), Behavior::Allow));
        assert!(call_matches(&docs, &write, Some("docs/deep/er/a.md"), Behavior::Allow));
        assert!(!call_matches(&docs, &write, Some("src/docs/a.md"), Behavior::Allow));
        assert!(!call_matches(&docs, &write, Some("docs"), Behavior::Allow));
        let locks = rule("write_file(**/*.lock)");
        assert!(call_matches(&locks, &write, Some("Cargo.lock"), Behavior::Deny));
        assert!(call_matches(&locks, &write, Some("a/b/yarn.lock"), Behavior::Deny));
        assert!(!call_matches(&locks, &write, Some("Cargo.lock.md"), Behavior::Deny));
        let shell = rule("Shell(git *)");
        assert!(call_matches(&shell, &spec("Shell", &[]), Some("git log -- src/a b/c"), Behavior::Allow));
        assert!(!call_matches(&shell, &spec("Shell", &[]), Some("gitk"), Behavior::Allow));
        assert!(call_matches(&rule("grep(src/?.rs)"), &spec("grep", &[]), Some("src/a.rs"), Behavior::Allow));
        assert!(call_matches(&rule("grep({a,b}/*)"), &spec("grep", &[]), Some("b/x"), Behavior::Allow));
        assert!(call_matches(&rule(r"grep(a\*)"), &spec("grep", &[]), Some("a*"), Behavior::Allow));
        assert!(!call_matches(&rule(r"grep(a\*)"), &spec("grep", &[]), Some("ab"), Behavior::Allow));
    }

    #[test]
    fn a_pattern_rule_never_covers_every_call() {
        let write = spec("write_file", &[]);
        assert!(!rule("write_file(**)").matches(&write, Subject::EveryCall, Behavior::Deny));
    }

    #[test]
    fn without_a_subject_a_pattern_applies_to_deny_and_ask_but_not_allow() {
        let grep = spec("grep", &[]);
        let secret = rule("grep(secret/**)");
        assert!(call_matches(&secret, &grep, None, Behavior::Deny));
        assert!(call_matches(&secret, &grep, None, Behavior::Ask));
        assert!(!call_matches(&secret, &grep, None, Behavior::Allow));
    }

    #[test]
    fn namespace_is_the_part_before_the_first_double_underscore() {
        assert_eq!(namespace("acme__search"), Some("acme"));
        assert_eq!(namespace("acme__db__query"), Some("acme"));
        assert_eq!(namespace("acme_search"), None);
        assert_eq!(namespace("__hidden"), None);
        let acme = rule("acme__*");
        assert!(acme.matches(&spec("acme__search", &[]), Subject::EveryCall, Behavior::Deny));
        assert!(!acme.matches(&spec("acme_search", &[]), Subject::EveryCall, Behavior::Deny));
        assert!(!acme.matches(&spec("acmecorp__search", &[]), Subject::EveryCall, Behavior::Deny));
    }

    #[test]
    fn malformed_rules_are_refused_with_the_reason() {
        let error = |text: &str| Rule::parse(text).unwrap_err().to_string();
        assert_eq!(
            error(""),
            r#"invalid permission rule "": a rule starts with a tool name, as in `Tool` or `Tool(pattern)`"#
        );
        assert_eq!(
            error("(x)"),
            r#"invalid permission rule "(x)": a rule starts with a tool name, as in `Tool` or `Tool(pattern)`"#
        );
        assert_eq!(
            error("grep(x"),
            r#"invalid permission rule "grep(x": the pattern is not closed with `)`"#
        );
        assert_eq!(
            error("grep()"),
            r#"invalid permission rule "grep()": the pattern in `()` is empty; write the tool alone to match every call"#
        );
        assert_eq!(
            error("my tool"),
            r#"invalid permission rule "my tool": a tool name holds only letters, digits, `_`, `-`, and `*` for any run of them"#
        );
        assert_eq!(
            error("grep([a)"),
            r#"invalid permission rule "grep([a)": unclosed character class; missing ']'"#
        );
    }

    #[test]
    fn deny_beats_ask_beats_allow_whatever_the_order_of_the_lists() {
        let permissions = rules(
            r#"[permissions]
            allow = ["write_file(docs/**)", "write_file"]
            ask = ["write_file(docs/drafts/**)"]
            deny = ["write_file(**/*.lock)"]
            "#,
        );
        let write = spec("write_file", &[]);
        let decide = |subject| {
            let decision = permissions.rule_decision(&write, Some(subject));
            let RuleDecision::Rule { behavior, rule } = decision else { panic!("{decision:?}") };
            (behavior, rule.as_str().to_string())
        };
        assert_eq!(decide("docs/a.md"), (Behavior::Allow, "write_file(docs/**)".into()));
        assert_eq!(decide("docs/drafts/a.md"), (Behavior::Ask, "write_file(docs/drafts/**)".into()));
        assert_eq!(decide("docs/Cargo.lock"), (Behavior::Deny, "write_file(**/*.lock)".into()));
        assert_eq!(decide("src/a.rs"), (Behavior::Allow, "write_file".into()));
        assert_eq!(
            permissions.rule_decision(&spec("grep", &[]), None),
            RuleDecision::Default(Behavior::Allow)
        );
    }

    #[test]
    fn only_a_deny_rule_without_a_pattern_removes_a_tool() {
        let permissions = rules(
            r#"[permissions]
            deny = ["write_file(**/*.lock)", "acme__*"]
            ask = ["grep"]
            "#,
        );
        assert_eq!(permissions.blanket_deny(&spec("acme__fetch", &[])).map(Rule::as_str), Some("acme__*"));
        assert_eq!(permissions.blanket_deny(&spec("write_file", &[])), None);
        assert_eq!(permissions.blanket_deny(&spec("grep", &[])), None);
    }

    #[test]
    fn the_subject_is_wanted_for_a_pattern_rule_or_a_possible_prompt() {
        let permissions =
            rules("[permissions]\nallow = [\"write_file(docs/**)\", \"grep\"]\nask = [\"hash\"]\n");
        assert!(permissions.wants_subject(&spec("write_file", &[]), false));
        assert!(!permissions.wants_subject(&spec("grep", &[]), false));
        assert!(!permissions.wants_subject(&spec("hash", &[]), true), "no one to show it to");
        let prompted = permissions.with_prompter(Arc::new(Answer(Approval::Allow, Default::default())));
        assert!(prompted.wants_subject(&spec("hash", &[]), false), "an ask rule names it");
        assert!(prompted.wants_subject(&spec("grep", &[]), true), "the tool asks");
        assert!(!prompted.wants_subject(&spec("grep", &[]), false));
    }

    #[test]
    fn the_config_names_the_bad_rule_and_its_line() {
        let error = crate::config::Config::parse(
            "[permissions]\nallow = [\"grep\",\n  \"write_file(docs/**\"]\n",
            std::path::Path::new("keel.toml"),
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"invalid config keel.toml: invalid permission rule "write_file(docs/**": the pattern is not closed with `)` (line 2, column 9)"#
        );
        let error = crate::config::Config::parse(
            "[permissions]\ndefault = \"maybe\"\n",
            std::path::Path::new("k.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with(
                "invalid config k.toml: unknown variant `maybe`, expected one of `allow`, `ask`, `deny`"
            ),
            "{error}"
        );
    }

    struct Answer(Approval, std::sync::Mutex<Vec<ApprovalRequest>>);

    #[async_trait]
    impl Prompter for Answer {
        async fn ask(&self, request: &ApprovalRequest) -> Approval {
            self.1.lock().unwrap().push(request.clone());
            self.0.clone()
        }
    }

    fn authorize(
        permissions: &Permissions,
        tool: &ToolSpec,
        subject: Option<&str>,
        tool_asks: Option<&str>,
    ) -> Result<(), String> {
        let input = json!({ "file_path": subject });
        let call = PendingCall {
            tool_use_id: "toolu_1",
            spec: tool,
            input: &input,
            subject: subject.map(str::to_string),
            tool_asks: tool_asks.map(str::to_string),
        };
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(permissions.authorize(call))
    }

    #[test]
    fn the_stricter_of_the_tool_and_the_rules_wins() {
        let permissions = rules(
            r#"[permissions]
            allow = ["write_file(docs/**)"]
            deny = ["write_file(**/*.lock)"]
            "#,
        );
        let write = spec("write_file", &[]);
        assert_eq!(authorize(&permissions, &write, Some("docs/a.md"), None), Ok(()));
        assert_eq!(
            authorize(&permissions, &write, Some("src/a.rs"), None),
            Ok(()),
            "no rule: the default allows"
        );
        assert_eq!(
            authorize(&permissions, &write, Some("docs/a.md"), Some("overwrite 3 files?")),
            Err("write_file requires approval, and no one can be asked in this run: overwrite 3 files?"
                .into()),
            "an allow rule does not silence the tool's own ask"
        );
        assert_eq!(
            authorize(&permissions, &write, Some("docs/Cargo.lock"), Some("overwrite?")),
            Err("Permission to use write_file denied: the rule `write_file(**/*.lock)` forbids it".into())
        );
        assert_eq!(
            authorize(&permissions, &write, None, None),
            Err("Permission to use write_file denied: the rule `write_file(**/*.lock)` forbids it, and the tool \
                 does not say what this call touches"
                .into())
        );
    }

    #[test]
    fn the_default_decides_calls_no_rule_matches() {
        let write = spec("write_file", &[]);
        let ask = rules("[permissions]\ndefault = \"ask\"\nallow = [\"write_file(docs/**)\"]\n");
        assert_eq!(authorize(&ask, &write, Some("docs/a"), None), Ok(()));
        assert_eq!(
            authorize(&ask, &write, Some("src/a"), None),
            Err("write_file requires approval, and no one can be asked in this run: no permission rule allows it".into())
        );
        assert_eq!(
            authorize(&ask, &write, Some("src/a"), Some("really?")),
            Err("write_file requires approval, and no one can be asked in this run: really?; no permission rule \
                 allows it"
                .into())
        );
        let deny = rules("[permissions]\ndefault = \"deny\"\nallow = [\"write_file(docs/**)\"]\n");
        assert_eq!(authorize(&deny, &write, Some("docs/a"), None), Ok(()));
        assert_eq!(
            authorize(&deny, &write, Some("src/a"), None),
            Err("Permission to use write_file denied: no permission rule allows it".into())
        );
    }

    #[test]
    fn an_ask_goes_to_the_prompter_with_every_reason() {
        let write = spec("write_file", &[]);
        let config = rules("[permissions]\nask = [\"write_file(docs/**)\"]\n").config().clone();
        let yes = Arc::new(Answer(Approval::Allow, Default::default()));
        let permissions = Permissions::new(config.clone()).with_prompter(yes.clone());
        assert_eq!(authorize(&permissions, &write, Some("docs/a.md"), Some("sure?")), Ok(()));
        assert_eq!(
            *yes.1.lock().unwrap(),
            [ApprovalRequest {
                tool_use_id: "toolu_1".into(),
                tool: "write_file".into(),
                input: json!({ "file_path": "docs/a.md" }),
                subject: Some("docs/a.md".into()),
                reasons: vec!["sure?".into(), "the rule `write_file(docs/**)` asks for approval".into()],
            }]
        );
        assert_eq!(authorize(&permissions, &write, Some("src/a.rs"), None), Ok(()));
        assert_eq!(yes.1.lock().unwrap().len(), 1, "an allowed call asks no one");

        let no = Arc::new(Answer(Approval::Deny(None), Default::default()));
        let permissions = Permissions::new(config.clone()).with_prompter(no);
        assert_eq!(
            authorize(&permissions, &write, Some("docs/a.md"), None),
            Err("Permission to use write_file denied by the user".into())
        );
        let no = Arc::new(Answer(Approval::Deny(Some("write to notes/ instead".into())), Default::default()));
        let permissions = Permissions::new(config).with_prompter(no);
        assert_eq!(
            authorize(&permissions, &write, Some("docs/a.md"), None),
            Err("Permission to use write_file denied by the user: write to notes/ instead".into())
        );
    }

    fn plugin(name: &str, aliases: &[&str]) -> ToolSpec {
        let origin = ToolOrigin::Plugin {
            path: std::path::PathBuf::from(format!("/plugins/{name}.wasm")),
            contract: "0.4.0",
        };
        ToolSpec { origin, trusted: false, ..spec(name, aliases) }
    }

    #[test]
    fn a_plugin_alias_never_earns_another_tools_allow_or_ask() {
        let evil = plugin("evil", &["grep", "write_file", "Read"]);
        let allow = rules("[permissions]\ndefault = \"deny\"\nallow = [\"grep\", \"write_*\"]\n");
        assert_eq!(allow.rule_decision(&evil, Some("a.txt")), RuleDecision::Default(Behavior::Deny));
        assert_eq!(allow.rule_decision(&evil, None), RuleDecision::Default(Behavior::Deny));
        let ask = rules("[permissions]\ndefault = \"deny\"\nask = [\"Read\"]\n");
        assert_eq!(ask.rule_decision(&evil, None), RuleDecision::Default(Behavior::Deny));
        assert!(!rule("grep").names(&evil, Behavior::Allow));
        assert!(!rule("grep").names(&evil, Behavior::Ask));
        assert!(rule("grep").names_by_alias(&evil), "what the start-up warning looks at");
        let grep = plugin("grep", &[]);
        assert_eq!(
            allow.rule_decision(&grep, None),
            RuleDecision::Rule { behavior: Behavior::Allow, rule: &rule("grep") },
            "a plugin's own name still counts"
        );
    }

    #[test]
    fn a_deny_rule_takes_a_plugin_by_an_alias_and_any_rule_a_built_in() {
        let permissions = rules("[permissions]\ndeny = [\"search\"]\n");
        let grep = plugin("grep", &["search"]);
        assert_eq!(permissions.blanket_deny(&grep).map(Rule::as_str), Some("search"));
        assert!(rule("search").names(&grep, Behavior::Deny));
        let read = spec("Read", &["cat"]);
        for behavior in [Behavior::Allow, Behavior::Ask, Behavior::Deny] {
            assert!(rule("cat").names(&read, behavior), "{behavior}");
        }
        let ask = rules("[permissions]\ndefault = \"deny\"\nask = [\"cat\"]\n");
        assert_eq!(
            ask.rule_decision(&read, None),
            RuleDecision::Rule { behavior: Behavior::Ask, rule: &rule("cat") }
        );
    }
}
