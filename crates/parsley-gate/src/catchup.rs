//! The catch-up tracker: when has a task read the history that existed when it started?
//!
//! # The rule (the book's specification, §5)
//! At task start, before reading, the runtime reads the **startup end** of every input channel:
//! its high watermark, from ListOffsets(LATEST) with `READ_UNCOMMITTED` isolation — not the
//! LSO, because committed history can sit above the first offset of a transaction that is
//! still open, and declaring the channel caught up at the LSO would let that history arrive
//! late. A channel is **caught up** once its frontier reaches the startup end:
//!
//! ```text
//! caught_up(c)  ⇔  startup_end(c) is known  ∧  F[c] + 1 >= startup_end(c)
//! ```
//!
//! and a topic is caught up only when **every** one of its channels (of this task) is.
//!
//! # Why the frontier, and not a record offset or a position
//! - The last returned record's offset never reaches the end when the log ends with a commit
//!   marker (case C02, FLINK-34470): `T(r0,r1,r2)+C` has its marker at 3 and end offset 4, and
//!   the consumer never returns offset 3. The gate's frontier covers markers by *position
//!   advance* ([`Gate::position`](crate::Gate::position)), so `F + 1` reaches 4.
//! - A look-ahead delivery leaves the frontier unchanged, so it cannot declare a channel caught
//!   up while earlier records are still causally blocked.
//! - The consumer's position alone would have the same fault: it passes records that were
//!   fetched but are still held by the gate.
//!
//! The frontier is therefore the only evidence this tracker takes: the runtime passes
//! [`Gate::frontier`](crate::Gate::frontier) after each batch of gate events
//! ([`CatchUp::frontier`], or [`CatchUp::follow`] for every channel at once).
//!
//! # Invariants, per input channel
//! - `startup_end` is the high watermark read at the latest [`CatchUp::start`] (`>= 0`);
//!   `None` until then: a channel whose end is unknown is **not** caught up (like an unseeded
//!   channel in the gate, it is never ignored);
//! - `frontier` never decreases; `-1` (claims nothing) until the first reading;
//! - caught up is therefore sticky between two `start` calls.
//!
//! # Restarts
//! Nothing here is persisted. A restarted task builds a fresh tracker, reads fresh end offsets
//! with [`CatchUp::start`] and passes the frontier restored from the gate's snapshot: a channel
//! whose committed frontier already reaches the fresh end is caught up at once, and a channel
//! mid-history waits only for the offsets between its frontier and the fresh end, never for the
//! data it processed before the restart.
//!
//! The rule is the book's specification, §5 ("Caught up"); cases C01, C02, C14.

use parsley_clock::{Channel, TopicId};

use crate::error::GateError;
use crate::gate::Gate;

/// What the tracker knows about one input channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelProgress {
    /// The channel.
    pub channel: Channel,
    /// The high watermark read at task start (an offset, `>= 0`); `None` before
    /// [`CatchUp::start`].
    pub startup_end: Option<i64>,
    /// The gate's frontier: every offset `<= frontier` is delivered or absent; `-1` before the
    /// first reading.
    pub frontier: i64,
}

impl ChannelProgress {
    /// `true` once the frontier reaches the startup end: `frontier + 1 >= startup_end`.
    pub fn caught_up(&self) -> bool {
        self.startup_end.is_some_and(|end| self.frontier + 1 >= end)
    }

    /// Offsets between the first undelivered offset and the startup end (records, commit
    /// markers and aborted records alike): `0` when caught up, `None` before
    /// [`CatchUp::start`]. A channel that stays above zero with nothing fetched is waiting for
    /// an open transaction to resolve (the book's specification, §5: show it, do not guess).
    pub fn remaining(&self) -> Option<i64> {
        self.startup_end
            .map(|end| end.saturating_sub(self.frontier + 1).max(0))
    }
}

/// Tracks, per input channel of one task, whether the history that existed at task start has
/// been read (module docs: the rule and why it uses the frontier).
///
/// Cost: channels are kept sorted; every operation on one channel is a binary search
/// (`O(log n)`), [`CatchUp::topic_caught_up`] and [`CatchUp::all_caught_up`] are `O(n)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchUp {
    /// Sorted by channel, no duplicates.
    pub(crate) channels: Vec<ChannelProgress>,
}

