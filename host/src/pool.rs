//! The tool pool: which tools the model sees, in which order, and the rules
//! every call of them is held to.
//!
//! Assembly (README, "Tool pool and permissions"): built-ins sorted by name, then plugins sorted by
//! name, de-duplicated by name keeping the first, so a built-in always wins a
//! clash and adding or removing a plugin never changes the order or the
//! definitions of the built-ins (what keeps an agent's prompt cache valid).
//! Before that, tools are left out that the model must not see: disabled
//! ones (`is-enabled` false or trapping, with a warning), those outside the
//! [`Mode`], and those a `deny` rule without a pattern covers — judged by the
//! same matcher as the permission check of each call ([`Permissions`]).
//! Aliases resolve to their tool and never shadow a real name; an alias
//! that loses its name, to a tool's name or to an earlier alias, is left out
//! with a warning, as a tool losing a name clash is.
//!
//! When some tool is deferred (`should-defer` without `always-load`), the
//! built-in [`ToolSearch`] is added last: its description names the deferred
//! tools, and it changes with them, so it goes after everything whose bytes
//! must stay put.

pub mod builtin;
pub mod definitions;
pub(crate) mod schema;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use self::builtin::{TOOL_SEARCH, ToolSearch};
pub use self::schema::InputSchema;
use crate::error::{Error, Result};
use crate::permissions::{Behavior, Mode, Permissions};
use crate::tool::{Tool, ToolOrigin, ToolSpec};

/// The built-ins [`Mode::Simple`] keeps.
pub const CORE_BUILTINS: &[&str] = &["Read"];

/// A tool in the pool, with its compiled input schema.
pub struct PoolEntry {
    /// The tool.
    pub tool: Arc<dyn Tool>,
    /// Its input schema, compiled once.
    pub schema: InputSchema,
    /// Its output schema, compiled once, when it declares one: every
    /// structured value it returns is checked against it.
    pub output_schema: Option<InputSchema>,
}

/// How a pool is assembled.
///
/// Defaults: no permission rules (every call the tool allows may run, an
/// `ask` is a denial), [`Mode::Full`], and `ToolSearch` added when some tool
/// is deferred.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// The rules, the mode and the prompter; kept by the pool for the
    /// permission check of every call.
    pub permissions: Arc<Permissions>,
    /// Whether to add `ToolSearch` when some tool is deferred. Without it no
    /// tool is deferred: each is shown in full.
    pub tool_search: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions { permissions: Arc::default(), tool_search: true }
    }
}

/// The tools offered to the model, in the order they are offered, and the
/// rules their calls are held to. See the [module docs](self).
pub struct ToolPool {
    entries: Vec<Arc<PoolEntry>>,
    index: HashMap<String, usize>,
    permissions: Arc<Permissions>,
    deferral: bool,
}

impl ToolPool {
    /// Assemble the pool with [`PoolOptions::default`]. Returns it with a
    /// warning for every tool left out against its author's wish.
    pub fn assemble(
        builtins: Vec<Arc<dyn Tool>>,
        plugins: Vec<Arc<dyn Tool>>,
    ) -> Result<(Self, Vec<String>)> {
        ToolPool::assemble_with(builtins, plugins, PoolOptions::default())
    }

