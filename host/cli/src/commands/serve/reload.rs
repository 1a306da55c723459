//! Plugins reloaded while serving.
//!
//! [`Plugins`] keeps each plugin file the server loaded, with the size and
//! modification time it had. [`watch`] looks at the `--plugins` paths every
//! [`POLL`]; when what it sees has held still for one more look (a file
//! being copied in is not loaded half-written), it loads what was added or
//! changed and drops what was removed. A file that fails to load is logged
//! with the reason: the version it replaced keeps serving, and a new file is
//! left out until it loads. Then a new host is built with the plugins as
//! they are now and put in place; calls in flight finish on the pool they
//! started in, and every client is told the tool list changed.
//!
//! When the runtime has pins (a lock, `sha256` keys), every version loaded
//! is checked against them as at start: the engine checks the file's
//! digest before any of its code runs, and then the pins of the name it
//! gives. A version that breaks one is refused like any file that fails
//! to load.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use keel_host::load::{Grants, PluginTool, Runtime, plugin_files};
use keel_host::{HostBuilder, Limits, Tool};

use super::metrics::Metrics;

/// How often the plugin paths are looked at.
pub const POLL: Duration = Duration::from_millis(500);

/// What a plugin file looked like when it was loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let metadata = std::fs::metadata(path).ok()?;
    Some(Stamp { len: metadata.len(), modified: metadata.modified().ok() })
}

/// The plugin files of the paths, each with its stamp, in order.
fn scan(paths: &[PathBuf]) -> BTreeMap<PathBuf, Stamp> {
    let mut found = BTreeMap::new();
    for path in paths {
        // A path gone for now (a directory being replaced) lists nothing.
        for file in plugin_files(path).unwrap_or_default() {
            if let Some(stamp) = stamp(&file) {
                found.insert(file, stamp);
            }
        }
    }
    found
}

/// The plugins the server serves, by file.
pub struct Plugins {
    paths: Vec<PathBuf>,
    runtime: Arc<Runtime>,
    grants: Grants,
    limits: Limits,
    loaded: BTreeMap<PathBuf, (Stamp, Arc<dyn Tool>)>,
    /// New files that failed to load, as they were: tried again only once
    /// they change.
    failed: BTreeMap<PathBuf, Stamp>,
    /// What the last look saw, to tell a settled change from one under way.
    seen: BTreeMap<PathBuf, Stamp>,
    /// Told of what is served and of each file that fails to load.
    metrics: Option<Arc<Metrics>>,
}

impl Plugins {
    /// Load every plugin of `paths`, as a host loads them: several at once,
    /// and the first that fails, in file order, is the error.
    pub async fn load(
        paths: Vec<PathBuf>,
        runtime: Arc<Runtime>,
        grants: Grants,
        limits: Limits,
    ) -> keel_host::Result<Self> {
        let seen = scan(&paths);
        // Several at once, as a host loads them.
        let files: Vec<PathBuf> = seen.keys().cloned().collect();
        let tools = keel_host::load_plugins(&runtime, files, Arc::new(grants.clone()), limits).await?;
        if let Some(pins) = runtime.pins() {
            keel_host::lock_entries(pins, tools.iter().map(|tool| tool as &dyn Tool))?;
        }
        let loaded = seen
            .iter()
            .zip(tools)
            .map(|((file, stamp), tool)| (file.clone(), (*stamp, Arc::new(tool) as Arc<dyn Tool>)))
            .collect();
        Ok(Plugins { paths, runtime, grants, limits, loaded, failed: BTreeMap::new(), seen, metrics: None })
    }

    async fn load_one(&self, file: &Path) -> keel_host::Result<Arc<dyn Tool>> {
        let plugin = PluginTool::load_with_grants(&self.runtime, file, &self.grants, &self.limits).await?;
        if let Some(pins) = self.runtime.pins() {
            pins.check_plugin(&plugin.spec().name, file)?;
        }
        Ok(Arc::new(plugin))
    }

    /// Count what is served and what fails to load in `metrics` from now on.
    pub fn count_in(&mut self, metrics: Arc<Metrics>) {
        self.metrics = Some(metrics);
    }

    /// The tools, in file order.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.loaded.values().map(|(_, tool)| tool.clone()).collect()
    }

    /// Look again: whether the served plugins changed, having loaded what
    /// was added or changed and dropped what was removed.
    pub async fn rescan(&mut self) -> bool {
        let now = scan(&self.paths);
        let settled = now == self.seen;
        self.seen = now.clone();
        if !settled {
            return false;
        }
        let mut changed = false;
        self.failed.retain(|file, _| now.contains_key(file));
        let removed: Vec<PathBuf> =
            self.loaded.keys().filter(|file| !now.contains_key(*file)).cloned().collect();
        for file in removed {
            tracing::info!("plugin {} was removed; its tool is no longer served", file.display());
            self.loaded.remove(&file);
            changed = true;
        }
        for (file, stamp) in now {
            if self.loaded.get(&file).is_some_and(|(loaded, _)| *loaded == stamp)
                || self.failed.get(&file) == Some(&stamp)
            {
                continue;
            }
            match self.load_one(&file).await {
                Ok(tool) => {
                    tracing::info!("plugin {} loaded: serving {}", file.display(), tool.spec().name);
                    self.failed.remove(&file);
                    self.loaded.insert(file, (stamp, tool));
                    changed = true;
                }
                Err(error) => {
                    let kept = if self.loaded.contains_key(&file) {
                        "the version loaded before keeps serving"
                    } else {
                        "it is not served"
                    };
                    tracing::error!("{error}; {kept}");
                    if let Some(metrics) = &self.metrics {
                        metrics.load_failed();
                    }
                    // Not tried again until the file changes once more.
                    if let Some((loaded, _)) = self.loaded.get_mut(&file) {
                        *loaded = stamp;
                    } else {
                        self.failed.insert(file, stamp);
                    }
                }
            }
        }
        changed
    }
}

/// Look at the plugins every [`POLL`], and on each settled change build a
/// host from `builder()` with them and hand it to `serve`.
pub async fn watch<B, S, F>(mut plugins: Plugins, builder: B, serve: S)
where
    B: Fn() -> Result<HostBuilder>,
    S: Fn(keel_host::Host) -> F,
    F: Future<Output = ()>,
{
    loop {
        tokio::time::sleep(POLL).await;
        if !plugins.rescan().await {
            continue;
        }
        let built = match builder() {
            Ok(builder) => builder.plugin_tools(plugins.tools()).build().await.map_err(anyhow::Error::from),
            Err(error) => Err(error),
        };
        match built {
            Ok(host) => {
                if let Some(metrics) = &plugins.metrics {
                    metrics.plugins_loaded(plugins.loaded.len());
                }
                serve(host).await;
            }
            Err(error) => {
                tracing::error!(
                    "the reloaded plugins could not be served, the last pool keeps serving: {error:#}"
                );
                if let Some(metrics) = &plugins.metrics {
                    metrics.load_failed();
                }
            }
        }
    }
}
