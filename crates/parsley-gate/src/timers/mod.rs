//! The timer queue: the event-time sort of one task.
//!
//! # The rule (the book's specification, §5)
//! **The timer queue is the sort.** Each delivered record is parked under a *park time* and
//! released when the watermark reaches it; nothing else sorts. Records leave in ascending
//! `(park time, arrival)` order, where arrival is the order in which they were parked.
//!
//! - **Causal order wins over event time.** A record is parked at the maximum of its own event
//!   time and the park times of its parked causal ancestors (the caller passes them: it knows
//!   the record's ancestors from the gate). An effect stamped with an earlier, skewed time is
//!   therefore never released before its cause: its park time is at least the cause's, and it
//!   arrived after it.
//! - **Release rule.** A record is released once `park time <= watermark`; one whose park time
//!   is already at or below the watermark when it is parked is released at once.
//! - **Late records.** A record whose *own* event time is strictly below the watermark when it
//!   is parked is **late**, counted in total and per key (the violation counter). Equality is
//!   not late: the watermark is the highest delivered time of the slowest input, which may
//!   deliver another record with that same time, and such a record is in order.
//!
//! # Invariants
//! - every parked record has `park time > watermark` (releases are eager);
//! - `park time >= event time`;
//! - arrivals are unique and increase in parking order;
//! - the watermark never decreases;
//! - every parked record is either *pending* (parked since the last
//!   [`TimerQueue::take_changes`], not written yet) or in exactly one *live segment*; a live
//!   segment holds at least one parked record;
//! - the entries of the live segments number at most [`CARRY_FACTOR`] times the parked records
//!   in them plus the queue's carry slack, after every [`TimerQueue::take_changes`].
//!
//! # Changelogging, by segment
//! A queue holding days of history is large, so it is never written whole, and it is not
//! written record by record either. Its changelog form ([`QueueParts`]) is a small **header**
//! (watermark, next arrival, next segment number, counters), **segments** ([`Part::Segment`],
//! numbered in writing order) and one record per **key with late records** ([`Part::Late`])
//! holding its count.
//!
//! - [`TimerQueue::take_changes`] writes the records parked since the previous call that are
//!   still parked as **one segment record** (several when they exceed the segment size, so a
//!   record stays below the changelog's maximum message size): each entry is its
//!   `(park time, arrival)`, key, event time, late flag and value. A record parked and released
//!   between two calls (the steady live case, released within the lag) is never written.
//! - **Releases are not written.** The queue releases exactly the records whose park time is at
//!   or below its watermark (every parked record's park time is above it; the watermark never
//!   decreases), and the header written in the same transaction holds that watermark. So an
//!   entry of a live segment is still parked iff its park time is above the header's
//!   watermark: [`TimerQueue::from_parts`] keeps exactly those.
//! - A segment all of whose entries are released gets a **tombstone**.
//! - A segment kept alive by a few entries (typically far-future ones) would keep the log
//!   long: when the live segments hold more than [`CARRY_FACTOR`] entries per parked record
//!   (plus a slack), the sparsest segments' parked entries are **carried** into the new
//!   segment and the old ones tombstoned, in the same call. Each carried entry is paid for by
//!   at least `CARRY_FACTOR - 1` released ones, so carrying at most adds a third to the
//!   entries written.
//!
//! Restore rebuilds exactly the queue: the same entries in the same `(park time, arrival)`
//! order, the same watermark, arrivals, counters and late counts. Each record is a version
//! byte, then bincode 2 (standard configuration); a segment record is its ids
//! (`Vec<(park time, arrival)>`, readable alone with [`segment_ids`]) followed by its entries.
//! Decoding checks every invariant across all parts and never panics on corrupt bytes.
//!
//! Cost: parking one record is `O(1)` when it extends one of a few ascending runs of ids (the
//! common case: history arrives in time order per input channel), `O(log n)` for `n` parked
//! records otherwise (a B-tree); releasing is a merge of the runs and the tree. Both move small
//! `(id, slot)` pairs pointing into a slab of entries, and a record parked since the last
//! changelog write is found again through its slot, without a search;
//! a changelog write is one record per segment (about one per commit interval) and per
//! changed late count, plus one tombstone per emptied segment; carrying scans the parked
//! records once.
//!
//! The rule is the book's specification, §5 ("The timer queue is the sort", "Late records").
//!
//! # Where the parts live
//! - this file: the [`TimerQueue`] and its API in memory — parking, raising the watermark,
//!   releasing, counters — with the records it returns ([`Released`], [`Parking`]) and its
//!   counters ([`TimerMetrics`]);
//! - `sort`: the in-memory sort — the parked entries in a slab, ordered by
//!   `(park time, arrival)` in ascending runs and a B-tree;
//! - `changelog`: the changelog form — its parts ([`Part`], [`QueueParts`]), segments,
//!   carrying and tombstones ([`TimerQueue::to_parts`], [`TimerQueue::take_changes`]), the
//!   rebuild ([`TimerQueue::from_parts`]) and the limits ([`SEGMENT_BYTES`],
//!   [`CARRY_FACTOR`], [`CARRY_SLACK`]);
//! - `codec`: the bytes of one changelog record — version byte, bincode, segment packing,
//!   [`segment_ids`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

