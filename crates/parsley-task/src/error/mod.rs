//! The error of Parsley's task layer and of the Kafka runtime built on it: one public type,
//! [`Error`], whose classification ([`Error::is_retriable`], [`Error::is_transient`],
//! [`Error::is_fatal`], [`Error::is_fenced`]) holds for every layer. The Kafka client's part of
//! an error is [`ClientError`] (module `kafka`), which names librdkafka's code and flags
//! without the client library's types.

use std::sync::Arc;

use parsley_clock::{Channel, Coordinate};

mod kafka;

pub use kafka::{ClientError, KafkaCode, TransactionFlags};

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong while talking to Kafka or running a stage.
///
/// # Classification
/// As librdkafka's error flags do for a client call, three public methods say what an error
/// means for a stage:
/// - [`Error::is_retriable`]: a failed transaction; the runtime aborts it, returns every task
///   to its last commit and carries on (a bounded number of times in a row);
/// - [`Error::is_transient`]: a client error reporting a connection state, which librdkafka
///   recovers from on its own;
/// - [`Error::is_fatal`]: neither; the stage ends on it.
///
/// Fatal excludes the other two; retriable and transient overlap only for an [`Error::Kafka`]
/// holding a transactional API error that requires an abort and carries a connection-state
/// code. [`Error::is_fenced`] says, besides, whether a newer epoch of the producer's
/// transactional id exists. Every method looks through [`Error::StageFailed`] at the stage's
/// own error ([`Error::stage_error`]).
///
/// ```
/// use parsley_task::Error;
///
/// fn after_stop(e: &Error) -> &'static str {
///     match e.stage_error() {
///         Error::RecordsLost { .. } => "records were deleted before delivery: decide",
///         Error::Fenced { .. } => "another process runs with this instance id",
///         _ if e.is_transient() => "the cluster was unreachable: restart later",
///         _ => "look at the error",
///     }
/// }
/// let lost = Error::RecordsLost { topic: "in".into(), partition: 0, from: 5, log_start: 50 };
/// assert!(lost.is_fatal() && !lost.is_retriable());
/// assert_eq!(after_stop(&lost), "records were deleted before delivery: decide");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Kafka client call failed.
    #[error("{operation}: {source}")]
    Kafka {
        /// What was being done.
        operation: String,
        /// The client's error.
        source: ClientError,
    },
    /// A transactional API call failed.
    #[error("{operation}: {code}: {message}{}", if *fatal { " (fatal)" } else if *requires_abort { " (the transaction must be aborted)" } else { "" })]
    Transaction {
        /// What was being done.
        operation: String,
        /// librdkafka's error code.
        code: KafkaCode,
        /// librdkafka's message.
        message: String,
        /// The producer cannot be used any more (fenced, or a fatal idempotence error).
        fatal: bool,
        /// The transaction cannot commit and must be aborted.
        requires_abort: bool,
    },
    /// A client could not authenticate to the cluster or set up TLS with it: wrong
    /// credentials, a certificate the client does not trust, a mechanism the listener does not
    /// enable. Reported as soon as librdkafka reports it (within the configured timeout).
    #[error(
        "the {client} client cannot connect securely to {listener} ({protocol}{}): {code}: {message}",
        mechanism.as_deref().map_or(String::new(), |m| format!(", SASL mechanism {m}"))
    )]
    Security {
        /// The listener: the client's `bootstrap.servers`.
        listener: Box<str>,
        /// Its `security.protocol`.
        protocol: Box<str>,
        /// Its `sasl.mechanisms`, when the protocol uses SASL.
        mechanism: Option<Box<str>>,
        /// The client's role (`consumer`, `producer`, `admin`, `restore`).
        client: &'static str,
        /// librdkafka's code (`_AUTHENTICATION`, `_SSL`, …).
        code: KafkaCode,
        /// librdkafka's message.
        message: Box<str>,
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
    /// The stages' consumer is configured for a consumer group protocol other than the classic
    /// one (`group.protocol`, KIP-848's `consumer` protocol): refused at start, before any
    /// client is made. Under that protocol the group coordinator computes the assignment on
    /// the broker and hands partitions over one by one, so a stage could not ask for its
    /// co-partitioned assignment (every source's partition `p` in one member) nor commit a
    /// task's work before any of its partitions moves.
    #[error(
        "consumer property group.protocol={protocol}: Parsley stages need the classic group \
         protocol (KIP-848's consumer protocol assigns partitions on the broker and moves them \
         one by one, so a stage can neither keep a task's co-partitioned sources together nor \
         commit the task before a partition of it moves); remove the property or set it to \
         classic"
    )]
    UnsupportedGroupProtocol {
        /// The value given.
        protocol: String,
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
    /// A record's stamp header could not be decoded: an impossible stamp.
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
    /// A record's stamp cannot come from a truthful sender (the book's specification, §4): a claim
    /// on its own channel at or beyond itself, or a claim beyond the channel's high watermark read
    /// after the record arrived.
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
    /// A send was not acknowledged, for a reason the next try may not meet (a record refused
    /// for what it is — too large, a timestamp outside the topic's window — is
    /// [`Error::OutputRefused`] instead).
    #[error("send to {channel} (topic {topic}) failed: {source}")]
    Send {
        /// Topic name.
        topic: String,
        /// The target channel.
        channel: Box<Channel>,
        /// The client's error.
        source: ClientError,
    },
    /// An output record that the stage's producer or the broker refuses for what it is, and
    /// would refuse on every try: larger than a size limit (librdkafka's `MSG_SIZE_TOO_LARGE`
    /// from `produce()`, the broker's `MESSAGE_TOO_LARGE` for its batch), or a timestamp
    /// outside the window the topic accepts (the broker's `INVALID_TIMESTAMP`, or
    /// `INVALID_RECORD` for it; Kafka 4 refuses by default a `CreateTime` more than an hour
    /// ahead of its clock, KIP-1030). Cases C16 and C17.
    ///
    /// It is not retried: the transaction that made the record is aborted, so nothing of it
    /// becomes visible and its input offsets do not move. When the input record that caused the
    /// record is known, the stage's [`BadRecordPolicy`](parsley_stage::BadRecordPolicy)
    /// applies to that input record
    /// ([`BadRecordKind::OutputRefused`](parsley_stage::BadRecordKind::OutputRefused)): under
    /// `Fail` the stage stops with this error; under `Skip` or `DeadLetter` the transaction is
    /// aborted, every task returns to its last commit, and the redo skips or dead-letters that
    /// input record instead of handling it — none of its outputs is written, a transaction
    /// that lost one of them never commits. A refused dead letter or changelog record, or one
    /// whose input is not known, stops the stage under every policy.
    ///
    /// When the broker refuses a batch, every record in it fails; the one named is the record
    /// that explains the refusal alone (too large alone, or a timestamp outside the topic's
    /// window). A refused batch that no single record explains (records that fit one by one
    /// in a batch that does not) stays an [`Error::Send`]. After the broker refused a batch the
    /// runtime replaces the stage's producer before the redo: librdkafka goes on counting the
    /// refused batch's sequence numbers, which would make the broker refuse the next
    /// transaction's first send as `OUT_OF_ORDER_SEQUENCE_NUMBER`.
    #[error(
        "stage {stage}: {} to {topic}/{partition} refused: {reason} (not retried)",
        refused_what(input.as_deref(), *dead_letter)
    )]
    OutputRefused {
        /// The stage.
        stage: String,
        /// The input record whose delivery made the refused record (with `dead_letter`: the
        /// record the refused dead letter carries), when known; `None` for a changelog record.
        input: Option<Box<InputRecord>>,
        /// The refused record is a dead letter.
        dead_letter: bool,
        /// The refused record's topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Why it is refused.
        reason: Box<Refusal>,
    },
    /// Another producer initialised this stage's transactional id while the stage's
    /// transaction had been open for less than `transaction.timeout.ms`, so the transaction
    /// coordinator cannot have fenced it for its age (that fence, case C08, is recovered from
    /// with a new producer): another process runs with this `instance_id`, and this stage is
    /// its zombie. Nothing of the open transaction becomes visible, the group's offsets are
    /// unchanged, and the stage gives up its tasks without taking the id back, which would
    /// fence the live owner in turn (case C09).
    ///
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
    /// A stage run by `Runtime::start` or
    /// `Runtime::start_stages` ended with an error: what
    /// `Running::stop` returns for it. `source` is the stage's own
    /// typed error (match on `*source`, or use [`Error::stage_error`]); the classification
    /// methods ([`Error::is_retriable`], [`Error::is_fenced`], [`Error::is_transient`],
    /// [`Error::is_fatal`]) see through this wrapper.
    ///
    /// The error is shared (`Arc`) because the same error also reached the stage's observer as
    /// [`Progress::Failed`](crate::metrics::Progress::Failed), and [`Error`] is not `Clone` (it holds
    /// librdkafka's and the processor's errors).
    #[error("stage {stage} failed: {source}")]
    StageFailed {
        /// The stage.
        stage: String,
        /// The error the stage ended with.
        #[source]
        source: Arc<Error>,
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
    /// The stream thread of a stage could not be spawned (the stage never ran).
    #[error("stage {stage}: cannot spawn its stream thread: {source}")]
    ThreadSpawn {
        /// The stage.
        stage: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The metrics endpoint
    /// (`RuntimeConfig::metrics_address`) cannot listen at
    /// `address` (in use, not an address of this host, a privileged port, …) or cannot start its
    /// thread; no stage was started.
    #[error("cannot serve metrics at {address}: {source}")]
    MetricsListener {
        /// The address asked for.
        address: std::net::SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The handlers of SIGINT and SIGTERM could not be installed
    /// (`Runtime::run_until_signal`,
    /// `Running::wait_for_signal`); nothing was started or
    /// stopped.
    #[error("cannot install the handlers of SIGINT and SIGTERM: {source}")]
    Signals {
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A record given to `CausalProducer::send_record`
    /// cannot be sent as asked: nothing was sent and the producer's clock is unchanged.
    #[error("record for topic {topic} refused: {problem}")]
    InvalidRecord {
        /// The record's topic.
        topic: String,
        /// What is wrong with it.
        problem: RecordProblem,
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
    /// An internal topic of the topology (a repartition topic) exists with another partition
    /// count than the topics it takes its count from
    /// ([`InternalTopic::partitions_of`](parsley_stage::InternalTopic::partitions_of)): created
    /// by hand, or left from an earlier topology whose sources had another count.
    #[error(
        "internal topic {topic} has {partitions} partitions, the topics it is co-partitioned with have {expected}"
    )]
    InternalTopicPartitions {
        /// The internal topic.
        topic: String,
        /// Its partition count.
        partitions: i32,
        /// The largest partition count of the topics it takes its count from.
        expected: i32,
    },
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
    /// move between tasks), or its identity (deleted and recreated: a new channel, whose
    /// offsets have nothing to do with the old one's). Found at an assignment, when the
    /// consumer reports the topic unknown, and by a check of the sources' ids every few
    /// seconds, so a recreated topic never stalls a stage silently.
    #[error(
        "stage {stage}: source topic {topic} changed while the stage runs: partitions {} -> {}{}",
        partitions.0,
        partitions.1,
        if *recreated { format!(", and it was recreated (topic id {} -> {})", ids.0, ids.1) } else { String::new() }
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
        /// The topic's id when the stage started, and now.
        ids: (parsley_clock::TopicId, parsley_clock::TopicId),
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
    /// A delivered record's key belongs on another partition than the one it was read from:
    /// murmur2 of its bytes (the Java client's default partitioner, Kafka Streams' and
    /// Parsley's) gives `expected`. Its writer partitions some other way — librdkafka's default
    /// partitioner, `consistent_random`, does — or wrote before the topic's partition count
    /// changed; the stage's per-key state and claims would split the key across tasks, so it
    /// stops instead (case C20). A source partitioned some other way on purpose opts out with
    /// [`KeyPartitioning::Unchecked`](parsley_stage::KeyPartitioning::Unchecked).
    #[error(
        "stage {stage}: record {topic}/{partition}@{offset} has key {key}, which murmur2 puts on partition {expected} of {partitions}: its writer does not partition like the Java client (librdkafka's default partitioner is consistent_random; set partitioner=murmur2_random), or wrote before the topic's partition count changed; a source partitioned some other way on purpose opts out with KeyPartitioning::Unchecked"
    )]
    KeyPartitionMismatch {
        /// Stage name.
        stage: String,
        /// Source topic.
        topic: String,
        /// The partition the record was read from.
        partition: i32,
        /// Offset.
        offset: i64,
        /// The key, rendered: UTF-8 text when it is, else hex (the first 64 bytes).
        key: String,
        /// The partition murmur2 gives the key.
        expected: i32,
        /// The topic's partition count.
        partitions: i32,
    },
    /// A record without a key reached a stage that keeps fold state by key: the stage's
    /// [`BadRecordPolicy`](parsley_stage::BadRecordPolicy) applies (this error under `Fail`;
    /// case C19).
    #[error(
        "stage {stage}: record {topic}/{partition}@{offset} has no key, and the stage keeps fold state by key (a stage whose handler's State is () takes records without a key)"
    )]
    KeylessRecord {
        /// Stage name.
        stage: String,
        /// Source topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
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
    /// A call of the commit did not return within the stage's timeout or its transaction
    /// timeout, whichever is shorter (plus a second): the
    /// stage gave up on it, replaced its producer (which aborts the open transaction) and
    /// redoes the work from its last commit ([retriable](Error::is_retriable)). librdkafka can
    /// wait past its own timeout when the group coordinator leaves the cluster (case C21).
    #[error(
        "{operation} did not return within {timeout:?}: the producer is replaced, which aborts the transaction"
    )]
    TransactionStalled {
        /// The call.
        operation: &'static str,
        /// The bound the call was given: the shorter of the stage's timeout and its transaction
        /// timeout.
        timeout: std::time::Duration,
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

/// A record of a stage's source: `topic/partition@offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRecord {
    /// The source topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
}

