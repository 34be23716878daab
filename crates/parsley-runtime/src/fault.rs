//! Crash points for fault-injection tests: compiled only with the cargo feature
//! `fault-injection`, armed only by [`RuntimeConfig::crash_at`](crate::RuntimeConfig::crash_at).
//!
//! A build without the feature has no crash point and reads no environment variable for one.
//! The test suite and the fault-injection driver of the inventory example enable the feature;
//! a process armed with a crash point dies there on purpose, as under `kill -9`, so a test can
//! check what a restart restores (case C10).

use tracing::warn;

use parsley_task::error::Result;

/// Where a stage armed with [`RuntimeConfig::crash_at`](crate::RuntimeConfig::crash_at) aborts
/// its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CrashPoint {
    /// At the first commit of a transaction with deliveries, once its changelog records are in
    /// the log and before its offsets and its commit: the process aborts (`SIGABRT`; no
    /// cleanup, no transaction abort), leaving the transaction open for the coordinator to
    /// abort (case C10).
    AfterChangelog,
}

/// Aborts the process when the armed crash point (`RuntimeConfig::crash_at`) is `point`, after
/// `before` (which makes the crash land where the point says, e.g. a flush so the records are
/// in the log).
///
/// # Errors
/// `before`'s error.
pub(crate) fn reached(
    armed: Option<CrashPoint>,
    point: CrashPoint,
    before: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if armed == Some(point) {
        before()?;
        warn!(?point, "crash point reached: aborting the process");
        std::process::abort();
    }
    Ok(())
}
