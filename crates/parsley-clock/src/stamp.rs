//! Stamps: what an emitted record carries in its `parsley.stamp` header.
//!
//! A stamp holds the sender tag of the record and its dependency clock: every coordinate the
//! sender had delivered, learned or had acknowledged before it sent the record (DESIGN.md §3).
//! The clock is a *claim*: a receiver's gate must have delivered every claimed coordinate on
//! the channels it consumes before it delivers the record.
//!
//! Not yet carried: in-flight claims `(sender, channel, seq)` and the acked-through sequence
//! (DESIGN.md §3, issue 3). Until they exist a sender claims only acknowledged coordinates and
//! keeps its sends to different channels ordered by waiting for acks
//! (see [`CausalClock`](crate::CausalClock)); the header codec reserves flag bits for them and
//! rejects any header that sets those bits.

use crate::clock::Clock;
use crate::sender::SenderTag;

/// The causal metadata of one emitted record.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Stamp {
    /// Who sent the record and the send's sequence; `None` for a stamp that only claims.
    pub sender: Option<SenderTag>,
    /// The record's dependencies.
    pub clock: Clock,
}

impl Stamp {
    /// A stamp of `sender` claiming `clock`.
    pub fn new(sender: Option<SenderTag>, clock: Clock) -> Self {
        Stamp { sender, clock }
    }
}