impl std::fmt::Display for InputRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.topic, self.partition, self.offset)
    }
}

/// Why an output record is refused for good ([`Error::OutputRefused`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The record is larger than a size limit.
    #[error(
        "{size} B, its headers included, is over the limit of {} ({setting})",
        limit.map_or("unknown size".to_string(), |l| format!("{l} B"))
    )]
    TooLarge {
        /// The record's size as the limit counts it, its headers (the stamp's among them)
        /// included: for the producer's `message.max.bytes`, librdkafka's bound (key, value
        /// and serialized headers plus 36 B of record framing); for the topic's
        /// `max.message.bytes`, the size of an uncompressed batch holding the record alone
        /// (61 B of batch header plus the framed record).
        size: u64,
        /// The limit, bytes; `None` when it could not be read.
        limit: Option<u64>,
        /// The setting that sets it: [`PRODUCER_SIZE_LIMIT`] or [`TOPIC_SIZE_LIMIT`].
        setting: &'static str,
    },
    /// The record's timestamp is outside the window the topic accepts (`CreateTime` topics).
    #[error(
        "record timestamp {timestamp} ms is {} ms {} this host's clock, beyond {setting}{}",
        skew_ms.unsigned_abs(),
        if *skew_ms >= 0 { "ahead of" } else { "behind" },
        max_ms.map_or(String::new(), |m| format!(" = {m} ms"))
    )]
    Timestamp {
        /// The record timestamp, ms since the epoch.
        timestamp: i64,
        /// How far it was from this host's clock when refused, ms (positive: ahead).
        skew_ms: i64,
        /// The topic setting it breaks: [`TIMESTAMP_AFTER_LIMIT`] or
        /// [`TIMESTAMP_BEFORE_LIMIT`] (the broker's `log.`-prefixed settings are their
        /// defaults).
        setting: &'static str,
        /// The setting's value, ms; `None` when it could not be read.
        max_ms: Option<i64>,
    },
}

