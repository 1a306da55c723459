//! The tool pool: which tools the model sees, in which order.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::schema::InputSchema;
use crate::tool::{Tool, ToolOrigin};

/// A tool in the pool, with its compiled input schema.
pub struct PoolEntry {
    /// The tool.
    pub tool: Arc<dyn Tool>,
    /// Its input schema, compiled once.
    pub schema: InputSchema,
}

/// The tools offered to the model: built-ins sorted by name, then plugins
/// sorted by name, de-duplicated by name keeping the first, so a built-in
/// always wins a clash and adding a plugin never reorders the built-ins (what
/// keeps an agent's prompt cache valid).
pub struct ToolPool {
    entries: Vec<PoolEntry>,
    index: HashMap<String, usize>,
}

impl ToolPool {
    /// Assemble the pool. Returns it with a warning for every tool left out.
    pub fn assemble(
        mut builtins: Vec<Arc<dyn Tool>>,
        mut plugins: Vec<Arc<dyn Tool>>,
    ) -> Result<(Self, Vec<String>)> {
        builtins.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
        plugins.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
        let mut pool = ToolPool { entries: Vec::new(), index: HashMap::new() };
        let mut warnings = Vec::new();
        for tool in builtins.into_iter().chain(plugins) {
            let spec = tool.spec();
            if !spec.enabled {
                warnings.push(format!("tool `{}` is disabled and left out", spec.name));
                continue;
            }
            if let Some(&kept) = pool.index.get(&spec.name) {
                let kept = pool.entries[kept].tool.spec();
                if kept.aliases.contains(&spec.name) {
                    // An alias never shadows a real name: the real tool takes it.
                    pool.index.remove(&spec.name);
                } else {
                    warnings.push(format!(
                        "tool `{}` from {} is left out: the name is taken by {}",
                        spec.name,
                        describe(&spec.origin),
                        describe(&kept.origin)
                    ));
                    continue;
                }
            }
            let schema = InputSchema::compile(&spec.input_schema).map_err(|reason| match &spec.origin {
                ToolOrigin::Plugin { path } => {
                    Error::plugin(path, format!("the input schema of `{}` is invalid: {reason}", spec.name))
                }
                ToolOrigin::BuiltIn => {
                    Error::Engine(format!("built-in `{}` has an invalid schema: {reason}", spec.name))
                }
            })?;
            let position = pool.entries.len();
            pool.index.insert(spec.name.clone(), position);
            for alias in &spec.aliases {
                pool.index.entry(alias.clone()).or_insert(position);
            }
            pool.entries.push(PoolEntry { tool, schema });
        }
        Ok((pool, warnings))
    }

    /// The tool called `name`, by its name or an alias.
    pub fn get(&self, name: &str) -> Option<&PoolEntry> {
        self.index.get(name).map(|&position| &self.entries[position])
    }

    /// The tools in pool order.
    pub fn entries(&self) -> &[PoolEntry] {
        &self.entries
    }

    /// Names close to `name`, closest first: for "no such tool" errors.
    pub fn close_names(&self, name: &str) -> Vec<&str> {
        let wanted = name.to_lowercase();
        let mut scored: Vec<(f64, &str)> = self
            .entries
            .iter()
            .map(|entry| entry.tool.spec().name.as_str())
            .map(|candidate| (strsim::jaro_winkler(&wanted, &candidate.to_lowercase()), candidate))
            .filter(|(score, _)| *score >= 0.8)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        scored.into_iter().take(3).map(|(_, name)| name).collect()
    }
}

fn describe(origin: &ToolOrigin) -> String {
    match origin {
        ToolOrigin::BuiltIn => "the built-in".into(),
        ToolOrigin::Plugin { path } => format!("plugin {}", path.display()),
    }
}
