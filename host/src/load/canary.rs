//! keel's own tool, `keel-warm-up`: the component of `canary.wat`, which
//! imports nothing and answers every call with one text block.
//! [`Host::warm_up`](crate::Host::warm_up) calls it once, through the path
//! every call takes, so that a plugin's first call finds that path run
//! before: the sandbox made for a call's grant, the `call` export's input and
//! output carried across, the result through the budgets. It is in no pool a
//! model is offered, and pins do not apply to it: it is part of keel.

use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
use crate::limits::Limits;
use crate::load::engine::Runtime;
use crate::load::grants::Grants;
use crate::load::plugin::PluginTool;

/// The tool's name.
pub(crate) const NAME: &str = "keel-warm-up";

/// The component, assembled from `canary.wat` by the build script.
const COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/canary.wasm"));

/// The content key the compile cache files the component under.
pub(crate) fn content_key() -> String {
    blake3::hash(COMPONENT).to_hex().to_string()
}

/// The tool, on `runtime`, with `limits` and the default grant in
/// `workspace` (which it cannot reach: it imports nothing), compiled or
/// taken from the compile cache.
pub(crate) async fn load(runtime: &Arc<Runtime>, workspace: &Path, limits: &Limits) -> Result<PluginTool> {
    let label = Path::new(NAME);
    let compiled = runtime.compile_own(label, COMPONENT)?;
    PluginTool::from_compiled(runtime, label, compiled, &Grants::none(workspace), limits).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_imports_nothing_so_that_no_grant_reaches_anything() {
        let runtime = Runtime::new(&Limits::default(), None).unwrap();
        let compiled = runtime.compile_own(Path::new(NAME), COMPONENT).unwrap();
        let imports: Vec<String> = compiled
            .component
            .component_type()
            .imports(runtime.engine())
            .map(|(name, _)| name.into())
            .collect();
        assert!(imports.is_empty(), "{imports:?}");
    }

    #[test]
    fn the_cache_lists_it_as_keels_own() {
        let cache = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(&Limits::default(), Some(cache.path().to_path_buf())).unwrap();
        let compiled = runtime.compile_own(Path::new(NAME), COMPONENT).unwrap();
        assert_eq!(compiled.content_key.as_deref(), Some(content_key().as_str()));
        let listing = crate::load::cache::list(cache.path()).unwrap();
        assert_eq!(listing.entries.len(), 1);
        assert!(listing.entries[0].is_keels_own() && listing.entries[0].plugins.is_empty());
    }

    #[tokio::test]
    async fn it_loads_as_any_plugin_with_its_plan_fixed_and_read_only() {
        let workspace = tempfile::tempdir().unwrap();
        let runtime = Arc::new(Runtime::new(&Limits::default(), None).unwrap());
        let tool = load(&runtime, workspace.path(), &Limits::default()).await.unwrap();
        let spec = crate::tool::Tool::spec(&tool);
        assert_eq!(spec.name, NAME);
        assert!(spec.enabled && !spec.requires_user_interaction);
        assert_eq!(tool.fixed_plan(), Some((true, true)));
        assert!(!tool.checks_input());
    }
}