impl Refusal {
    /// `true` when the broker refused the record (in its batch's delivery report), `false`
    /// when librdkafka's `produce()` did (nothing was sent).
    pub fn by_broker(&self) -> bool {
        match self {
            Refusal::TooLarge { setting, .. } => *setting != PRODUCER_SIZE_LIMIT,
            Refusal::Timestamp { .. } => true,
        }
    }
}

/// The producer setting of [`Refusal::TooLarge`] checked in librdkafka's `produce()`.
pub const PRODUCER_SIZE_LIMIT: &str = "message.max.bytes of the stage's producer";
/// The topic setting of [`Refusal::TooLarge`] checked by the broker.
pub const TOPIC_SIZE_LIMIT: &str = "max.message.bytes of the topic";
/// The topic setting of [`Refusal::Timestamp`] for a timestamp ahead of the broker's clock
/// (the broker's default: `log.message.timestamp.after.max.ms`, one hour since Kafka 4.0).
pub const TIMESTAMP_AFTER_LIMIT: &str = "message.timestamp.after.max.ms of the topic";
/// The topic setting of [`Refusal::Timestamp`] for a timestamp behind the broker's clock
/// (the broker's default: `log.message.timestamp.before.max.ms`, unlimited).
pub const TIMESTAMP_BEFORE_LIMIT: &str = "message.timestamp.before.max.ms of the topic";

