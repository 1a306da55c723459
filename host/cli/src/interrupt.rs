//! Stop signals: Ctrl-C (`SIGINT`) from a person, `SIGTERM` from a process
//! manager. Pulling, loading and compiling plugins can take many seconds,
//! and a signal then stops the command there, before any call runs or
//! anything is written. A batch that has begun is interrupted instead
//! (`keel run`: its calls get their interrupt results, and the exit status
//! says the run was stopped), and `keel serve` stops its own way
//! (`commands/serve/stop.rs`).

use std::future::Future;

use anyhow::Result;

/// A signal that stops a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// `SIGINT`: Ctrl-C on a terminal.
    Interrupt,
    /// `SIGTERM`: a process manager's request to stop.
    Terminate,
}

impl Signal {
    /// Its name, as `kill -l` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
        }
    }

    /// The exit status a shell gives a command this signal ended (128 and
    /// the signal's number), so that a script running keel in a loop stops
    /// too.
    pub fn status(self) -> u8 {
        match self {
            Signal::Interrupt => 130,
            Signal::Terminate => 143,
        }
    }
}

/// A command a signal stopped. `main` says so and exits with the signal's
/// status.
#[derive(Debug)]
pub struct Stopped {
    /// The signal that stopped it.
    pub signal: Signal,
    /// Whether it came before anything ran. After, the command has said
    /// what it did (`keel run`: every call's result and the summary).
    pub while_starting: bool,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.signal, self.while_starting) {
            (Signal::Interrupt, true) => f.write_str("interrupted while starting"),
            (Signal::Interrupt, false) => f.write_str("interrupted"),
            (signal, true) => write!(f, "stopped by {} while starting", signal.name()),
            (signal, false) => write!(f, "stopped by {}", signal.name()),
        }
    }
}

impl std::error::Error for Stopped {}

/// The [`Stopped`] that `error` is, or was caused by.
pub fn stopped(error: &anyhow::Error) -> Option<&Stopped> {
    error.chain().find_map(|cause| cause.downcast_ref::<Stopped>())
}

/// `SIGINT` and `SIGTERM`, listened for from when this is made, so that
/// none sent after is missed, however the command goes on to use them.
pub struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// Listen for both signals; must be called on a runtime.
    pub fn listen() -> Result<Self> {
        #[cfg(unix)]
        {
            use anyhow::Context as _;
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt()).context("failed to listen for SIGINT")?,
                terminate: signal(SignalKind::terminate()).context("failed to listen for SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// Wait for the next signal.
    pub async fn received(&mut self) -> Signal {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => Signal::Interrupt,
                _ = self.terminate.recv() => Signal::Terminate,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Signal::Interrupt
        }
    }

    /// `work`, unless a signal comes first: then `work` is dropped and the
    /// answer is [`Stopped`] while starting.
    pub async fn or<T>(&mut self, work: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::select! {
            done = work => done,
            signal = self.received() => Err(Stopped { signal, while_starting: true }.into()),
        }
    }
}

/// Let `runtime` go once the work it ran came to `outcome`. After a signal
/// its blocking threads may still be compiling a plugin nobody waits for:
/// the runtime is not waited for, where dropping it would wait for them all.
pub fn end<T>(runtime: tokio::runtime::Runtime, outcome: Result<T>) -> Result<T> {
    match &outcome {
        Err(error) if stopped(error).is_some() => runtime.shutdown_background(),
        _ => drop(runtime),
    }
    outcome
}
