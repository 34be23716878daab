//! Records held back by watermark alignment, kept instead of dropped.
//!
//! An input that runs ahead of the watermark is not read on: what the consumer returns of it
//! next is **held** here, in offset order, and not offered to its task until alignment lets the
//! input go on. Holding is what pausing the partition at the consumer would do — nothing of it
//! reaches the gate — without its cost: librdkafka drops a paused partition's prefetched records
//! and fetches them again on resume (as the Java consumer did before KAFKA-7548), which on a
//! history read in bursts cost a fetch round trip per pause. Only when an input's held records
//! reach [`HOLD_BYTES`] is its partition paused at the consumer as well, so what is held stays
//! bounded.
//!
//! Invariants, per channel: held records are in ascending offset order and above every record
//! of the channel offered to the gate; the consumer's position handed to the gate is at most the
//! first held offset (the gate never treats a held record as read past, so neither the frontier
//! nor a committed offset passes it); a channel's partition is paused at the consumer for what
//! it holds (`full`) from when its records reach [`HOLD_BYTES`] until it is released; a release
//! hands back all its records.
//!
//! So what one input ahead adds to its task's timer queue per release is bounded by the cap,
//! not by the drift: a release of an input whose records lie hours apart in event time would
//! otherwise go a drift's worth at a time, one stream-thread turn each (measured: a history
//! read 40 times slower).

use std::collections::{HashMap, VecDeque};

use parsley_clock::Channel;

use super::record::Fetched;

/// Most bytes held per input before its partition is paused at the consumer as well: twice
/// librdkafka's default most bytes of one partition in one fetch response
/// (`max.partition.fetch.bytes`, 1 MiB), so a held input takes in what the fetches already under
/// way bring. Counted as each record's key and value plus its fixed size in memory.
pub(crate) const HOLD_BYTES: usize = 2 << 20;

/// A record as the hold buffer counts it.
pub(crate) trait HeldRecord {
    /// Its offset.
    fn offset(&self) -> i64;
    /// The bytes it takes in memory.
    fn bytes(&self) -> usize;
}

impl HeldRecord for Fetched {
    fn offset(&self) -> i64 {
        self.arrival.offset
    }

    fn bytes(&self) -> usize {
        let p = &self.arrival.payload;
        std::mem::size_of::<Fetched>()
            + p.key.as_ref().map_or(0, Vec::len)
            + p.value.as_ref().map_or(0, Vec::len)
    }
}

/// One input's held records.
#[derive(Debug)]
struct Buffer<R> {
    records: VecDeque<R>,
    bytes: usize,
    /// Its partition is paused at the consumer too.
    full: bool,
}

/// What [`Held::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Held.
    Held,
    /// Held, and the input just reached [`HOLD_BYTES`]: pause its partition at the consumer.
    Full,
}

/// The held records of every input held now.
#[derive(Debug)]
pub(crate) struct Held<R> {
    buffers: HashMap<Channel, Buffer<R>>,
    cap: usize,
}

impl<R: HeldRecord> Held<R> {
    /// No record held; at most `cap` bytes per input before its partition is paused.
    pub(crate) fn new(cap: usize) -> Self {
        Held {
            buffers: HashMap::new(),
            cap,
        }
    }

    /// Holds `record` of `channel` (it comes after every record held of it).
    pub(crate) fn push(&mut self, channel: Channel, record: R) -> Pushed {
        let b = self.buffers.entry(channel).or_insert_with(|| Buffer {
            records: VecDeque::new(),
            bytes: 0,
            full: false,
        });
        debug_assert!(
            b.records
                .back()
                .is_none_or(|r| r.offset() < record.offset())
        );
        b.bytes += record.bytes();
        b.records.push_back(record);
        if !b.full && b.bytes >= self.cap {
            b.full = true;
            Pushed::Full
        } else {
            Pushed::Held
        }
    }

    /// Hands back every record held of `channel`, in offset order, and whether its partition
    /// was paused at the consumer for them (resume it).
    pub(crate) fn release(&mut self, channel: &Channel) -> (VecDeque<R>, bool) {
        self.buffers
            .remove(channel)
            .map_or((VecDeque::new(), false), |b| (b.records, b.full))
    }

    /// The offset of the first record held of `channel`, if any.
    pub(crate) fn first(&self, channel: &Channel) -> Option<i64> {
        self.buffers.get(channel)?.records.front().map(R::offset)
    }

    /// `true` when `channel`'s partition is paused at the consumer for what it holds.
    pub(crate) fn is_full(&self, channel: &Channel) -> bool {
        self.buffers.get(channel).is_some_and(|b| b.full)
    }

