//! `CausalClock`: the node clock of a sender, for stage tasks and plain producers alike.
//!
//! A node's clock accumulates (the book's specification, §3): the highest offset it delivered (or,
//! for a plain producer, consumed) on each channel, the stamps it learned from those records, and
//! the coordinates of its own sends once they are acknowledged. [`CausalClock::stamp`] turns that
//! into the [`Stamp`] of the next send.
//!
//! # Earlier sends that are not acknowledged yet
//! A record cannot name its own coordinate (the broker assigns it), and an earlier send that is
//! not acknowledged has no coordinate yet. How a stamp covers such sends depends on the
//! sender:
//! - **transactional** ([`CausalClock::transactional`]): the stamp carries an *in-flight claim*
//!   `(channel, seq)` for every other channel with unacknowledged sends. That is sound only
//!   because a commit flushes every send of the transaction before any becomes visible: when a
//!   receiver sees this record, the claimed sends are in the log below the channel's high
//!   watermark.
//! - **idempotent, not transactional** ([`CausalClock::new`]): no in-flight claims — an
//!   unacknowledged send may still be appended after this record is visible. Before a send to
//!   a *different* channel every earlier send must be acknowledged, so that its coordinate is
//!   in the clock; [`CausalClock::stamp`] refuses with [`Error::UnackedSends`] otherwise and the
//!   caller flushes and retries.
//!
//! Sends to the same channel need no claim in either mode: an idempotent producer appends them
//! in send order and a receiver delivers the records of one sender on one channel in that
//! order.
//!
//! # The target's own entry
//! A stamp never names the channel its record is sent to: every coordinate a sender knows on
//! a channel — delivered, consumed, learned or acknowledged — was appended before its next send
//! to that channel, since a partition's log only grows. The record's own coordinate is
//! therefore above that entry, a receiver reaches it only after every offset below it (the
//! gate delivers a channel in offset order), and delivering the record claims its coordinate,
//! which dominates the entry. Leaving the entry out loses nothing and saves a topic group
//! (about 20 bytes) on the stamp of every stage that writes where it wrote before.
//!
//! Requirements on the caller: the producer is idempotent (`enable.idempotence=true`, implied
//! by transactions); every send is reported back exactly once through [`CausalClock::acked`]
//! or [`CausalClock::failed`]; a transactional caller that aborts restores the clone it took
//! when the transaction began (the aborted coordinates must not stay claimed); the in-flight
//! claims of a record this node delivered are resolved or replaced by the caller (the gate
//! says how) and passed to [`CausalClock::learn`] as coordinates — they are never carried
//! forward.

use std::collections::VecDeque;

use crate::channel::{Channel, Coordinate};
use crate::clock::Clock;
use crate::codec;
use crate::error::{Error, Result};
use crate::sender::{SenderId, SenderTag};
use crate::stamp::{InFlight, Stamp};

/// The causal state of one sender: what it claims, its send sequence and its unacked sends.
#[derive(Clone, Debug)]
pub struct CausalClock {
    sender: SenderId,
    /// The sequence the next send gets; strictly increasing.
    next_seq: u64,
    /// May stamps carry in-flight claims?
    transactional: bool,
    /// Delivered or consumed coordinates, learned stamps and acknowledged own sends.
    clock: Clock,
    /// Unacknowledged sends per channel, sorted by channel; each channel's sequences
    /// ascending (sequences are allocated in increasing order and appended, and a
    /// channel's reports usually come in send order, so settling is a `pop_front`). A
    /// channel whose sends are all settled keeps its (empty) entry: the channels a sender
    /// writes to are few and come back.
    unacked: Vec<(Channel, VecDeque<u64>)>,
    /// Total of the sequences in `unacked`.
    unacked_count: usize,
    /// Reused by [`CausalClock::stamp_into`] for the in-flight claims of one stamp.
    scratch: Vec<InFlight>,
}

impl CausalClock {
    /// A new idempotent (non-transactional) sender with an empty clock, whose first send has
    /// sequence 0. Its stamps claim acknowledged sends only.
    pub fn new(sender: SenderId) -> Self {
        Self::resume(sender, 0, Clock::new(), false)
    }

    /// A new transactional sender with an empty clock: its stamps claim unacknowledged sends
    /// to other channels in flight.
    pub fn transactional(sender: SenderId) -> Self {
        Self::resume(sender, 0, Clock::new(), true)
    }

