//! Plugins reloaded while serving.
//!
//! [`Plugins`] keeps each plugin file the server loaded, with the size and
//! modification time it had. [`watch`] looks at the `--plugins` paths when
//! the kernel reports a change in them or in the directories that hold
//! them (inotify, through the `notify` crate), and every [`FALLBACK`]
//! besides, for a filesystem that reports nothing; an idle server is not
//! woken to look. When what it sees has held still for one more look,
//! [`POLL`] later (a file being copied in is not loaded half-written), it
//! loads what was added or changed and drops what was removed. A file that
//! fails to load is logged with the reason: the version it replaced keeps
//! serving, and a new file is left out until it loads. Then a new host is
//! built with the plugins as they are now and put in place; calls in flight
//! finish on the pool they started in, and every client is told the tool
//! list changed.
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

/// How long a change must hold still before it is loaded: the time
/// between the two looks that must agree.
pub const POLL: Duration = Duration::from_millis(500);

/// How often the plugin paths are looked at when no change is reported: a
/// network filesystem may report none. Where no watch could be set, they
/// are looked at every [`POLL`].
pub const FALLBACK: Duration = Duration::from_secs(10);

/// What one look at the plugin paths found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// Not what the look before saw: a change is under way.
    Moving,
    /// Settled, and the served plugins are the same.
    Unchanged,
    /// Settled, and what was added or changed is loaded, what was removed
    /// dropped.
    Changed,
}

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

    /// Look again: whether what is there has held still since the last
    /// look and, if so, whether the served plugins changed, having loaded
    /// what was added or changed and dropped what was removed.
    pub async fn rescan(&mut self) -> Look {
        let now = scan(&self.paths);
        let settled = now == self.seen;
        self.seen = now.clone();
        if !settled {
            return Look::Moving;
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
        if changed { Look::Changed } else { Look::Unchanged }
    }
}

/// The kernel's reports of changes in the plugin paths, each path watched
/// with the directory that holds it (so a directory or file replaced whole
/// is seen too). Each report wakes one waiter, or the next to wait.
struct Changes {
    reported: Arc<tokio::sync::Notify>,
    /// The plugin paths, absolute, as the watcher names what it reports.
    paths: Arc<[PathBuf]>,
    /// None where no watch could be set.
    watcher: Option<notify::RecommendedWatcher>,
    /// Whether some path is watched neither itself nor through the
    /// directory that holds it, so that a change there may go unreported:
    /// looks then come every [`POLL`] until a watch holds again.
    blind: bool,
}

/// Whether an event leaves every file as it was: a file or directory
/// opened, read or closed unwritten. A look opens the directories it
/// lists, and a load the files it reads; a look at each would look again
/// for ever.
fn changes_nothing(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    matches!(kind, EventKind::Access(access) if *access != AccessKind::Close(AccessMode::Write))
}

/// Whether `event` may change what a look at `paths` finds: it is about a
/// plugin path or an entry of one (not about another entry of the
/// directory that holds it), or it names nothing, as when the kernel's
/// queue overflowed.
fn concerns(event: &notify::Event, paths: &[PathBuf]) -> bool {
    event.paths.is_empty()
        || event.paths.iter().any(|changed| {
            paths.iter().any(|path| changed == path || changed.parent() == Some(path.as_path()))
        })
}

impl Changes {
    fn watch(paths: &[PathBuf]) -> Self {
        let reported = Arc::new(tokio::sync::Notify::new());
        let cwd = std::env::current_dir().unwrap_or_default();
        let paths: Arc<[PathBuf]> = paths.iter().map(|path| cwd.join(path)).collect();
        let (sender, concerned) = (reported.clone(), paths.clone());
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // An error may have lost a change: look.
            let look = match &event {
                Ok(event) => !changes_nothing(&event.kind) && concerns(event, &concerned),
                Err(_) => true,
            };
            if look {
                sender.notify_one();
            }
        });
        let watcher = match watcher {
            Ok(watcher) => Some(watcher),
            Err(error) => {
                tracing::warn!("cannot watch the plugin paths, looking at them every {POLL:?}: {error}");
                None
            }
        };
        let mut changes = Changes { reported, paths, watcher, blind: false };
        changes.rewatch();
        changes
    }

    /// Watch every path and its directory again: one that was replaced is
    /// a new directory or file, and one that was missing may be back. A
    /// path missing now is seen through its directory; one whose directory
    /// is missing too, or that the kernel refuses to watch (its limit of
    /// watches reached, say), is looked at every [`POLL`] instead.
    fn rewatch(&mut self) {
        use notify::Watcher;
        let Some(watcher) = &mut self.watcher else { return };
        // Why the first path watched by neither was refused, if it was.
        let mut refused = None;
        let mut blind = false;
        for path in self.paths.iter() {
            let (mut watched, mut refusal) = (false, None);
            for dir in [Some(path.as_path()), path.parent()].into_iter().flatten() {
                match watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
                    Ok(()) => watched = true,
                    Err(error) if is_missing(&error) => {}
                    Err(error) => refusal = refusal.or(Some((dir.to_path_buf(), error))),
                }
            }
            if !watched {
                blind = true;
                refused = refused.or(refusal);
            }
        }
        if blind && !self.blind {
            match refused {
                Some((dir, error)) => tracing::warn!(
                    "cannot watch {}, looking at the plugin paths every {POLL:?}: {error}",
                    dir.display()
                ),
                None => {
                    tracing::debug!("a plugin path and its directory are missing; looking every {POLL:?}")
                }
            }
        }
        self.blind = blind;
    }

    /// Until a change is reported, or the time to look anyway has come.
    async fn next(&self) {
        let period = if self.watcher.is_some() && !self.blind { FALLBACK } else { POLL };
        let _ = tokio::time::timeout(period, self.reported.notified()).await;
    }
}