    /// Assemble the pool (see the [module docs](self)). Returns it with a
    /// warning for every tool left out against its author's wish (disabled,
    /// or losing a name clash), for every alias losing a name clash, and for
    /// every `[permissions]` rule that names no tool. Tools the
    /// configuration leaves out are logged, not warned about.
    pub fn assemble_with(
        mut builtins: Vec<Arc<dyn Tool>>,
        mut plugins: Vec<Arc<dyn Tool>>,
        options: PoolOptions,
    ) -> Result<(Self, Vec<String>)> {
        builtins.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
        plugins.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
        let permissions = options.permissions;
        let mut pool = ToolPool {
            entries: Vec::new(),
            index: HashMap::new(),
            permissions: permissions.clone(),
            deferral: false,
        };
        let all: Vec<&Arc<dyn Tool>> = builtins.iter().chain(&plugins).collect();
        let mut warnings = unmatched_rules(&permissions, &all, options.tool_search);
        for tool in builtins.into_iter().chain(plugins) {
            let spec = tool.spec();
            if !spec.enabled {
                warnings.push(format!("tool `{}` is disabled and left out", spec.name));
                continue;
            }
            if !pool.offers(spec) {
                continue;
            }
            if options.tool_search && spec.name == TOOL_SEARCH && spec.origin != ToolOrigin::BuiltIn {
                warnings.push(format!(
                    "tool `{TOOL_SEARCH}` from {} is left out: the name is reserved for the built-in",
                    describe(&spec.origin)
                ));
                continue;
            }
            if let Some(&kept) = pool.index.get(&spec.name) {
                let kept = pool.entries[kept].tool.spec();
                // Held by an alias, the name goes to this tool (`push` says
                // which alias lost it): an alias never shadows a real name.
                if kept.name == spec.name {
                    warnings.push(format!(
                        "tool `{}` from {} is left out: the name is taken by {}",
                        spec.name,
                        describe(&spec.origin),
                        describe(&kept.origin)
                    ));
                    continue;
                }
            }
            pool.push(tool, &mut warnings)?;
        }
        if options.tool_search {
            let deferred: Vec<&ToolSpec> =
                pool.entries.iter().map(|entry| entry.tool.spec()).filter(|spec| deferrable(spec)).collect();
            if !deferred.is_empty() {
                let search = ToolSearch::new(deferred);
                if pool.offers(search.spec()) {
                    pool.push(Arc::new(search), &mut warnings)?;
                    pool.deferral = true;
                }
            }
        }
        Ok((pool, warnings))
    }

    /// Whether the mode and the blanket `deny` rules let the model see
    /// `spec`; logs why not.
    fn offers(&self, spec: &ToolSpec) -> bool {
        let core = spec.origin == ToolOrigin::BuiltIn && CORE_BUILTINS.contains(&spec.name.as_str());
        if self.permissions.mode() == Mode::Simple && !core {
            tracing::info!(
                "tool `{}` is left out: the simple mode offers only the core built-ins",
                spec.name
            );
            return false;
        }
        if let Some(rule) = self.permissions.blanket_deny(spec) {
            tracing::info!(
                "tool `{}` is left out: the deny rule `{rule}` covers every call of it",
                spec.name
            );
            return false;
        }
        true
    }

    /// Add `tool` at the end, under its name and every alias not taken; a
    /// warning for each alias left out: one of `tool`'s own, taken by an
    /// earlier tool's name or alias, or an earlier tool's alias that the name
    /// of `tool` takes (the caller has made sure no earlier tool has that
    /// name).
    fn push(&mut self, tool: Arc<dyn Tool>, warnings: &mut Vec<String>) -> Result<()> {
        let spec = tool.spec();
        let invalid = |which: &str, reason: String| match &spec.origin {
            ToolOrigin::Plugin { path, .. } => {
                Error::plugin(path, format!("the {which} schema of `{}` is invalid: {reason}", spec.name))
            }
            ToolOrigin::BuiltIn => {
                Error::Engine(format!("built-in `{}` has an invalid {which} schema: {reason}", spec.name))
            }
        };
        let schema = InputSchema::compile(&spec.input_schema).map_err(|reason| invalid("input", reason))?;
        let output_schema = spec
            .output_schema
            .as_ref()
            .map(|schema| InputSchema::compile_output(schema).map_err(|reason| invalid("output", reason)))
            .transpose()?;
        let position = self.entries.len();
        if let Some(earlier) = self.index.insert(spec.name.clone(), position)
            && let earlier = self.entries[earlier].tool.spec()
            && earlier.name != spec.name
        {
            warnings.push(format!(
                "alias `{}` of {} is left out: the name is taken by {}",
                spec.name,
                describe_tool(earlier),
                describe_tool(spec)
            ));
        }
        for alias in &spec.aliases {
            match self.index.entry(alias.clone()) {
                Entry::Vacant(vacant) => {
                    vacant.insert(position);
                }
                Entry::Occupied(taken) if *taken.get() == position => {}
                Entry::Occupied(taken) => {
                    let holder = self.entries[*taken.get()].tool.spec();
                    let by = if holder.name == *alias { "" } else { "an alias of " };
                    warnings.push(format!(
                        "alias `{alias}` of {} is left out: the name is taken by {by}{}",
                        describe_tool(spec),
                        describe_tool(holder)
                    ));
                }
            }
        }
        self.entries.push(Arc::new(PoolEntry { tool, schema, output_schema }));
        Ok(())
    }

