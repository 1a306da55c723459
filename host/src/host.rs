//! The host: an engine, a pool of tools and a workspace, built once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use tracing::instrument::WithSubscriber as _;

use crate::batch::ToolUse;
use crate::budget::Budget;
use crate::budget::ledger::Ledger;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::events::Event;
use crate::events::summary::{DefaultSummarizer, Summarizer};
use crate::limits::Limits;
use crate::load::canary;
use crate::load::engine::{Runtime, default_cache_dir};
use crate::load::grants::Access;
use crate::load::grants::Grants;
use crate::load::lock::{LockedPlugin, Pins};
use crate::load::plugin::{LoadReport, PluginTool, plugin_files};
use crate::permissions::{KeelFile, Permissions, Prompter};
use crate::pool::builtin;
use crate::pool::{PoolOptions, ToolPool};
use crate::run::context;
use crate::run::interrupt::Interrupt;
use crate::run::scheduler::{self, BatchOutcome, Events, RunOptions};
use crate::run::stream::CallStream;
use crate::tool::Tool;

/// Where a session's persisted results go by default, inside the workspace.
pub const DEFAULT_SESSION_DIR: &str = ".keel/session";

/// Builds a [`Host`].
///
/// Defaults: the workspace is the current directory; no plugins; the
/// built-in tools included; no prompter (a call that needs approval is
/// denied); [`Limits::default`]; compiled plugins cached in
/// [`default_cache_dir`] (`$KEEL_CACHE_DIR`, else `$XDG_CACHE_HOME/keel`,
/// else `~/.cache/keel`).
pub struct HostBuilder {
    workspace: Option<PathBuf>,
    plugin_paths: Vec<PathBuf>,
    limits: Limits,
    cache_dir: Option<PathBuf>,
    builtins: bool,
    native: Vec<Arc<dyn Tool>>,
    config: Config,
    prompter: Option<Arc<dyn Prompter>>,
    session_dir: Option<PathBuf>,
    ledger: Ledger,
    keep_ledger: bool,
    summarizer: Option<Arc<dyn Summarizer>>,
    environment: Option<Environment>,
    preloaded: Vec<Arc<dyn Tool>>,
    engine: Option<Arc<Runtime>>,
    pins: Option<Arc<Pins>>,
    keel_files: Vec<(KeelFile, PathBuf)>,
}

/// The bundled roots and the PEM files of `[network] roots`, read relative
/// to `workspace`.
fn trusted_roots(paths: &[PathBuf], workspace: &Path) -> Result<crate::load::network::TlsRoots> {
    let mut pems = Vec::new();
    for path in paths {
        let path = workspace.join(path);
        let pem = crate::config::NetworkConfig::read_root(&path)?;
        pems.push((path, pem));
    }
    crate::load::network::TlsRoots::with_extra(&pems)
        .map_err(|reason| Error::Config { path: PathBuf::from("[network] roots"), reason })
}

/// Where a host reads the variables that grants name: the values of `env`
/// grants, and the `${NAME}` of secrets.
pub type Environment = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

impl HostBuilder {
    /// Plugins loaded already ([`crate::load::PluginTool::load_with_grants`]),
    /// joining the plugins found at the [`HostBuilder::plugins`] paths: a
    /// server that reloads plugins while serving keeps the ones it has and
    /// loads only what changed. They run on the engine that loaded them: a
    /// host given no [`HostBuilder::plugins`] paths makes no engine of its
    /// own.
    pub fn plugin_tools(mut self, tools: impl IntoIterator<Item = Arc<dyn Tool>>) -> Self {
        self.preloaded.extend(tools);
        self
    }

    /// The engine the plugins of [`HostBuilder::plugin_tools`] were loaded
    /// on. A host given no [`HostBuilder::plugins`] paths makes no engine of
    /// its own, and runs keel's own warm-up tool on this one
    /// ([`Host::warm_up`]); without it, its warm-up ends with a call of no
    /// tool, which runs less of the path a first call takes.
    pub fn engine(mut self, runtime: Arc<Runtime>) -> Self {
        self.engine = Some(runtime);
        self
    }

    /// Read the variables grants name from `environment` instead of the
    /// process environment: an embedder that keeps credentials elsewhere
    /// (a vault, a keyring) hands them to keel here, and they reach
    /// requests as secrets without ever being in a process environment.
    pub fn environment(mut self, environment: Environment) -> Self {
        self.environment = Some(environment);
        self
    }

    /// The directory the tools work in, mounted at `/workspace` in sandboxes.
    pub fn workspace(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workspace = Some(dir.into());
        self
    }

    /// Load the plugin at `path`: a `.wasm` component, or a directory whose
    /// `.wasm` files are all loaded.
    pub fn plugins(mut self, path: impl Into<PathBuf>) -> Self {
        self.plugin_paths.push(path.into());
        self
    }

    /// The sandbox limits of every plugin call.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Check every plugin against `pins` (a lock, `sha256` keys) before its
    /// code runs; a plugin that breaks one fails the build, naming it.
    /// Default: no pins, and no digest computed.
    pub fn pins(mut self, pins: Arc<Pins>) -> Self {
        self.pins = Some(pins);
        self
    }

    /// The engine a host of this builder runs on, for plugins loaded ahead
    /// of it ([`HostBuilder::plugin_tools`]): `limits`, the compile cache
    /// and the pins.
    pub fn runtime(&self, limits: &Limits) -> Result<Runtime> {
        let runtime = Runtime::new(limits, self.cache_dir.clone())?;
        Ok(match &self.pins {
            Some(pins) => runtime.with_pins(pins.clone()),
            None => runtime,
        })
    }

    /// One of keel's own files, such as the configuration the host's config
    /// was read from (or would be read from, if it is missing): no call may
    /// name it, and a start where a plugin may write the configuration or
    /// the lock file is warned of. The plugin paths and the compile cache
    /// are counted without being named here.
    pub fn keel_file(mut self, kind: KeelFile, path: impl Into<PathBuf>) -> Self {
        self.keel_files.push((kind, path.into()));
        self
    }

