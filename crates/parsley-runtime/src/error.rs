//! The errors of `parsley-runtime`.

use parsley_clock::{Channel, Coordinate};
use rdkafka::error::KafkaError;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong while talking to Kafka or running a stage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Kafka client call failed.
    #[error("{operation}: {source}")]
    Kafka {
        /// What was being done.
        operation: String,
        /// The client's error.
        source: KafkaError,
    },
    /// A transactional API call failed.
    #[error("{operation}: {code:?}: {message}{}", if *fatal { " (fatal)" } else if *requires_abort { " (the transaction must be aborted)" } else { "" })]
    Transaction {
        /// What was being done.
        operation: String,
        /// librdkafka's error code.
        code: rdkafka::types::RDKafkaErrorCode,
        /// librdkafka's message.
        message: String,
        /// The producer cannot be used any more (fenced, or a fatal idempotence error).
        fatal: bool,
        /// The transaction cannot commit and must be aborted.
        requires_abort: bool,
    },
    /// An admin request failed.
    #[error("{operation}: {message}")]
    Admin {
        /// What was being done.
        operation: String,
        /// The broker's or client's message.
        message: String,
    },
    /// A topic the topology or the caller names does not exist.
    #[error("topic {topic} does not exist (topics are not created automatically)")]
    UnknownTopic {
        /// The topic name.
        topic: String,
    },
    /// The sources of a stage do not have the same partition count, so its tasks cannot be
    /// co-partitioned.
    #[error(
        "stage {stage}: source topics are not co-partitioned: {}",
        describe_counts(partitions)
    )]
    NotCoPartitioned {
        /// The stage.
        stage: String,
        /// Each source topic with its partition count.
        partitions: Vec<(String, i32)>,
    },
    /// A record's `parsley.stamp` header could not be decoded: an impossible stamp.
    #[error("impossible stamp on record {topic}/{partition}@{offset} (channel {}): {source}", record.channel)]
    MalformedStamp {
        /// Topic name of the record.
        topic: String,
        /// Partition of the record.
        partition: i32,
        /// Offset of the record.
        offset: i64,
        /// The record's coordinate.
        record: Coordinate,
        /// The decoder's error, naming the byte and what was wrong.
        source: Box<parsley_clock::Error>,
    },
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
    /// A record's stamp cannot come from a truthful sender (DESIGN.md §4): a claim on its own
    /// channel at or beyond itself, or a claim beyond the channel's high watermark read after
    /// the record arrived.
    #[error("stage {stage}: impossible stamp on record {topic}/{}@{} (channel {}) from sender {}: claims {} ({})", stamp.record.channel.partition, stamp.record.offset, stamp.record, stamp.sender.map_or("unknown".to_string(), |s| s.to_string()), stamp.claim, stamp.reason)]
    ImpossibleStamp {
        /// The stage.
        stage: String,
        /// The topic name of the record.
        topic: String,
        /// What the gate found.
        stamp: Box<parsley_gate::ImpossibleStamp>,
    },
    /// The stage's processor failed on a delivered record (decode, handler, encode).
    #[error(transparent)]
    Stage(#[from] parsley_stage::Error),
    /// A clock operation failed.
    #[error("clock: {0}")]
    Clock(Box<parsley_clock::Error>),
    /// A send was not acknowledged.
    #[error("send to {channel} (topic {topic}) failed: {source}")]
    Send {
        /// Topic name.
        topic: String,
        /// The target channel.
        channel: Box<Channel>,
        /// The client's error.
        source: KafkaError,
    },
    /// Another producer initialised this stage's transactional id while the stage's
    /// transaction had been open for less than `transaction.timeout.ms`, so the transaction
    /// coordinator cannot have fenced it for its age (that fence, case C08, is recovered from
    /// with a new producer): another process runs with this [`instance_id`], and this stage is
    /// its zombie. Nothing of the open transaction becomes visible, the group's offsets are
    /// unchanged, and the stage gives up its tasks without taking the id back, which would
    /// fence the live owner in turn (case C09).
    ///
    /// [`instance_id`]: crate::RuntimeConfig::instance_id
    #[error(
        "transactional id {transactional_id} was taken by another producer while this stage's transaction had been open {open_ms} ms, less than transaction.timeout.ms ({timeout_ms} ms): another process runs with this instance id, so this stage gives up its tasks ({message})"
    )]
    Fenced {
        /// The stage's transactional id.
        transactional_id: String,
        /// How long the fenced transaction had been open when the fence was seen, ms.
        open_ms: u64,
        /// The producer's `transaction.timeout.ms`.
        timeout_ms: u64,
        /// librdkafka's message.
        message: String,
    },
    /// A stage with this name is not in the topology.
    #[error("no stage named {0} in the topology")]
    UnknownStage(String),
    /// A stage thread ended with an error.
    #[error("stage {stage} failed: {message}")]
    StageFailed {
        /// The stage.
        stage: String,
        /// Its error, rendered.
        message: String,
    },
    /// The changelog topic of a stage exists with another partition count than its sources.
    #[error(
        "changelog topic {topic} has {partitions} partitions, the stage's sources have {expected}"
    )]
    ChangelogPartitions {
        /// The changelog topic.
        topic: String,
        /// Its partition count.
        partitions: i32,
        /// The sources' partition count.
        expected: i32,
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
    /// Records a stage had not delivered were deleted (retention or `DeleteRecords`): the
    /// offset it needed next on a source partition lies below the partition's log start
    /// offset — at startup or a rebalance, the group's committed offset; while it runs, the
    /// consumer's position when a fetch found it out of range. The stage stops rather than
    /// jump over them (case C12); resuming at `log_start` is an operator's decision.
    #[error(
        "{topic}/{partition}: records [{from}, {log_start}) were deleted before this stage delivered them (it needed offset {from} next; the log now starts at {log_start})"
    )]
    RecordsLost {
        /// The source topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The first record lost: the offset the stage needed next.
        from: i64,
        /// The partition's log start offset: the first record still there.
        log_start: i64,
    },
    /// A source topic of a running stage changed under it: its partition count (keys would
    /// move between tasks), or its identity (deleted and recreated).
    #[error(
        "stage {stage}: source topic {topic} changed while the stage runs: partitions {} -> {}{}",
        partitions.0,
        partitions.1,
        if *recreated { ", and it was recreated (new topic id)" } else { "" }
    )]
    SourceChanged {
        /// The stage.
        stage: String,
        /// The topic.
        topic: String,
        /// Partition counts when the stage started and now.
        partitions: (i32, i32),
        /// The topic id changed.
        recreated: bool,
    },
    /// A source topic was deleted while the stage runs: its consumer reported the topic
    /// unknown and the cluster confirms it is gone. A topic created again under the name is a
    /// new channel (new topic id), read from its log start when the stage starts again (case
    /// C11); the old channel's offsets never carry over.
    #[error(
        "stage {stage}: source topic {topic} was deleted while the stage runs (a topic created again under that name is a new channel, read from its log start when the stage starts again)"
    )]
    SourceDeleted {
        /// The stage.
        stage: String,
        /// The topic.
        topic: String,
    },
    /// A stage that orders by event time received a record without a timestamp (its event
    /// time); it is not delivered, and its offset is not committed.
    #[error(
        "stage {stage}: record {topic}/{partition}@{offset} has no timestamp, so no event time"
    )]
    NoEventTime {
        /// Stage name.
        stage: String,
        /// Source topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
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
    /// Something did not happen within its deadline.
    #[error("{what} did not complete within {timeout:?}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The deadline.
        timeout: std::time::Duration,
    },
}