/// Why a record given to `CausalProducer::send_record` is
/// refused ([`Error::InvalidRecord`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordProblem {
    /// An extra header is named like the stamp header
    /// ([`STAMP_HEADER`](parsley_clock::STAMP_HEADER), or its earlier name
    /// [`LEGACY_STAMP_HEADER`](parsley_clock::LEGACY_STAMP_HEADER)): the producer writes the
    /// stamp itself.
    #[error("header {0:?} is the stamp header, which the producer writes itself")]
    ReservedHeader(String),
    /// An extra header's name contains a NUL byte, which librdkafka's header names cannot hold.
    #[error("header name {0:?} contains a NUL byte")]
    NulInHeaderName(String),
    /// The record timestamp is not positive: librdkafka sends a timestamp of 0 as "now", and
    /// Kafka has no timestamps before the epoch.
    #[error("timestamp {0} ms is not after the epoch")]
    Timestamp(i64),
}

impl From<parsley_clock::Error> for Error {
    fn from(e: parsley_clock::Error) -> Self {
        Error::Clock(Box::new(e))
    }
}

impl Error {
    /// An [`Error::Kafka`]: `operation` failed with the client's error `source`.
    pub fn kafka(operation: impl Into<String>, source: ClientError) -> Self {
        Error::Kafka {
            operation: operation.into(),
            source,
        }
    }