mod changelog;
mod codec;
mod sort;

#[cfg(test)]
mod tests;

use changelog::Segment;
pub use changelog::{CARRY_FACTOR, CARRY_SLACK, Part, QueueParts, SEGMENT_BYTES};
pub use codec::segment_ids;
use sort::{Entry, Id, Parked};

/// A record released by the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released<K, V> {
    /// Its key.
    pub key: K,
    /// Its own event time, ms since the epoch.
    pub event_time_ms: i64,
    /// The time it was parked under (its event time raised to its ancestors' park times), ms.
    pub park_time_ms: i64,
    /// Its arrival number: the order in which records were parked, from 0.
    pub arrival: u64,
    /// `true` when its event time was below the watermark when it was parked.
    pub late: bool,
    /// The value the caller parked.
    pub value: V,
}

/// What [`TimerQueue::park`] did with a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parking<K, V> {
    /// Parked until the watermark reaches `park_time_ms`.
    Parked {
        /// The park time, ms since the epoch: pass it as an ancestor park time for the
        /// record's causal descendants.
        park_time_ms: i64,
        /// Its arrival number.
        arrival: u64,
        /// `true` when its own event time was below the watermark (it waits for a parked
        /// ancestor).
        late: bool,
    },
    /// Its park time was already at or below the watermark: released at once.
    Released(Released<K, V>),
}

/// Counters a runtime exports as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerMetrics {
    /// Records parked (released at once included).
    pub parked: u64,
    /// Records released.
    pub released: u64,
    /// Records whose event time was below the watermark when parked (the violation counter).
    pub late: u64,
    /// Records parked above their own event time because of a parked ancestor.
    pub raised: u64,
}

/// The event-time sort of one task (module docs: the release rule and the late count).
///
/// `K` is the record key (late records are counted per key), `V` what the caller needs back.
#[derive(Debug, Clone)]
pub struct TimerQueue<K, V> {
    /// Parked records by `(park time, arrival)`; every park time is above `watermark`.
    parked: Parked<K, V>,
    /// Released by the last [`raise`](TimerQueue::raise) and not taken yet
    /// ([`next_released`](TimerQueue::next_released)), by `(park time, arrival)`, with their
    /// slots in `parked`.
    ready: VecDeque<(Id, usize)>,
    /// The latest watermark passed to [`TimerQueue::advance`]; never decreases.
    watermark: Option<i64>,
    next_arrival: u64,
    /// Late records per key (keys with at least one).
    late: BTreeMap<K, u64>,
    metrics: TimerMetrics,
    /// Live segments by number.
    segments: BTreeMap<u64, Segment>,
    /// The number of the next segment written.
    next_segment: u64,
    /// Ids (with their slots) parked since the last
    /// [`take_changes`](TimerQueue::take_changes), in arrival order (some may be released
    /// since).
    pending: Vec<(Id, usize)>,
    /// Segments emptied since the last [`take_changes`](TimerQueue::take_changes): a
    /// tombstone is due.
    dead: Vec<u64>,
    /// Entries of the live segments, and of those the parked ones.
    log_entries: u64,
    written_parked: u64,
    /// Keys whose late count grew since the last [`take_changes`](TimerQueue::take_changes).
    changed_late: BTreeSet<K>,
    /// Largest segment record value, bytes.
    segment_bytes: usize,
    /// Dead entries tolerated in live segments before carrying.
    carry_slack: u64,
}

