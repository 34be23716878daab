//! `CausalClock`: the node clock of a sender, for stage tasks and plain producers alike.
//!
//! A node's clock accumulates (DESIGN.md §3): the highest offset it delivered (or, for a plain
//! producer, consumed) on each channel, the stamps it learned from those records, and the
//! coordinates of its own sends once they are acknowledged. [`CausalClock::stamp`] turns that
//! into the [`Stamp`] of the next send.
//!
//! # Soundness without in-flight claims
//! A record cannot name its own coordinate (the broker assigns it), and this version of the
//! stamp carries no in-flight claims yet (issue 3). So a send may claim only *acknowledged*
//! earlier sends. Two rules keep every earlier send of this sender claimed or ordered:
//! - sends to the **same** channel need no claim: an idempotent producer appends them in send
//!   order, and a receiver delivers a channel in offset order;
//! - before a send to a **different** channel, every earlier send must be acknowledged, so
//!   that its coordinate is in the clock. [`CausalClock::stamp`] refuses with
//!   [`Error::UnackedSends`] otherwise; the caller flushes and retries.
//!
//! Requirements on the caller: the producer is idempotent (`enable.idempotence=true`, implied
//! by transactions), every send is reported back exactly once through [`CausalClock::acked`]
//! or [`CausalClock::failed`], and a transactional caller that aborts restores the clone it
//! took when the transaction began (the aborted coordinates must not stay claimed).

use crate::channel::{Channel, Coordinate};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::sender::{SenderId, SenderTag};
use crate::stamp::Stamp;

/// The causal state of one sender: what it claims, its send sequence and its unacked sends.
#[derive(Clone, Debug)]
pub struct CausalClock {
    sender: SenderId,
    /// The sequence the next send gets; strictly increasing.
    next_seq: u64,
    /// Delivered or consumed coordinates, learned stamps and acknowledged own sends.
    clock: Clock,
    /// Channels with unacknowledged sends and how many, sorted by channel.
    unacked: Vec<(Channel, u64)>,
}

impl CausalClock {
    /// A new sender incarnation with an empty clock, whose first send has sequence 0.
    pub fn new(sender: SenderId) -> Self {
        Self::resume(sender, 0, Clock::new())
    }

    /// Resumes a sender from committed state: its id, the sequence of its next send and its
    /// clock. Nothing is unacknowledged after a commit.
    pub fn resume(sender: SenderId, next_seq: u64, clock: Clock) -> Self {
        CausalClock {
            sender,
            next_seq,
            clock,
            unacked: Vec::new(),
        }
    }

    /// This sender's identity.
    pub fn sender(&self) -> SenderId {
        self.sender
    }

    /// The sequence the next send will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// What this sender claims now.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Number of sends not acknowledged or failed yet.
    pub fn unacked(&self) -> u64 {
        self.unacked.iter().map(|(_, n)| n).sum()
    }

    /// Records that the record at `coordinate` was delivered to (or consumed by) this node,
    /// with its stamp if it carried one: the node now claims the coordinate and everything
    /// the stamp claimed.
    ///
    /// # Panics
    /// When `coordinate.offset` is negative (a Kafka record's offset never is).
    pub fn observe(&mut self, coordinate: Coordinate, stamp: Option<&Stamp>) {
        if let Some(s) = stamp {
            self.clock.merge(&s.clock);
        }
        self.clock.observe(coordinate);
    }

