//! `keel serve` on stdio: the session on a thread of its own.
//!
//! The session's requests are read, its calls run and its replies written
//! on one thread, by a current-thread runtime. On the runtime every core's
//! worker shares, a call of a client that waits for each reply hopped
//! between the workers: read on one, run on the other, its reply written
//! back on the first, each hand-over waking a sleeping thread on a core
//! whose caches held nothing of the request. That was a fifth to two
//! fifths of the server's CPU per call (README, Performance: levers kept).
//!
//! A call that arrives while another call of the session runs on its
//! thread is run on the shared runtime instead ([`Placement`]), whose
//! workers run it beside the first: calls that may overlap still do, on
//! every core.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, Result};
use rmcp::ServiceExt as _;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::runtime::Handle;

use super::arrivals::Arrivals;
use super::{Server, fast_calls, stop, unreadable};

/// Where a session's calls run: on the session's own thread while no other
/// call of it runs there, else on the shared runtime. Clones share it.
#[derive(Clone)]
pub struct Placement {
    /// The runtime every core's worker shares.
    shared: Handle,
    /// Whether a call runs on the session's thread.
    busy: Arc<AtomicBool>,
}

impl Placement {
    /// This thread for a call, taken until the [`Running`] is dropped,
    /// unless a call already runs here: then `Err`, and the call goes to
    /// [`Placement::run_elsewhere`].
    pub fn claim(&self) -> Result<Running<'_>, &Self> {
        if self.busy.swap(true, Ordering::Relaxed) {
            return Err(self);
        }
        Ok(Running(&self.busy))
    }

    /// Run `call` on the shared runtime; it is stopped there if the caller
    /// gives up waiting, as a call run here would be. `None` if the shared
    /// runtime dropped it, shutting down as the process ends.
    pub async fn run_elsewhere<T: Send + 'static>(
        &self,
        call: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let mut task = Abort(self.shared.spawn(call));
        match (&mut task.0).await {
            Ok(output) => Some(output),
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => None,
        }
    }
}

/// A call running on the session's thread, which is free again once it is
/// dropped.
pub struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// A task on the shared runtime, aborted when dropped: a call handed there
/// ends with the request that made it, as one run here would.
struct Abort<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Abort<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The thread a stdio session runs on, started before the server is made
/// so that the server's warm-ups run there: the session's calls run there,
/// and wasmtime's pool gives each thread slots of a shard of its own.
pub struct Session {
    runtime: Handle,
    server: tokio::sync::oneshot::Sender<Server>,
    ended: tokio::sync::oneshot::Receiver<Result<()>>,
}

impl Session {
    /// Start the session's thread and its runtime; it waits for the server
    /// ([`Session::serve`]), and ends if it is dropped instead.
    pub fn start() -> Result<Self> {
        let shared = Handle::current();
        let (server, given) = tokio::sync::oneshot::channel::<Server>();
        let (handle, ended) = super::call_thread("keel-stdio".into(), move |runtime| {
            let served = runtime.block_on(async move {
                match given.await {
                    Ok(server) => session(server, shared).await,
                    Err(_) => Ok(()),
                }
            });
            // A blocking read of stdin (not a pipe) cannot be cancelled: it
            // is not waited for.
            runtime.shutdown_background();
            served
        })?;
        Ok(Session { runtime: handle, server, ended })
    }

    /// The runtime of the session's thread.
    pub fn handle(&self) -> Handle {
        self.runtime.clone()
    }

    /// Serve MCP on stdin and stdout with `server` until the client closes
    /// stdin or the server stops.
    pub async fn serve(self, server: Server) -> Result<()> {
        if self.server.send(server).is_err() {
            anyhow::bail!("the stdio session's thread ended before it was given the server");
        }
        self.ended.await.context("the stdio session's thread panicked")?
    }
}