    /// The rules every call of the pool's tools is held to.
    pub fn permissions(&self) -> &Permissions {
        &self.permissions
    }

    /// Whether the model is shown `spec` by name only, through `ToolSearch`:
    /// it is deferred and the pool has `ToolSearch` to find it.
    pub fn is_deferred(&self, spec: &ToolSpec) -> bool {
        self.deferral && deferrable(spec)
    }

    /// The tool called `name`, by its name or an alias.
    pub fn get(&self, name: &str) -> Option<&Arc<PoolEntry>> {
        self.index.get(name).map(|&position| &self.entries[position])
    }

    /// The tools in pool order.
    pub fn entries(&self) -> &[Arc<PoolEntry>] {
        &self.entries
    }

    /// Names close to `name`, closest first: for "no such tool" errors.
    pub fn close_names(&self, name: &str) -> Vec<&str> {
        close_names(name, self.entries.iter().map(|entry| entry.tool.spec().name.as_str()))
    }
}

/// Up to three of `candidates` close to `name` (Jaro-Winkler 0.8 or more,
/// case aside), closest first.
fn close_names<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let wanted = name.to_lowercase();
    let mut scored: Vec<(f64, &str)> = candidates
        .map(|candidate| (strsim::jaro_winkler(&wanted, &candidate.to_lowercase()), candidate))
        .filter(|(score, _)| *score >= 0.8)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    scored.into_iter().take(3).map(|(_, name)| name).collect()
}

/// `warning` about `name`, ending with the `candidates` close to it, if
/// any: `…; did you mean grep?`.
pub(crate) fn suggesting<'a>(
    warning: String,
    name: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> String {
    match close_names(name, candidates).as_slice() {
        [] => warning,
        close => format!("{warning}; did you mean {}?", close.join(", ")),
    }
}

/// A warning for each `[permissions]` rule that names none of `tools` (nor
/// the built-in tool search, when it may be offered): a typo in a `deny`
/// rule would otherwise leave the tool it meant allowed, without a word. An
/// `allow` or `ask` rule that names a plugin only by an alias names no tool
/// (it matches a plugin by its own name), and its warning says so.
fn unmatched_rules(permissions: &Permissions, tools: &[&Arc<dyn Tool>], tool_search: bool) -> Vec<String> {
    let config = permissions.config();
    let lists =
        [(Behavior::Allow, &config.allow), (Behavior::Ask, &config.ask), (Behavior::Deny, &config.deny)];
    let mut warnings = Vec::new();
    for (behavior, rule) in
        lists.into_iter().flat_map(|(behavior, rules)| rules.iter().map(move |rule| (behavior, rule)))
    {
        let named = tools.iter().any(|tool| rule.names(tool.spec(), behavior))
            || (tool_search && rule.names_tool(TOOL_SEARCH));
        if named {
            continue;
        }
        let warning =
            format!("the `[permissions]` {behavior} rule `{}` names no tool of this run", rule.as_str());
        let by_alias: Vec<String> = tools
            .iter()
            .map(|tool| tool.spec())
            .filter(|spec| rule.names_by_alias(spec))
            .map(describe_tool)
            .collect();
        // A rule that names aliases gets no suggestion: the closest name
        // may be that of the plugin claiming them.
        warnings.push(match by_alias.as_slice() {
            [] => suggesting(warning, rule.tool(), tools.iter().map(|tool| tool.spec().name.as_str())),
            [one] => format!(
                "{warning}, only an alias of {one}: allow and ask rules match a plugin by its own name"
            ),
            many => format!(
                "{warning}, only aliases of {}: allow and ask rules match a plugin by its own name",
                many.join(", ")
            ),
        });
    }
    warnings
}

/// How a warning names a tool and where it comes from: tool `grep` from
/// plugin /plugins/grep.wasm.
fn describe_tool(spec: &ToolSpec) -> String {
    format!("tool `{}` from {}", spec.name, describe(&spec.origin))
}

fn describe(origin: &ToolOrigin) -> String {
    match origin {
        ToolOrigin::BuiltIn => "the built-in".into(),
        ToolOrigin::Plugin { path, .. } => format!("plugin {}", path.display()),
    }
}

/// Whether a tool asks to be listed by name only.
fn deferrable(spec: &ToolSpec) -> bool {
    spec.should_defer && !spec.always_load
}