    /// Where compiled plugins are cached; `None` turns the cache off.
    pub fn cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }

    /// Apply a configuration file: its limits override [`Self::limits`].
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Add a native tool of the embedding agent's own. It joins the pool
    /// with the built-ins: sorted among them, ahead of every plugin, and it
    /// wins a name clash with a plugin.
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.native.push(tool);
        self
    }

    /// Who is asked when a call needs approval (a permission rule, the
    /// default or the tool itself says `ask`). Default: no one, and such a
    /// call is denied with a message saying it requires approval.
    pub fn prompter(mut self, prompter: Arc<dyn Prompter>) -> Self {
        self.prompter = Some(prompter);
        self
    }

    /// Where persisted results go (`tool-results/` below it). Default:
    /// `.keel/session` in the workspace, so the model can read them back.
    pub fn session_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.session_dir = Some(dir.into());
        self
    }

    /// Continue from the budget decisions of an earlier session (a resumed
    /// transcript, or a sub-agent's clone): a result once sent whole stays
    /// whole, and a replaced one keeps its exact replacement.
    pub fn ledger(mut self, ledger: Ledger) -> Self {
        self.ledger = ledger;
        self
    }

    /// Keep no ledger: each budget decision is made and forgotten, and
    /// [`Host::ledger`] stays empty. For a host whose results are never
    /// sent again, such as an MCP server's, where every call's result is
    /// final and a ledger would only grow, by an entry per call, for as long
    /// as the host serves.
    pub fn without_ledger(mut self) -> Self {
        self.keep_ledger = false;
        self
    }

    /// Who labels each batch once it finished. Default: the deterministic
    /// [`DefaultSummarizer`].
    pub fn summarizer(mut self, summarizer: Arc<dyn Summarizer>) -> Self {
        self.summarizer = Some(summarizer);
        self
    }

    /// Whether the built-in tools (such as `Read`) are in the pool.
    pub fn builtins(mut self, yes: bool) -> Self {
        self.builtins = yes;
        self
    }

    /// The workspace, canonical, and the grants of the configuration
    /// resolved against it, as the host would build them: for plugins loaded
    /// ahead of the host ([`HostBuilder::plugin_tools`]).
    pub fn resolve_grants(&self) -> Result<(PathBuf, Grants)> {
        let workspace = match &self.workspace {
            Some(dir) => dir.clone(),
            None => std::env::current_dir().map_err(|error| Error::io("read", ".", error))?,
        };
        let workspace =
            workspace.canonicalize().map_err(|error| Error::io("open workspace", &workspace, error))?;
        let mut grants = match &self.environment {
            Some(environment) => {
                Grants::from_config_with_env(&self.config.plugins, &workspace, |name| environment(name))?
            }
            None => Grants::from_config(&self.config.plugins, &workspace)?,
        };
        if !self.config.network.roots.is_empty() {
            grants.trust(&trusted_roots(&self.config.network.roots, &workspace)?);
        }
        Ok((workspace, grants))
    }

    /// The limits calls will run under: [`HostBuilder::limits`] with the
    /// configuration's `[limits]` applied.
    pub fn resolve_limits(&self) -> Limits {
        self.config.limits.apply(self.limits)
    }

    /// Where the compile cache is.
    pub fn cache(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// Load every plugin and assemble the pool. Fails on the first plugin that
    /// cannot be loaded, naming its file.
    ///
    /// Plugins load in parallel, up to one per core (see `load_plugins`);
    /// the outcome is the same as loading them one after another: the pool,
    /// the load reports in the order of the files, and the error of the
    /// first file in that order that fails.
    pub async fn build(self) -> Result<Host> {
        let (workspace, grants) = self.resolve_grants()?;
        let limits = self.resolve_limits();
        // Meanwhile, on another core, what the first schema compiled needs.
        let meta_schemas = tokio::task::spawn_blocking(crate::pool::schema::prepare_meta_schemas);
        // An engine only for plugins this builder loads: a plugin loaded
        // ahead of it ([`HostBuilder::plugin_tools`]) runs on the engine that
        // loaded it, and another would cost a start its pools and a thread.
        let runtime =
            if self.plugin_paths.is_empty() { self.engine } else { Some(Arc::new(self.runtime(&limits)?)) };
        let grants = Arc::new(grants);
        let upkeep = match (&self.cache_dir, self.config.cache.max_size_mib) {
            (Some(dir), Some(mib)) => Some(spawn_upkeep(dir.clone(), mib.get().saturating_mul(1 << 20))),
            _ => None,
        };

        let mut builtins: Vec<Arc<dyn Tool>> = self.native;
        let mut read = None;
        if self.builtins {
            let tool: Arc<dyn Tool> = Arc::new(
                builtin::Read::with_grant(&grants.for_tool("Read"))
                    .map_err(|error| Error::io("open workspace", &workspace, error))?
                    .with_deadline(limits.deadline),
            );
            read = Some(tool.clone());
            builtins.push(tool);
        }
        // Every plugin file in order, up to a path that cannot be listed: its
        // error counts only when no plugin before it fails to load.
        let mut files = Vec::new();
        let mut listed = Ok(());
        for path in &self.plugin_paths {
            match plugin_files(path) {
                Ok(found) => {
                    if found.is_empty() {
                        tracing::warn!("{} holds no plugin: no .wasm file in it", path.display());
                    }
                    files.extend(found);
                }
                Err(error) => {
                    listed = Err(error);
                    break;
                }
            }
        }
        let loaded = match &runtime {
            Some(runtime) => load_plugins(runtime, files, grants.clone(), limits).await?,
            None => Vec::new(),
        };
        listed?;
        let locked = match &self.pins {
            Some(pins) => lock_entries(
                pins,
                loaded
                    .iter()
                    .map(|plugin| plugin as &dyn Tool)
                    .chain(self.preloaded.iter().map(|tool| &**tool)),
            )?,
            None => Vec::new(),
        };
        let mut plugins: Vec<Arc<dyn Tool>> = Vec::with_capacity(loaded.len());
        let mut reports = Vec::with_capacity(loaded.len());
        for plugin in loaded {
            reports.push((plugin.spec().name.clone(), plugin.load_report().clone()));
            plugins.push(Arc::new(plugin));
        }
        plugins.extend(self.preloaded);
        let mut keel_files = self.keel_files;
        keel_files.extend(self.plugin_paths.iter().map(|path| (KeelFile::Plugins, path.clone())));
        keel_files.extend(self.cache_dir.iter().map(|dir| (KeelFile::Cache, dir.clone())));
        // Every call of these is read-only, held so by the sandbox: the
        // plugins that fixed a read-only plan, and the built-in `Read`.
        let read_only = |tool: &Arc<dyn Tool>| {
            tool.always_read_only() || read.as_ref().is_some_and(|read| Arc::ptr_eq(read, tool))
        };
        let tools = || builtins.iter().chain(&plugins);
        let writers: Vec<&str> =
            tools().filter(|tool| !read_only(tool)).map(|tool| tool.spec().name.as_str()).collect();
        let read_only_tools: Vec<String> = tools()
            .map(|tool| tool.spec().name.as_str())
            .filter(|name| !writers.contains(name))
            .map(str::to_owned)
            .collect();
        let mut permissions = Permissions::new(self.config.permissions.clone())
            .in_workspace(&workspace)
            .guarding(keel_files.iter().cloned(), read_only_tools);
        if let Some(prompter) = self.prompter {
            permissions = permissions.with_prompter(prompter);
        }
        let exposed = exposed_keel_files(&keel_files, &plugins, &grants, &workspace);
        let options = PoolOptions { permissions: Arc::new(permissions), tool_search: self.builtins };
        if let Err(error) = meta_schemas.await
            && error.is_panic()
        {
            std::panic::resume_unwind(error.into_panic());
        }
        let names: Vec<&str> =
            builtins.iter().chain(&plugins).map(|tool| tool.spec().name.as_str()).collect();
        let ungranted: Vec<String> = grants
            .unmatched(&names)
            .into_iter()
            .map(|pattern| {
                let warning = format!("`[plugins.{pattern}]` grants no tool of this run");
                crate::pool::suggesting(warning, pattern, names.iter().copied())
            })
            .collect();
        let (pool, mut warnings) = ToolPool::assemble_with(builtins, plugins, options)?;
        warnings.extend(ungranted);
        warnings.extend(exposed);
        let session_dir = self.session_dir.unwrap_or_else(|| workspace.join(DEFAULT_SESSION_DIR));
        // Persisted outputs are shown by a path the model can open with
        // `Read`: relative to the workspace when the session lives in it.
        let shown = session_dir.strip_prefix(&workspace).unwrap_or(&session_dir).display().to_string();
        // Tools can change anything in the workspace, so below it no folder
        // on the way to the results is followed through a link.
        let store = Arc::new(crate::budget::SessionDir::in_workspace(&workspace, session_dir));
        let budget = Budget::with_store(&self.config.budget, store).shown_root(shown);
        warnings.extend(budget.check_tools(pool.entries().iter().map(|entry| entry.tool.spec())));
        for warning in &warnings {
            tracing::warn!("{warning}");
        }
        // Those of the budget's overrides, it logged as it was made.
        warnings.extend(budget.warnings().iter().cloned());
        let options = RunOptions {
            cap: scheduler::max_tool_use_concurrency(self.config.max_tool_use_concurrency),
            batch_fuel: Some(limits.batch_fuel),
            max_input: limits.input,
            max_context: limits.context,
            budget,
            ledger: self.keep_ledger.then(|| Arc::new(tokio::sync::Mutex::new(self.ledger))),
            summarizer: self.summarizer.unwrap_or_else(|| Arc::new(DefaultSummarizer)),
        };
        Ok(Host {
            runtime,
            limits,
            pool: Arc::new(pool),
            workspace,
            grants,
            warnings,
            reports,
            options: Arc::new(options),
            locked,
            upkeep: std::sync::Mutex::new(upkeep),
        })
    }
}

