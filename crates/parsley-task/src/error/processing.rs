//! The processing kind of [`Error`](super::Error): what went wrong inside a stage while it
//! processed records it could take — the answer to "is my code, or the stage's own state,
//! wrong?": the stage's processor (decode, handler, encode), the causal gate, a clock, the
//! on-disk state store, the changelog and its restore, the event-time state, a panic of the
//! stream thread. Each names the stage and the task (its partition) when known.

/// A stage's processing failed ([`Error::Processing`](super::Error::Processing)). Fatal every
/// time: none is [retriable](ProcessingError::is_retriable) nor
/// [transient](ProcessingError::is_transient); restarting the stage restores every task from
/// its last commit, so look at the cause first.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessingError {
    /// The stage's processor failed on a delivered record (decode, handler, encode).
    #[error(transparent)]
    Stage(parsley_stage::Error),
    /// The gate refused a record or a seed (impossible stamp, out-of-order fetch, …).
    #[error("stage {stage}, task {partition}: {source}")]
    Gate {
        /// The stage.
        stage: String,
        /// The task's partition.
        partition: i32,
        /// The gate's error.
        source: Box<parsley_gate::GateError>,
    },
    /// A clock operation failed.
    #[error("clock: {0}")]
    Clock(Box<parsley_clock::Error>),
    /// The on-disk state store (`RuntimeConfig::state_dir`) failed:
    /// it cannot be opened (another process holds it), read or written.
    #[error("state store {path}: {message}")]
    StateStore {
        /// The store's directory.
        path: String,
        /// What failed.
        message: String,
    },
    /// A changelog record does not decode.
    #[error("changelog {topic}/{partition}@{offset}: {message}")]
    Changelog {
        /// The changelog topic.
        topic: String,
        /// Its partition (the task).
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// What is wrong.
        message: String,
    },
    /// The restored task snapshot and the group's committed offsets describe different
    /// moments even after re-reading both: the changelog or the offsets were written by
    /// something else than this stage's transactions.
    #[error(
        "stage {stage}, task {partition}: the changelog's snapshot was committed with input offsets {changelog:?}, the group's committed offsets are {group:?}"
    )]
    RestoreMismatch {
        /// The stage.
        stage: String,
        /// The task's partition.
        partition: i32,
        /// `topic/partition@offset` of the snapshot.
        changelog: Vec<String>,
        /// `topic/partition@offset` committed by the group.
        group: Vec<String>,
    },
    /// A task's changelog restore did not reach the partition's high watermark within the
    /// runtime's `timeout` because a transaction open on the partition held it: the restore
    /// reads `read_committed`, and its position stood at the partition's last stable offset
    /// (the first offset of the oldest open transaction), below the high watermark. The
    /// transaction is another producer's — the process that owned the task before and died
    /// mid-transaction, or one that still runs with another `instance_id`. It ends when its
    /// producer commits or aborts it, when a producer with its transactional id starts
    /// (restarting that instance), or when the coordinator aborts it after that producer's
    /// `transaction.timeout.ms`. The producer is named by the transactional id that Parsley's
    /// producers write on the first changelog record of each transaction on a partition
    /// (header `parsley.txn`), read from the open transaction's first record; a producer that is not a Parsley stage is not named
    /// (librdkafka 2.12 offers no `DescribeProducers`, KIP-664).
    #[error(
        "restoring {topic}/{partition}: the read stopped at the last stable offset {last_stable_offset}, below the high watermark {high_watermark}: a transaction open on the partition since offset {last_stable_offset}{} did not end within {timeout:?}; it ends when its producer commits or aborts it, or when the coordinator aborts it after that producer's transaction.timeout.ms (this stage's producers: {transaction_timeout:?})",
        producer.as_deref().map_or(String::new(), |p| format!(", by the producer with transactional id {p},"))
    )]
    RestoreBlocked {
        /// The changelog topic.
        topic: String,
        /// The task's partition.
        partition: i32,
        /// The partition's last stable offset: where the open transaction begins, and where
        /// the restore's position stood.
        last_stable_offset: i64,
        /// The partition's high watermark, which the restore reads up to.
        high_watermark: i64,
        /// The restore's deadline (the runtime's `timeout`).
        timeout: std::time::Duration,
        /// This stage's producers' `transaction.timeout.ms`.
        transaction_timeout: std::time::Duration,
        /// The transactional id of the producer whose transaction holds the partition, when
        /// its first record names one (every changelog record a stage writes does).
        producer: Option<String>,
    },
    /// The event-time state of a task (watermark or timer queue) is inconsistent, does not
    /// decode, or holds parked records that the stage's configuration would lose (a stage that
    /// stopped ordering by event time while records were parked).
    #[error("stage {stage}, task {partition}: event-time state: {message}")]
    EventTime {
        /// Stage name.
        stage: String,
        /// The task.
        partition: i32,
        /// What is wrong.
        message: String,
    },
    /// The stream thread of a stage panicked: the stage ended without an error of its own
    /// (nothing of its open transaction becomes visible; every task restarts from its last
    /// commit).
    #[error("stage {stage}: its stream thread panicked{}", message.as_deref().map_or(String::new(), |m| format!(": {m}")))]
    StagePanicked {
        /// The stage.
        stage: String,
        /// The panic's message, when its payload was a string.
        message: Option<String>,
    },
}

impl From<parsley_stage::Error> for ProcessingError {
    fn from(e: parsley_stage::Error) -> Self {
        ProcessingError::Stage(e)
    }
}

impl From<parsley_clock::Error> for ProcessingError {
    fn from(e: parsley_clock::Error) -> Self {
        ProcessingError::Clock(Box::new(e))
    }
}

impl ProcessingError {
    /// Always `false`: the processor, the gate and the stage's state meet the same records
    /// and state again on a redo ([`Error::is_retriable`](super::Error::is_retriable)).
    pub fn is_retriable(&self) -> bool {
        match self {
            ProcessingError::Stage(_)
            | ProcessingError::Gate { .. }
            | ProcessingError::Clock(_)
            | ProcessingError::StateStore { .. }
            | ProcessingError::Changelog { .. }
            | ProcessingError::RestoreMismatch { .. }
            | ProcessingError::RestoreBlocked { .. }
            | ProcessingError::EventTime { .. }
            | ProcessingError::StagePanicked { .. } => false,
        }
    }

    /// Always `false` ([`Error::is_transient`](super::Error::is_transient)).
    pub fn is_transient(&self) -> bool {
        false
    }

    /// Always `false` ([`Error::is_fenced`](super::Error::is_fenced)).
    pub fn is_fenced(&self) -> bool {
        false
    }
}