/// Two queues are equal when they hold the same records, watermark, arrivals, counters and late
/// counts; which keys changed since the last changelog write is not compared.
impl<K: PartialEq, V: PartialEq> PartialEq for TimerQueue<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.parked.len() == other.parked.len()
            && self
                .parked
                .iter()
                .zip(other.parked.iter())
                .all(|((a, x), (b, y))| a == b && x.same(y))
            && self.watermark == other.watermark
            && self.next_arrival == other.next_arrival
            && self.late == other.late
            && self.metrics == other.metrics
    }
}

impl<K: Eq, V: Eq> Eq for TimerQueue<K, V> {}

impl<K, V> Default for TimerQueue<K, V> {
    fn default() -> Self {
        TimerQueue {
            parked: Parked::default(),
            ready: VecDeque::new(),
            watermark: None,
            next_arrival: 0,
            late: BTreeMap::new(),
            metrics: TimerMetrics::default(),
            segments: BTreeMap::new(),
            next_segment: 0,
            pending: Vec::new(),
            dead: Vec::new(),
            log_entries: 0,
            written_parked: 0,
            changed_late: BTreeSet::new(),
            segment_bytes: SEGMENT_BYTES,
            carry_slack: CARRY_SLACK,
        }
    }
}

impl<K: Ord + Clone, V> TimerQueue<K, V> {
    /// An empty queue with no watermark: nothing is released before the first
    /// [`advance`](Self::advance).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the changelog limits (module docs): the largest segment record value,
    /// `segment_bytes` (a single entry larger than that gets a segment of its own), and the
    /// dead entries tolerated before carrying, `carry_slack`. Not part of the changelog: set
    /// them again on a rebuilt queue. Defaults: [`SEGMENT_BYTES`], [`CARRY_SLACK`].
    pub fn with_changelog_limits(mut self, segment_bytes: usize, carry_slack: u64) -> Self {
        self.segment_bytes = segment_bytes.max(1);
        self.carry_slack = carry_slack;
        self
    }

    /// Parks a delivered record of `key` with its own `event_time_ms` (ms since the epoch)
    /// under `max(event_time_ms, ancestor park times)`. `ancestor_park_times` are the park
    /// times of the record's causal ancestors that were parked here (already released ones may
    /// be passed too: they change nothing). Released at once when that park time is at or
    /// below the watermark.
    pub fn park(
        &mut self,
        key: K,
        event_time_ms: i64,
        ancestor_park_times: impl IntoIterator<Item = i64>,
        value: V,
    ) -> Parking<K, V> {
        debug_assert!(
            self.ready.is_empty(),
            "records released by `raise` are taken before the next is parked"
        );
        let park_time_ms = ancestor_park_times
            .into_iter()
            .fold(event_time_ms, i64::max);
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.metrics.parked += 1;
        if park_time_ms > event_time_ms {
            self.metrics.raised += 1;
        }
        let late = self.watermark.is_some_and(|w| event_time_ms < w);
        if late {
            self.metrics.late += 1;
            *self.late.entry(key.clone()).or_default() += 1;
            if !self.changed_late.contains(&key) {
                self.changed_late.insert(key.clone());
            }
        }
        if self.watermark.is_some_and(|w| park_time_ms <= w) {
            self.metrics.released += 1;
            return Parking::Released(Released {
                key,
                event_time_ms,
                park_time_ms,
                arrival,
                late,
                value,
            });
        }
        let id = (park_time_ms, arrival);
        let slot = self.parked.insert(
            id,
            Entry {
                key,
                event_time_ms,
                late,
                value,
                segment: None,
            },
        );
        self.pending.push((id, slot));
        Parking::Parked {
            park_time_ms,
            arrival,
            late,
        }
    }

    /// Raises the watermark to `watermark_ms` (ms since the epoch) and releases every parked
    /// record whose park time is at or below it, in ascending `(park time, arrival)` order. A
    /// watermark below the current one changes nothing (the queue's watermark never
    /// decreases). [`raise`](Self::raise) and [`next_released`](Self::next_released) do the
    /// same one record at a time, without collecting them.
    pub fn advance(&mut self, watermark_ms: i64) -> Vec<Released<K, V>> {
        self.raise(watermark_ms);
        std::iter::from_fn(|| self.next_released()).collect()
    }

