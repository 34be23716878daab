//! The state of each channel a [`Gate`] consumes: the queue of fetched records ([`Slot`]s) in
//! offset order, the frontier, baseline and look-ahead set, the latest position and high
//! watermark read, the records watching the channel, and per-sender bookkeeping
//! ([`SenderState`], in a map hashed cheaply: sender ids are random).
//!
//! # Invariants, per consumed channel
//! - `frontier`: every offset `<= frontier` was delivered or is absent for this consumer; it
//!   never decreases;
//! - `queue`: fetched records with offsets above the frontier, ascending; its front is never a
//!   delivered record;
//! - `lookahead`: exactly the delivered offsets above the frontier;
//! - `undelivered` counts the queue's undelivered records, `spilled` those of them that are
//!   stubs; a tracked record is never a stub;
//! - per sender: the highest delivered sequence, and the fetched undelivered records by
//!   sequence (in offset order, since one sender's sends to one partition append in order).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use parsley_clock::{Channel, SenderId, SenderTag, Stamp};

use super::{Arrival, Awaiting, Refetch};
#[cfg(doc)]
use super::{Gate, Resolution};

pub(super) type Idx = usize;

/// A deliverable record: (timestamp, channel, offset), ordered as deliveries are.
pub(super) type ReadyKey = (i64, Idx, i64);

/// The deliverable records, smallest first. Most of the time one record at a time is ready (it
/// is delivered before the next arrives): it waits outside the heap until a second joins it.
/// Invariant: when `one` holds a record, `heap` is empty.
#[derive(Debug, Default)]
pub(super) struct Ready {
    one: Option<ReadyKey>,
    heap: BinaryHeap<Reverse<ReadyKey>>,
}

impl Ready {
    pub(super) fn push(&mut self, key: ReadyKey) {
        if self.heap.is_empty() {
            match self.one.take() {
                None => {
                    self.one = Some(key);
                    return;
                }
                Some(one) => self.heap.push(Reverse(one)),
            }
        }
        self.heap.push(Reverse(key));
    }

    /// The smallest ready record, taken out.
    pub(super) fn pop(&mut self) -> Option<ReadyKey> {
        self.one
            .take()
            .or_else(|| self.heap.pop().map(|Reverse(key)| key))
    }
}

/// Hashes a random UUID by its first 8 bytes (sender ids are random: no need for SipHash).
#[derive(Default)]
pub(super) struct SenderHasher(u64);

impl Hasher for SenderHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(b);
        }
    }
}

pub(super) type SenderMap<V> = HashMap<SenderId, V, BuildHasherDefault<SenderHasher>>;

#[derive(Debug, Default)]
pub(super) struct SenderState {
    /// Highest delivered (or discarded) sequence.
    pub(super) delivered: Option<u64>,
    /// Fetched, undelivered records: sequence → offset.
    pub(super) pending: BTreeMap<u64, i64>,
}

#[derive(Debug)]
pub(super) struct Slot<R> {
    pub(super) offset: i64,
    pub(super) timestamp: i64,
    pub(super) epoch: u64,
    pub(super) stamp: Option<Stamp>,
    /// `None` once delivered (a look-ahead tombstone) or while spilled.
    pub(super) payload: Option<R>,
    /// Spilled: undelivered, payload and stamp dropped until re-fetched.
    pub(super) spilled: bool,
    /// The stamp's sender tag, kept while spilled (to check the re-fetched record).
    pub(super) sender: Option<SenderTag>,
    /// Clock entries `[..cursor]` are satisfied for good.
    pub(super) cursor: usize,
    pub(super) waited: bool,
    /// Head of its queue or pulled by a claim: being checked.
    pub(super) tracked: bool,
    pub(super) ready: bool,
    /// Reported impossible, waiting for [`Gate::resolve`].
    pub(super) impossible: bool,
    /// Resolved with [`Resolution::Deliver`]: impossible claims are ignored.
    pub(super) allow_impossible: bool,
    pub(super) blocked: Option<Awaiting>,
}

#[derive(Debug)]
pub(super) struct ChannelState<R> {
    pub(super) channel: Channel,
    pub(super) baseline: Option<i64>,
    pub(super) frontier: i64,
    pub(super) queue: VecDeque<Slot<R>>,
    /// Undelivered records in `queue` (spilled ones included).
    pub(super) undelivered: usize,
    /// Spilled records in `queue`.
    pub(super) spilled: usize,
    /// While re-fetching spilled records.
    pub(super) refetch: Option<Refetch>,
    pub(super) lookahead: BTreeSet<i64>,
    pub(super) senders: SenderMap<SenderState>,
    /// The consumer's application position (next offset to return), latest reading.
    pub(super) position: Option<i64>,
    /// Latest high watermark reading and the poll epoch it was read after.
    pub(super) high_watermark: Option<(i64, u64)>,
    /// Tracked records (channel, offset) to re-check on any event on this channel.
    pub(super) watchers: Vec<(Idx, i64)>,
}

impl<R> Slot<R> {
    pub(super) fn new(a: Arrival<R>) -> Self {
        Slot {
            offset: a.offset,
            timestamp: a.timestamp,
            epoch: a.epoch,
            sender: a.stamp.as_ref().and_then(|st| st.sender),
            stamp: a.stamp,
            payload: Some(a.payload),
            spilled: false,
            cursor: 0,
            waited: false,
            tracked: false,
            ready: false,
            impossible: false,
            allow_impossible: false,
            blocked: None,
        }
    }

    pub(super) fn tombstone(a: Arrival<R>) -> Self {
        let mut s = Slot::new(a);
        s.payload = None;
        s.stamp = None;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_records_come_out_smallest_first_as_from_a_heap() {
        let mut ready = Ready::default();
        let mut reference = BinaryHeap::new();
        // Pushes and pops interleaved: one at a time, then several, then one again.
        let ops: [Option<ReadyKey>; 12] = [
            Some((5, 0, 1)),
            None,
            Some((3, 1, 7)),
            Some((3, 0, 9)),
            Some((9, 2, 2)),
            None,
            Some((1, 3, 4)),
            None,
            None,
            None,
            Some((2, 0, 2)),
            None,
        ];
        for op in ops {
            match op {
                Some(key) => {
                    ready.push(key);
                    reference.push(Reverse(key));
                }
                None => assert_eq!(ready.pop(), reference.pop().map(|Reverse(k)| k)),
            }
        }
        assert_eq!(ready.pop(), None);
        assert!(reference.is_empty());
    }
}