/// Whether a watch failed only because there is nothing at its path.
fn is_missing(error: &notify::Error) -> bool {
    match &error.kind {
        notify::ErrorKind::PathNotFound => true,
        notify::ErrorKind::Io(error) => error.kind() == std::io::ErrorKind::NotFound,
        _ => false,
    }
}

/// Look at the plugins whenever a change is reported (and every
/// [`FALLBACK`]), again every [`POLL`] until what is there holds still, and
/// on each settled change build a host from `builder()` with them and hand
/// it to `serve`.
pub async fn watch<B, S, F>(mut plugins: Plugins, builder: B, serve: S)
where
    B: Fn() -> Result<HostBuilder>,
    S: Fn(keel_host::Host) -> F,
    F: Future<Output = ()>,
{
    let mut changes = Changes::watch(&plugins.paths);
    // The first look comes at once: a change made while the watch was being
    // set up was reported to nobody.
    loop {
        let mut look = plugins.rescan().await;
        while look == Look::Moving {
            tokio::time::sleep(POLL).await;
            look = plugins.rescan().await;
        }
        changes.rewatch();
        if look == Look::Changed {
            serve_reloaded(&plugins, &builder, &serve).await;
        }
        changes.next().await;
    }
}

/// Build a host from `builder()` with the plugins as they are now and hand
/// it to `serve`; if it cannot be built, the last pool keeps serving.
async fn serve_reloaded<B, S, F>(plugins: &Plugins, builder: &B, serve: &S)
where
    B: Fn() -> Result<HostBuilder>,
    S: Fn(keel_host::Host) -> F,
    F: Future<Output = ()>,
{
    let built = match builder() {
        Ok(builder) => {
            let builder = builder.engine(plugins.runtime.clone()).plugin_tools(plugins.tools());
            builder.build().await.map_err(anyhow::Error::from)
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a change is reported within `within`.
    async fn reported(changes: &Changes, within: Duration) -> bool {
        tokio::time::timeout(within, changes.reported.notified()).await.is_ok()
    }

    /// Take the reports of the change just made, until none comes for a
    /// while: one change is several events.
    async fn drain(changes: &Changes) {
        while reported(changes, Duration::from_millis(200)).await {}
    }

    #[tokio::test]
    async fn a_file_added_changed_or_removed_is_reported_at_once_and_a_look_is_not() {
        let parent = tempfile::tempdir().unwrap();
        let plugins = parent.path().join("plugins");
        std::fs::create_dir(&plugins).unwrap();
        let paths = vec![plugins.clone()];
        let changes = Changes::watch(&paths);
        assert!(changes.watcher.is_some(), "inotify watches the plugin paths");
        assert!(!changes.blind, "the plugin directory is watched");
        let file = plugins.join("echo.wasm");
        // Each well within the fallback's period: reported, not found by a
        // look at the end of it.
        let within = FALLBACK / 4;

        std::fs::write(&file, b"first").unwrap();
        assert!(reported(&changes, within).await, "a file added");
        drain(&changes).await;
        // A look lists the directory and reads nothing: no change of its
        // own, or the server would look for ever.
        assert_eq!(scan(&paths).len(), 1);
        let _ = std::fs::read(&file).unwrap();
        // Nor is a change beside the plugin directory.
        std::fs::write(parent.path().join("notes.txt"), b"unrelated").unwrap();
        assert!(
            !reported(&changes, Duration::from_secs(1)).await,
            "a look, a read or a sibling is no change"
        );

        std::fs::write(&file, b"second").unwrap();
        assert!(reported(&changes, within).await, "a file changed");
        drain(&changes).await;
        std::fs::remove_file(&file).unwrap();
        assert!(reported(&changes, within).await, "a file removed");
    }

    #[tokio::test]
    async fn a_plugin_directory_removed_and_made_again_is_watched_again() {
        let parent = tempfile::tempdir().unwrap();
        let plugins = parent.path().join("plugins");
        std::fs::create_dir(&plugins).unwrap();
        let mut changes = Changes::watch(std::slice::from_ref(&plugins));
        let within = FALLBACK / 4;

        std::fs::remove_dir(&plugins).unwrap();
        assert!(reported(&changes, within).await, "the directory removed");
        changes.rewatch();
        drain(&changes).await;
        // Nothing watches the directory now: its parent's watch sees it back.
        std::fs::create_dir(&plugins).unwrap();
        assert!(reported(&changes, within).await, "the directory made again");
        changes.rewatch();
        drain(&changes).await;

        std::fs::write(plugins.join("echo.wasm"), b"new").unwrap();
        assert!(reported(&changes, within).await, "a file added to the new directory");
    }

    #[tokio::test]
    async fn a_path_whose_directory_is_missing_is_looked_at_often_until_it_can_be_watched() {
        let root = tempfile::tempdir().unwrap();
        let plugins = root.path().join("tools").join("plugins");
        let mut changes = Changes::watch(std::slice::from_ref(&plugins));
        assert!(changes.watcher.is_some(), "inotify is available");
        assert!(changes.blind, "neither the path nor its directory exists to be watched");

        std::fs::create_dir(root.path().join("tools")).unwrap();
        changes.rewatch();
        assert!(!changes.blind, "its directory is watched now");
        drain(&changes).await;
        std::fs::create_dir(&plugins).unwrap();
        assert!(reported(&changes, FALLBACK / 4).await, "the plugin directory made");
        changes.rewatch();
        assert!(!changes.blind);
    }
}
