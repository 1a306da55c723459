//! The one wasmtime engine shared by all plugins, its epoch ticker, and the
//! on-disk compile cache.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::bindings::Tool as ToolBindings;
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::sandbox::{SandboxState, SharedPreopens};

/// How often the epoch advances: the granularity of deadlines, and how often
/// a long-running guest yields to let other calls on its thread progress.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// How many instances may be alive at once across all calls. A batch keeps
/// one instance per pending call between its questions and its call, so this
/// bounds the calls of all batches in flight together.
const MAX_LIVE_INSTANCES: u32 = 1_000;

/// The engine, configured once for every plugin: component model, async,
/// fuel, epoch interruption and the pooling allocator.
pub struct Runtime {
    engine: Engine,
    linker: Linker<SandboxState>,
    cache: Option<CompileCache>,
}

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
            .linear_memory_keep_resident(1 << 20)
            .table_keep_resident(64 << 10)
            .pagemap_scan(Enabled::Auto);

        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .consume_fuel(metered)
            .epoch_interruption(metered)
            .max_wasm_stack(limits.stack)
            .async_stack_size(limits.stack + (1 << 20))
            .concurrency_support(false)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|error| Error::Engine(format!("{error:#}")))?;
        if metered {
            start_epoch_ticker(&engine);
        }

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
                linker.allow_shadowing(false);
                Ok(())
            })
            .map_err(|error| Error::Engine(format!("failed to link WASI: {error:#}")))?;
        ToolBindings::add_to_linker::<_, wasmtime::component::HasSelf<SandboxState>>(&mut linker, |state| {
            state
        })
        .map_err(|error| Error::Engine(format!("failed to link host imports: {error:#}")))?;

        let cache = cache_dir.map(|dir| CompileCache::new(dir, &engine));
        Ok(Runtime { engine, linker, cache })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The linker with WASI and the host imports.
    pub fn linker(&self) -> &Linker<SandboxState> {
        &self.linker
    }

    /// Compile `bytes` (read from `path`), or load them from the cache.
    pub fn compile(&self, path: &Path, bytes: &[u8]) -> Result<Compiled> {
        let started = Instant::now();
        let compile = || {
            Component::new(&self.engine, bytes).map_err(|error| {
                Error::plugin(path, format!("not a valid component: {}", root_cause(&error)))
            })
        };
        let (component, from_cache) = match &self.cache {
            Some(cache) => cache.get_or_compile(&self.engine, bytes, compile)?,
            None => (compile()?, false),
        };
        Ok(Compiled { component, from_cache, time: started.elapsed() })
    }
}

/// A compiled component and how it was obtained.
pub struct Compiled {
    /// The component.
    pub component: Component,
    /// Whether it was loaded from the compile cache.
    pub from_cache: bool,
    /// How long compiling or loading took.
    pub time: Duration,
}

/// The innermost cause of a wasmtime error, which says what actually failed.
pub(crate) fn root_cause(error: &wasmtime::Error) -> String {
    error.chain().last().map(ToString::to_string).unwrap_or_default()
}

/// Advance the engine's epoch every [`EPOCH_TICK`] for as long as the engine
/// lives: the thread holds only a weak reference and stops with the engine.
fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("keel-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .expect("failed to spawn the epoch thread");
}

/// Compiled components on disk, so a second start does not recompile.
///
/// A file's name is the BLAKE3 hash of the component's bytes plus a
/// fingerprint of the wasmtime version and every engine setting that affects
/// compiled code: a change of either misses the cache instead of loading
/// stale code. BLAKE3 is as collision-resistant as sha256 and several times
/// faster, which matters because every start hashes every plugin in full.
/// (Entries named by the earlier sha256 scheme are never looked up again.)
struct CompileCache {
    dir: PathBuf,
    engine_key: String,
    /// A lock for each entry this runtime has compiled.
    compiling: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
}

