//! The interrupt an agent sends a running batch (or call).

use tokio_util::sync::CancellationToken;

/// Interrupts a running batch: calls not started are not started, running
/// `cancel` calls stop, `block` calls run to their end. Every call still gets
/// exactly one result.
#[derive(Clone, Debug, Default)]
pub struct Interrupt(CancellationToken);

impl Interrupt {
    /// A fresh, untriggered interrupt.
    pub fn new() -> Self {
        Interrupt::default()
    }

    /// Interrupt the batch.
    pub fn interrupt(&self) {
        self.0.cancel();
    }

    /// Whether the batch was interrupted.
    pub fn is_interrupted(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once the batch is interrupted.
    pub async fn interrupted(&self) {
        self.0.cancelled().await;
    }
}