/// A warning for each of keel's configuration and lock files that exists
/// where a plugin may write (the workspace, or a directory granted it
/// read-write), naming the plugins: a plugin can change either without
/// naming it to the permission rules, and so what the next start grants.
fn exposed_keel_files(
    files: &[(KeelFile, PathBuf)],
    plugins: &[Arc<dyn Tool>],
    grants: &Grants,
    workspace: &Path,
) -> Vec<String> {
    let mut warnings = Vec::new();
    for (kind, path) in files {
        if !matches!(kind, KeelFile::Config | KeelFile::Lock) || !path.is_file() {
            continue;
        }
        let Ok(real) = path.canonicalize() else { continue };
        let writers: Vec<&str> = plugins
            .iter()
            .filter(|tool| !tool.always_read_only())
            .map(|tool| tool.spec().name.as_str())
            .filter(|name| {
                let grant = grants.for_tool(name);
                (grant.workspace_access == Access::ReadWrite && real.starts_with(&grant.workspace))
                    || grant
                        .dirs
                        .iter()
                        .any(|dir| dir.access == Access::ReadWrite && real.starts_with(&dir.host))
            })
            .collect();
        let Some((last, others)) = writers.split_last() else { continue };
        let named = match others {
            [] => format!("the plugin {last} may"),
            others => format!("the plugins {} and {last} may", others.join(", ")),
        };
        let shown = real.strip_prefix(workspace).unwrap_or(&real).display();
        warnings.push(format!(
            "{shown}, {}, is where {named} write: keel refuses every call that names it, but a plugin that \
             writes it all the same changes what keel does at its next start; keep it where no plugin may \
             write",
            kind.what()
        ));
    }
    warnings
}

/// Check each plugin of `tools` against `pins`, and with `--locked` that
/// the lock names nothing else; the lock's entries for them, one per tool
/// name. The same component loaded twice (a file given twice, two tags of
/// one digest) is pinned once, as the pool keeps one; two components of one
/// name are refused, as a lock pins a name to one component.
pub fn lock_entries<'a>(
    pins: &Pins,
    tools: impl IntoIterator<Item = &'a dyn Tool>,
) -> Result<Vec<LockedPlugin>> {
    let mut entries: Vec<LockedPlugin> = Vec::new();
    for tool in tools {
        let spec = tool.spec();
        let crate::tool::ToolOrigin::Plugin { path, contract } = &spec.origin else { continue };
        let entry = pins.entry_for(&spec.name, path, contract);
        let kept = entry.as_ref().and_then(|entry| entries.iter().find(|kept| kept.name == entry.name));
        if let (Some(entry), Some(kept)) = (&entry, kept) {
            if kept.sha256 == entry.sha256 {
                continue;
            }
            return Err(Error::Pin {
                path: pins.named(path),
                reason: format!(
                    "its tool {} is also the tool of {}, another component; a lock pins one component per \
                     tool name, so give only one of them",
                    spec.name, kept.source
                ),
            });
        }
        pins.check_plugin(&spec.name, path)?;
        entries.extend(entry);
    }
    pins.check_complete(entries.iter().map(|entry| entry.name.as_str()))?;
    Ok(entries)
}