/// The session, on its thread's runtime.
async fn session(server: Server, shared: Handle) -> Result<()> {
    let server = Server { placement: Some(Placement { shared, busy: Arc::default() }), ..server };
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    let lane = fast_calls::CallLane::default();
    let stdin =
        unreadable::BoundedLines::new(stdin, unreadable::MAX_MESSAGE_BYTES).decoding_calls(lane.clone());
    // The lines are bounded below; a stand-in for one too large is short.
    let rw = AsyncRwTransport::new_server(stdin, stdout).with_max_line_length(unreadable::MAX_MESSAGE_BYTES);
    let transport = Arrivals::new(rw, server.live.clone(), lane, server.stopping.clone());
    tracing::info!("serving {} tools over MCP on stdio", server.live.current().tools.len());
    let stopping = server.stopping.clone();
    let Some(service) = stopping.run_until_cancelled(server.serve(transport)).await else {
        return Ok(());
    };
    let service = service.context("failed to start the MCP session")?;
    let waiting = service.waiting();
    tokio::pin!(waiting);
    tokio::select! {
        ended = &mut waiting => {
            ended.context("the MCP session failed")?;
            return Ok(());
        }
        () = stopping.cancelled() => {}
    }
    // Stopping on a signal: the calls in flight were interrupted, and the
    // transport ends the session once each is answered. (At the end of the
    // input they run to their ends, and the session ends above.)
    match tokio::time::timeout(stop::DRAIN, waiting).await {
        Ok(ended) => {
            ended.context("the MCP session failed")?;
        }
        Err(_) => tracing::warn!(
            "requests still unanswered {}s after the server began to stop; stopping anyway",
            stop::DRAIN.as_secs()
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The shared runtime of a test: one worker, named so that a call can
    /// tell where it ran.
    fn shared() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("shared-worker")
            .enable_all()
            .build()
            .unwrap()
    }

    fn where_it_runs() -> Option<String> {
        std::thread::current().name().map(str::to_owned)
    }

    #[test]
    fn a_call_runs_here_while_no_other_does_and_on_the_shared_runtime_while_one_does() {
        let shared = shared();
        let placement = Placement { shared: shared.handle().clone(), busy: Arc::default() };
        let first = placement.claim().ok().expect("no call runs here yet");
        let second = placement.claim().err().expect("a call runs here");
        let here = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let ran = here.block_on(second.run_elsewhere(async { where_it_runs() }));
        assert_eq!(ran.flatten().as_deref(), Some("shared-worker"));
        drop(first);
        assert!(placement.claim().is_ok(), "the thread is free again once its call ends");
    }

    #[test]
    fn a_call_the_shared_runtime_drops_as_it_shuts_down_has_no_output() {
        let shared = shared();
        let placement = Placement { shared: shared.handle().clone(), busy: Arc::default() };
        let here = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let ran = here.block_on(async {
            let waiting = placement.run_elsewhere(std::future::pending::<()>());
            tokio::pin!(waiting);
            // Handed over first, then dropped there.
            let handed = tokio::time::timeout(Duration::from_millis(20), &mut waiting).await;
            assert!(handed.is_err(), "the call never ends by itself");
            shared.shutdown_background();
            tokio::time::timeout(Duration::from_secs(5), waiting).await
        });
        assert_eq!(ran, Ok(None), "its caller is told it has no output");
    }

    #[test]
    fn a_call_on_the_shared_runtime_is_stopped_when_its_caller_gives_up() {
        /// Set when the call's future is dropped.
        struct Dropped(Arc<AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let shared = shared();
        let placement = Placement { shared: shared.handle().clone(), busy: Arc::default() };
        let dropped = Arc::new(AtomicBool::new(false));
        let call = {
            let dropped = Dropped(dropped.clone());
            async move {
                let _dropped = dropped;
                std::future::pending::<()>().await
            }
        };
        let here = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let waited = here.block_on(async {
            tokio::time::timeout(Duration::from_millis(20), placement.run_elsewhere(call)).await
        });
        assert!(waited.is_err(), "the call never ends by itself");
        for _ in 0..500 {
            if dropped.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the call given up on still runs on the shared runtime");
    }
}
