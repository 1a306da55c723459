//! The one wasmtime engine shared by all plugins (the thread that advances
//! its epoch is in `epoch.rs`), and the on-disk compile cache.

use std::collections::HashMap;
use std::fs::Metadata;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::error::{Error, Result};
use crate::limits::{Limits, human_bytes};
use crate::load::bindings::{v0_2, v0_3, v0_4};
use crate::load::epoch::Ticker;
use crate::load::lock::{Pins, is_sha256_hex, sha256_hex};
use crate::load::sandbox::{SandboxState, SharedPreopens, root_cause};

/// How many instances may be alive at once across all calls. A batch keeps
/// one instance per pending call between its questions and its call, so this
/// bounds the calls of all batches in flight together.
const MAX_LIVE_INSTANCES: u32 = 1_000;

/// The engine, configured once for every plugin: component model, async,
/// fuel, epoch interruption and the pooling allocator.
pub struct Runtime {
    engine: Engine,
    /// What advances the engine's epoch; none when nothing is metered.
    ticker: Option<Ticker>,
    linker: Linker<SandboxState>,
    cache: Option<CompileCache>,
    /// What every component is checked against before its code runs.
    pins: Option<Arc<Pins>>,
    /// The memory and table limits the engine's pool was made for, to name
    /// in the refusal of a component that needs more.
    memory: usize,
    table_elements: usize,
}

/// The topic under which the sha256 digest of a component's bytes is kept
/// beside its compiled code, so that a pinned start need not read a file
/// the index knows.
const DIGEST_TOPIC: &str = "sha256";

impl Runtime {
    /// Build the engine for `limits`, caching compiled code in `cache_dir`.
    pub fn new(limits: &Limits, cache_dir: Option<PathBuf>) -> Result<Self> {
        Runtime::build(limits, cache_dir, true)
    }

    /// The same engine with neither fuel nor epoch interruption: a guest on
    /// it cannot be stopped. Only for the benchmark that shows what metering
    /// costs.
    pub(crate) fn unmetered(limits: &Limits) -> Result<Self> {
        Runtime::build(limits, None, false)
    }

    fn build(limits: &Limits, cache_dir: Option<PathBuf>, metered: bool) -> Result<Self> {
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(MAX_LIVE_INSTANCES)
            .total_core_instances(MAX_LIVE_INSTANCES * 4)
            .total_memories(MAX_LIVE_INSTANCES)
            .total_tables(MAX_LIVE_INSTANCES * 4)
            .total_stacks(MAX_LIVE_INSTANCES)
            .max_memories_per_component(4)
            .max_tables_per_component(8)
            .max_core_instances_per_component(32)
            .max_memory_size(limits.memory)
            .table_elements(limits.table_elements)
            // Reuse warm slots without re-faulting their first pages: what
            // makes a fresh sandbox per call nearly as cheap as a reused one.
            // Up to 8 MiB: a call that reads a body or a file of a few MiB
            // otherwise has the kernel fault in and zero every page of it
            // again, call after call. Only pages the last instance dirtied
            // stay, and each is reset before the next instance sees it.
            .linear_memory_keep_resident(8 << 20)
            .table_keep_resident(64 << 10)
            .pagemap_scan(Enabled::Auto);

        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .consume_fuel(metered)
            .epoch_interruption(metered)
            .max_wasm_stack(limits.stack)
            .async_stack_size(limits.stack.saturating_add(1 << 20))
            .concurrency_support(false)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|error| Error::Engine(format!("{error:#}")))?;
        let ticker = metered.then(|| Ticker::start(&engine));

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .and_then(|()| {
                // Directories come from the plugin's handles opened at load,
                // not from each sandbox's WASI context.
                linker.allow_shadowing(true);
                wasmtime_wasi::p2::bindings::filesystem::preopens::add_to_linker::<_, SharedPreopens>(
                    &mut linker,
                    |state| state,
                )?;
                crate::load::special_files::add_to_linker(&mut linker)?;
                linker.allow_shadowing(false);
                Ok(())
            })
            .map_err(|error| Error::Engine(format!("failed to link WASI: {error:#}")))?;
        // `wasi:http` types and the outgoing handler; every request goes
        // through the sandbox's egress hook.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|error| Error::Engine(format!("failed to link wasi:http: {error:#}")))?;
        // Every contract version's host imports, side by side: a component
        // links against those of the version it was built for.
        v0_2::Tool::add_to_linker::<_, wasmtime::component::HasSelf<SandboxState>>(&mut linker, |state| {
            state
        })
        .and_then(|()| {
            v0_3::Tool::add_to_linker::<_, wasmtime::component::HasSelf<SandboxState>>(&mut linker, |s| s)
        })
        .and_then(|()| {
            v0_4::Tool::add_to_linker::<_, wasmtime::component::HasSelf<SandboxState>>(&mut linker, |s| s)
        })
        .map_err(|error| Error::Engine(format!("failed to link host imports: {error:#}")))?;