    /// Names the stage, and the input record when known, in an [`Error::OutputRefused`] made
    /// where they are not known (the producer's side: its `stage` is empty); any other error
    /// is returned unchanged.
    pub fn refused_in(self, stage: &str, input: Option<InputRecord>, dead_letter: bool) -> Error {
        match self {
            Error::OutputRefused {
                stage: named,
                input: known,
                dead_letter: was,
                topic,
                partition,
                reason,
            } if named.is_empty() => Error::OutputRefused {
                stage: stage.to_string(),
                input: known.or(input.map(Box::new)),
                dead_letter: was || dead_letter,
                topic,
                partition,
                reason,
            },
            other => other,
        }
    }

    /// The error a stage itself ended with: the `source` of an [`Error::StageFailed`] (through
    /// any nesting), or `self` for every other error. The classification methods below look
    /// at this error.
    pub fn stage_error(&self) -> &Error {
        let mut e = self;
        while let Error::StageFailed { source, .. } = e {
            e = source;
        }
        e
    }

    /// `true` when the runtime recovers from this error in place: met inside a stage's
    /// transaction, it aborts the open transaction, returns every task to its last commit
    /// (with a new producer if this one is fenced or failed) and carries on — at most five
    /// times in a row without a commit in between. These are the transaction's own failures,
    /// not the data's or the handler's:
    /// - [`Error::Transaction`] that is not fatal, or whose code is a fence (see
    ///   [`Error::is_fenced`]: the recovery tells a transaction the coordinator aborted for
    ///   its age, which is redone, from another process running as this instance, which ends
    ///   the stage with [`Error::Fenced`]);
    /// - [`Error::Send`]: a send that failed (the abort decides: a fenced producer cannot
    ///   abort, and the stage ends then) — not [`Error::OutputRefused`], a record refused for
    ///   good, which is never retried as it was (the stage's bad-record policy may take its
    ///   input record out of the redo);
    /// - [`Error::Kafka`] holding a transactional API error ([`ClientError::transaction`])
    ///   that is not fatal and requires an abort or may be retried (a coordinator that moved
    ///   mid-call: `AddOffsetsToTxn` meeting `_TRANSPORT`, seen when the transaction
    ///   coordinator's broker was killed), or whose code is a fence;
    /// - [`Error::TransactionStalled`]: a commit call that did not return in time (the
    ///   recovery replaces the producer instead of aborting with it).
    ///
    /// Every other error is not retriable, [`Error::Fenced`] included. Apart from looking
    /// through [`Error::StageFailed`] (which a stage never returns itself), this is exactly the
    /// rule the stream loop applies to the errors of its batches. A retriable error that
    /// reaches the caller (from `Running::stop` or
    /// [`Progress::Failed`](crate::metrics::Progress::Failed)) ended its stage anyway: the recoveries in
    /// a row ran out, or it came before the stage's first transaction (at startup); restarting
    /// the stage restores every task from its last commit.
    pub fn is_retriable(&self) -> bool {
        match self.stage_error() {
            // A fence seen at the commit goes to the recovery too, which tells a timed-out
            // transaction (redone) from a zombie (ends the stage: `Error::Fenced`).
            Error::Transaction { fatal, code, .. } => !*fatal || code.is_fencing(),
            // The abort decides: a fenced producer cannot abort, and the stage ends then.
            Error::Send { .. } => true,
            // A call that never returned: the producer is replaced.
            Error::TransactionStalled { .. } => true,
            Error::Kafka { source, .. } => match source.transaction {
                Some(t) => (!t.fatal && (t.requires_abort || t.retriable)) || source.is_fencing(),
                None => false,
            },
            _ => false,
        }
    }