    /// The stamp for the next send, to `target`; allocates its sequence number and counts the
    /// send as unacknowledged.
    ///
    /// # Errors
    /// [`Error::UnackedSends`] when sends to other channels are not acknowledged yet (see the
    /// module docs); nothing changes, flush and call again.
    pub fn stamp(&mut self, target: Channel) -> Result<Stamp> {
        if let Some(&(first_pending, _)) = self.unacked.iter().find(|(c, _)| *c != target) {
            return Err(Error::UnackedSends {
                target,
                pending: self
                    .unacked
                    .iter()
                    .filter(|(c, _)| *c != target)
                    .map(|(_, n)| *n as usize)
                    .sum(),
                first_pending,
            });
        }
        let tag = SenderTag {
            sender: self.sender,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        match self.unacked.binary_search_by(|(c, _)| c.cmp(&target)) {
            Ok(i) => self.unacked[i].1 += 1,
            Err(i) => self.unacked.insert(i, (target, 1)),
        }
        Ok(Stamp::new(Some(tag), self.clock.clone()))
    }

    /// Records the acknowledgement of a send: the node now claims its coordinate.
    ///
    /// # Errors
    /// [`Error::NoSendOutstanding`] when no send to that channel was outstanding, and
    /// [`Error::NegativeOffset`] for a negative offset; the clock is unchanged.
    pub fn acked(&mut self, coordinate: Coordinate) -> Result<()> {
        if coordinate.offset < 0 {
            return Err(Error::NegativeOffset {
                channel: coordinate.channel,
                offset: coordinate.offset,
            });
        }
        self.settle(coordinate.channel)?;
        self.clock.observe(coordinate);
        Ok(())
    }

    /// Records that a send to `channel` failed and was not appended.
    ///
    /// # Errors
    /// [`Error::NoSendOutstanding`] when no send to that channel was outstanding.
    pub fn failed(&mut self, channel: Channel) -> Result<()> {
        self.settle(channel)
    }

    fn settle(&mut self, channel: Channel) -> Result<()> {
        match self.unacked.binary_search_by(|(c, _)| c.cmp(&channel)) {
            Ok(i) => {
                self.unacked[i].1 -= 1;
                if self.unacked[i].1 == 0 {
                    self.unacked.remove(i);
                }
                Ok(())
            }
            Err(_) => Err(Error::NoSendOutstanding { channel }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::TopicId;

    fn ch(t: u8, p: i32) -> Channel {
        Channel::new(TopicId::from_bytes([t; 16]), p)
    }

    #[test]
    fn stamps_claim_observed_records_and_learned_stamps() {
        let mut cc = CausalClock::new(SenderId::from_bytes([7; 16]));
        let upstream: Clock = [ch(9, 0).at(40)].into_iter().collect();
        cc.observe(ch(1, 0).at(5), Some(&Stamp::new(None, upstream)));
        let s = cc.stamp(ch(2, 0)).unwrap();
        assert_eq!(s.sender.unwrap().seq, 0);
        assert!(s.clock.covers(ch(1, 0).at(5)));
        assert!(s.clock.covers(ch(9, 0).at(40)));
        assert_eq!(cc.next_seq(), 1);
    }

    #[test]
    fn same_channel_sends_need_no_ack_but_a_channel_switch_does() {
        let mut cc = CausalClock::new(SenderId::from_bytes([7; 16]));
        cc.stamp(ch(2, 0)).unwrap();
        cc.stamp(ch(2, 0)).unwrap();
        let err = cc.stamp(ch(3, 0)).unwrap_err();
        assert!(matches!(err, Error::UnackedSends { pending: 2, .. }));
        assert_eq!(cc.next_seq(), 2, "a refused stamp allocates nothing");
        cc.acked(ch(2, 0).at(10)).unwrap();
        assert!(cc.stamp(ch(3, 0)).is_err(), "one send still pending");
        cc.failed(ch(2, 0)).unwrap();
        let s = cc.stamp(ch(3, 0)).unwrap();
        assert!(s.clock.covers(ch(2, 0).at(10)), "the acked send is claimed");
        assert_eq!(s.sender.unwrap().seq, 2);
    }

    #[test]
    fn a_report_without_a_send_is_an_error() {
        let mut cc = CausalClock::new(SenderId::from_bytes([7; 16]));
        assert!(matches!(
            cc.acked(ch(2, 0).at(1)),
            Err(Error::NoSendOutstanding { .. })
        ));
        assert!(cc.clock().is_empty());
    }
}
