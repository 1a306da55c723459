//! The interrupt an agent sends a running batch (or call).

use tokio_util::sync::CancellationToken;

/// Interrupts a running batch: calls not started are not started, running
/// `cancel` calls stop, `block` calls run to their end. Every call still gets
/// exactly one result.
#[derive(Clone, Debug)]
pub struct Interrupt(Option<CancellationToken>);

impl Default for Interrupt {
    fn default() -> Self {
        Interrupt(Some(CancellationToken::new()))
    }
}

impl Interrupt {
    /// A fresh, untriggered interrupt.
    pub fn new() -> Self {
        Interrupt::default()
    }

    /// A fresh interrupt that `token` triggers too, the moment it is
    /// cancelled: a server that stops every call at once has each call see
    /// the stop before any of them is polled again, so no call that was
    /// waiting its turn can start in between.
    pub fn child_of(token: &CancellationToken) -> Self {
        Interrupt(Some(token.child_token()))
    }

    /// An interrupt nothing can trigger, for a batch no handle reaches: it
    /// holds no token, so its calls take no lock to learn they may go on.
    pub(crate) fn never() -> Self {
        Interrupt(None)
    }

    /// Interrupt the batch.
    pub fn interrupt(&self) {
        if let Some(token) = &self.0 {
            token.cancel();
        }
    }

    /// Whether the batch was interrupted.
    pub fn is_interrupted(&self) -> bool {
        self.0.as_ref().is_some_and(CancellationToken::is_cancelled)
    }

    /// Resolves once the batch is interrupted.
    pub async fn interrupted(&self) {
        match &self.0 {
            Some(token) => token.cancelled().await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_interrupt_reaches_its_clones_and_one_nothing_can_trigger_stays_quiet() {
        let interrupt = Interrupt::new();
        let held = interrupt.clone();
        interrupt.interrupt();
        assert!(held.is_interrupted());
        held.interrupted().await;

        let never = Interrupt::never();
        never.interrupt();
        assert!(!never.clone().is_interrupted());
        let waited = tokio::time::timeout(std::time::Duration::from_millis(20), never.interrupted()).await;
        assert!(waited.is_err(), "nothing can interrupt it");
    }
}