        let cache = cache_dir.and_then(|dir| match made_dir(&dir) {
            Ok(()) => Some(CompileCache::new(dir, &engine)),
            Err(error) => {
                // Said once, not for every read and write of every plugin.
                tracing::warn!(path = %dir.display(), "no compile cache, every plugin compiled afresh: {error}");
                None
            }
        });
        Ok(Runtime {
            engine,
            ticker,
            linker,
            cache,
            pins: None,
            memory: limits.memory,
            table_elements: limits.table_elements,
        })
    }

    /// Check every component this runtime compiles or loads against
    /// `pins`, before any of its code runs (see [`Pins`]). The sha256 of a
    /// component is then computed whenever its bytes are read, and kept in
    /// the compile cache beside its code for the starts that do not read
    /// them.
    pub fn with_pins(mut self, pins: Arc<Pins>) -> Self {
        self.pins = Some(pins);
        self
    }

    /// The pins components are checked against, if any.
    pub fn pins(&self) -> Option<&Arc<Pins>> {
        self.pins.as_ref()
    }

    /// Check `bytes`, read from `path`, against the pins; when they have a
    /// content key, keep their digest beside it.
    fn vet_bytes(&self, path: &Path, bytes: &[u8], content_key: Option<&str>) -> Result<()> {
        let Some(pins) = &self.pins else { return Ok(()) };
        let sha256 = sha256_hex(bytes);
        if let Some(content_key) = content_key {
            self.remember(content_key, DIGEST_TOPIC, sha256.as_bytes());
        }
        pins.vet_file(path, &sha256)
    }

    /// The cached code of the bytes `identity` names, found for `path`
    /// without reading it, once they passed the pins; `None` when the code
    /// is not cached or, with pins, their digest is not known: the file is
    /// then read.
    fn load_vetted(
        &self,
        cache: &CompileCache,
        path: &Path,
        identity: &Identity,
    ) -> Result<Option<Component>> {
        match self.vet_known(path, &identity.content_key) {
            Some(vetted) => vetted.map(|()| cache.load_identified(&self.engine, identity)),
            None => Ok(None),
        }
    }

    /// Check the bytes of `content_key`, found for `path` without reading
    /// it, against the pins: `None` when their digest is not known, and the
    /// file must be read.
    fn vet_known(&self, path: &Path, content_key: &str) -> Option<Result<()>> {
        let Some(pins) = &self.pins else { return Some(Ok(())) };
        let held = self.recall(content_key, DIGEST_TOPIC)?;
        let sha256 = std::str::from_utf8(&held).ok().filter(|text| is_sha256_hex(text))?;
        Some(pins.vet_file(path, sha256))
    }

    /// The engine.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// What advances the engine's epoch, for every sandbox to wake
    /// ([`Ticker::wake`]); none when nothing is metered.
    pub(crate) fn ticker(&self) -> Option<Ticker> {
        self.ticker.clone()
    }

    /// The linker with WASI and the host imports.
    pub(crate) fn linker(&self) -> &Linker<SandboxState> {
        &self.linker
    }

    /// Compile `bytes` (read from `path`), or load them from the cache.
    pub(crate) fn compile(&self, path: &Path, bytes: &[u8]) -> Result<Compiled> {
        self.compile_vetted(path, bytes, |content_key| self.vet_bytes(path, bytes, content_key))
    }

    /// Compile keel's own component `bytes` (`label` names it in errors), or
    /// load it from the cache: [`Runtime::compile`], but not held to the
    /// pins, which vouch for plugins, not for what keel itself ships.
    pub(crate) fn compile_own(&self, label: &Path, bytes: &[u8]) -> Result<Compiled> {
        self.compile_vetted(label, bytes, |_| Ok(()))
    }

    /// Compile `bytes`, or load them from the cache, once `vet` passed them
    /// (given their content key when there is a cache).
    fn compile_vetted(
        &self,
        path: &Path,
        bytes: &[u8],
        vet: impl FnOnce(Option<&str>) -> Result<()>,
    ) -> Result<Compiled> {
        let started = Instant::now();
        let (component, from_cache, content_key) = match &self.cache {
            Some(cache) => {
                let content_key = cache.content_key(bytes);
                vet(Some(&content_key))?;
                let (component, from_cache) =
                    cache.get_or_compile(&self.engine, &content_key, || self.compile_bytes(path, bytes))?;
                (component, from_cache, Some(content_key))
            }
            None => {
                vet(None)?;
                (self.compile_bytes(path, bytes)?, false, None)
            }
        };
        let size = bytes.len() as u64;
        Ok(Compiled { component, from_cache, time: started.elapsed(), size, content_key })
    }

    /// Compile the component in the file at `path`, or load it from the
    /// cache. `check` vets the file's bytes whenever they are read, before
    /// anything else looks at them.
    ///
    /// A file the cache's index knows, unchanged since, is not read at all:
    /// its compiled code is loaded directly. The index records only files
    /// whose bytes passed `check` here, so a caller passes the same `check`
    /// every time; its errors are the same whether or not the cache is warm,
    /// since a file that would fail it is never in the index.
    pub(crate) fn compile_file(
        &self,
        path: &Path,
        check: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<Compiled> {
        let started = Instant::now();
        if let Some(cache) = &self.cache
            && let Some(identity) = cache.identify(path)
            && let Some(component) = self.load_vetted(cache, path, &identity)?
        {
            let Identity { content_key, size } = identity;
            return Ok(Compiled {
                component,
                from_cache: true,
                time: started.elapsed(),
                size,
                content_key: Some(content_key),
            });
        }
        self.read_and_compile(path, None, check, started)
    }

    /// What the compile cache's index knows of the file at `path` as it is
    /// now, without opening the file: the content key of its bytes and its
    /// size. `None` when there is no cache or the index does not know the
    /// file so (see [`Runtime::compile_file`]).
    pub(crate) fn identify(&self, path: &Path) -> Option<Identity> {
        let identity = self.cache.as_ref()?.identify(path)?;
        // A component its pins refuse is left to the full load, which says so.
        self.vet_known(path, &identity.content_key)?.ok()?;
        Some(identity)
    }

    /// The component of the bytes `identity` names, which the file at `path`
    /// held when it was identified: loaded from the cache, or else read from
    /// `path` again, vetted by `check` and compiled. Fails, saying so, when
    /// the file no longer holds those bytes.
    pub(crate) fn compile_identified(
        &self,
        path: &Path,
        identity: &Identity,
        check: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<Compiled> {
        let started = Instant::now();
        if let Some(cache) = &self.cache
            && let Some(component) = self.load_vetted(cache, path, identity)?
        {
            let (size, content_key) = (identity.size, Some(identity.content_key.clone()));
            return Ok(Compiled { component, from_cache: true, time: started.elapsed(), size, content_key });
        }
        self.read_and_compile(path, Some(&identity.content_key), check, started)
    }

    /// Read the file at `path`, vet its bytes with `check`, and compile them
    /// or load them from the cache, indexing the file; when `expected` is
    /// given, only if they are still the bytes of that content key.
    fn read_and_compile(
        &self,
        path: &Path,
        expected: Option<&str>,
        check: impl FnOnce(&[u8]) -> Result<()>,
        started: Instant,
    ) -> Result<Compiled> {
        let (bytes, stat) = read_with_stat(path).map_err(|error| Error::io("read", path, error))?;
        check(&bytes)?;
        let Some(cache) = &self.cache else {
            self.vet_bytes(path, &bytes, None)?;
            let component = self.compile_bytes(path, &bytes)?;
            let (time, size) = (started.elapsed(), stat.len());
            return Ok(Compiled { component, from_cache: false, time, size, content_key: None });
        };
        let content_key = cache.content_key(&bytes);
        if expected.is_some_and(|expected| expected != content_key) {
            return Err(Error::plugin(
                path,
                "changed since keel loaded it; restart keel to load the new version",
            ));
        }
        self.vet_bytes(path, &bytes, Some(&content_key))?;
        let (component, from_cache) =
            cache.get_or_compile(&self.engine, &content_key, || self.compile_bytes(path, &bytes))?;
        cache.record(path, &stat, &content_key);
        let (time, size) = (started.elapsed(), stat.len());
        Ok(Compiled { component, from_cache, time, size, content_key: Some(content_key) })
    }

    /// What was stored by [`Runtime::remember`] for the bytes of
    /// `content_key` under `topic`, on this engine; `None` when nothing
    /// was, or there is no cache. It may be damaged (a crash while it was
    /// written): the caller checks it, and treats what it cannot read as
    /// absent.
    pub(crate) fn recall(&self, content_key: &str, topic: &str) -> Option<Vec<u8>> {
        let cache = self.cache.as_ref()?;
        std::fs::read(cache.answers_entry(content_key, topic)).ok()
    }

    /// Store `answers` about the bytes of `content_key` under `topic`, for
    /// [`Runtime::recall`]: what a later start can know of a component
    /// without loading it. Best effort, and not synced: a failure is logged.
    pub(crate) fn remember(&self, content_key: &str, topic: &str, answers: &[u8]) {
        let Some(cache) = &self.cache else { return };
        let entry = cache.answers_entry(content_key, topic);
        if let Err(error) = crate::fs::replace_unsynced(&entry, answers) {
            tracing::warn!(path = %entry.display(), "failed to write to the compile cache: {error}");
        }
    }

    fn compile_bytes(&self, path: &Path, bytes: &[u8]) -> Result<Component> {
        Component::new(&self.engine, bytes).map_err(|error| {
            let cause = root_cause(&error);
            let reason = match Exceeded::of(&cause) {
                Some(Exceeded::Memory(bytes)) => format!(
                    "its memory starts at {}, over the memory limit of {} (`memory_mib` in `[limits]`)",
                    human_bytes(bytes),
                    human_bytes(self.memory)
                ),
                Some(Exceeded::Table(elements)) => format!(
                    "a table of it starts at {elements} elements, over the limit of {} (`table_elements` in \
                     `[limits]`)",
                    self.table_elements
                ),
                None => format!("not a valid component: {cause}"),
            };
            Error::plugin(path, reason)
        })
    }
}

/// The bytes of the file at `path` and its metadata, taken from the same
/// open file: the metadata describes the very file that was read, even if
/// `path` is replaced meanwhile.
fn read_with_stat(path: &Path) -> std::io::Result<(Vec<u8>, Metadata)> {
    let mut file = std::fs::File::open(path)?;
    let stat = file.metadata()?;
    let mut bytes = Vec::with_capacity(usize::try_from(stat.len()).unwrap_or(0));
    file.read_to_end(&mut bytes)?;
    Ok((bytes, stat))
}

/// A compiled component and how it was obtained.
pub struct Compiled {
    /// The component.
    pub component: Component,
    /// Whether it was loaded from the compile cache.
    pub from_cache: bool,
    /// How long compiling or loading took.
    pub time: Duration,
    /// Size of the component file in bytes.
    pub size: u64,
    /// The content key of the component's bytes, when there is a cache:
    /// what [`Runtime::recall`] and [`Runtime::remember`] file answers by.
    pub content_key: Option<String>,
}

/// A file as the compile cache's index knows it (see [`Runtime::identify`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The content key of the bytes the file holds.
    pub content_key: String,
    /// The file's size in bytes.
    pub size: u64,
}