    /// Resumes a sender from committed state: its id, the sequence of its next send, its clock
    /// and whether it is transactional. Nothing is unacknowledged after a commit.
    pub fn resume(sender: SenderId, next_seq: u64, clock: Clock, transactional: bool) -> Self {
        CausalClock {
            sender,
            next_seq,
            transactional,
            clock,
            unacked: Vec::new(),
            unacked_count: 0,
            scratch: Vec::new(),
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

    /// `true` when stamps may carry in-flight claims.
    pub fn is_transactional(&self) -> bool {
        self.transactional
    }

    /// What this sender claims by coordinate now.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Number of sends not acknowledged or failed yet.
    pub fn unacked(&self) -> usize {
        self.unacked_count
    }

    /// The highest sequence such that it and every earlier send are acknowledged.
    pub fn acked_through(&self) -> Option<u64> {
        let first_unacked = self
            .unacked
            .iter()
            .filter_map(|(_, seqs)| seqs.front().copied())
            .min()
            .unwrap_or(self.next_seq);
        first_unacked.checked_sub(1)
    }

    /// The last unacknowledged send of every channel other than `target` that has one, in
    /// channel order: the in-flight claims of a send to `target`.
    fn claims_besides(&self, target: Channel) -> impl Iterator<Item = InFlight> + '_ {
        self.unacked
            .iter()
            .filter(move |(channel, _)| *channel != target)
            .filter_map(|(channel, seqs)| {
                seqs.back().map(|&seq| InFlight {
                    channel: *channel,
                    seq,
                })
            })
    }

    /// Unacknowledged sends to channels other than `target`.
    fn pending_besides(&self, target: Channel) -> usize {
        self.unacked
            .iter()
            .filter(|(channel, _)| *channel != target)
            .map(|(_, seqs)| seqs.len())
            .sum()
    }

    /// Counts send `seq` to `target` as unacknowledged (`seq` is the highest so far).
    fn add_unacked(&mut self, seq: u64, target: Channel) {
        let i = match self.unacked.binary_search_by(|(c, _)| c.cmp(&target)) {
            Ok(i) => i,
            Err(i) => {
                self.unacked.insert(i, (target, VecDeque::new()));
                i
            }
        };
        self.unacked[i].1.push_back(seq);
        self.unacked_count += 1;
    }

    /// Records that the record at `coordinate` was delivered to (or consumed by) this node,
    /// with its stamp if it carried one: the node now claims the coordinate and everything
    /// the stamp's clock claimed. The stamp's in-flight claims are *not* taken: pass their
    /// resolution to [`CausalClock::learn`].
    ///
    /// # Panics
    /// When `coordinate.offset` is negative (a Kafka record's offset never is).
    pub fn observe(&mut self, coordinate: Coordinate, stamp: Option<&Stamp>) {
        if let Some(s) = stamp {
            self.clock.merge(&s.clock);
        }
        self.clock.observe(coordinate);
    }

    /// Claims `coordinate` from now on (a replacement for an in-flight claim that this node
    /// did not resolve by its own delivery).
    ///
    /// # Errors
    /// [`Error::NegativeOffset`].
    pub fn learn(&mut self, coordinate: Coordinate) -> Result<()> {
        self.clock.try_observe(coordinate)
    }

    /// The stamp for the next send, to `target`; allocates its sequence number and counts the
    /// send as unacknowledged.
    ///
    /// The stamp's clock is the node's clock less its entry on `target`: the record's own
    /// coordinate supersedes it (see the module docs).
    ///
    /// # Errors
    /// [`Error::UnackedSends`] for a non-transactional sender with unacknowledged sends to
    /// other channels (see the module docs); nothing changes, flush and call again.
    pub fn stamp(&mut self, target: Channel) -> Result<Stamp> {
        let in_flight: Vec<InFlight> = self.claims_besides(target).collect();
        if !self.transactional && !in_flight.is_empty() {
            return Err(Error::UnackedSends {
                target,
                pending: self.pending_besides(target),
                first_pending: in_flight[0].channel,
            });
        }
        let seq = self.next_seq;
        let clock = codec::Entries::without(self.clock.entries(), target);
        let stamp = Stamp {
            sender: Some(SenderTag {
                sender: self.sender,
                seq,
            }),
            clock: Clock::from_sorted_unchecked(clock.to_vec()),
            in_flight,
            acked_through: self.acked_through(),
        };
        self.next_seq += 1;
        self.add_unacked(seq, target);
        Ok(stamp)
    }

    /// As [`CausalClock::stamp`], but appends the stamp's encoding (the stamp
    /// header value, [`crate::codec`]) to `out` instead of returning a [`Stamp`]: the node's
    /// clock is encoded in place, not copied. Returns the send's sender tag.
    ///
    /// # Errors
    /// As [`CausalClock::stamp`]; `out` is unchanged on error.
    pub fn stamp_into(&mut self, target: Channel, out: &mut Vec<u8>) -> Result<SenderTag> {
        let mut in_flight = std::mem::take(&mut self.scratch);
        in_flight.clear();
        in_flight.extend(self.claims_besides(target));
        if !self.transactional && !in_flight.is_empty() {
            let first_pending = in_flight[0].channel;
            self.scratch = in_flight;
            return Err(Error::UnackedSends {
                target,
                pending: self.pending_besides(target),
                first_pending,
            });
        }
        let tag = SenderTag {
            sender: self.sender,
            seq: self.next_seq,
        };
        codec::encode_parts(
            codec::Format::V2,
            Some(tag),
            self.acked_through(),
            codec::Entries::without(self.clock.entries(), target),
            &in_flight,
            out,
        );
        self.scratch = in_flight;
        self.next_seq += 1;
        self.add_unacked(tag.seq, target);
        Ok(tag)
    }

    /// Records the acknowledgement of send `seq`: the node now claims its coordinate.
    ///
    /// # Errors
    /// [`Error::NoSendOutstanding`] when `seq` is not an outstanding send to that channel, and
    /// [`Error::NegativeOffset`] for a negative offset; the clock is unchanged.
    pub fn acked(&mut self, seq: u64, coordinate: Coordinate) -> Result<()> {
        if coordinate.offset < 0 {
            return Err(Error::NegativeOffset {
                channel: coordinate.channel,
                offset: coordinate.offset,
            });
        }
        if !self.settle(seq, coordinate.channel) {
            return Err(Error::NoSendOutstanding {
                channel: coordinate.channel,
            });
        }
        self.clock.observe(coordinate);
        Ok(())
    }

    /// Records that send `seq` failed and was not appended.
    ///
    /// # Errors
    /// [`Error::NoSendOutstanding`] when `seq` is not outstanding.
    pub fn failed(&mut self, seq: u64, channel: Channel) -> Result<()> {
        if !self.settle(seq, channel) {
            return Err(Error::NoSendOutstanding { channel });
        }
        Ok(())
    }

    /// Removes send `seq` to `channel` from the unacknowledged sends; `false` (nothing
    /// changes) when it is not one.
    fn settle(&mut self, seq: u64, channel: Channel) -> bool {
        let Ok(i) = self.unacked.binary_search_by(|(c, _)| c.cmp(&channel)) else {
            return false;
        };
        let seqs = &mut self.unacked[i].1;
        if seqs.front() == Some(&seq) {
            seqs.pop_front();
        } else {
            // A report out of send order (a failed send settled early, say).
            let Ok(at) = seqs.binary_search(&seq) else {
                return false;
            };
            seqs.remove(at);
        }
        self.unacked_count -= 1;
        true
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
    fn a_stamp_leaves_out_the_channel_it_is_sent_to() {
        let (input, out0, out1) = (ch(1, 0), ch(2, 0), ch(2, 1));
        let mut c = CausalClock::transactional(SenderId::from_short([1; 8]));
        c.observe(input.at(10), None);
        let s = c.stamp(out0).unwrap();
        c.acked(s.sender.unwrap().seq, out0.at(100)).unwrap();
        let s = c.stamp(out1).unwrap();
        c.acked(s.sender.unwrap().seq, out1.at(200)).unwrap();
        // The node claims all three; a send to out0 names the other two, not out0.
        assert_eq!(c.clock().len(), 3);
        let to_out0 = c.stamp(out0).unwrap();
        assert_eq!(
            to_out0.clock.entries(),
            &[(input, 10), (out1, 200)],
            "out0's own entry is left out"
        );
        let mut bytes = Vec::new();
        let mut again = c.clone();
        again.stamp_into(input, &mut bytes).unwrap();
        let to_input = crate::codec::decode(&bytes).unwrap();
        assert_eq!(to_input.clock.entries(), &[(out0, 100), (out1, 200)]);
        // The node's own clock keeps every entry.
        assert_eq!(c.clock().len(), 3);
    }

    #[test]
    fn stamps_claim_observed_records_and_learned_stamps() {
        let mut cc = CausalClock::new(SenderId::from_bytes([7; 16]));
        let upstream: Clock = [ch(9, 0).at(40)].into_iter().collect();
        cc.observe(ch(1, 0).at(5), Some(&Stamp::new(None, upstream)));
        cc.learn(ch(8, 2).at(11)).unwrap();
        let s = cc.stamp(ch(2, 0)).unwrap();
        assert_eq!(s.sender.unwrap().seq, 0);
        assert!(s.clock.covers(ch(1, 0).at(5)));
        assert!(s.clock.covers(ch(9, 0).at(40)));
        assert!(s.clock.covers(ch(8, 2).at(11)));
        assert_eq!(s.acked_through, None);
        assert_eq!(cc.next_seq(), 1);
    }

    #[test]
    fn an_idempotent_sender_needs_acks_at_a_channel_switch() {
        let mut cc = CausalClock::new(SenderId::from_bytes([7; 16]));
        cc.stamp(ch(2, 0)).unwrap();
        cc.stamp(ch(2, 0)).unwrap();
        let err = cc.stamp(ch(3, 0)).unwrap_err();
        assert!(matches!(err, Error::UnackedSends { pending: 2, .. }));
        assert_eq!(cc.next_seq(), 2, "a refused stamp allocates nothing");
        cc.acked(0, ch(2, 0).at(10)).unwrap();
        assert!(cc.stamp(ch(3, 0)).is_err(), "one send still pending");
        cc.failed(1, ch(2, 0)).unwrap();
        let s = cc.stamp(ch(3, 0)).unwrap();
        assert!(s.clock.covers(ch(2, 0).at(10)), "the acked send is claimed");
        assert!(s.in_flight.is_empty());
        assert_eq!(s.sender.unwrap().seq, 2);
        assert_eq!(s.acked_through, Some(1));
    }

    #[test]
    fn a_transactional_sender_claims_unacked_sends_in_flight() {
        let mut cc = CausalClock::transactional(SenderId::from_bytes([7; 16]));
        cc.stamp(ch(2, 0)).unwrap(); // 0
        cc.stamp(ch(2, 0)).unwrap(); // 1
        cc.stamp(ch(4, 1)).unwrap(); // 2
        let s = cc.stamp(ch(3, 0)).unwrap(); // 3
        assert_eq!(
            s.in_flight,
            vec![
                InFlight {
                    channel: ch(2, 0),
                    seq: 1
                },
                InFlight {
                    channel: ch(4, 1),
                    seq: 2
                },
            ]
        );
        assert_eq!(s.acked_through, None);
        s.validate().unwrap();
        // Same-channel sends are not claimed in flight: per-sender order covers them.
        let s = cc.stamp(ch(2, 0)).unwrap(); // 4
        assert_eq!(s.in_flight.len(), 2, "claims channels 3/0 and 4/1, not 2/0");
        assert!(s.in_flight.iter().all(|c| c.channel != ch(2, 0)));
        // Acks turn claims into coordinates.
        cc.acked(0, ch(2, 0).at(7)).unwrap();
        cc.acked(1, ch(2, 0).at(8)).unwrap();
        let s = cc.stamp(ch(5, 0)).unwrap(); // 5
        assert_eq!(s.acked_through, Some(1));
        assert!(s.clock.covers(ch(2, 0).at(8)));
        assert_eq!(
            s.in_flight
                .iter()
                .map(|c| (c.channel, c.seq))
                .collect::<Vec<_>>(),
            vec![(ch(2, 0), 4), (ch(3, 0), 3), (ch(4, 1), 2)]
        );
        s.validate().unwrap();
    }

    /// `stamp_into` writes exactly the bytes of `encode(stamp(..))` and changes the sender the
    /// same way, over a history of sends, acks and failures on both kinds of sender.
    #[test]
    fn stamp_into_writes_the_encoding_of_stamp() {
        for transactional in [true, false] {
            let id = SenderId::from_bytes([7; 16]);
            let mut a = if transactional {
                CausalClock::transactional(id)
            } else {
                CausalClock::new(id)
            };
            a.observe(ch(1, 0).at(5), None);
            let mut b = a.clone();
            let mut buf = vec![0xAA]; // appended to, not overwritten
            let targets = [ch(2, 0), ch(2, 0), ch(4, 1), ch(3, 0), ch(2, 0)];
            for (i, &target) in targets.iter().enumerate() {
                let expected = a.stamp(target).map(|s| crate::codec::encode(&s));
                buf.truncate(1);
                let got = b.stamp_into(target, &mut buf);
                match expected {
                    Ok(bytes) => {
                        assert_eq!(
                            got.unwrap().seq,
                            i as u64 - u64::from(!transactional && i > 2)
                        );
                        assert_eq!(&buf[1..], &bytes[..], "send {i}");
                    }
                    Err(e) => {
                        assert_eq!(got.unwrap_err(), e);
                        assert_eq!(buf, [0xAA], "nothing written on error");
                        // The idempotent sender needs its acks before switching channel.
                        if i == 2 {
                            for c in [&mut a, &mut b] {
                                c.acked(0, ch(2, 0).at(10)).unwrap();
                                c.failed(1, ch(2, 0)).unwrap();
                            }
                        }
                    }
                }
                assert_eq!((a.next_seq(), a.unacked()), (b.next_seq(), b.unacked()));
                assert_eq!(a.acked_through(), b.acked_through());
            }
        }
    }

    /// What a sender's unacknowledged sends are, kept the plain way: sequence → channel.
    #[derive(Default)]
    struct Model {
        unacked: std::collections::BTreeMap<u64, Channel>,
        next_seq: u64,
    }

    impl Model {
        fn claims(&self, target: Channel) -> Vec<InFlight> {
            let mut last: std::collections::BTreeMap<Channel, u64> = Default::default();
            for (&seq, &c) in &self.unacked {
                if c != target {
                    last.insert(c, seq);
                }
            }
            last.into_iter()
                .map(|(channel, seq)| InFlight { channel, seq })
                .collect()
        }
    }

    proptest::proptest! {
        /// Over random sends, acknowledgements (in or out of send order, of existing and
        /// unknown sends) and failures, a transactional sender's in-flight claims, its
        /// acknowledged-through sequence, its count of unacknowledged sends and its answers
        /// to reports are those of the plain model.
        #[test]
        fn unacked_sends_follow_the_model(
            ops in proptest::collection::vec((0u8..4, 0u8..3, 0usize..8), 1..200)
        ) {
            let mut cc = CausalClock::transactional(SenderId::from_bytes([7; 16]));
            let mut model = Model::default();
            for (op, c, pick) in ops {
                let channel = ch(2 + c % 2, i32::from(c));
                match op {
                    0 | 1 => {
                        let expected = model.claims(channel);
                        let s = cc.stamp(channel).unwrap();
                        proptest::prop_assert_eq!(&s.in_flight, &expected);
                        proptest::prop_assert_eq!(s.sender.unwrap().seq, model.next_seq);
                        model.unacked.insert(model.next_seq, channel);
                        model.next_seq += 1;
                    }
                    _ => {
                        // An outstanding send (any of them, not only the oldest), or a
                        // sequence that is not one.
                        let seq = model
                            .unacked
                            .keys()
                            .nth(pick)
                            .copied()
                            .unwrap_or(model.next_seq + pick as u64);
                        let outstanding = model.unacked.get(&seq) == Some(&channel);
                        let answer = if op == 2 {
                            cc.acked(seq, channel.at(seq as i64))
                        } else {
                            cc.failed(seq, channel)
                        };
                        proptest::prop_assert_eq!(answer.is_ok(), outstanding);
                        if outstanding {
                            model.unacked.remove(&seq);
                        }
                    }
                }
                proptest::prop_assert_eq!(cc.unacked(), model.unacked.len());
                let first = model.unacked.keys().next().copied().unwrap_or(model.next_seq);
                proptest::prop_assert_eq!(cc.acked_through(), first.checked_sub(1));
            }
        }
    }

    #[test]
    fn reports_must_match_an_outstanding_send() {
        let mut cc = CausalClock::new(SenderId::from_bytes([7; 16]));
        assert!(matches!(
            cc.acked(0, ch(2, 0).at(1)),
            Err(Error::NoSendOutstanding { .. })
        ));
        cc.stamp(ch(2, 0)).unwrap();
        assert!(cc.acked(0, ch(3, 0).at(1)).is_err(), "wrong channel");
        assert!(cc.clock().is_empty());
    }
}
