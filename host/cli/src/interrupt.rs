//! Stop signals: Ctrl-C (`SIGINT`) from a person, `SIGTERM` from a process
//! manager. Pulling, loading and compiling plugins can take many seconds,
//! and a signal then stops the command there, before any call runs or
//! anything is written. A batch that has begun is interrupted instead
//! (`keel run`: its calls get their interrupt results, and the exit status
//! says the run was stopped), and `keel serve` stops its own way
//! (`commands/serve/stop.rs`).

use std::future::Future;
use std::io::Write as _;

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
    end_with(runtime, outcome, |_| false)
}

/// [`end`], where `signalled` finds in what the work came to whether a
/// signal came while it ran (`keel run`'s interrupted batch). Its calls'
/// blocking work may still run then, out of reach of their interrupt (a
/// read of a pipe nobody writes), and the process would never exit.
pub fn end_with<T>(
    runtime: tokio::runtime::Runtime,
    outcome: Result<T>,
    signalled: impl FnOnce(&T) -> bool,
) -> Result<T> {
    let signalled = match &outcome {
        Err(error) => stopped(error).is_some(),
        Ok(done) => signalled(done),
    };
    if signalled {
        runtime.shutdown_background()
    } else {
        drop(runtime)
    }
    outcome
}

/// Files being written under a temporary name ([`Staging`]): a signal that
/// ends the process at once ([`exit_on_signal`]) removes them, so that no
/// half-written file is left beside a report.
static STAGING: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

/// A temporary file being written, removed should a signal end the process
/// before it is renamed or dropped.
pub struct Staging(std::path::PathBuf);

impl Staging {
    /// Remember `path` until this is dropped.
    pub fn of(path: &std::path::Path) -> Self {
        STAGING.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(path.to_path_buf());
        Staging(path.to_path_buf())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let mut staging = STAGING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(at) = staging.iter().position(|path| *path == self.0) {
            staging.swap_remove(at);
        }
    }
}

/// From now on, `SIGINT` or `SIGTERM` ends the process at once: once the
/// work a signal interrupts is over (a batch, a server's drain), what is
/// left (writing the reports, sending the last spans) is not worth a wait
/// the user asked to end. The signal's handler stays installed for the
/// life of the process, so without this a signal would be caught and
/// nobody told. On a signal, `said` gives the line stderr gets and the
/// exit status; the files being written ([`Staging`]) are removed first.
/// Listens from when it is called, on a thread of its own.
pub fn exit_on_signal(said: impl FnOnce(Signal) -> (String, u8) + Send + 'static) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut signals = {
        let _entered = runtime.enter();
        Signals::listen()?
    };
    std::thread::Builder::new().name("keel-signals".into()).spawn(move || {
        let signal = runtime.block_on(signals.received());
        let (line, status) = said(signal);
        // Held until the process ends: no new file is staged meanwhile.
        let staging = STAGING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for path in staging.iter() {
            let _ = std::fs::remove_file(path);
        }
        let _ = writeln!(std::io::stderr().lock(), "{line}");
        std::process::exit(i32::from(status));
    })?;
    Ok(())
}

/// Run `work`, and say `what` it waits for on stderr if it takes longer
/// than a person waits without wondering why.
pub fn said_if_slow<T>(what: impl std::fmt::Display, work: impl FnOnce() -> T) -> T {
    const PATIENCE: std::time::Duration = std::time::Duration::from_millis(250);
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let line = format!("keel: {what}");
    let teller = std::thread::Builder::new().name("keel-waiting".into()).spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(PATIENCE) {
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
    });
    let result = work();
    drop(done);
    if let Ok(teller) = teller {
        let _ = teller.join();
    }
    result
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn after_a_signal_the_blocking_work_still_running_is_not_waited_for() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        // Blocking work an interrupt does not reach, as a read of a pipe
        // nobody writes; it ends with the test.
        let (_writer, blocked) = std::sync::mpsc::channel::<()>();
        runtime.spawn_blocking(move || blocked.recv());
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let outcome = end_with(runtime, Ok(true), |signalled| *signalled);
            let _ = done.send(outcome.is_ok());
        });
        assert_eq!(ended.recv_timeout(Duration::from_secs(10)), Ok(true), "the runtime was waited for");
    }
}