/// Make the directory `dir` unless it is one: the error, when it cannot be,
/// says why in a few words.
fn made_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::create_dir_all(dir) {
        Err(_) if dir.exists() && !dir.is_dir() => Err(std::io::Error::other("it is not a directory")),
        made => made,
    }
}

/// Compiled components on disk, so a second start does not recompile.
///
/// A compiled component (an artifact) is named by its content key, the
/// BLAKE3 hash of the component's bytes, plus a fingerprint of the wasmtime
/// version and every engine setting that affects compiled code: a change of
/// either misses the cache instead of loading stale code. BLAKE3 is as
/// collision-resistant as sha256 and several times faster. (Artifacts named
/// by the earlier sha256 scheme are never looked up again.)
///
/// Hashing a plugin means reading it in full, so an index in `index/` spares
/// that on a warm start, as ccache's direct mode and git's index do: an
/// index entry is named by a file's identity (its canonical path, device,
/// inode, size, modification and change times, and the engine fingerprint)
/// and holds the content key of the bytes read from that file. Writing to a
/// file changes its change time, which no one can set back, so an entry is
/// found only while the file still holds those bytes. A file changed within
/// [`RACY_WINDOW`] is not indexed: it could change again within the same
/// timestamp granule and keep its identity.
///
/// What a caller learnt of a component and wants a later start to know
/// without loading it (a plugin's load-time answers) is kept in `answers/`,
/// named by the content key, the engine fingerprint and a topic the caller
/// chooses ([`Runtime::remember`]).
struct CompileCache {
    dir: PathBuf,
    engine_key: String,
    /// How recently a file may have changed and still be indexed: the
    /// default [`RACY_WINDOW`], shorter only in tests.
    racy_window: Duration,
    /// A lock for each artifact this runtime has compiled.
    compiling: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
}

