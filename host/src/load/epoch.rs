//! The engine's epoch: the thread that advances it, which is what stops a
//! guest at its deadline and makes a long-running one yield.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::Engine;

/// How often the engine's epoch advances: the granularity of deadlines, and
/// how often a long-running guest yields to let other calls on its thread
/// progress.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// How many ticks in a row the engine has had no live instance before its
/// epoch thread stops ticking: a second.
const EPOCH_IDLE_TICKS: u32 = 100;

/// How often the epoch thread, stopped, looks whether its engine is gone,
/// and so how long it may outlive it, parked.
pub(crate) const EPOCH_IDLE_CHECK: Duration = Duration::from_secs(10);

/// The thread that advances an engine's epoch every [`EPOCH_TICK`], which
/// is what stops a guest at its deadline. It holds only a weak reference
/// and ends with the engine. Once the engine has had no live instance for
/// [`EPOCH_IDLE_TICKS`] ticks it stops ticking, waking only every
/// [`EPOCH_IDLE_CHECK`], so that an idle server is not woken a hundred times
/// a second; the next sandbox wakes it ([`Ticker::wake`]) before its guest
/// is called.
#[derive(Clone)]
pub(crate) struct Ticker {
    thread: std::thread::Thread,
    /// Set while the thread has stopped ticking, or is about to.
    stopped: Arc<AtomicBool>,
}

impl Ticker {
    /// Start the thread for `engine`.
    pub(crate) fn start(engine: &Engine) -> Ticker {
        let weak = engine.weak();
        let stopped = Arc::new(AtomicBool::new(false));
        let flag = stopped.clone();
        let live = |engine: &Engine| {
            engine.pooling_allocator_metrics().map_or(1, |metrics| metrics.component_instances())
        };
        let thread = std::thread::Builder::new()
            .name("keel-epoch".into())
            .spawn(move || {
                let mut idle = 0u32;
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    idle = if live(&engine) == 0 { idle.saturating_add(1) } else { 0 };
                    if idle < EPOCH_IDLE_TICKS {
                        drop(engine);
                        std::thread::sleep(EPOCH_TICK);
                        continue;
                    }
                    flag.store(true, Ordering::Relaxed);
                    // Pairs with the fence in `wake`: either this count sees
                    // the instance a sandbox just made, or that sandbox sees
                    // the flag and unparks this thread.
                    std::sync::atomic::fence(Ordering::SeqCst);
                    let still_idle = live(&engine) == 0;
                    drop(engine);
                    if still_idle {
                        std::thread::park_timeout(EPOCH_IDLE_CHECK);
                    }
                    flag.store(false, Ordering::Relaxed);
                }
            })
            .expect("failed to spawn the epoch thread");
        Ticker { thread: thread.thread().clone(), stopped }
    }

    /// Make sure the epoch advances while the instance just made lives:
    /// called once it is counted among the engine's live instances, before
    /// its guest is called.
    pub(crate) fn wake(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.stopped.load(Ordering::Relaxed) {
            self.thread.unpark();
        }
    }

    /// Whether the thread has stopped ticking, or is about to.
    #[cfg(test)]
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }
}