impl CatchUp {
    /// A tracker for the task's input channels (partition `p` of every source topic, whether or
    /// not they are assigned yet). Duplicates are ignored. Every channel starts with an unknown
    /// end, so nothing is caught up before [`CatchUp::start`].
    pub fn new(inputs: impl IntoIterator<Item = Channel>) -> Self {
        let mut list: Vec<Channel> = inputs.into_iter().collect();
        list.sort();
        list.dedup();
        CatchUp {
            channels: list
                .into_iter()
                .map(|channel| ChannelProgress {
                    channel,
                    startup_end: None,
                    frontier: -1,
                })
                .collect(),
        }
    }

    pub(crate) fn index(&self, channel: &Channel) -> Result<usize, GateError> {
        self.channels
            .binary_search_by(|s| s.channel.cmp(channel))
            .map_err(|_| GateError::NotConsumed { channel: *channel })
    }

    /// Records the startup end of `channel`: its high watermark (an offset, the next offset to
    /// be written, open transactions included) read with ListOffsets(LATEST,
    /// `READ_UNCOMMITTED`) when the channel is assigned to the task, before reading. A second
    /// call (a reassignment without a restart) replaces the end with the fresh reading; caught
    /// up is then judged against it.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`] for a channel outside the inputs,
    /// [`GateError::NegativeEndOffset`] for an end below zero (a librdkafka sentinel such as
    /// `-1001` passed through by mistake).
    pub fn start(&mut self, channel: Channel, end_offset: i64) -> Result<(), GateError> {
        let i = self.index(&channel)?;
        if end_offset < 0 {
            return Err(GateError::NegativeEndOffset {
                channel,
                end_offset,
            });
        }
        self.channels[i].startup_end = Some(end_offset);
        Ok(())
    }

    /// Records the gate's frontier of `channel` ([`Gate::frontier`]): every offset
    /// `<= frontier` is delivered or proven absent. Pass it after each batch of gate events
    /// (deliveries and [`Gate::position`] calls); a position read after the poll that consumed a
    /// trailing commit marker moves the gate's frontier over the marker, and so makes the
    /// channel caught up here.
    ///
    /// # Errors
    /// [`GateError::NotConsumed`]; [`GateError::FrontierBehind`] when `frontier` is below the
    /// previous reading (a frontier never decreases; a restarted task builds a new tracker).
    pub fn frontier(&mut self, channel: Channel, frontier: i64) -> Result<(), GateError> {
        let i = self.index(&channel)?;
        let s = &mut self.channels[i];
        if frontier < s.frontier {
            return Err(GateError::FrontierBehind {
                channel,
                frontier,
                previous: s.frontier,
            });
        }
        s.frontier = frontier;
        Ok(())
    }

    /// Reads the frontier of every input channel that `gate` has seeded (a convenience over
    /// [`CatchUp::frontier`]). Channels the gate does not consume are left alone.
    ///
    /// # Errors
    /// [`GateError::FrontierBehind`] as for [`CatchUp::frontier`] (a tracker paired with a gate
    /// restored from an older snapshot).
    pub fn follow<R>(&mut self, gate: &Gate<R>) -> Result<(), GateError> {
        for i in 0..self.channels.len() {
            let channel = self.channels[i].channel;
            if let Some(f) = gate.frontier(&channel) {
                self.frontier(channel, f)?;
            }
        }
        Ok(())
    }

    /// `true` when `channel` is one of the tracked inputs.
    pub fn tracks(&self, channel: &Channel) -> bool {
        self.index(channel).is_ok()
    }

    /// The tracked input channels, sorted.
    pub fn inputs(&self) -> impl ExactSizeIterator<Item = Channel> + '_ {
        self.channels.iter().map(|s| s.channel)
    }

    /// What the tracker knows about `channel`; `None` when it is not an input.
    pub fn progress(&self, channel: &Channel) -> Option<ChannelProgress> {
        self.index(channel).ok().map(|i| self.channels[i])
    }

    /// `true` when `channel` is caught up: its startup end is known and `F + 1 >=
    /// startup_end`. `false` for a channel that is not an input.
    pub fn caught_up(&self, channel: &Channel) -> bool {
        self.progress(channel).is_some_and(|p| p.caught_up())
    }

    /// `true` when every input channel of `topic` is caught up. `false` when no input channel
    /// belongs to `topic` (an empty set proves nothing).
    pub fn topic_caught_up(&self, topic: TopicId) -> bool {
        let mut any = false;
        for p in self.channels.iter().filter(|p| p.channel.topic == topic) {
            if !p.caught_up() {
                return false;
            }
            any = true;
        }
        any
    }

    /// `true` when every input channel is caught up (also for a tracker with no inputs).
    pub fn all_caught_up(&self) -> bool {
        self.channels.iter().all(ChannelProgress::caught_up)
    }

    /// The input channels not caught up yet, with what is known about them (for the progress
    /// metric and the log line that names a channel waiting on an open transaction).
    pub fn waiting(&self) -> impl Iterator<Item = ChannelProgress> + '_ {
        self.channels.iter().filter(|p| !p.caught_up()).copied()
    }
}