/// How long after a file last changed before it may be indexed. Timestamps
/// advance in granules (a few milliseconds on Linux, 2 s on FAT), and a file
/// written twice within one keeps the same identity; 2 s covers them all, as
/// git's racy-timestamp check does. A plugin installed a moment ago is read
/// and hashed until then.
pub(crate) const RACY_WINDOW: Duration = Duration::from_secs(2);

/// The subdirectory of the cache that holds the index.
const INDEX_DIR: &str = "index";

/// The subdirectory of the cache that holds what [`Runtime::remember`] keeps.
const ANSWERS_DIR: &str = "answers";

impl CompileCache {
    fn new(dir: PathBuf, engine: &Engine) -> Self {
        let mut hasher = Blake3Hasher(blake3::Hasher::new());
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = hex(&hasher.0.finalize().as_bytes()[..8]);
        CompileCache { dir, engine_key, racy_window: RACY_WINDOW, compiling: Mutex::default() }
    }

    /// The component of the artifact named by `content_key`, or else made by
    /// `compile` and stored; and whether it came from the cache.
    fn get_or_compile(
        &self,
        engine: &Engine,
        content_key: &str,
        compile: impl FnOnce() -> Result<Component>,
    ) -> Result<(Component, bool)> {
        // The bytes are hashed once: the artifact looked up is the one written.
        let artifact = self.artifact(content_key);
        if let Some(component) = load_cached(engine, &artifact) {
            return Ok((component, true));
        }
        // Plugins load in parallel: of two loads of the same bytes, the
        // second waits while the first compiles them, then finds their artifact.
        let lock = {
            let mut compiling = self.compiling.lock().unwrap_or_else(PoisonError::into_inner);
            compiling.entry(artifact.clone()).or_default().clone()
        };
        let _compiling = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(component) = load_cached(engine, &artifact) {
            return Ok((component, true));
        }
        let component = compile()?;
        self.store(&component, &artifact);
        Ok((component, false))
    }

    /// The content key of the component `bytes`: their BLAKE3 hash, in hex.
    fn content_key(&self, bytes: &[u8]) -> String {
        blake3::hash(bytes).to_hex().to_string()
    }

    /// The artifact of the bytes whose content key is `content_key`: a name
    /// bound to those exact bytes and this engine.
    fn artifact(&self, content_key: &str) -> PathBuf {
        self.dir.join(format!("{content_key}-{}.cwasm", self.engine_key))
    }

