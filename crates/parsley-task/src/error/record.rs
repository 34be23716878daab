//! The record kind of [`Error`](super::Error): a record that Parsley cannot take or write as it
//! is — the answer to "is my data wrong?": a stamp no truthful sender writes, a record without
//! the key or timestamp the stage needs, a record the caller hands the producer that cannot be
//! sent, an output the broker refuses for good, records deleted before the stage read them, a
//! source topic changed under the stage. Each names the record (`topic/partition@offset`,
//! offsets `i64`) or the topic. None is retried as it was: the record would be met again.

use parsley_clock::Coordinate;
use parsley_stage::KeyPartitioning;

/// A record, or a source topic's records, that a stage cannot handle as they are
/// ([`Error::Record`](super::Error::Record)). Fatal every time: none is
/// [retriable](RecordError::is_retriable) nor [transient](RecordError::is_transient).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
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
    /// A record given to `CausalProducer::send_record`
    /// cannot be sent as asked: nothing was sent and the producer's clock is unchanged.
    #[error("record for topic {topic} refused: {problem}")]
    InvalidRecord {
        /// The record's topic.
        topic: String,
        /// What is wrong with it.
        problem: RecordProblem,
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
    /// When the broker refuses a batch, every record in it fails; the one named is the record that
    /// explains the refusal alone (too large alone, or a timestamp outside the topic's window). A
    /// refused batch that no single record explains (records that fit one by one in a batch that
    /// does not) stays an [`KafkaError::Send`](crate::error::KafkaError::Send). After the broker
    /// refused a batch the runtime replaces the stage's producer before the redo: librdkafka goes
    /// on counting the refused batch's sequence numbers, which would make the broker refuse the
    /// next transaction's first send as `OUT_OF_ORDER_SEQUENCE_NUMBER`.
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
    /// the partitioner declared for the source (`partitioner`, murmur2 by default: the Java
    /// client's, Kafka Streams' and Parsley's) gives `expected`. Its writer partitions some
    /// other way — librdkafka's default partitioner, `consistent_random`, uses CRC32 — or wrote
    /// before the topic's partition count changed; the stage's per-key state and claims would
    /// split the key across tasks, so it stops instead (case C20). `matches` names the
    /// partitioner, murmur2 or CRC32, that does put the key where it is, and the message gives
    /// the line that declares it
    /// ([`KeyPartitioning`](parsley_stage::KeyPartitioning)); a source partitioned some other
    /// way on purpose opts out with `KeyPartitioning::Unchecked`.
    #[error(
        "stage {stage}: record {topic}/{partition}@{offset} has key {key}, which {} puts on partition {expected} of {partitions}; {}",
        partitioner_name(*.partitioner),
        mismatch_advice(.topic, *.matches)
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
        /// The partitioner declared for the source, which was checked.
        partitioner: KeyPartitioning,
        /// The partition it gives the key.
        expected: i32,
        /// The topic's partition count.
        partitions: i32,
        /// The other partitioner, murmur2 or CRC32, if it puts the key on `partition`.
        matches: Option<KeyPartitioning>,
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
}

impl RecordError {
    /// Names the stage, and the input record when known, in a [`RecordError::OutputRefused`]
    /// made where they are not known (the producer's side: its `stage` is empty); any other
    /// error is returned unchanged.
    pub fn refused_in(self, stage: &str, input: Option<InputRecord>, dead_letter: bool) -> Self {
        match self {
            RecordError::OutputRefused {
                stage: named,
                input: known,
                dead_letter: was,
                topic,
                partition,
                reason,
            } if named.is_empty() => RecordError::OutputRefused {
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

    /// Always `false`: a record is met again on every try, and an output refused for good is
    /// never retried as it was (the stage's bad-record policy may take its input record out of
    /// the redo) ([`Error::is_retriable`](super::Error::is_retriable)).
    pub fn is_retriable(&self) -> bool {
        match self {
            RecordError::MalformedStamp { .. }
            | RecordError::ImpossibleStamp { .. }
            | RecordError::InvalidRecord { .. }
            | RecordError::OutputRefused { .. }
            | RecordError::RecordsLost { .. }
            | RecordError::SourceChanged { .. }
            | RecordError::SourceDeleted { .. }
            | RecordError::KeyPartitionMismatch { .. }
            | RecordError::KeylessRecord { .. }
            | RecordError::NoEventTime { .. } => false,
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

/// Why an output record is refused for good
/// ([`RecordError::OutputRefused`](crate::error::RecordError::OutputRefused)).
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
/// refused ([`RecordError::InvalidRecord`](crate::error::RecordError::InvalidRecord)).
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

/// The name of a checked partitioner in messages.
fn partitioner_name(p: KeyPartitioning) -> &'static str {
    match p {
        KeyPartitioning::Murmur2 => "murmur2",
        KeyPartitioning::Crc32 => "CRC32",
        KeyPartitioning::Unchecked => "no partitioner",
    }
}

/// What a [`RecordError::KeyPartitionMismatch`] advises: the line that declares the partitioner
/// the key matches, if one does.
fn mismatch_advice(topic: &str, matches: Option<KeyPartitioning>) -> String {
    match matches {
        Some(KeyPartitioning::Crc32) => format!(
            "it is where CRC32 puts it: its writer uses librdkafka's default partitioner (consistent_random, as clients built on librdkafka do: C, Python, Go, .NET, Rust's rdkafka); declare it on the stage with .key_partitioning(\"{topic}\", KeyPartitioning::Crc32), or in the DSL read it with Consumed::default().key_partitioning(KeyPartitioning::Crc32)"
        ),
        Some(KeyPartitioning::Murmur2) => format!(
            "it is where murmur2 puts it (the Java client's default partitioner): declare {topic} KeyPartitioning::Murmur2, the default"
        ),
        _ => "neither murmur2 nor CRC32 puts it there: its writer partitions some other way, or wrote before the topic's partition count changed; a source partitioned some other way on purpose opts out with KeyPartitioning::Unchecked".to_string(),
    }
}

/// A key for an error message: UTF-8 text in quotes, as it is (control characters escaped),
/// else hex; the first 64 bytes.
pub fn render_key(key: &[u8]) -> String {
    let shown = &key[..key.len().min(64)];
    let more = if key.len() > 64 { "…" } else { "" };
    match std::str::from_utf8(shown) {
        Ok(text) => {
            let text: String = text
                .chars()
                .flat_map(|c| {
                    let escape = c.is_control().then(|| c.escape_debug());
                    escape
                        .into_iter()
                        .flatten()
                        .chain((!c.is_control()).then_some(c))
                })
                .collect();
            format!("\"{text}\"{more}")
        }
        Err(_) => {
            let hex: String = shown.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}{more}")
        }
    }
}

/// What [`RecordError::OutputRefused`](crate::error::RecordError::OutputRefused) says was refused.
fn refused_what(input: Option<&InputRecord>, dead_letter: bool) -> String {
    match (input, dead_letter) {
        (Some(i), false) => format!("an output of input record {i}"),
        (Some(i), true) => format!("the dead letter of input record {i}"),
        (None, true) => "a dead letter".to_string(),
        (None, false) => "a record".to_string(),
    }
}
