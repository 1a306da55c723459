//! Ctrl-C while a command starts: pulling, loading and compiling plugins
//! can take many seconds, and a person who gives up on it stops the command
//! there, before any call runs or anything is written. A batch that has
//! begun is interrupted instead (`keel run`: its calls get their interrupt
//! results), and `keel serve` stops its own way (`commands/serve/stop.rs`).

use std::future::Future;

use anyhow::Result;

/// Ctrl-C came while the command was starting: it ran nothing. `main` says
/// so and exits with 130, as a shell reports a command `SIGINT` ended.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted while starting")
    }
}

impl std::error::Error for Interrupted {}

/// Whether `error` is, or was caused by, [`Interrupted`].
pub fn interrupted(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.is::<Interrupted>())
}

/// Ctrl-C (`SIGINT`), listened for from when it is made, so that none sent
/// after is missed, however the command goes on to use it.
pub struct CtrlC {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl CtrlC {
    /// Listen for Ctrl-C; must be called on a runtime.
    pub fn listen() -> Result<Self> {
        #[cfg(unix)]
        {
            use anyhow::Context as _;
            let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                .context("failed to listen for SIGINT")?;
            Ok(CtrlC { signal })
        }
        #[cfg(not(unix))]
        Ok(CtrlC {})
    }

    /// Wait for the next Ctrl-C.
    pub async fn received(&mut self) {
        #[cfg(unix)]
        self.signal.recv().await;
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }

    /// `work`, unless Ctrl-C comes first: then `work` is dropped and the
    /// answer is [`Interrupted`].
    pub async fn or<T>(&mut self, work: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::select! {
            done = work => done,
            () = self.received() => Err(Interrupted.into()),
        }
    }
}

/// Let `runtime` go once the work it ran came to `outcome`. After Ctrl-C its
/// blocking threads may still be compiling a plugin nobody waits for: the
/// runtime is not waited for, where dropping it would wait for them all.
pub fn end<T>(runtime: tokio::runtime::Runtime, outcome: Result<T>) -> Result<T> {
    match &outcome {
        Err(error) if interrupted(error) => runtime.shutdown_background(),
        _ => drop(runtime),
    }
    outcome
}
