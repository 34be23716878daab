//! The errors of `parsley-stage`.

use crate::codec::CodecError;
use crate::handler::HandlerError;
use crate::processor::Part;
use crate::topology::BadRecordKind;

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
