//! The request to stop that stages, the signal handler and the metrics endpoint share.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A cloneable request to stop: stream threads commit and return at their next loop turn
/// (within 100 ms of polling).
#[derive(Debug, Clone, Default)]
pub struct Shutdown(pub(crate) Arc<AtomicBool>);

impl Shutdown {
    /// A fresh, untriggered signal.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every stage watching this signal to stop.
    pub fn trigger(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// `true` once [`Shutdown::trigger`] was called.
    pub fn is_triggered(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}