    /// Forgets the records of `channel` at or above `offset` (the consumer reads them again
    /// from there after a seek); returns how many.
    pub(crate) fn forget_from(&mut self, channel: &Channel, offset: i64) -> usize {
        let Some(b) = self.buffers.get_mut(channel) else {
            return 0;
        };
        let keep = b.records.partition_point(|r| r.offset() < offset);
        let forgotten = b.records.len() - keep;
        for r in b.records.drain(keep..) {
            b.bytes -= r.bytes();
        }
        forgotten
    }

    /// Forgets every held record (they are read again from the committed offsets); returns the
    /// channels whose partitions were paused at the consumer for what they held.
    pub(crate) fn clear(&mut self) -> Vec<Channel> {
        let full = self
            .buffers
            .iter()
            .filter(|(_, b)| b.full)
            .map(|(c, _)| *c)
            .collect();
        self.buffers.clear();
        full
    }

    /// Records of `channel` held now.
    pub(crate) fn len_of(&self, channel: &Channel) -> usize {
        self.buffers.get(channel).map_or(0, |b| b.records.len())
    }

    /// Records held now, over every input.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buffers.values().map(|b| b.records.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use parsley_clock::TopicId;

    use super::*;

    /// A record at an offset, 100 bytes.
    #[derive(Debug, PartialEq)]
    struct Rec(i64);

    impl HeldRecord for Rec {
        fn offset(&self) -> i64 {
            self.0
        }
        fn bytes(&self) -> usize {
            100
        }
    }

    fn ch(p: i32) -> Channel {
        Channel::new(TopicId::from_halves(1, 1), p)
    }

    fn offsets(records: VecDeque<Rec>) -> Vec<i64> {
        records.into_iter().map(|r| r.0).collect()
    }

    #[test]
    fn an_input_is_paused_once_when_it_reaches_the_cap_and_released_in_offset_order() {
        let mut held = Held::new(300);
        assert_eq!(held.push(ch(0), Rec(5)), Pushed::Held);
        assert_eq!(held.push(ch(0), Rec(6)), Pushed::Held);
        assert_eq!(held.push(ch(1), Rec(9)), Pushed::Held);
        assert!(!held.is_full(&ch(0)));
        // 300 bytes on channel 0: pause it now, and only now.
        assert_eq!(held.push(ch(0), Rec(8)), Pushed::Full);
        assert_eq!(held.push(ch(0), Rec(10)), Pushed::Held);
        assert!(held.is_full(&ch(0)));
        assert!(!held.is_full(&ch(1)));
        assert_eq!(held.first(&ch(0)), Some(5));
        assert_eq!(held.len(), 5);
        assert_eq!((held.len_of(&ch(0)), held.len_of(&ch(1))), (4, 1));
        let (records, full) = held.release(&ch(0));
        assert!(full);
        assert_eq!(offsets(records), vec![5, 6, 8, 10]);
        assert_eq!(held.first(&ch(0)), None);
        assert!(!held.is_full(&ch(0)));
        let (records, full) = held.release(&ch(1));
        assert!(!full);
        assert_eq!(offsets(records), vec![9]);
        assert_eq!(held.release(&ch(1)), (VecDeque::new(), false));
    }

    #[test]
    fn a_seek_forgets_what_is_read_again_and_keeps_what_lies_below() {
        let mut held = Held::new(1_000);
        for o in [3, 4, 7, 9] {
            held.push(ch(0), Rec(o));
        }
        assert_eq!(held.forget_from(&ch(0), 5), 2);
        assert_eq!(held.forget_from(&ch(1), 0), 0);
        assert_eq!(held.first(&ch(0)), Some(3));
        // What was forgotten no longer counts: 2 records, 200 bytes, 8 more reach the cap.
        for o in 5..12 {
            assert_eq!(held.push(ch(0), Rec(o)), Pushed::Held);
        }
        assert_eq!(held.push(ch(0), Rec(12)), Pushed::Full);
        assert_eq!(held.forget_from(&ch(0), 0), 10);
        assert_eq!(held.first(&ch(0)), None);
    }

    #[test]
    fn clearing_names_the_inputs_paused_at_the_consumer() {
        let mut held = Held::new(150);
        held.push(ch(0), Rec(1));
        held.push(ch(0), Rec(2));
        held.push(ch(1), Rec(1));
        assert_eq!(held.clear(), vec![ch(0)]);
        assert_eq!(held.len(), 0);
        assert!(!held.is_full(&ch(0)));
    }
}