/// Enforce the compile cache's cap on a thread of its own, so that no start
/// waits for it.
fn spawn_upkeep(dir: PathBuf, max_bytes: u64) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("keel-cache-cap".into())
        .spawn(move || match crate::load::cache::enforce_cap(&dir, max_bytes) {
            Ok(pruned) if pruned.files > 0 => tracing::info!(
                "compile cache over its cap of {} MiB: removed {} files ({} bytes)",
                max_bytes >> 20,
                pruned.files,
                pruned.bytes
            ),
            Ok(_) => {}
            Err(error) => tracing::warn!("failed to enforce the compile cache's cap: {error}"),
        })
        .expect("failed to spawn the cache upkeep thread")
}

/// Load the plugins in `files`, several at once: up to one per core, each on
/// a blocking thread of the current tokio runtime, so that neither its
/// worker threads nor the caller's are held by reading, hashing,
/// deserialising or compiling code. The plugins come back in the order of
/// `files`. Fails with the error of the first file, in that order, that
/// cannot be loaded, whichever failed first in time; files after it are not
/// started once it is known.
pub async fn load_plugins(
    runtime: &Arc<Runtime>,
    files: Vec<PathBuf>,
    grants: Arc<Grants>,
    limits: Limits,
) -> Result<Vec<PluginTool>> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from).min(files.len());
    let queue = Arc::new(LoadQueue {
        needed: AtomicUsize::new(files.len()),
        next: AtomicUsize::new(0),
        files,
        runtime: runtime.clone(),
        grants,
        limits,
    });
    // A build that is dropped part-way leaves the remaining files unstarted.
    let _abandon = AbandonOnDrop(queue.clone());
    let handle = tokio::runtime::Handle::current();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (queue, handle) = (queue.clone(), handle.clone());
            tokio::task::spawn_blocking(move || queue.work(&handle))
        })
        .collect();
    let mut loaded = Vec::with_capacity(queue.files.len());
    for worker in workers {
        match worker.await {
            Ok(results) => loaded.extend(results),
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
    loaded.sort_unstable_by_key(|(index, _)| *index);
    loaded.into_iter().map(|(_, result)| result).collect()
}

/// The files of [`load_plugins`], taken in order by its threads.
struct LoadQueue {
    files: Vec<PathBuf>,
    /// How many files, from the first, the outcome still needs: all of them
    /// until one fails, then those up to the first failure known.
    needed: AtomicUsize,
    /// The index of the next file to take.
    next: AtomicUsize,
    runtime: Arc<Runtime>,
    grants: Arc<Grants>,
    limits: Limits,
}

impl LoadQueue {
    /// Load files until none is left or needed, giving each outcome with
    /// its file's index. Every file before the first failure is loaded: a
    /// thread skips only files after a known failure, and files are taken
    /// in order.
    fn work(&self, handle: &tokio::runtime::Handle) -> Vec<(usize, Result<PluginTool>)> {
        let mut results = Vec::new();
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            if index >= self.needed.load(Ordering::Relaxed) {
                return results;
            }
            let load =
                PluginTool::load_with_grants(&self.runtime, &self.files[index], &self.grants, &self.limits);
            let result = handle.block_on(load);
            if result.is_err() {
                self.needed.fetch_min(index + 1, Ordering::Relaxed);
            }
            results.push((index, result));
        }
    }
}

/// Tells the threads of [`load_plugins`] to start no more files when its
/// future is dropped.
struct AbandonOnDrop(Arc<LoadQueue>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.needed.store(0, Ordering::Relaxed);
    }
}

