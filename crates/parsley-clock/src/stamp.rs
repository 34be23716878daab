//! Stamps: what an emitted record carries in its stamp header ([`crate::STAMP_HEADER`]).
//!
//! A stamp says who sent the record and what it depends on (the book's specification, §1, §3):
//! - the **sender tag**: the sender's identity and this send's sequence;
//! - the **clock**: coordinates the sender had delivered, learned or had acknowledged, except
//!   on the record's own channel, where the record's coordinate supersedes them
//!   ([`crate::CausalClock::stamp`]);
//! - **in-flight claims** `(channel, seq)`: "every send of *this stamp's sender* to `channel`
//!   with sequence `<= seq`" — earlier sends whose offsets the sender did not know yet because
//!   they were not acknowledged. Only a transactional sender may make them: a commit flushes
//!   every send before any becomes visible, so when a receiver sees this record, the claimed
//!   sends are in the log below the channel's high watermark;
//! - the **acked-through** sequence: every send of the sender with sequence `<=` it was
//!   acknowledged before this one, so it is claimed by coordinate in the clock.
//!
//! A stamp only ever carries in-flight claims on its own sender's sends: a node that delivers
//! a record resolves the record's in-flight claims by its own delivery or replaces them by a
//! coordinate (the book's specification, §3), so it has none of another sender's to pass on.
//!
//! Invariants (checked by [`Stamp::validate`] and by the decoder):
//! - in-flight claims are sorted by channel, one per channel, and need a sender tag;
//! - every in-flight sequence is below the stamp's own sequence and above `acked_through`;
//! - `acked_through` is below the stamp's own sequence.

use crate::channel::Channel;
use crate::clock::Clock;
use crate::error::{DecodeErrorKind, Error, Result};
use crate::sender::SenderTag;

/// A claim on the stamp's sender's earlier sends to one channel that were not acknowledged
/// when the record was sent: every send to `channel` with sequence `<= seq`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct InFlight {
    /// The channel of the claimed sends.
    pub channel: Channel,
    /// The highest claimed send sequence on that channel.
    pub seq: u64,
}

/// The causal metadata of one emitted record.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Stamp {
    /// Who sent the record and the send's sequence; `None` for a stamp that only claims.
    pub sender: Option<SenderTag>,
    /// The record's coordinate dependencies.
    pub clock: Clock,
    /// Claims on the sender's own unacknowledged earlier sends, sorted by channel.
    pub in_flight: Vec<InFlight>,
    /// Every send of the sender with a sequence `<=` this was acknowledged before this one.
    pub acked_through: Option<u64>,
}

impl Stamp {
    /// A stamp of `sender` claiming `clock`, with no in-flight claims.
    pub fn new(sender: Option<SenderTag>, clock: Clock) -> Self {
        Stamp {
            sender,
            clock,
            in_flight: Vec::new(),
            acked_through: None,
        }
    }

    /// Checks the invariants listed in the module docs.
    ///
    /// # Errors
    /// [`Error::Decode`] at byte 0 with the kind that names the broken invariant.
    pub fn validate(&self) -> Result<()> {
        let fail = |kind| Err(Error::Decode { at: 0, kind });
        let Some(tag) = self.sender else {
            if !self.in_flight.is_empty() || self.acked_through.is_some() {
                return fail(DecodeErrorKind::ClaimsWithoutSender);
            }
            return Ok(());
        };
        if self.acked_through.is_some_and(|a| a >= tag.seq) {
            return fail(DecodeErrorKind::InconsistentSequences);
        }
        for (i, c) in self.in_flight.iter().enumerate() {
            if i > 0 && self.in_flight[i - 1].channel >= c.channel {
                return fail(DecodeErrorKind::UnsortedTopics);
            }
            if c.seq >= tag.seq || self.acked_through.is_some_and(|a| c.seq <= a) {
                return fail(DecodeErrorKind::InconsistentSequences);
            }
        }
        Ok(())
    }
}
