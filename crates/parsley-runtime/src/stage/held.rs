//! Records held back by watermark alignment (module `alignment`), kept instead of dropped.
//!
//! A record of an input whose event time lies beyond the input's bound (the watermark plus the
//! limit) is **held** here, in offset order, with every later record of the input, and not
//! offered to its task until the bound reaches it. Holding is what pausing the partition at the
//! consumer would do — nothing of it reaches the gate — without its cost: librdkafka drops a
//! paused partition's prefetched records and fetches them again on resume (as the Java consumer
//! did before KAFKA-7548), which on a history read in bursts cost a fetch round trip per pause.
//! Only when an input's held records reach [`HOLD_BYTES`] is its partition paused at the
//! consumer as well, and resumed once they are down to half of that, so what is held stays
//! bounded.
//!
//! Invariants, per channel: held records are in ascending offset order and above every record
//! of the channel offered to the gate; the consumer's position handed to the gate is at most the
//! first held offset (the gate never treats a held record as read past, so neither the frontier
//! nor a committed offset passes it); a channel's partition is paused at the consumer for what
//! it holds (`full`) from when its records reach [`HOLD_BYTES`] until they are down to half of
//! it; a release hands back a prefix of its records.
//!
//! So what one input adds to its task's timer queue is bounded by the limit's worth of its event
//! time, not by how far it runs ahead: the records beyond the bound wait here, before the gate,
//! where nothing of them is changelogged.

use std::collections::VecDeque;

use parsley_clock::Channel;

use parsley_task::ChannelMap;
use parsley_task::record::Fetched;

/// Most bytes of one partition in one fetch response (`max.partition.fetch.bytes`, bytes on
/// the wire, compressed) for a stage with watermark alignment: 256 KiB instead of librdkafka's
/// 1 MiB. A response brings a run of one partition's records, and on a history that run covers
/// far more event time than the drift — at 10x the experiment's history a partition's whole
/// week is about 1.3 MiB compressed, so a 1 MiB run spans about five days — and nearly all of
/// it is held; a smaller run holds less at a time at the same pace.
pub(crate) const ALIGNED_PARTITION_FETCH_BYTES: &str = "262144";

/// Most bytes held per input before its partition is paused at the consumer as well, counted
/// as each record's key and value plus its fixed size in memory. Each pause drops what
/// librdkafka prefetched of the partition, fetched again on resume: with 1 MiB fetches, a cap
/// of 2 MiB fetched the experiment's history at 10x six times over (14 million records for 2.4
/// million), and at 100x (24 million records, 36 inputs) the aligned drain took 34.2 s at
/// 4 MiB, 25.8 s at 8 MiB and 25.7 s at 16 MiB, peaking at 423, 473 and 742 MiB. With
/// [`ALIGNED_PARTITION_FETCH_BYTES`] and this cap the same drain took 25.2 s at 209 MiB (26.6 s
/// at 462 MiB with 1 MiB fetches and 8 MiB, run beside it).
pub(crate) const HOLD_BYTES: usize = 2 << 20;

/// A record as the hold buffer counts it.
pub(crate) trait HeldRecord {
    /// Its offset.
    fn offset(&self) -> i64;
    /// The bytes it takes in memory.
    fn bytes(&self) -> usize;
    /// Its event time (its timestamp), ms since the epoch.
    fn event_time(&self) -> i64;
}

impl HeldRecord for Box<Fetched> {
    fn offset(&self) -> i64 {
        self.arrival.offset
    }

    fn bytes(&self) -> usize {
        let p = &self.arrival.payload;
        std::mem::size_of::<Fetched>()
            + p.key.as_ref().map_or(0, Vec::len)
            + p.value.as_ref().map_or(0, Vec::len)
    }

