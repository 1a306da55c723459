//! Stopping on a signal: `SIGINT` or `SIGTERM` ends `keel serve` the way the
//! end of its input does, so that what it keeps for later is not lost: the
//! trace file gets its last write, the events file its last line, and the
//! spans waiting for the OTLP exporter are sent before the process exits.
//!
//! First it drains: the calls in flight are interrupted and every request
//! it has is answered (a call interrupted before it started says so), while
//! no new connection is taken and each open one closes once its requests are
//! answered.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

/// How long a stopping server waits for its requests in flight to be
/// answered: their calls are interrupted, so only a call whose tool blocks
/// interrupts (it runs to its end, within its deadline) or a client slow to
/// read its reply takes this long.
pub const DRAIN: Duration = Duration::from_secs(10);

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

    /// Run `serving` until it ends or a stop signal arrives. On a signal,
    /// `stopping` is cancelled, which interrupts the calls in flight and
    /// stops the server taking new requests, and `serving` is given up to
    /// [`DRAIN`] to answer those it has; a second signal ends it at once.
    /// Stopped by a signal, the server has done nothing wrong: `Ok`.
    pub async fn or(
        mut self,
        stopping: CancellationToken,
        serving: impl Future<Output = Result<()>>,
    ) -> Result<()> {
        tokio::pin!(serving);
        let signal = tokio::select! {
            served = &mut serving => return served,
            signal = self.received() => signal,
        };
        tracing::info!("stopping on {signal}");
        super::say(format_args!("keel: stopping on {signal}"));
        stopping.cancel();
        tokio::select! {
            served = tokio::time::timeout(DRAIN, &mut serving) => match served {
                Ok(served) => served,
                Err(_) => {
                    super::say(format_args!(
                        "keel: requests still unanswered after {}s; stopping anyway",
                        DRAIN.as_secs()
                    ));
                    Ok(())
                }
            },
            signal = self.received() => {
                super::say(format_args!("keel: {signal} again: stopping now"));
                Ok(())
            }
        }
    }
}
