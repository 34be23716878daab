//! The errors of `parsley-gate`.

use std::fmt;

use parsley_clock::{Channel, Coordinate};

/// What the gate refused and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// The channel is not one of the task's consumed channels.
    #[error("channel {channel} is not consumed by this task")]
    NotConsumed {
        /// The channel named by the caller.
        channel: Channel,
    },
    /// A record arrived on a channel that was never seeded (the runtime must seed a channel
    /// with the consumer's position when it is first assigned).
    #[error("channel {channel} is not seeded")]
    NotSeeded {
        /// The channel named by the caller.
        channel: Channel,
    },
    /// A channel was seeded twice; its baseline is fixed by the first assignment.
    #[error("channel {channel} is already seeded at baseline {baseline}")]
    AlreadySeeded {
        /// The channel named by the caller.
        channel: Channel,
        /// The baseline it already has.
        baseline: i64,
    },
    /// A seed position below zero.
    #[error("cannot seed channel {channel} at negative position {position}")]
    NegativePosition {
        /// The channel named by the caller.
        channel: Channel,
        /// The rejected position.
        position: i64,
    },
    /// A fetched record's offset is not above the frontier and the last queued offset: the
    /// consumer returned records out of order or twice.
    #[error("record at {channel}@{offset} is not above the previous offset {previous}")]
    OffsetNotAscending {
        /// The record's channel.
        channel: Channel,
        /// The record's offset.
        offset: i64,
        /// The frontier or the last queued offset.
        previous: i64,
    },
    /// A position below a record the gate was already given: positions must be read after the
    /// poll whose records were offered.
    #[error("position {position} of {channel} is not above the last offered offset {last}")]
    PositionBehind {
        /// The channel.
        channel: Channel,
        /// The position given.
        position: i64,
        /// The last offset offered (or the frontier).
        last: i64,
    },
    /// A re-fetched record does not match the spilled record it should replace (another
    /// sender, or no record was fetched at that offset before): the partition's history changed
    /// under the task (truncation, or a recreated topic read under the old id).
    #[error(
        "re-fetched record at {channel}@{offset} does not match what was fetched there before (sender then: {before}, now: {now})"
    )]
    RefetchMismatch {
        /// The channel.
        channel: Channel,
        /// The offset.
        offset: i64,
        /// The sender tag the spilled record had (`none` for an unstamped record or no record).
        before: String,
        /// The sender tag of the re-fetched record.
        now: String,
    },
    /// [`Gate::begin_refetch`](crate::Gate::begin_refetch) for a channel with no spilled record at or above the
    /// offset.
    #[error("nothing spilled on {channel} at or above offset {from}")]
    NothingSpilled {
        /// The channel.
        channel: Channel,
        /// The requested offset.
        from: i64,
    },
    /// [`Gate::resolve`](crate::Gate::resolve) was called for a record that is not held for an
    /// impossible stamp.
    #[error("record {record} is not held for an impossible stamp")]
    NotHeld {
        /// The record named by the caller.
        record: Coordinate,
    },
    /// A startup end offset or last stable offset below zero (offsets start at 0; librdkafka
    /// reports an unknown offset as `-1001`).
    #[error("end offset {end_offset} of {channel} is negative")]
    NegativeEndOffset {
        /// The channel.
        channel: Channel,
        /// The rejected end offset.
        end_offset: i64,
    },
    /// A frontier reading below an earlier one: a frontier never decreases.
    #[error("frontier {frontier} of {channel} is below the previous reading {previous}")]
    FrontierBehind {
        /// The channel.
        channel: Channel,
        /// The frontier given.
        frontier: i64,
        /// The previous reading.
        previous: i64,
    },
    /// [`WatermarkTracker::control`](crate::WatermarkTracker::control) on a tracker built
    /// without a control stream.
    #[error("no control stream is configured")]
    NoControlStream,
    /// Bytes that do not decode to a timer queue (wrong version, truncated or corrupt), or a
    /// key or value whose serde implementation failed while encoding.
    #[error("timer queue codec: {message}")]
    TimerQueueCodec {
        /// What the codec reported.
        message: String,
    },
    /// The timer queue's changes were asked for while records it released were not taken yet
    /// ([`TimerQueue::raise`](crate::TimerQueue::raise)): written, they would count as
    /// released before the caller had them.
    #[error("{count} released timer-queue records are not taken yet")]
    ReleasedNotTaken {
        /// Released records not taken.
        count: usize,
    },
}

impl GateError {
    /// Attaches the refused value, so the caller gets it back.
    pub fn with<T>(self, refused: T) -> Refused<T> {
        Refused {
            kind: self,
            refused,
        }
    }
}

/// Why a claim is impossible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImpossibleReason {
    /// The stamp claims an offset on the record's own channel at or beyond the record: a
    /// record cannot depend on itself or on what was appended after it.
    SelfClaim,
    /// The stamp claims an offset at or beyond the channel's high watermark read after the
    /// poll that returned the record: a claim from the future.
    BeyondHighWatermark {
        /// That high watermark.
        high_watermark: i64,
    },
}

impl fmt::Display for ImpossibleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImpossibleReason::SelfClaim => {
                f.write_str("a claim on its own channel at or beyond its own offset")
            }
            ImpossibleReason::BeyondHighWatermark { high_watermark } => write!(
                f,
                "a claim at or beyond the high watermark {high_watermark} read after the record arrived"
            ),
        }
    }
}

/// A refusal that hands back what was refused: nothing is lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}")]
pub struct Refused<T> {
    /// Why it was refused.
    pub kind: GateError,
    /// The value the caller passed, unchanged.
    pub refused: T,
}