    fn event_time(&self) -> i64 {
        self.arrival.timestamp
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

impl<R> Default for Buffer<R> {
    fn default() -> Self {
        Buffer {
            records: VecDeque::new(),
            bytes: 0,
            full: false,
        }
    }
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
    buffers: ChannelMap<Buffer<R>>,
    cap: usize,
}

impl<R: HeldRecord> Held<R> {
    /// No record held; at most `cap` bytes per input before its partition is paused.
    pub(crate) fn new(cap: usize) -> Self {
        Held {
            buffers: ChannelMap::default(),
            cap,
        }
    }

    /// Holds `record` of `channel` (it comes after every record held of it).
    pub(crate) fn push(&mut self, channel: Channel, record: R) -> Pushed {
        let b = self.buffers.entry(channel).or_default();
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

    /// Hands back the records held of `channel` that may go on, in offset order: those before
    /// the first whose event time lies above `up_to`, and with `at_least_one` the first
    /// whatever its event time; and whether its partition, paused at the consumer for what it
    /// held, may be resumed (what it holds is down to half the cap). The channel's buffer keeps
    /// its capacity for what it holds next.
    pub(crate) fn release(
        &mut self,
        channel: &Channel,
        up_to: i64,
        at_least_one: bool,
    ) -> (std::collections::vec_deque::Drain<'_, R>, bool) {
        let b = self.buffers.entry(*channel).or_default();
        let mut n = b
            .records
            .iter()
            .position(|r| r.event_time() > up_to)
            .unwrap_or(b.records.len());
        if n == 0 && at_least_one && !b.records.is_empty() {
            n = 1;
        }
        b.bytes -= b.records.range(..n).map(R::bytes).sum::<usize>();
        let resume = b.full && b.bytes <= self.cap / 2;
        if resume {
            b.full = false;
        }
        (b.records.drain(..n), resume)
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

    /// The bytes held now over every input, as [`HeldRecord::bytes`] counts them.
    pub(crate) fn bytes(&self) -> usize {
        self.buffers.values().map(|b| b.bytes).sum()
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

    /// A record at an offset, 100 bytes, its event time 1,000 times its offset.
    #[derive(Debug, PartialEq)]
    struct Rec(i64);

    impl HeldRecord for Rec {
        fn offset(&self) -> i64 {
            self.0
        }
        fn bytes(&self) -> usize {
            100
        }
        fn event_time(&self) -> i64 {
            self.0 * 1_000
        }
    }

    fn ch(p: i32) -> Channel {
        Channel::new(TopicId::from_halves(1, 1), p)
    }

    fn offsets(records: impl IntoIterator<Item = Rec>) -> Vec<i64> {
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
        assert_eq!(
            held.bytes(),
            500,
            "what the memory bound counts, over every input"
        );
        let (records, full) = held.release(&ch(0), i64::MAX, false);
        assert!(full);
        assert_eq!(offsets(records), vec![5, 6, 8, 10]);
        assert_eq!(held.bytes(), 100);
        assert_eq!(held.first(&ch(0)), None);
        assert!(!held.is_full(&ch(0)));
        let (records, full) = held.release(&ch(1), i64::MAX, false);
        assert!(!full);
        assert_eq!(offsets(records), vec![9]);
        let (records, full) = held.release(&ch(1), i64::MAX, true);
        assert_eq!((records.count(), full), (0, false));
    }

    /// A record at an offset with an event time, 100 bytes.
    #[derive(Debug, PartialEq)]
    struct Timed(i64, i64);

    impl HeldRecord for Timed {
        fn offset(&self) -> i64 {
            self.0
        }
        fn bytes(&self) -> usize {
            100
        }
        fn event_time(&self) -> i64 {
            self.1
        }
    }

    fn timed_offsets(records: impl IntoIterator<Item = Timed>) -> Vec<i64> {
        records.into_iter().map(|r| r.0).collect()
    }

    #[test]
    fn a_release_hands_back_the_prefix_up_to_the_bound_and_resumes_at_half_the_cap() {
        let mut held = Held::new(400);
        for (offset, ms) in [(1, 1_000), (2, 2_000), (3, 5_000), (4, 3_000), (5, 9_000)] {
            held.push(ch(0), Timed(offset, ms));
        }
        assert!(held.is_full(&ch(0)));
        // Up to 2,999 ms: offsets 1 and 2; 3 (5,000 ms) stops the prefix, 4 behind it waits.
        let (records, resume) = held.release(&ch(0), 2_999, false);
        assert_eq!(timed_offsets(records), vec![1, 2]);
        // 300 bytes left, above half the cap: still paused.
        assert!(!resume);
        assert!(held.is_full(&ch(0)));
        assert_eq!(held.first(&ch(0)), Some(3));
        // Nothing below the bound: nothing, unless at least one is asked for.
        let (records, _) = held.release(&ch(0), 2_999, false);
        assert_eq!(records.count(), 0);
        let (records, resume) = held.release(&ch(0), 2_999, true);
        assert_eq!(timed_offsets(records), vec![3]);
        // 200 bytes left, half the cap: resume.
        assert!(resume);
        assert!(!held.is_full(&ch(0)));
        let (records, resume) = held.release(&ch(0), 9_000, false);
        assert_eq!(timed_offsets(records), vec![4, 5]);
        assert!(!resume);
        assert_eq!(held.len_of(&ch(0)), 0);
        assert_eq!(held.first(&ch(0)), None);
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