    fn store(&self, component: &Component, artifact: &Path) {
        let written = component
            .serialize()
            .map_err(|error| root_cause(&error))
            .and_then(|code| crate::fs::write_atomically(artifact, &code).map_err(|error| error.to_string()));
        if let Err(error) = written {
            tracing::warn!(path = %artifact.display(), "failed to write compile cache: {error}");
        }
    }

    /// The file at `path` as the index knows it, when it knows the file as
    /// it is now; `None`, a miss, otherwise. The file itself is not opened.
    fn identify(&self, path: &Path) -> Option<Identity> {
        let stat = std::fs::metadata(path).ok().filter(Metadata::is_file)?;
        let (entry, _) = self.index_entry(path, &stat)?;
        let held = read_and_mark_seen(&entry)?;
        let content_key = parse_content_key(&held)?.to_owned();
        Some(Identity { content_key, size: stat.len() })
    }

    /// The component of the artifact `identity` names, when it loads; an
    /// artifact that does not load is left to the full lookup, which reports
    /// it and replaces it.
    fn load_identified(&self, engine: &Engine, identity: &Identity) -> Option<Component> {
        try_load(engine, &self.artifact(&identity.content_key)).ok()?
    }

    /// Where answers about the bytes of `content_key` under `topic` are
    /// kept: a name bound to those bytes, this engine and the topic.
    ///
    /// The name begins with the content key, so that `keel cache prune`
    /// can tell which bytes an entry is about.
    fn answers_entry(&self, content_key: &str, topic: &str) -> PathBuf {
        let mut hasher = blake3::Hasher::new();
        for part in [&self.engine_key, topic] {
            hasher.update(&(part.len() as u64).to_le_bytes()).update(part.as_bytes());
        }
        let name = format!("{content_key}-{}", hex(&hasher.finalize().as_bytes()[..8]));
        self.dir.join(ANSWERS_DIR).join(name)
    }

    /// Index the file at `path`, described by `stat` (taken from the open
    /// file whose bytes were hashed), as holding the bytes of `content_key`;
    /// unless it changed too recently for its identity to be trusted.
    fn record(&self, path: &Path, stat: &Metadata, content_key: &str) {
        let Some(stamp) = FileStamp::of(stat) else { return };
        if !stamp.settled(SystemTime::now(), self.racy_window) {
            return;
        }
        let Some((entry, canonical)) = self.index_entry(path, stat) else { return };
        // The path after the key is for `keel cache` to show; a lookup
        // reads the key alone.
        let held = format!("{content_key}\n{}", canonical.display());
        // Not synced: after a crash an entry may be empty or gone, which is
        // a miss (`parse_content_key` refuses anything but a whole key), and
        // a sync per plugin would cost a start that indexes 50 of them more
        // than its own work.
        if let Err(error) = crate::fs::replace_unsynced(&entry, held.as_bytes()) {
            tracing::warn!(path = %entry.display(), "failed to write compile cache index: {error}");
        }
    }

    /// The index entry of the file at `path` as `stat` describes it, or
    /// `None` when the file has no identity to key it by.
    fn index_entry(&self, path: &Path, stat: &Metadata) -> Option<(PathBuf, PathBuf)> {
        let stamp = FileStamp::of(stat)?;
        let path = path.canonicalize().ok()?;
        let mut hasher = blake3::Hasher::new();
        // A path holds no NUL byte, so the fields cannot run into each other.
        hasher.update(path.as_os_str().as_encoded_bytes()).update(&[0]);
        for field in [stamp.device, stamp.inode, stamp.size] {
            hasher.update(&field.to_le_bytes());
        }
        for time in [stamp.modified, stamp.changed] {
            hasher.update(&time.to_le_bytes());
        }
        hasher.update(self.engine_key.as_bytes());
        Some((self.dir.join(INDEX_DIR).join(hex(&hasher.finalize().as_bytes()[..16])), path))
    }
}

/// The content key held by an index entry, or `None` when the entry is not
/// one (truncated, or not written by [`CompileCache::record`]): 64 hex
/// digits, alone or before a newline and the file's path.
pub(crate) fn parse_content_key(entry: &[u8]) -> Option<&str> {
    let (key, rest) = entry.split_at_checked(64)?;
    let well_formed = key.iter().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
        && (rest.is_empty() || rest[0] == b'\n');
    well_formed.then(|| std::str::from_utf8(key).ok()).flatten()
}

/// How stale an index entry's modification time may grow before a hit
/// moves it to now. It is when a plugin file was last seen, which
/// `keel cache prune` and the size cap go by; moving it on every hit would
/// cost a start a write per plugin.
pub(crate) const SEEN_GRANULE: Duration = Duration::from_secs(3600);

/// The index entry at `entry`, marked as seen now when its mark is older
/// than [`SEEN_GRANULE`]; `None` when it cannot be read.
fn read_and_mark_seen(entry: &Path) -> Option<Vec<u8>> {
    let mut file = std::fs::File::open(entry).ok()?;
    let mut held = Vec::with_capacity(128);
    file.read_to_end(&mut held).ok()?;
    let now = SystemTime::now();
    let stale = file
        .metadata()
        .and_then(|stat| stat.modified())
        .is_ok_and(|modified| now.duration_since(modified).is_ok_and(|age| age > SEEN_GRANULE));
    if stale {
        // Best effort: a mark not moved only makes the entry look older.
        let _ = file.set_modified(now);
    }
    Some(held)
}