impl CompileCache {
    fn new(dir: PathBuf, engine: &Engine) -> Self {
        let mut hasher = Blake3Hasher(blake3::Hasher::new());
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = hex(&hasher.0.finalize().as_bytes()[..8]);
        CompileCache { dir, engine_key, compiling: Mutex::default() }
    }

    /// The component `bytes` from its entry, or else made by `compile` and
    /// stored; and whether it came from the cache.
    fn get_or_compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
        compile: impl FnOnce() -> Result<Component>,
    ) -> Result<(Component, bool)> {
        // The bytes are hashed once: the entry looked up is the one written.
        let entry = self.entry(bytes);
        if let Some(component) = load_cached(engine, &entry) {
            return Ok((component, true));
        }
        // Plugins load in parallel: of two loads of the same bytes, the
        // second waits while the first compiles them, then finds their entry.
        let lock = {
            let mut compiling = self.compiling.lock().unwrap_or_else(PoisonError::into_inner);
            compiling.entry(entry.clone()).or_default().clone()
        };
        let _compiling = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(component) = load_cached(engine, &entry) {
            return Ok((component, true));
        }
        let component = compile()?;
        self.store(&component, &entry);
        Ok((component, false))
    }

    /// The entry of the component `bytes`: a name bound to these exact
    /// bytes and this engine.
    fn entry(&self, bytes: &[u8]) -> PathBuf {
        self.dir.join(format!("{}-{}.cwasm", blake3::hash(bytes).to_hex(), self.engine_key))
    }

    fn store(&self, component: &Component, entry: &Path) {
        let written = component
            .serialize()
            .map_err(|error| root_cause(&error))
            .and_then(|code| write_atomically(&self.dir, entry, &code).map_err(|error| error.to_string()));
        if let Err(error) = written {
            tracing::warn!(path = %entry.display(), "failed to write compile cache: {error}");
        }
    }
}

/// The component cached at `entry` (a name from [`CompileCache::entry`]), or
/// `None` when there is none or it cannot be used.
fn load_cached(engine: &Engine, entry: &Path) -> Option<Component> {
    // SAFETY: `deserialize_file` trusts the file to hold code compiled by
    // this wasmtime for this engine configuration, and to stay unchanged
    // while it is mapped. It does: the cache directory is written only by
    // `CompileCache::store`, atomically (a complete new file renamed over
    // the name, never a file changed in place), and the name binds the exact
    // component bytes (their BLAKE3 hash, computed from the very bytes that
    // are compiled on a miss) and the engine's compatibility fingerprint, so
    // no other code or configuration can be found under it. A missing file
    // is only a miss. wasmtime still checks the header's version and
    // settings and refuses a mismatch.
    match unsafe { Component::deserialize_file(engine, entry) } {
        Ok(component) => Some(component),
        Err(error) if is_not_found(&error) => None,
        Err(error) => {
            tracing::warn!(path = %entry.display(), "ignoring unreadable compile cache entry: {}", root_cause(&error));
            None
        }
    }
}

/// Whether `error` says the file does not exist: a miss, not a fault.
fn is_not_found(error: &wasmtime::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
    })
}

/// Write `contents` to `path` so that readers see the old file, or the whole
/// new one, never a part: a temporary file in the same directory, synced,
/// then renamed over the target.
pub(crate) fn write_atomically(dir: &Path, path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    file.write_all(contents)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|error| error.error)?;
    Ok(())
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
    fn a_cache_entry_is_bound_to_the_exact_bytes() {
        let cache = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(&Limits::default(), Some(cache.path().to_path_buf())).unwrap();
        let path = Path::new("plugin.wasm");
        assert!(!runtime.compile(path, &component(1)).unwrap().from_cache, "a cold cache compiles");
        assert!(runtime.compile(path, &component(1)).unwrap().from_cache, "the same bytes hit");
        assert!(!runtime.compile(path, &component(2)).unwrap().from_cache, "other bytes miss");
        assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 2);
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