/// A loaded set of tools, ready to run batches.
pub struct Host {
    /// The engine of the plugins it loaded itself; when it loaded none, the
    /// one it was given ([`HostBuilder::engine`]), if any.
    runtime: Option<Arc<Runtime>>,
    /// The limits its plugins were loaded with ([`HostBuilder::resolve_limits`]).
    limits: Limits,
    pool: Arc<ToolPool>,
    workspace: PathBuf,
    grants: Arc<Grants>,
    warnings: Vec<String>,
    reports: Vec<(String, LoadReport)>,
    options: Arc<RunOptions>,
    /// What a lock records of the plugins, when the host was built with pins.
    locked: Vec<LockedPlugin>,
    /// The thread enforcing the compile cache's cap, until waited for.
    upkeep: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Host {
    /// What a lock records of each plugin the host loaded (see
    /// [`HostBuilder::pins`]); empty for a host built without pins.
    pub fn lock_entries(&self) -> &[LockedPlugin] {
        &self.locked
    }

    /// Wait until the compile cache's cap, enforced on a thread of its own
    /// from the start, is met: for a process about to exit, once its work
    /// is done.
    pub fn wait_for_cache_upkeep(&self) {
        let handle = self.upkeep.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }

    /// Every budget decision made so far, to save with the transcript and
    /// hand to [`HostBuilder::ledger`] when the session resumes; empty for a
    /// host built [`HostBuilder::without_ledger`].
    pub async fn ledger(&self) -> Ledger {
        match &self.options.ledger {
            Some(ledger) => ledger.lock().await.clone(),
            None => Ledger::new(),
        }
    }

    /// Start building a host.
    pub fn builder() -> HostBuilder {
        HostBuilder {
            workspace: None,
            plugin_paths: Vec::new(),
            limits: Limits::default(),
            cache_dir: default_cache_dir(),
            builtins: true,
            native: Vec::new(),
            config: Config::default(),
            prompter: None,
            session_dir: None,
            ledger: Ledger::new(),
            keep_ledger: true,
            summarizer: None,
            environment: None,
            preloaded: Vec::new(),
            engine: None,
            pins: None,
            keel_files: Vec::new(),
        }
    }

    /// The pool of tools.
    pub fn pool(&self) -> &ToolPool {
        &self.pool
    }

    /// The workspace directory on the host.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// What each tool may reach besides its input, as the configuration
    /// grants it.
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// Warnings from assembling the pool (tools left out, and why).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// How each plugin was loaded, by tool name, in load order.
    pub fn load_reports(&self) -> &[(String, LoadReport)] {
        &self.reports
    }

    /// The concurrency cap: calls of one concurrency-safe run in flight at once.
    pub fn max_tool_use_concurrency(&self) -> usize {
        self.options.cap
    }

    /// Results the budgets have persisted so far, by either tier, in every
    /// batch and stream of this host.
    pub fn results_persisted(&self) -> u64 {
        self.options.budget.results_persisted()
    }

    /// Start running a batch from `context` (see [`context::initial`]) on
    /// the current tokio runtime. Its events can be read as it runs; it can
    /// be interrupted; [`BatchRun::finish`] waits for its outcome.
    pub fn start_batch(&self, uses: Vec<ToolUse>, context: serde_json::Value) -> BatchRun {
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        let interrupt = Interrupt::new();
        let (pool, options, sink, stop) =
            (self.pool.clone(), self.options.clone(), Events::Channel(sender), interrupt.clone());
        let task =
            tokio::spawn(
                async move { scheduler::run(pool, uses.into(), context, options, sink, stop).await },
            );
        BatchRun { events, interrupt, task }
    }

    /// Run a batch from a fresh context and wait for its outcome.
    ///
    /// A batch of one call runs in the caller's task rather than a task of
    /// its own: nobody reads its events, and a hop to another thread and
    /// back would cost more than a small call itself.
    pub async fn run_batch(&self, uses: &[ToolUse]) -> BatchOutcome {
        if uses.len() <= 1 {
            let options = self.options.clone();
            return scheduler::run(
                self.pool.clone(),
                uses.into(),
                context::initial(),
                options,
                Events::Nobody,
                Interrupt::never(),
            )
            .await;
        }
        // A longer batch runs as a task of its own, on the runtime's workers:
        // its calls' tasks then wake it without crossing to the caller's
        // thread (1,000 safe calls ran 15% faster).
        let (pool, uses, options) = (self.pool.clone(), uses.to_vec(), self.options.clone());
        let run = async move {
            scheduler::run(pool, uses.into(), context::initial(), options, Events::Nobody, Interrupt::never())
                .await
        };
        match tokio::spawn(run).await {
            Ok(outcome) => outcome,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }

    /// Get every tool ready for its first call ([`Tool::warm_up`]): for a
    /// plugin, load its code if it was left unloaded at start and run one
    /// sandbox of it, one plugin after another, and once all are loaded one
    /// more sandbox of each, in a second pass; then run one call through
    /// the path every call takes, keeping nothing of it: a call of keel's
    /// own tool, `keel-warm-up`, which imports nothing and is in no pool
    /// offered to a model, on the engine of the host's plugins (its own, or
    /// the one it was given: [`HostBuilder::engine`]); or, when it has no
    /// engine, a call of no tool, which its planning answers with an error. A first call then neither loads code nor
    /// finds its pool slot or the host's own code cold; nor, on the thread
    /// that runs the warm-up, fresh stack pages ([`prefault_thread_stack`]).
    /// Meant to run in the background once the host is built, as `keel
    /// serve` runs it; the future holds the pool, the run options and the
    /// engine, not the host.
    ///
    /// [`Tool::warm_up`]: crate::tool::Tool::warm_up
    pub fn warm_up(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let pool = self.pool.clone();
        let options = self.options.clone();
        let own = self.runtime.clone().map(|runtime| (runtime, self.workspace.clone(), self.limits));
        async move {
            prefault_thread_stack();
            // The first pass loads code, which streams megabytes through
            // the caches; the second touches only what each tool's first
            // call will, so that every tool's, not only the last few's, is
            // still in the shared cache when that call comes.
            for _pass in 0..2 {
                for entry in pool.entries() {
                    entry.tool.warm_up().await;
                    // The calls that arrive meanwhile go first.
                    tokio::task::yield_now().await;
                }
            }
            // Loaded, as it is called, out of every subscriber's sight.
            let own = match own {
                Some((runtime, workspace, limits)) => own_pool(&runtime, &workspace, &limits)
                    .with_subscriber(Quiet)
                    .await
                    .inspect_err(|error| tracing::debug!("warm-up: {error}"))
                    .ok(),
                None => None,
            };
            let (pool, name) = match own {
                Some(own) => (own, canary::NAME),
                None if pool.get(WARM_UP_CALL).is_none() => (pool, WARM_UP_CALL),
                None => return,
            };
            // Kept in no ledger and reported to nobody, not even a tracing
            // subscriber: a first call then finds the batch's, the
            // sandbox's and the budgets' code mapped and in the caches.
            let options = Arc::new(RunOptions { ledger: None, ..RunOptions::clone(&options) });
            let call = [ToolUse::new(name, name, Value::Object(Default::default()))];
            let (events, interrupt) = (Events::Nobody, Interrupt::never());
            scheduler::run(pool, call[..].into(), context::initial(), options, events, interrupt)
                .with_subscriber(Quiet)
                .await;
        }
    }

    /// A stream of calls that arrive one at a time, as an MCP server's
    /// concurrent requests do, starting from `context` (see
    /// [`context::initial`]): each call is planned, admitted and run by the
    /// rules of a batch, in arrival order, and answered on its own. See
    /// [`CallStream`].
    ///
    /// ```no_run
    /// # async fn serve(host: &keel_host::Host) {
    /// use keel_host::{Interrupt, ToolUse};
    /// use serde_json::json;
    ///
    /// let stream = host.stream(keel_host::context::initial());
    /// // Where requests are read, in the order they came:
    /// let (first, second) = (stream.arrive(), stream.arrive());
    /// // Then each on its own task, in any order:
    /// let write = ToolUse::new("a", "write_file", json!({ "file_path": "x", "content": "1" }));
    /// let grep = ToolUse::new("b", "grep", json!({ "pattern": "1" }));
    /// let interrupt = Interrupt::new();
    /// // The grep waits for the write that arrived before it, and sees it.
    /// let (_found, _wrote) =
    ///     tokio::join!(second.run(grep, None, &interrupt), first.run(write, None, &interrupt));
    /// # }
    /// ```
    pub fn stream(&self, context: Value) -> CallStream {
        CallStream::new(self.pool.clone(), self.options.clone(), context)
    }

    /// A stream of this host's tools in the place of `previous` (a server's
    /// pool reloaded): its calls start once every call of `previous` has
    /// ended, from the context those left ([`CallStream`]).
    pub fn stream_after(&self, previous: &CallStream) -> CallStream {
        CallStream::following(self.pool.clone(), self.options.clone(), previous)
    }
}

/// The name and id of the call [`Host::warm_up`] runs when the host has no
/// engine of its own: no tool's, as no plugin's name may hold a space (a
/// native tool of this name is left alone, and the call is not made).
const WARM_UP_CALL: &str = "keel warm-up";

/// A pool of keel's own tool alone, with the default permissions (which
/// allow it: it is read-only). Failing to load it costs only a colder first
/// call.
async fn own_pool(runtime: &Arc<Runtime>, workspace: &Path, limits: &Limits) -> Result<Arc<ToolPool>> {
    let tool = canary::load(runtime, workspace, limits).await?;
    let (pool, _) = ToolPool::assemble(Vec::new(), vec![Arc::new(tool)])?;
    Ok(Arc::new(pool))
}

/// How much of a thread's stack [`prefault_thread_stack`] touches: more than
/// plugin calls take (a runtime worker of `keel serve` reaches about 84 KiB
/// deep serving them), and a sixteenth of the 2 MiB the worker has.
pub const STACK_PREFAULT: usize = 128 << 10;

/// Touch the next [`STACK_PREFAULT`] bytes of this thread's stack, once per
/// thread, so that the pages are mapped before a call needs them. A
/// thread's stack is mapped only as it first grows that deep, and a
/// plugin's first call goes deeper than anything before it: seven page
/// faults on that call's path, a fifth of its time. Meant for the threads
/// that run calls, before the first: a runtime's workers, as each first
/// goes idle (tokio's `on_thread_park`, which its blocking threads do not
/// run, as `keel serve` and `keel run` set it). [`Host::warm_up`] runs it
/// on its own thread. The pages stay mapped for the thread's life, an
/// eighth of a MiB each; on a thread that has run it, it only reads a
/// thread-local.
pub fn prefault_thread_stack() {
    thread_local! {
        static PREFAULTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if !PREFAULTED.replace(true) {
        touch_stack();
    }
}

#[inline(never)]
fn touch_stack() {
    let mut stack = [0u8; STACK_PREFAULT];
    std::hint::black_box(&mut stack);
}

/// A batch running in the background.
pub struct BatchRun {
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    interrupt: Interrupt,
    task: tokio::task::JoinHandle<BatchOutcome>,
}

impl BatchRun {
    /// The next event; `None` once the batch has finished and every event
    /// was read.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// A handle that interrupts this batch.
    pub fn interrupter(&self) -> Interrupt {
        self.interrupt.clone()
    }

    /// Wait for the batch to finish, dropping events not yet read.
    pub async fn finish(self) -> BatchOutcome {
        drop(self.events);
        match self.task.await {
            Ok(outcome) => outcome,
            // The scheduler does not panic on any input; if it ever did,
            // resuming the panic is better than inventing results.
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
}

/// A subscriber that takes nothing and says so: what the warm-up runs
/// under. Unlike `tracing`'s own `NoSubscriber`, it gives its highest level
/// (none), so that it does not raise the level every subscriber of the
/// process is asked about: a subscriber that names no level counts as
/// wanting them all, and every call after the warm-up would then make its
/// spans and events only to find nobody wants them.
struct Quiet;

impl tracing::Subscriber for Quiet {
    fn register_callsite(&self, _: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::never()
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::OFF)
    }

    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        // Never called: no span is enabled.
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, _: &tracing::Event<'_>) {}

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

#[cfg(test)]
mod tests {
    /// Page faults this thread has taken that needed no disk read, read
    /// into a buffer on the stack so that the reading itself maps nothing.
    #[cfg(target_os = "linux")]
    fn minor_faults() -> u64 {
        use std::io::Read;
        let mut stat = [0u8; 1024];
        let mut file = std::fs::File::open("/proc/thread-self/stat").unwrap();
        let len = file.read(&mut stat).unwrap();
        let stat = std::str::from_utf8(&stat[..len]).unwrap();
        // The fields after the command's closing parenthesis; minflt is the
        // tenth field of the line.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split(' ').nth(7).unwrap().parse().unwrap()
    }

    /// Use `SIZE` bytes of stack below this frame; give the faults it took.
    /// The frame that uses them is a call of its own: a frame's pages are
    /// touched as it is entered, by the compiler's stack probes.
    #[cfg(target_os = "linux")]
    fn faults_going_deep<const SIZE: usize>() -> u64 {
        #[inline(never)]
        fn go_deep<const SIZE: usize>() {
            let mut frame = [1u8; SIZE];
            std::hint::black_box(&mut frame);
        }
        // The first read in a process maps pages of its own.
        let _ = minor_faults();
        let before = minor_faults();
        go_deep::<SIZE>();
        minor_faults() - before
    }

    /// Going [`DEEP`] bytes down a new thread's stack, prefaulted first
    /// when `KEEL_STACK_PROBE` is `prefaulted`: the faults it took, printed.
    /// Run by the test below in a process of its own, whose one new thread
    /// has a stack nothing touched before: in a process that has ended
    /// threads, a new thread may get one's stack, mapped already.
    #[cfg(target_os = "linux")]
    #[test]
    #[ignore = "run in a process of its own by a_prefaulted_stack_maps_no_page_as_a_call_goes_deep"]
    fn stack_faults_probe() {
        let prefault = std::env::var("KEEL_STACK_PROBE").is_ok_and(|mode| mode == "prefaulted");
        // Too small a stack to hold a huge page, which a kernel may map at
        // the first touch.
        let faults = std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || {
                if prefault {
                    super::prefault_thread_stack();
                }
                faults_going_deep::<DEEP>()
            })
            .unwrap()
            .join()
            .unwrap();
        println!("stack faults: {faults}");
    }

    #[cfg(target_os = "linux")]
    const DEEP: usize = 96 << 10;

    /// The faults [`stack_faults_probe`] counted in a process of its own.
    #[cfg(target_os = "linux")]
    fn probe_stack_faults(mode: &str) -> u64 {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "host::tests::stack_faults_probe",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("KEEL_STACK_PROBE", mode)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let faults = stdout.lines().find_map(|line| line.split("stack faults: ").nth(1));
        let faults = faults.unwrap_or_else(|| panic!("the probe printed no faults: {stdout}"));
        faults.trim().parse().unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_prefaulted_stack_maps_no_page_as_a_call_goes_deep() {
        let (fresh, prefaulted) = (probe_stack_faults("fresh"), probe_stack_faults("prefaulted"));
        assert!(fresh > 0, "a fresh thread's stack took no fault to go {DEEP} bytes deep");
        assert_eq!(prefaulted, 0, "a prefaulted stack still took faults (a fresh one took {fresh})");
    }

    /// A warm-up on an engine (so with keel's own tool), in a process whose
    /// one subscriber wants warnings: the level the process's subscribers
    /// are asked about afterwards, and whether a call's span is then made,
    /// printed. Run by the test below in a process of its own: the level is
    /// the process's, and other tests' subscribers would raise it.
    #[test]
    #[ignore = "run in a process of its own by a_warm_up_leaves_the_level_of_the_process_as_it_was"]
    fn warm_up_level_probe() {
        let warnings = tracing_subscriber::fmt().with_max_level(tracing::Level::WARN).finish();
        tracing::subscriber::set_global_default(warnings).unwrap();
        let workspace = tempfile::tempdir().unwrap();
        let engine = Arc::new(Runtime::new(&Limits::default(), None).unwrap());
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let builder = Host::builder().workspace(workspace.path()).cache_dir(None).engine(engine);
        let host = runtime.block_on(builder.build()).unwrap();
        runtime.block_on(host.warm_up());
        println!("level: {}", tracing::level_filters::LevelFilter::current());
        let made = !tracing::info_span!(target: "keel_host::call", "call").is_disabled();
        println!("span made: {made}");
    }

    #[test]
    fn a_warm_up_leaves_the_level_of_the_process_as_it_was() {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "host::tests::warm_up_level_probe",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "the probe failed: {stdout}");
        assert!(stdout.contains("level: warn"), "{stdout}");
        assert!(stdout.contains("span made: false"), "{stdout}");
    }

    use super::*;

    #[tokio::test]
    async fn keels_own_tool_answers_its_call_through_the_path_every_call_takes() {
        let workspace = tempfile::tempdir().unwrap();
        let host = Host::builder().workspace(workspace.path()).cache_dir(None).build().await.unwrap();
        let runtime = Arc::new(Runtime::new(&Limits::default(), None).unwrap());
        let pool =
            own_pool(&runtime, workspace.path(), &Limits::default()).await.expect("keel's own tool loads");
        let call = [ToolUse::new("w", canary::NAME, serde_json::json!({ "any": ["input"] }))];
        let (events, interrupt) = (Events::Nobody, Interrupt::never());
        let options = host.options.clone();
        let outcome =
            scheduler::run(pool, call[..].into(), context::initial(), options, events, interrupt).await;
        let result = &outcome.results[0];
        assert!(!result.is_error, "{result:?}");
        assert_eq!(result.content.text(), "warm");
    }

    #[tokio::test]
    async fn a_host_given_the_engine_its_plugins_were_loaded_on_warms_up_on_it() {
        let workspace = tempfile::tempdir().unwrap();
        let runtime = Arc::new(Runtime::new(&Limits::default(), None).unwrap());
        let given = Host::builder().workspace(workspace.path()).cache_dir(None).engine(runtime.clone());
        let given = given.build().await.unwrap();
        assert!(given.runtime.as_ref().is_some_and(|engine| Arc::ptr_eq(engine, &runtime)));
        let bare = Host::builder().workspace(workspace.path()).cache_dir(None).build().await.unwrap();
        assert!(bare.runtime.is_none(), "a host with no plugin and no engine given makes none");
    }

    fn build(workspace: &Path, paths: &[&Path]) -> Result<Host> {
        let builder =
            paths.iter().fold(Host::builder().workspace(workspace).cache_dir(None), |builder, path| {
                builder.plugins(*path)
            });
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        runtime.block_on(builder.build())
    }

    /// A component that takes a while to compile and then fails the
    /// contract check: it exports nothing.
    fn slow_bad_component() -> Vec<u8> {
        let functions: String = (0..2_000)
            .map(|i| {
                format!(
                    "(func (param i32) (result i32) local.get 0 i32.const {i} i32.mul i32.const 7 i32.add)"
                )
            })
            .collect();
        wat::parse_str(format!("(component (core module {functions}))")).unwrap()
    }

    #[test]
    fn the_error_is_the_first_failing_file_in_order_not_in_time() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p00.wasm"), slow_bad_component()).unwrap();
        for i in 1..20 {
            std::fs::write(dir.path().join(format!("p{i:02}.wasm")), "not wasm").unwrap();
        }
        for _ in 0..3 {
            let error = build(dir.path(), &[dir.path()]).err().expect("no file loads").to_string();
            let first = dir.path().join("p00.wasm");
            assert!(error.starts_with(&format!("failed to load plugin {}: ", first.display())), "{error}");
            assert!(error.contains("does not export"), "{error}");
        }
    }

    #[test]
    fn a_load_error_before_an_unlistable_path_wins_and_one_after_it_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.wasm");
        std::fs::write(&bad, "not wasm").unwrap();
        let missing = dir.path().join("missing");
        let error = build(dir.path(), &[&bad, &missing]).err().unwrap().to_string();
        assert!(error.starts_with(&format!("failed to load plugin {}: ", bad.display())), "{error}");
        let error = build(dir.path(), &[&missing, &bad]).err().unwrap().to_string();
        assert!(error.starts_with(&format!("failed to read {}: ", missing.display())), "{error}");
    }

    #[test]
    fn load_reports_follow_the_order_of_the_files() {
        let dir = tempfile::tempdir().unwrap();
        // File order is the reverse of tool-name order.
        let tools = ["keel_tool_write_file", "keel_tool_grep", "keel_tool_echo"];
        for (i, tool) in tools.iter().enumerate() {
            std::fs::copy(keel_tests::guest(tool), dir.path().join(format!("p{i}.wasm"))).unwrap();
        }
        let host = build(dir.path(), &[dir.path()]).unwrap();
        let names: Vec<&str> = host.load_reports().iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["write_file", "grep", "echo"]);
        let pool: Vec<&str> =
            host.pool().entries().iter().map(|entry| entry.tool.spec().name.as_str()).collect();
        assert_eq!(pool, ["Read", "echo", "grep", "write_file"]);
    }

    /// A call's sandbox is torn down as the call is answered, unless the
    /// thread asked to defer its teardowns: then it waits until the thread
    /// has run what was ready (README, Performance).
    #[test]
    fn a_sandbox_waits_for_its_teardown_only_on_a_thread_that_defers_them() {
        let dir = tempfile::tempdir().unwrap();
        let echo = keel_tests::guest("keel_tool_echo");
        let host = build(dir.path(), &[&echo]).unwrap();
        let engine = host.runtime.as_ref().expect("an engine for the plugins it loaded").engine().clone();
        let live = || engine.pooling_allocator_metrics().expect("a pooling engine").component_instances();
        let call = |id: &str| [ToolUse::new(id, "echo", serde_json::json!({ "text": "hi" }))];
        let hi = |id: &str| vec![crate::ToolResult::ok(id, "hi")];
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            assert_eq!(host.run_batch(&call("toolu_1")).await.results, hi("toolu_1"));
            assert_eq!(live(), 0, "torn down at once by default");
            crate::defer_teardown_on_this_thread();
            assert_eq!(host.run_batch(&call("toolu_2")).await.results, hi("toolu_2"));
            assert_eq!(live(), 1, "waiting for the thread to run what was ready");
            assert_eq!(host.run_batch(&call("toolu_3")).await.results, hi("toolu_3"));
            assert_eq!(live(), 1, "at most one waits a thread");
            for _ in 0..10 {
                if live() == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(live(), 0, "torn down once the thread ran it");
        });
    }