/// What identifies a file's contents without reading them.
struct FileStamp {
    device: u64,
    inode: u64,
    size: u64,
    /// Last modification, in nanoseconds since the Unix epoch.
    modified: i128,
    /// Last change of contents or metadata, in nanoseconds since the Unix
    /// epoch: set by the kernel on every write, and settable by no one.
    changed: i128,
}

impl FileStamp {
    #[cfg(unix)]
    fn of(stat: &Metadata) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let nanos = |secs: i64, nsecs: i64| i128::from(secs) * 1_000_000_000 + i128::from(nsecs);
        Some(FileStamp {
            device: stat.dev(),
            inode: stat.ino(),
            size: stat.size(),
            modified: nanos(stat.mtime(), stat.mtime_nsec()),
            changed: nanos(stat.ctime(), stat.ctime_nsec()),
        })
    }

    /// Elsewhere there is no change time that a write always moves: nothing
    /// is indexed, and every start reads and hashes its plugins.
    #[cfg(not(unix))]
    fn of(_stat: &Metadata) -> Option<Self> {
        None
    }

    /// Whether the file last changed at least `window` before `now`. A time
    /// in the future is not settled.
    fn settled(&self, now: SystemTime, window: Duration) -> bool {
        let Ok(now) = now.duration_since(SystemTime::UNIX_EPOCH) else { return false };
        let since = i128::try_from(now.as_nanos()).unwrap_or(i128::MAX)
            - i128::try_from(window.as_nanos()).unwrap_or(i128::MAX);
        self.modified <= since && self.changed <= since
    }
}

/// What a component needs beyond the limits an engine's pool was made
/// for, read from wasmtime's refusal of it.
#[derive(Debug, PartialEq)]
enum Exceeded {
    /// Bytes its smallest memory starts at.
    Memory(usize),
    /// Elements a table of it starts at.
    Table(usize),
}

impl Exceeded {
    /// What `cause`, the reason wasmtime gave for refusing a component,
    /// says it needs; `None` when it is refused for anything else.
    fn of(cause: &str) -> Option<Self> {
        let number_after = |text: &str| {
            let (_, rest) = cause.split_once(text)?;
            rest.split(' ').next()?.parse::<usize>().ok()
        };
        if !cause.contains("which exceeds the limit of") {
            return None;
        }
        let memory = number_after("memory has a minimum byte size of ").map(Exceeded::Memory);
        memory.or_else(|| number_after("has a minimum element size of ").map(Exceeded::Table))
    }
}

/// The component cached at `artifact` (a name from
/// [`CompileCache::artifact`]), or `None` when there is none or it cannot be
/// used. One that needs more than this engine's limits is not damaged: its
/// compilation, next, says so.
fn load_cached(engine: &Engine, artifact: &Path) -> Option<Component> {
    try_load(engine, artifact).unwrap_or_else(|error| {
        if Exceeded::of(&error).is_none() {
            tracing::warn!(path = %artifact.display(), "ignoring unreadable compile cache entry: {error}");
        }
        None
    })
}

/// The component cached at `artifact`: `None` when there is no such file,
/// an error when it cannot be used.
fn try_load(engine: &Engine, artifact: &Path) -> Result<Option<Component>, String> {
    // SAFETY: `deserialize_file` trusts the file to hold code compiled by
    // this wasmtime for this engine configuration, and to stay unchanged
    // while it is mapped. It does: `artifact` is a name made by
    // `CompileCache::artifact`, under which only `CompileCache::store`
    // writes, atomically (a complete new file renamed over the name, never a
    // file changed in place); and the name binds the exact component bytes
    // (their BLAKE3 hash, computed from the very bytes that are compiled on
    // a miss) and the engine's compatibility fingerprint, so no other code
    // or configuration can be found under it. An index hit, which does not
    // read the plugin file, binds exact bytes all the same: the index only
    // maps a file's identity to a content key (taken only as 64 hex digits,
    // so it names an artifact and nothing else), and the artifact is still
    // named by that hash. The mapping is also current, since any write to
    // the file changes its change time and so its identity; and were it
    // stale, it could only choose another artifact of this cache. A missing
    // file is only a miss. wasmtime still checks the header's version and
    // settings and refuses a mismatch.
    match unsafe { Component::deserialize_file(engine, artifact) } {
        Ok(component) => Ok(Some(component)),
        Err(error) if is_not_found(&error) => Ok(None),
        Err(error) => Err(root_cause(&error)),
    }
}

/// Whether `error` says the file does not exist: a miss, not a fault.
fn is_not_found(error: &wasmtime::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
    })
}

/// Feeds `Hash` values into BLAKE3, for the engine fingerprint.
struct Blake3Hasher(blake3::Hasher);