    /// `true` when the producer was fenced: a newer epoch of its transactional id exists
    /// (another producer initialised it, or the coordinator aborted a timed-out transaction),
    /// or the stage gave up its tasks for that reason ([`Error::Fenced`]). Fence codes are
    /// librdkafka's `_FENCED` and the broker's `PRODUCER_FENCED` and `INVALID_PRODUCER_EPOCH`,
    /// in an [`Error::Transaction`], or in the client error of an [`Error::Kafka`] or
    /// [`Error::Send`]. Only [`Error::Fenced`] says another process runs with this instance
    /// id; a fence code in an [`Error::Transaction`], an [`Error::Send`] or a transactional
    /// API error is [retriable](Error::is_retriable) (the recovery tells the two causes
    /// apart).
    pub fn is_fenced(&self) -> bool {
        match self.stage_error() {
            Error::Fenced { .. } => true,
            Error::Transaction { code, .. } => code.is_fencing(),
            Error::Kafka { source, .. } | Error::Send { source, .. } => source.is_fencing(),
            _ => false,
        }
    }

    /// `true` for a client error ([`Error::Kafka`]) that reports a connection state, not a
    /// lost record or a refused request: librdkafka's `_ALL_BROKERS_DOWN`, `_TRANSPORT`,
    /// `_TIMED_OUT`, and the broker's `REQUEST_TIMED_OUT` and `NETWORK_EXCEPTION`. librdkafka
    /// recovers from them on its own: a stage's consumer carries on after them (polling, and
    /// reading a changelog), so a stage ends with one only when another call met it (reading
    /// metadata or offsets, initialising transactions, …); restarting the stage once the
    /// cluster is reachable again is expected to work.
    pub fn is_transient(&self) -> bool {
        matches!(self.stage_error(), Error::Kafka { source, .. } if source.is_transient())
    }

    /// `true` when the error is neither [retriable](Error::is_retriable) nor
    /// [transient](Error::is_transient): nothing in the runtime recovers from it in place, so
    /// a stage that ends with it stays stopped; look at its cause before restarting the stage.
    /// This covers every error about the data, the topics, the topology, the handler or
    /// another process — [`Error::RecordsLost`], [`Error::Fenced`], [`Error::ImpossibleStamp`],
    /// [`Error::MalformedStamp`], [`Error::Gate`], [`Error::Stage`],
    /// [`Error::RestoreMismatch`], [`Error::Changelog`], [`Error::ChangelogPartitions`],
    /// [`Error::InternalTopicPartitions`],
    /// [`Error::SourceChanged`], [`Error::SourceDeleted`], [`Error::NotCoPartitioned`],
    /// [`Error::NoEventTime`], [`Error::EventTime`], [`Error::OutputRefused`], … — and also a
    /// fatal [`Error::Transaction`]
    /// whose code is not a fence (the producer cannot be used any more), [`Error::Admin`],
    /// [`Error::Timeout`], [`Error::RestoreBlocked`], [`Error::StagePanicked`],
    /// [`Error::ThreadSpawn`], [`Error::Signals`], [`Error::MetricsListener`],
    /// [`Error::InvalidRecord`], and an [`Error::Kafka`] that is neither retriable nor transient.
    pub fn is_fatal(&self) -> bool {
        !self.is_retriable() && !self.is_transient()
    }
}

/// A key for an error message: quoted UTF-8 text when it is, else hex; the first 64 bytes.
pub fn render_key(key: &[u8]) -> String {
    let shown = &key[..key.len().min(64)];
    let more = if key.len() > 64 { "…" } else { "" };
    match std::str::from_utf8(shown) {
        Ok(text) => format!("{text:?}{more}"),
        Err(_) => {
            let hex: String = shown.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}{more}")
        }
    }
}

/// What [`Error::OutputRefused`] says was refused.
fn refused_what(input: Option<&InputRecord>, dead_letter: bool) -> String {
    match (input, dead_letter) {
        (Some(i), false) => format!("an output of input record {i}"),
        (Some(i), true) => format!("the dead letter of input record {i}"),
        (None, true) => "a dead letter".to_string(),
        (None, false) => "a record".to_string(),
    }
}

fn describe_counts(partitions: &[(String, i32)]) -> String {
    partitions
        .iter()
        .map(|(t, n)| format!("{t} has {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