    /// On a worker that tears its sandboxes down when idle, a call's
    /// sandbox outlives its answer until the worker goes idle, at most one
    /// a worker; a worker that stops tears its own down too.
    #[test]
    fn a_worker_tears_its_last_sandbox_down_when_it_goes_idle() {
        let dir = tempfile::tempdir().unwrap();
        let echo = keel_tests::guest("keel_tool_echo");
        let host = Arc::new(build(dir.path(), &[&echo]).unwrap());
        let engine = host.runtime.as_ref().expect("an engine for the plugins it loaded").engine().clone();
        let live =
            move || engine.pooling_allocator_metrics().expect("a pooling engine").component_instances();
        let live = Arc::new(live);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .on_thread_park(crate::tear_down_when_idle)
            .on_thread_stop(crate::tear_down_when_idle)
            .build()
            .unwrap();
        let calls = |host: Arc<Host>, ids: [&'static str; 2]| {
            let live = live.clone();
            async move {
                let mut seen = Vec::new();
                for id in ids {
                    let call = [ToolUse::new(id, "echo", serde_json::json!({ "text": "hi" }))];
                    assert_eq!(host.run_batch(&call).await.results, vec![crate::ToolResult::ok(id, "hi")]);
                    seen.push(live());
                }
                seen
            }
        };
        let wait_for = |want: u64| {
            for _ in 0..500 {
                if live() == want {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert_eq!(live(), want);
        };
        // Once the worker has gone idle (or been told as if it had: when it
        // first parks is its own), its calls leave their sandbox waiting,
        // and one waits at most.
        runtime.block_on(runtime.spawn(async { crate::tear_down_when_idle() })).unwrap();
        let first = runtime.block_on(runtime.spawn(calls(host.clone(), ["toolu_1", "toolu_2"]))).unwrap();
        assert_eq!(first, [1, 1], "the first waits, the second is torn down at once");
        wait_for(0);
        let second = runtime.block_on(runtime.spawn(calls(host, ["toolu_3", "toolu_4"]))).unwrap();
        assert_eq!(second, [1, 1], "and again once it went idle");
        drop(runtime);
        assert_eq!(live(), 0, "torn down as the worker stopped");
    }

    /// An engine with no live instance for a second stops advancing its
    /// epoch, and the next sandbox starts it again before its guest runs: a
    /// loop with no fuel limit, called then, still stops at its deadline.
    #[test]
    fn an_idle_engine_stops_its_epoch_and_a_sandbox_starts_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let hostile = keel_tests::guest("keel_guest_hostile");
        let limits =
            Limits { fuel: u64::MAX, deadline: std::time::Duration::from_millis(300), ..Limits::default() };
        let builder = Host::builder().workspace(dir.path()).cache_dir(None).limits(limits).plugins(&hostile);
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let host = runtime.block_on(builder.build()).unwrap();
        let ticker = host.runtime.as_ref().and_then(|runtime| runtime.ticker()).expect("a metered engine");
        let idle = std::time::Instant::now();
        while !ticker.is_stopped() {
            assert!(idle.elapsed() < std::time::Duration::from_secs(30), "the epoch never stopped");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // On a thread of its own: were the epoch not started again, the loop
        // would never end, and the test fails instead of waiting on it.
        let (done, finished) = std::sync::mpsc::channel();
        let called = std::time::Instant::now();
        std::thread::spawn(move || {
            let call = [ToolUse::new("toolu_1", "hostile", serde_json::json!({ "act": "loop" }))];
            let _ = done.send(runtime.block_on(host.run_batch(&call)).results);
        });
        let results = finished.recv_timeout(std::time::Duration::from_secs(60)).expect("the loop stopped");
        let stopped = crate::ToolResult::error("toolu_1", "hostile failed: deadline of 300ms exceeded");
        assert_eq!(results, [stopped]);
        let took = called.elapsed();
        let woken_by_itself = crate::load::epoch::EPOCH_IDLE_CHECK;
        assert!(took < woken_by_itself / 2, "stopped {took:?} after the call, as the thread woke by itself");
    }
}