impl Hasher for Blake3Hasher {
    fn finish(&self) -> u64 {
        unreachable!("only the digest is read")
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The default compile cache directory: `$KEEL_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/keel`, else `~/.cache/keel`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("KEEL_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("keel"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/keel"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(answer: i32) -> Vec<u8> {
        wat::parse_str(format!("(component (core module (func (result i32) i32.const {answer})))")).unwrap()
    }

    #[test]
    fn a_stack_no_engine_can_carry_is_an_error_not_an_overflow() {
        let limits = Limits { stack: usize::MAX, ..Limits::default() };
        assert!(Runtime::new(&limits, None).is_err());
    }

    #[test]
    fn a_component_that_needs_more_than_the_limits_is_refused_naming_the_limit() {
        let limits = Limits { memory: 1 << 20, table_elements: 10, ..Limits::default() };
        let runtime = Runtime::new(&limits, None).unwrap();
        let refusal = |module: &str| {
            let bytes = wat::parse_str(format!("(component (core module {module}))")).unwrap();
            runtime.compile(Path::new("big.wasm"), &bytes).err().unwrap().to_string()
        };
        assert_eq!(
            refusal("(memory 17)"),
            "failed to load plugin big.wasm: its memory starts at 1088 KiB, over the memory limit of 1 MiB \
             (`memory_mib` in `[limits]`)"
        );
        assert_eq!(
            refusal("(table 100 funcref)"),
            "failed to load plugin big.wasm: a table of it starts at 100 elements, over the limit of 10 \
             (`table_elements` in `[limits]`)"
        );
        assert!(refusal("(memory 1) (memory 1)").contains("not a valid component"));
    }

    #[test]
    fn a_cache_entry_is_bound_to_the_exact_bytes() {
        let cache = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(&Limits::default(), Some(cache.path().to_path_buf())).unwrap();
        let path = Path::new("plugin.wasm");
        assert!(!runtime.compile(path, &component(1)).unwrap().from_cache, "a cold cache compiles");
        assert!(runtime.compile(path, &component(1)).unwrap().from_cache, "the same bytes hit");
        assert!(!runtime.compile(path, &component(2)).unwrap().from_cache, "other bytes miss");
        assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 2);
    }

    /// Long enough for a file's timestamps to move past their granule: a
    /// file written this long ago may be indexed by [`index_test`]'s runtime.
    const SETTLE: Duration = Duration::from_millis(100);

    /// A compile cache, a runtime over it whose index takes files changed at
    /// least `racy_window` ago, and where a test writes its plugin.
    struct IndexTest {
        cache: tempfile::TempDir,
        _plugins: tempfile::TempDir,
        runtime: Runtime,
        path: PathBuf,
    }

    fn index_test(racy_window: Duration) -> IndexTest {
        let (cache, plugins) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut runtime = Runtime::new(&Limits::default(), Some(cache.path().to_path_buf())).unwrap();
        runtime.cache.as_mut().unwrap().racy_window = racy_window;
        let path = plugins.path().join("plugin.wasm");
        IndexTest { cache, _plugins: plugins, runtime, path }
    }

    /// Write `bytes` to `path`, then wait until the file may be indexed.
    fn write_settled(path: &Path, bytes: &[u8]) {
        std::fs::write(path, bytes).unwrap();
        std::thread::sleep(SETTLE);
    }

    /// Load the file at `path`, and the bytes that were read from it, if
    /// any were.
    fn load(runtime: &Runtime, path: &Path) -> (Compiled, Option<Vec<u8>>) {
        let mut read = None;
        let compiled = runtime
            .compile_file(path, |bytes| {
                read = Some(bytes.to_vec());
                Ok(())
            })
            .unwrap();
        (compiled, read)
    }

    /// The index entries of `cache`, and what each holds.
    fn index_entries(cache: &Path) -> Vec<(PathBuf, String)> {
        let Ok(entries) = std::fs::read_dir(cache.join(INDEX_DIR)) else { return Vec::new() };
        entries
            .map(|entry| {
                let path = entry.unwrap().path();
                let held = std::fs::read_to_string(&path).unwrap();
                let key = held.split('\n').next().unwrap().to_owned();
                (path, key)
            })
            .collect()
    }

    #[test]
    fn an_unchanged_file_is_loaded_from_the_index_without_being_read() {
        let IndexTest { cache: _cache, _plugins, runtime, path } = index_test(SETTLE);
        write_settled(&path, &component(1));

        let (first, read) = load(&runtime, &path);
        assert!(!first.from_cache, "a cold cache compiles");
        assert_eq!(read, Some(component(1)), "a file the index does not know is read");
        let (second, read) = load(&runtime, &path);
        assert!(second.from_cache);
        assert_eq!(read, None, "an indexed file is not read");
        assert_eq!(second.size, component(1).len() as u64, "the size comes from the file's metadata");
    }

    #[test]
    fn a_file_rewritten_with_other_bytes_of_the_same_size_is_read_again() {
        let IndexTest { cache, _plugins, runtime, path } = index_test(SETTLE);
        assert_eq!(component(1).len(), component(2).len());
        write_settled(&path, &component(1));
        load(&runtime, &path);

        write_settled(&path, &component(2));
        let (rewritten, read) = load(&runtime, &path);
        assert_eq!(read, Some(component(2)), "the changed file is read, not served the old code");
        assert!(!rewritten.from_cache, "its new bytes are compiled");
        let (again, read) = load(&runtime, &path);
        assert!(again.from_cache && read.is_none(), "and its new identity is indexed");
        let held: Vec<String> = index_entries(cache.path()).into_iter().map(|(_, held)| held).collect();
        let keys = [1, 2].map(|answer| blake3::hash(&component(answer)).to_hex().to_string());
        assert_eq!(held.len(), 2);
        assert!(keys.iter().all(|key| held.contains(key)), "each identity maps to the bytes it had");
    }

    #[test]
    fn a_file_changed_moments_ago_is_not_indexed() {
        // However slow the machine, the file is younger than an hour.
        let IndexTest { cache, _plugins, runtime, path } = index_test(Duration::from_secs(3600));
        std::fs::write(&path, component(1)).unwrap();
        load(&runtime, &path);

        let (second, read) = load(&runtime, &path);
        assert!(second.from_cache, "its compiled code is found by its bytes");
        assert_eq!(read, Some(component(1)), "but the file is read again");
        assert!(index_entries(cache.path()).is_empty());
    }

    #[test]
    fn a_corrupt_or_truncated_index_entry_is_a_miss() {
        let IndexTest { cache, _plugins, runtime, path } = index_test(SETTLE);
        write_settled(&path, &component(1));
        load(&runtime, &path);
        let [(entry, key)] = <[_; 1]>::try_from(index_entries(cache.path())).unwrap();

        for corrupt in [b"garbage".as_slice(), &key.as_bytes()[..40], b"", key.to_uppercase().as_bytes()] {
            std::fs::write(&entry, corrupt).unwrap();
            let (compiled, read) = load(&runtime, &path);
            assert!(read.is_some(), "a corrupt entry is a miss: the file is read");
            assert!(compiled.from_cache, "and its code found by its bytes");
            let held = std::fs::read_to_string(&entry).unwrap();
            assert_eq!(held.split('\n').next().unwrap(), key, "the entry is rewritten");
        }
    }

    #[test]
    fn an_index_entry_whose_code_is_gone_is_a_miss() {
        let IndexTest { cache: _cache, _plugins, runtime, path } = index_test(SETTLE);
        write_settled(&path, &component(1));
        load(&runtime, &path);
        let artifact = runtime.cache.as_ref().unwrap().artifact(&blake3::hash(&component(1)).to_hex());
        std::fs::remove_file(artifact).unwrap();

        let (compiled, read) = load(&runtime, &path);
        assert!(read.is_some() && !compiled.from_cache, "the file is read and compiled again");
        let (compiled, read) = load(&runtime, &path);
        assert!(read.is_none() && compiled.from_cache);
    }

    /// Pins of a lock beside `path` holding `path` to `sha256`.
    fn pinned_to(path: &Path, sha256: &str) -> Arc<Pins> {
        let entry = crate::load::lock::LockedPlugin {
            name: "plugin".into(),
            source: "plugin.wasm".into(),
            resolved: None,
            sha256: sha256.into(),
            contract: "0.3.0".into(),
        };
        let lock = crate::load::lock::Lock::new(vec![entry]);
        let lock_path = path.with_file_name("keel.lock");
        Arc::new(Pins::new(lock_path, Some(lock), false, &Default::default()).unwrap())
    }

    #[test]
    fn a_pinned_warm_start_checks_the_digest_kept_beside_the_code_without_reading_the_file() {
        let IndexTest { cache: _cache, _plugins, mut runtime, path } = index_test(SETTLE);
        write_settled(&path, &component(1));
        let actual = sha256_hex(&component(1));
        runtime.pins = Some(pinned_to(&path, &actual));
        let (_, read) = load(&runtime, &path);
        assert!(read.is_some(), "a cold start reads the file, and keeps its digest");
        let (warm, read) = load(&runtime, &path);
        assert!(warm.from_cache && read.is_none(), "a warm one reads neither the file nor its bytes");

        runtime.pins = Some(pinned_to(&path, &"0".repeat(64)));
        let error = runtime.compile_file(&path, |_| panic!("the file is not read")).err().unwrap();
        let lock = path.with_file_name("keel.lock");
        assert_eq!(
            error.to_string(),
            format!(
                "refused plugin {}: {} pins sha256 {}, but the file's component has sha256 {actual}",
                path.display(),
                lock.display(),
                "0".repeat(64)
            )
        );
        assert!(runtime.identify(&path).is_none(), "a refused file is left to the full load, which says why");
    }

    #[test]
    fn the_same_bytes_loaded_at_once_are_compiled_once() {
        let cache = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(&Limits::default(), Some(cache.path().to_path_buf())).unwrap();
        let bytes = component(3);
        let compiled = std::thread::scope(|scope| {
            let loads: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| runtime.compile(Path::new("plugin.wasm"), &bytes).unwrap().from_cache)
                })
                .collect();
            loads.into_iter().map(|load| load.join().unwrap()).filter(|from_cache| !from_cache).count()
        });
        assert_eq!(compiled, 1, "one load compiles, the others wait and load its entry");
    }
}