impl From<parsley_clock::Error> for Error {
    fn from(e: parsley_clock::Error) -> Self {
        Error::Clock(Box::new(e))
    }
}

impl Error {
    pub(crate) fn kafka(operation: impl Into<String>, source: KafkaError) -> Self {
        Error::Kafka {
            operation: operation.into(),
            source,
        }
    }

    /// `true` when the producer was fenced: a newer epoch of its transactional id exists
    /// (another producer initialised it, or the coordinator aborted a timed-out transaction),
    /// or the stage gave up its tasks for that reason ([`Error::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        match self {
            Error::Fenced { .. } => true,
            Error::Transaction { code, .. } => fencing(*code),
            Error::Kafka { source, .. } | Error::Send { source, .. } => {
                source.rdkafka_error_code().is_some_and(fencing)
            }
            _ => false,
        }
    }
}

/// Whether `code` says a newer epoch of the producer's transactional id exists: librdkafka's
/// `_FENCED`, or the broker's `PRODUCER_FENCED` / `INVALID_PRODUCER_EPOCH`.
pub(crate) fn fencing(code: rdkafka::types::RDKafkaErrorCode) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        code,
        C::Fenced | C::ProducerFenced | C::InvalidProducerEpoch
    )
}

/// Consumer errors that report a connection state, not a lost record: librdkafka recovers
/// from them on its own.
pub(crate) fn transient(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::AllBrokersDown
                | C::BrokerTransportFailure
                | C::OperationTimedOut
                | C::RequestTimedOut
                | C::NetworkException
        )
    )
}

fn describe_counts(partitions: &[(String, i32)]) -> String {
    partitions
        .iter()
        .map(|(t, n)| format!("{t} has {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
