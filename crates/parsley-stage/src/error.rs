//! The errors of `parsley-stage`: [`Error`], with what it says of a record that failed: the
//! [`Part`] that did not decode and the [`BadRecordKind`] a bad-record policy counts.
//!
//! Below `processor` and `topology`, which return its errors: it imports only the error types
//! of `codec` and `handler`.

use crate::codec::CodecError;
use crate::handler::HandlerError;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong while building a topology or processing a record.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The topology is not valid; every problem found is listed.
    #[error("invalid topology: {}", problems.join("; "))]
    InvalidTopology {
        /// One line per problem, each naming the stage and topic concerned.
        problems: Vec<String>,
    },
    /// A record's key, value or the key's fold state could not be decoded.
    #[error("stage {stage}: cannot decode the {part} of {topic}/{partition}@{offset}: {source}")]
    Decode {
        /// Stage name.
        stage: String,
        /// Source topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// Which part.
        part: Part,
        /// The codec's error.
        source: CodecError,
    },
    /// A record had no key or no value (a tombstone) where the stage needs one.
    #[error("stage {stage}: record {topic}/{partition}@{offset} has no {part}")]
    Missing {
        /// Stage name.
        stage: String,
        /// Source topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// Which part is missing.
        part: Part,
    },
    /// The handler failed on a record.
    #[error("stage {stage}: handler failed on {topic}/{partition}@{offset}: {source}")]
    Handler {
        /// Stage name.
        stage: String,
        /// Source topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// The handler's error.
        source: HandlerError,
    },
    /// A punctuator failed (module `punctuation`): the stage stops.
    #[error("stage {stage}: punctuator failed on task {partition} at time {time} ms: {source}")]
    Punctuator {
        /// The stage.
        stage: String,
        /// The task's partition.
        partition: i32,
        /// The punctuation's time, ms since the epoch.
        time: i64,
        /// The punctuator's error.
        source: HandlerError,
    },
    /// An emission or a fold state could not be encoded.
    #[error("stage {stage}: cannot encode the {what}: {source}")]
    Encode {
        /// Stage name.
        stage: String,
        /// What was being encoded.
        what: &'static str,
        /// The codec's error.
        source: CodecError,
    },
    /// The fold state of another key of the task could not be read ([`crate::StateLookup`]).
    #[error("stage {stage}: cannot read the fold state of another key: {message}")]
    StateRead {
        /// Stage name.
        stage: String,
        /// What the store said.
        message: String,
    },
    /// The handler emitted to a topic the stage did not declare as a sink.
    #[error("stage {stage}: emission to undeclared sink topic {topic}")]
    UndeclaredSink {
        /// Stage name.
        stage: String,
        /// The topic the handler named.
        topic: String,
    },
}

impl Error {
    /// The kind of bad record this error is, when the record is at fault (a key or value that
    /// does not decode or is missing, a handler error): what the stage's
    /// [`BadRecordPolicy`](crate::BadRecordPolicy) applies to. `None` for the stage's own
    /// faults (a fold state that does not decode, an emission that cannot be encoded or goes
    /// to an undeclared sink, an invalid topology), which always stop the stage.
    pub fn bad_record_kind(&self) -> Option<BadRecordKind> {
        match self {
            Error::Decode {
                part: Part::Key, ..
            } => Some(BadRecordKind::KeyDecode),
            Error::Decode {
                part: Part::Value, ..
            } => Some(BadRecordKind::ValueDecode),
            Error::Missing {
                part: Part::Key, ..
            } => Some(BadRecordKind::MissingKey),
            Error::Missing {
                part: Part::Value, ..
            } => Some(BadRecordKind::MissingValue),
            Error::Handler { .. } => Some(BadRecordKind::Handler),
            _ => None,
        }
    }
}

/// Where a decoding failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The record key.
    Key,
    /// The record value.
    Value,
    /// The fold state of the record's key.
    State,
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Part::Key => "key",
            Part::Value => "value",
            Part::State => "state",
        })
    }
}

/// What made a record bad ([`BadRecordPolicy`](crate::BadRecordPolicy)); counted per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BadRecordKind {
    /// The key does not decode.
    KeyDecode,
    /// The value does not decode.
    ValueDecode,
    /// The record has no key, and the stage keeps fold state by key or its key type cannot
    /// stand for a missing key.
    MissingKey,
    /// The record has no value (a tombstone), and the stage's value type cannot stand for one.
    MissingValue,
    /// The handler returned an error.
    Handler,
    /// One of the records the handler emitted for it was refused for good by the stage's producer
    /// or the broker — larger than a size limit, or a timestamp outside the window the topic
    /// accepts (the runtime's `RecordError::OutputRefused`). The transaction holding its other
    /// outputs is aborted, and the redo applies the policy to the input record instead of handling
    /// it: none of its outputs is written.
    OutputRefused,
}

impl BadRecordKind {
    /// Every kind, in the order metrics list them.
    pub const ALL: [BadRecordKind; 6] = [
        BadRecordKind::KeyDecode,
        BadRecordKind::ValueDecode,
        BadRecordKind::MissingKey,
        BadRecordKind::MissingValue,
        BadRecordKind::Handler,
        BadRecordKind::OutputRefused,
    ];

    /// The kind's name, as a dead-lettered record's `parsley.dlq.kind` header gives it:
    /// `key-decode`, `value-decode`, `missing-key`, `missing-value`, `handler`,
    /// `output-refused`.
    pub fn name(self) -> &'static str {
        match self {
            BadRecordKind::KeyDecode => "key-decode",
            BadRecordKind::ValueDecode => "value-decode",
            BadRecordKind::MissingKey => "missing-key",
            BadRecordKind::MissingValue => "missing-value",
            BadRecordKind::Handler => "handler",
            BadRecordKind::OutputRefused => "output-refused",
        }
    }
}