#[cfg(test)]
mod tests {
    use parsley_clock::TopicId;

    use super::*;
    use crate::Arrival;

    fn ch(t: u8, p: i32) -> Channel {
        Channel::new(TopicId::from_bytes([t; 16]), p)
    }

    fn plain(offset: i64) -> Arrival<i64> {
        Arrival {
            offset,
            timestamp: 0,
            epoch: 1,
            stamp: None,
            payload: offset,
        }
    }

    #[test]
    fn nothing_is_caught_up_before_its_end_offset_is_known() {
        let (a, b) = (ch(1, 0), ch(1, 1));
        let mut t = CatchUp::new([a, b]);
        t.frontier(a, 1_000).unwrap();
        assert!(
            !t.caught_up(&a),
            "a frontier without a startup end proves nothing"
        );
        assert!(!t.all_caught_up());
        t.start(a, 1_000).unwrap();
        assert!(t.caught_up(&a));
        assert!(!t.all_caught_up(), "b has no startup end yet");
        assert_eq!(t.waiting().map(|p| p.channel).collect::<Vec<_>>(), vec![b]);
    }

    #[test]
    fn a_partition_empty_at_startup_is_caught_up_at_once() {
        // C14: end offset 0, nothing ever fetched, no frontier reading at all.
        let (empty, full) = (ch(1, 0), ch(1, 1));
        let mut t = CatchUp::new([empty, full]);
        t.start(empty, 0).unwrap();
        t.start(full, 101).unwrap();
        assert!(t.caught_up(&empty));
        assert_eq!(t.progress(&empty).unwrap().remaining(), Some(0));
        assert!(!t.caught_up(&full));
        assert_eq!(t.progress(&full).unwrap().remaining(), Some(101));
        // Seeded by the gate at position 0: F = -1, still caught up.
        t.frontier(empty, -1).unwrap();
        assert!(t.caught_up(&empty));
    }

    #[test]
    fn a_partition_emptied_by_retention_is_caught_up_once_seeded() {
        // Log start 100 = end 100: seeded at position 100, F = 99.
        let c = ch(1, 0);
        let mut t = CatchUp::new([c]);
        t.start(c, 100).unwrap();
        assert!(!t.caught_up(&c));
        t.frontier(c, 99).unwrap();
        assert!(t.caught_up(&c));
    }

    #[test]
    fn c02_a_log_ending_on_a_commit_marker_is_caught_up_by_the_position() {
        // T(r0,r1,r2)+C: records 0..=2, marker at 3, high watermark 4. Driven through the gate.
        let c = ch(1, 0);
        let mut gate: Gate<i64> = Gate::new([c]);
        gate.seed(c, 0).unwrap();
        let mut t = CatchUp::new([c]);
        t.start(c, 4).unwrap();
        for o in 0..3 {
            gate.offer(c, plain(o)).unwrap();
        }
        while gate.next_delivery().is_some() {}
        t.follow(&gate).unwrap();
        // The last returned record is 2: "offset + 1 >= end" would wait here for ever.
        assert_eq!(gate.frontier(&c), Some(2));
        assert!(!t.caught_up(&c));
        assert_eq!(t.progress(&c).unwrap().remaining(), Some(1));
        // The poll that consumed the marker moved the position to 4.
        gate.position(c, 4).unwrap();
        t.follow(&gate).unwrap();
        assert!(t.caught_up(&c));
        assert_eq!(t.progress(&c).unwrap().remaining(), Some(0));
    }

    #[test]
    fn a_look_ahead_delivery_does_not_make_a_channel_caught_up() {
        // The frontier stays below a look-ahead delivery: the tracker sees only the frontier.
        let c = ch(1, 0);
        let mut t = CatchUp::new([c]);
        t.start(c, 5).unwrap();
        t.frontier(c, 1).unwrap(); // 0..=1 delivered, 4 delivered ahead of blocked 2 and 3
        assert!(!t.caught_up(&c));
        t.frontier(c, 4).unwrap();
        assert!(t.caught_up(&c));
    }

