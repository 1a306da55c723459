//! Stopping on a signal: `SIGINT` or `SIGTERM` ends `keel serve` the way the
//! end of its input does, so that what it keeps for later is not lost: the
//! trace file gets its last write, the events file its last line, and the
//! spans waiting for the OTLP exporter are sent before the process exits.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context as _, Result};

/// How long a stopping server waits for work it cannot cancel (a blocking
/// read of stdin, a file being written) before it exits anyway.
pub const GRACE: Duration = Duration::from_millis(500);

/// The signals that stop the server, listened for from when it is made, so
/// that none sent while the server starts is missed.
pub struct Stop {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Stop {
    /// Listen for the stop signals; must be called on the runtime.
    pub fn listen() -> Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind: SignalKind, name: &str| {
                signal(kind).with_context(|| format!("failed to listen for {name}"))
            };
            Ok(Stop {
                terminate: listen(SignalKind::terminate(), "SIGTERM")?,
                interrupt: listen(SignalKind::interrupt(), "SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Stop {})
    }

    /// The name of the first stop signal to arrive.
    async fn received(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.terminate.recv() => "SIGTERM",
                _ = self.interrupt.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }

    /// Run `serving` until it ends or a stop signal arrives. Stopped by a
    /// signal, the server has done nothing wrong: `Ok`. The calls still in
    /// flight are dropped with the runtime's tasks.
    pub async fn or(mut self, serving: impl Future<Output = Result<()>>) -> Result<()> {
        tokio::select! {
            served = serving => served,
            signal = self.received() => {
                tracing::info!("stopping on {signal}");
                super::say(format_args!("keel: stopping on {signal}"));
                Ok(())
            }
        }
    }
}
