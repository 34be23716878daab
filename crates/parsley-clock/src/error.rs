//! The errors of `parsley-clock`.

use crate::channel::Channel;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a clock operation or while decoding a stamp header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A stamp header's bytes are not a canonical stamp of a known version.
    #[error("stamp header is malformed at byte {at}: {kind}")]
    Decode {
        /// Position in the header value where decoding failed.
        at: usize,
        /// What was wrong there.
        kind: DecodeErrorKind,
    },
    /// An offset below zero where a clock needs a record offset.
    #[error("offset {offset} on channel {channel} is negative; a clock entry claims offsets >= 0")]
    NegativeOffset {
        /// The channel of the rejected entry.
        channel: Channel,
        /// The rejected offset.
        offset: i64,
    },
    /// Clock entries given as sorted were not strictly ascending by channel.
    #[error("clock entries are not strictly ascending by channel at {channel}")]
    UnsortedEntries {
        /// The first channel out of order.
        channel: Channel,
    },
    /// A send was about to be stamped while earlier sends to other channels are unacknowledged.
    ///
    /// Without in-flight claims such a stamp could not claim those sends, and a
    /// receiver could deliver this record before them. Wait for their acks (flush) first.
    #[error(
        "cannot stamp a send to {target}: {pending} earlier send(s) to other channels are not acknowledged yet (first: {first_pending}); flush before switching channels"
    )]
    UnackedSends {
        /// The channel the caller wanted to send to.
        target: Channel,
        /// How many sends to other channels are still unacknowledged.
        pending: usize,
        /// One channel with unacknowledged sends.
        first_pending: Channel,
    },
    /// An acknowledgement or failure was reported for a channel with no send outstanding.
    #[error("no send to {channel} is outstanding, yet an acknowledgement or failure was reported")]
    NoSendOutstanding {
        /// The channel named by the report.
        channel: Channel,
    },
}

/// Why a stamp header could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The value ended before the structure did.
    #[error("truncated")]
    Truncated,
    /// The version byte names a format this build does not know.
    #[error("unknown stamp version {0}")]
    UnknownVersion(u8),
    /// A flag bit this version does not define is set.
    #[error("unknown flag bits {0:#010b}")]
    UnknownFlags(u8),
    /// A varint longer than 10 bytes or beyond `u64`.
    #[error("varint overflows u64")]
    VarintOverflow,
    /// A varint with redundant trailing zero groups.
    #[error("varint is not in its shortest form")]
    NonCanonicalVarint,
    /// Topic groups are not strictly ascending by topic id.
    #[error("topic groups are not strictly ascending")]
    UnsortedTopics,
    /// A topic group with zero entries.
    #[error("topic group has no entries")]
    EmptyTopicGroup,
    /// A partition beyond `i32::MAX`.
    #[error("partition out of range")]
    PartitionOutOfRange,
    /// An offset below zero or beyond `i64::MAX`.
    #[error("offset out of range")]
    OffsetOutOfRange,
    /// Bytes after the last topic group.
    #[error("trailing bytes after the stamp")]
    TrailingBytes,
    /// In-flight claims or an acked-through sequence without a sender tag to refer to.
    #[error("in-flight claims or acked-through without a sender")]
    ClaimsWithoutSender,
    /// Sequences that contradict each other: an in-flight claim at or beyond the stamp's own
    /// sequence or at or below its acked-through sequence, or acked-through at or beyond the
    /// stamp's own sequence.
    #[error("inconsistent sequences")]
    InconsistentSequences,
    /// A send sequence beyond `i64::MAX`.
    #[error("sequence out of range")]
    SequenceOutOfRange,
    /// A sender id written in 16 bytes that has the eight-byte short form (version 2).
    #[error("a 16-byte sender id that has a short form")]
    NonCanonicalSenderId,
}