    #[test]
    fn an_open_transaction_above_the_lso_keeps_the_channel_waiting() {
        // Committed history at 0..=9; a transaction opened at 10 and still open; its records
        // at 10..=14. The high watermark is 15 (the LSO would be 10).
        let c = ch(1, 0);
        let mut t = CatchUp::new([c]);
        t.start(c, 15).unwrap();
        t.frontier(c, 9).unwrap();
        assert!(!t.caught_up(&c), "the LSO is not the startup end");
        assert_eq!(t.waiting().next().unwrap().remaining(), Some(5));
        t.frontier(c, 15).unwrap(); // committed: records and marker at 15 read
        assert!(t.caught_up(&c));
    }

    #[test]
    fn a_restart_mid_history_reads_fresh_ends_and_keeps_what_was_processed() {
        let (done, mid) = (ch(1, 0), ch(1, 1));
        // Before the crash: ends 100 and 100, `done` read to 99, `mid` to 59.
        // After the restart: fresh ends 100 (nothing new) and 130 (30 live records), and the
        // frontiers restored from the gate's snapshot.
        let mut t = CatchUp::new([done, mid]);
        t.start(done, 100).unwrap();
        t.start(mid, 130).unwrap();
        t.frontier(done, 99).unwrap();
        t.frontier(mid, 59).unwrap();
        assert!(
            t.caught_up(&done),
            "no wait for data processed before the restart"
        );
        assert!(!t.caught_up(&mid));
        assert_eq!(t.progress(&mid).unwrap().remaining(), Some(70));
        t.frontier(mid, 99).unwrap();
        assert!(!t.caught_up(&mid), "the fresh end counts, not the old one");
        t.frontier(mid, 129).unwrap();
        assert!(t.caught_up(&mid));
        assert!(t.all_caught_up());
    }

    #[test]
    fn a_restart_through_a_restored_gate_is_caught_up_without_reading() {
        let c = ch(1, 0);
        let mut gate: Gate<i64> = Gate::new([c]);
        gate.seed(c, 0).unwrap();
        for o in 0..10 {
            gate.offer(c, plain(o)).unwrap();
        }
        while gate.next_delivery().is_some() {}
        let restored: Gate<i64> = Gate::restore([c], &gate.snapshot()).unwrap();
        let mut t = CatchUp::new([c]);
        t.start(c, 10).unwrap();
        t.follow(&restored).unwrap();
        assert!(t.caught_up(&c));
    }

    #[test]
    fn a_topic_is_caught_up_only_when_every_channel_is() {
        let (t1, t2) = (TopicId::from_bytes([1; 16]), TopicId::from_bytes([2; 16]));
        let (a0, a1, b0) = (
            Channel::new(t1, 0),
            Channel::new(t1, 1),
            Channel::new(t2, 0),
        );
        let mut t = CatchUp::new([a0, a1, b0]);
        for c in [a0, a1, b0] {
            t.start(c, 10).unwrap();
        }
        t.frontier(a0, 9).unwrap();
        assert!(!t.topic_caught_up(t1), "a1 is behind");
        assert!(!t.topic_caught_up(t2));
        t.frontier(a1, 9).unwrap();
        assert!(t.topic_caught_up(t1));
        assert!(!t.all_caught_up());
        assert!(
            !t.topic_caught_up(TopicId::from_bytes([3; 16])),
            "a topic with no input channel is not caught up"
        );
        t.frontier(b0, 9).unwrap();
        assert!(t.all_caught_up());
    }

    #[test]
    fn bad_evidence_is_refused() {
        let (c, other) = (ch(1, 0), ch(9, 0));
        let mut t = CatchUp::new([c]);
        assert_eq!(
            t.start(other, 3),
            Err(GateError::NotConsumed { channel: other })
        );
        assert_eq!(
            t.start(c, -1001),
            Err(GateError::NegativeEndOffset {
                channel: c,
                end_offset: -1001
            })
        );
        t.frontier(c, 5).unwrap();
        assert_eq!(
            t.frontier(c, 4),
            Err(GateError::FrontierBehind {
                channel: c,
                frontier: 4,
                previous: 5
            })
        );
        assert_eq!(
            t.progress(&c).unwrap().frontier,
            5,
            "a refused reading changes nothing"
        );
    }

    #[test]
    fn a_fresh_start_replaces_the_end() {
        let c = ch(1, 0);
        let mut t = CatchUp::new([c]);
        t.start(c, 10).unwrap();
        t.frontier(c, 9).unwrap();
        assert!(t.caught_up(&c));
        t.start(c, 20).unwrap();
        assert!(!t.caught_up(&c));
    }
}