    /// Raises the watermark as [`advance`](Self::advance) does, and returns how many records
    /// it released (with those not taken yet); take them, in order, with
    /// [`next_released`](Self::next_released) before parking another record or writing the
    /// queue's changes.
    pub fn raise(&mut self, watermark_ms: i64) -> usize {
        let w = self.watermark.map_or(watermark_ms, |w| w.max(watermark_ms));
        self.watermark = Some(w);
        let due = self
            .parked
            .split_below(w.checked_add(1).map(|next| (next, 0)));
        self.metrics.released += due.len() as u64;
        for (_, slot) in &due {
            // Pending ones were never written: nothing to do.
            if let Some(s) = self.parked.get(*slot).segment
                && let Some(seg) = self.segments.get_mut(&s)
            {
                seg.live -= 1;
                self.written_parked -= 1;
                if seg.live == 0 {
                    self.log_entries -= seg.total;
                    self.segments.remove(&s);
                    self.dead.push(s);
                }
            }
        }
        // Everything parked now lies above the ids released before (their park times were at
        // or below the earlier watermark, and a record parked since lies above it): the ready
        // queue stays in id order.
        debug_assert!(
            self.ready
                .back()
                .zip(due.first())
                .is_none_or(|((a, _), (b, _))| a < b)
        );
        self.ready.extend(due);
        // A queue whose changes are never taken keeps only the pending ids still parked.
        if self.pending.len() > 2 * self.parked.len() + 1_024 {
            let parked = &self.parked;
            let ready = &self.ready;
            self.pending.retain(|(id, slot)| {
                parked.holds(*id, *slot) && ready.binary_search(&(*id, *slot)).is_err()
            });
        }
        self.ready.len()
    }

    /// The next record released and not taken yet, in `(park time, arrival)` order.
    pub fn next_released(&mut self) -> Option<Released<K, V>> {
        let ((park_time_ms, arrival), slot) = self.ready.pop_front()?;
        let e = self.parked.take_slot(slot);
        Some(Released {
            key: e.key,
            event_time_ms: e.event_time_ms,
            park_time_ms,
            arrival,
            late: e.late,
            value: e.value,
        })
    }

    /// The park time of the next record released and not taken yet, ms: what
    /// [`next_released`](Self::next_released) would give next.
    pub fn next_released_time(&self) -> Option<i64> {
        self.ready
            .front()
            .map(|((park_time_ms, _), _)| *park_time_ms)
    }

    /// Records released and not taken yet ([`raise`](Self::raise)).
    pub fn released_untaken(&self) -> usize {
        self.ready.len()
    }

    /// The queue's watermark, ms since the epoch; `None` before the first advance.
    pub fn watermark(&self) -> Option<i64> {
        self.watermark
    }

    /// Records parked now.
    pub fn len(&self) -> usize {
        self.parked.len()
    }

    /// `true` when nothing is parked.
    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }

    /// The parked records in release order: `(park time ms, key, value)`. For a caller that
    /// indexes what is parked (for example by source coordinate, to find a record's parked
    /// ancestors after [`from_parts`](Self::from_parts)).
    pub fn parked(&self) -> impl Iterator<Item = (i64, &K, &V)> + '_ {
        self.parked.iter().map(|((t, _), e)| (t, &e.key, &e.value))
    }

    /// The smallest park time, ms: the watermark the next release needs.
    pub fn next_release(&self) -> Option<i64> {
        self.parked.first_id().map(|(t, _)| t)
    }

    /// Counters since the queue was created (they survive changelogging).
    pub fn metrics(&self) -> TimerMetrics {
        self.metrics
    }

    /// Late records of `key` (the per-key violation counter).
    pub fn late_for(&self, key: &K) -> u64 {
        self.late.get(key).copied().unwrap_or(0)
    }

    /// Keys with late records and their counts, ascending by key.
    pub fn late_by_key(&self) -> impl Iterator<Item = (&K, u64)> + '_ {
        self.late.iter().map(|(k, n)| (k, *n))
    }

    /// The keys whose late count grew since the last [`take_changes`](Self::take_changes),
    /// with their counts now, ascending by key.
    pub fn late_changed(&self) -> impl Iterator<Item = (&K, u64)> + '_ {
        self.changed_late
            .iter()
            .map(|k| (k, self.late.get(k).copied().unwrap_or(0)))
    }
}
