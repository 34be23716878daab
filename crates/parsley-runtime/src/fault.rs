//! Crash points and producer faults for fault-injection tests: compiled only with the cargo
//! feature `fault-injection`, armed only by
//! [`RuntimeConfig::crash_at`](crate::RuntimeConfig::crash_at) and
//! [`RuntimeConfig::inject`](crate::RuntimeConfig::inject).
//!
//! A build without the feature has no crash point and reads no environment variable for one.
//! The test suite and the fault-injection driver of the inventory example enable the feature;
//! a process armed with a crash point dies there on purpose, as under `kill -9`, so a test can
//! check what a restart restores (case C10).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
    /// While a task restores after an assignment: once its changelog partition is read (and
    /// held records in it), before the task is rebuilt and runs — the process aborts with the
    /// task still restoring (case C25).
    DuringRestore,
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

/// A fault a stage armed with [`RuntimeConfig::inject`](crate::RuntimeConfig::inject) puts into
/// its own transactional producer, once per configuration: librdkafka's error paths, reached
/// through librdkafka itself, where the broker cannot be made to take them on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProducerFault {
    /// At the first commit with deliveries, after its changelog records and before its offsets
    /// are sent, the producer meets the broker's `INVALID_TXN_STATE` as a fatal error
    /// (`rd_kafka_test_fatal_error`), as librdkafka reports an `EndTxn` the coordinator
    /// refused in that state: the offsets, the commit and the abort that follows all fail with
    /// it (case C27).
    InvalidTxnStateAtCommit,
    /// At the first commit with deliveries, once its call has returned (the transaction is
    /// committed), the stream thread meets a retriable transactional error before its tasks
    /// hear of the commit, as when a delivery report or the state store fails there: the
    /// recovery finds the transaction committed, and the tasks must tell so from the group's
    /// offsets (module `rollback` of the task).
    UnheardCommit,
}

/// An armed producer fault and whether it has fired (shared by every clone of the
/// configuration, so it fires once).
#[derive(Debug, Clone)]
pub(crate) struct ArmedFault {
    pub(crate) fault: ProducerFault,
    fired: Arc<AtomicBool>,
}

impl ArmedFault {
    pub(crate) fn new(fault: ProducerFault) -> Self {
        ArmedFault {
            fault,
            fired: Arc::new(AtomicBool::new(false)),
        }
    }

    /// `true` the first time it is asked for `fault` (it fires then), `false` afterwards.
    pub(crate) fn fire(&self, fault: ProducerFault) -> bool {
        self.fault == fault && !self.fired.swap(true, Ordering::SeqCst)
    }
}
