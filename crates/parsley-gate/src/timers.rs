//! The timer queue: the event-time sort of one task.
//!
//! # The rule (DESIGN.md §5)
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
//! Source: the silence-problem seed (§04 "One: the timer queue is the sort", §06 "What it
//! doesn't promise") and DESIGN.md §5.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::GateError;

/// Version byte of every changelog record ([`TimerQueue::to_parts`]); 1 wrote one record per
/// parked record.
const CODEC_VERSION: u8 = 2;
/// Default largest size of one segment record's value, bytes (below the broker's default
/// maximum message size of 1 MiB, with room for the key and the batch overhead).
pub const SEGMENT_BYTES: usize = 512 << 10;
/// Live segments may hold this many entries per parked record in them (plus the slack) before
/// the sparsest are carried forward (module docs).
pub const CARRY_FACTOR: u64 = 4;
/// Default carry slack, entries: below this many dead entries nothing is carried.
pub const CARRY_SLACK: u64 = 4_096;
/// Upper bound on what a decode may allocate (bincode's claim check), bytes.
const DECODE_LIMIT: usize = 1 << 30;

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

#[derive(Debug, Clone)]
struct Entry<K, V> {
    key: K,
    event_time_ms: i64,
    late: bool,
    value: V,
    /// The live segment that holds it; `None` while pending (not written yet).
    segment: Option<u64>,
}

impl<K: PartialEq, V: PartialEq> Entry<K, V> {
    /// Same record (where it is written is bookkeeping, not content).
    fn same(&self, other: &Self) -> bool {
        self.key == other.key
            && self.event_time_ms == other.event_time_ms
            && self.late == other.late
            && self.value == other.value
    }
}

/// Entries per chunk of the slab.
const CHUNK: usize = 4_096;

/// A slot of the slab: the entry it holds, under its id, or nothing (free).
type Slot<K, V> = Option<(Id, Entry<K, V>)>;

/// Ascending runs of ids kept beside the B-tree (see [`Parked`]).
const RUNS: usize = 16;

/// The parked entries: their ids in release order, each pointing into a slab of entries. The
/// ids are kept as up to [`RUNS`] ascending **runs** (deques) and a B-tree for the ids that
/// fit no run: a new id goes to the end of the run whose last id is the greatest below it,
/// else into a new run, else into the B-tree. History arrives in event-time order per input
/// channel, so a task parks a few interleaved ascending sequences: nearly every id is an
/// `O(1)` append instead of a B-tree insert into a tree of all parked records. Release order
/// is the merge of the runs and the tree. The B-tree and runs move small `(id, slot)` pairs,
/// not entries, and a pending id reaches its entry through its slot without a search (a slot
/// is reused once freed, so the id is checked). The slab grows in chunks of [`CHUNK`]
/// entries, so growing never moves the entries already in it. Released entries leave the
/// order at once and their slots when taken ([`Parked::take_slot`]).
#[derive(Debug, Clone)]
struct Parked<K, V> {
    order: BTreeMap<Id, usize>,
    runs: Vec<VecDeque<(Id, usize)>>,
    /// Ids in `order` and `runs`.
    len: usize,
    chunks: Vec<Vec<Slot<K, V>>>,
    free: Vec<usize>,
    /// Slots holding an entry (ordered or released and not taken yet).
    occupied: usize,
}

impl<K, V> Default for Parked<K, V> {
    fn default() -> Self {
        Parked {
            order: BTreeMap::new(),
            runs: Vec::new(),
            len: 0,
            chunks: Vec::new(),
            free: Vec::new(),
            occupied: 0,
        }
    }
}

impl<K, V> Parked<K, V> {
    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slot(&self, slot: usize) -> Option<&Slot<K, V>> {
        self.chunks.get(slot / CHUNK)?.get(slot % CHUNK)
    }

    fn slot_mut(&mut self, slot: usize) -> Option<&mut Slot<K, V>> {
        self.chunks.get_mut(slot / CHUNK)?.get_mut(slot % CHUNK)
    }

    /// Parks `e` under a new `id`; returns its slot.
    fn insert(&mut self, id: Id, e: Entry<K, V>) -> usize {
        let slot = match self.free.pop() {
            Some(slot) => {
                *self.slot_mut(slot).expect("a free slot is in the slab") = Some((id, e));
                slot
            }
            None => {
                if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
                    self.chunks.push(Vec::with_capacity(CHUNK));
                }
                let n = self.chunks.len() - 1;
                let chunk = &mut self.chunks[n];
                chunk.push(Some((id, e)));
                n * CHUNK + chunk.len() - 1
            }
        };
        // The run whose last id is the greatest below `id`.
        let mut best: Option<(usize, Id)> = None;
        for (i, run) in self.runs.iter().enumerate() {
            if let Some(&(last, _)) = run.back()
                && last < id
                && best.is_none_or(|(_, b)| last > b)
            {
                best = Some((i, last));
            }
        }
        match best {
            Some((i, _)) => self.runs[i].push_back((id, slot)),
            None if self.runs.len() < RUNS => self.runs.push(VecDeque::from([(id, slot)])),
            None => {
                self.order.insert(id, slot);
            }
        }
        self.len += 1;
        self.occupied += 1;
        slot
    }

    /// The entry `id`, if it is still in `slot`.
    fn at_mut(&mut self, id: Id, slot: usize) -> Option<&mut Entry<K, V>> {
        match self.slot_mut(slot) {
            Some(Some((i, e))) if *i == id => Some(e),
            _ => None,
        }
    }

    fn holds(&self, id: Id, slot: usize) -> bool {
        matches!(self.slot(slot), Some(Some((i, _))) if *i == id)
    }

    /// The entry in `slot` (an id of the order or of [`Parked::split_below`]).
    fn get(&self, slot: usize) -> &Entry<K, V> {
        let (_, e) = self
            .slot(slot)
            .and_then(Option::as_ref)
            .expect("an ordered id has its slot");
        e
    }

    /// Removes the ids below `bound` (all of them for `None`) from the order and returns them
    /// with their slots, in id order; their entries stay until taken.
    fn split_below(&mut self, bound: Option<Id>) -> Vec<(Id, usize)> {
        let below = |id: &Id| bound.is_none_or(|b| *id < b);
        let mut due = Vec::new();
        for run in &mut self.runs {
            let k = run.partition_point(|(id, _)| below(id));
            due.extend(run.drain(..k));
        }
        self.runs.retain(|run| !run.is_empty());
        let rest = match bound {
            Some(b) => self.order.split_off(&b),
            None => BTreeMap::new(),
        };
        due.extend(std::mem::replace(&mut self.order, rest));
        // A merge of ascending runs: the stable sort finds them.
        due.sort();
        self.len -= due.len();
        due
    }

    /// Takes the entry out of `slot` (one [`Parked::split_below`] returned) and frees the slot;
    /// once nothing is left, gives the slab back (pending ids then find nothing, as they
    /// should).
    fn take_slot(&mut self, slot: usize) -> Entry<K, V> {
        let (_, e) = self
            .slot_mut(slot)
            .and_then(Option::take)
            .expect("a released id has its slot");
        self.free.push(slot);
        self.occupied -= 1;
        if self.occupied == 0 {
            self.chunks = Vec::new();
            self.free = Vec::new();
        }
        e
    }

    /// `(id, slot)` of every entry in release order.
    fn ids(&self) -> impl Iterator<Item = (Id, usize)> + use<K, V> {
        let mut all: Vec<(Id, usize)> = Vec::with_capacity(self.len);
        for run in &self.runs {
            all.extend(run.iter().copied());
        }
        all.extend(self.order.iter().map(|(id, slot)| (*id, *slot)));
        all.sort();
        all.into_iter()
    }

    /// The entries in release order.
    fn iter(&self) -> impl Iterator<Item = (Id, &Entry<K, V>)> + '_ {
        self.ids().map(|(id, slot)| (id, self.get(slot)))
    }

    fn first_id(&self) -> Option<Id> {
        self.runs
            .iter()
            .filter_map(|run| run.front().map(|(id, _)| *id))
            .chain(self.order.keys().next().copied())
            .min()
    }
}

/// A written segment still holding parked records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    /// Entries written in it.
    total: u64,
    /// Of those, still parked.
    live: u64,
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

/// The queue-wide part of the changelog form ([`TimerQueue::to_parts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Header {
    watermark: Option<i64>,
    next_arrival: u64,
    next_segment: u64,
    metrics: TimerMetrics,
}

/// One entry of a segment record, after its id (module docs: changelogging).
#[derive(Serialize)]
struct EntryOut<'a, K, V> {
    key: &'a K,
    event_time_ms: i64,
    late: bool,
    value: &'a V,
}

#[derive(Deserialize)]
struct EntryIn<K, V> {
    key: K,
    event_time_ms: i64,
    late: bool,
    value: V,
}

/// What one changelog record of a queue describes (module docs: changelogging).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part<K> {
    /// A segment: parked records written together, by segment number.
    Segment(u64),
    /// The late count of one key.
    Late(K),
}

/// The changelog form of a queue, or of what changed in it since the last
/// [`take_changes`](TimerQueue::take_changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueParts<K> {
    /// The queue-wide record: watermark, next arrival, next segment, counters.
    pub header: Vec<u8>,
    /// Each part's record, or `None` when the part is gone (an emptied or carried segment: a
    /// tombstone).
    pub parts: Vec<(Part<K>, Option<Vec<u8>>)>,
}

fn codec_error(e: impl std::fmt::Display) -> GateError {
    GateError::TimerQueueCodec {
        message: e.to_string(),
    }
}

fn encode_into<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), GateError> {
    bincode::serde::encode_into_std_write(value, out, bincode::config::standard())
        .map(|_| ())
        .map_err(codec_error)
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, GateError> {
    let mut out = vec![CODEC_VERSION];
    encode_into(value, &mut out)?;
    Ok(out)
}

fn split_version<'a>(what: &str, bytes: &'a [u8]) -> Result<&'a [u8], String> {
    let (&version, body) = bytes
        .split_first()
        .ok_or_else(|| format!("{what}: empty input"))?;
    if version != CODEC_VERSION {
        return Err(format!("{what}: unknown version {version}"));
    }
    Ok(body)
}

/// Decodes one value from the front of `body`; returns it and the rest.
fn decode_front<'a, T: DeserializeOwned>(
    what: &str,
    body: &'a [u8],
) -> Result<(T, &'a [u8]), String> {
    let config = bincode::config::standard().with_limit::<DECODE_LIMIT>();
    let (value, used): (T, usize) =
        bincode::serde::decode_from_slice(body, config).map_err(|e| format!("{what}: {e}"))?;
    Ok((value, &body[used..]))
}

fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, String> {
    let (value, rest) = decode_front(what, split_version(what, bytes)?)?;
    if !rest.is_empty() {
        return Err(format!("{what}: {} trailing bytes", rest.len()));
    }
    Ok(value)
}

/// The ids `(park time, arrival)` of the entries of a segment record, in the record's order,
/// without decoding the entries (for tools and tests that inspect a changelog; an entry is
/// still parked iff its park time is above the watermark of the header committed with it).
///
/// # Errors
/// [`GateError::TimerQueueCodec`] for an unknown version or ids that do not decode.
pub fn segment_ids(bytes: &[u8]) -> Result<Vec<(i64, u64)>, GateError> {
    let body = split_version("segment", bytes).map_err(codec_error)?;
    decode_front("segment ids", body)
        .map(|(ids, _)| ids)
        .map_err(codec_error)
}

/// A parked record's id: `(park time, arrival)`.
type Id = (i64, u64);
/// A decoded segment record: each entry with its id.
type DecodedSegment<K, V> = Vec<(Id, EntryIn<K, V>)>;
/// Encoded segment records: each with the ids it holds.
type EncodedSegments = Vec<(Vec<Id>, Vec<u8>)>;

/// Decodes a segment record: its ids and entries, as many of one as of the other.
fn decode_segment<K: DeserializeOwned, V: DeserializeOwned>(
    bytes: &[u8],
) -> Result<DecodedSegment<K, V>, String> {
    let body = split_version("segment", bytes)?;
    let (ids, rest): (Vec<(i64, u64)>, _) = decode_front("segment ids", body)?;
    let (entries, rest): (Vec<EntryIn<K, V>>, _) = decode_front("segment entries", rest)?;
    if !rest.is_empty() {
        return Err(format!("segment: {} trailing bytes", rest.len()));
    }
    if ids.len() != entries.len() {
        return Err(format!(
            "segment: {} ids for {} entries",
            ids.len(),
            entries.len()
        ));
    }
    if ids.is_empty() {
        return Err("segment: no entries".into());
    }
    Ok(ids.into_iter().zip(entries).collect())
}

/// Packs encoded entries into segment records of at most `limit` bytes each (one entry larger
/// than that alone), in the order pushed.
struct Segments {
    limit: usize,
    /// The open segment: its ids and its entries' bytes.
    ids: Vec<Id>,
    bodies: Vec<u8>,
    /// One entry's bytes.
    scratch: Vec<u8>,
    done: EncodedSegments,
}

impl Segments {
    fn new(limit: usize) -> Self {
        Segments {
            limit,
            ids: Vec::new(),
            bodies: Vec::new(),
            scratch: Vec::new(),
            done: Vec::new(),
        }
    }

    /// Adds an entry; returns the index of the segment that holds it (0 for the first).
    fn push<K: Serialize, V: Serialize>(
        &mut self,
        id: Id,
        e: &Entry<K, V>,
    ) -> Result<u64, GateError> {
        self.scratch.clear();
        encode_into(
            &EntryOut {
                key: &e.key,
                event_time_ms: e.event_time_ms,
                late: e.late,
                value: &e.value,
            },
            &mut self.scratch,
        )?;
        // A version byte, two lengths (at most 9 bytes each), an id at most 18 bytes.
        let size = 19 + 18 * (self.ids.len() + 1) + self.bodies.len() + self.scratch.len();
        if !self.ids.is_empty() && size > self.limit {
            self.close()?;
        }
        self.ids.push(id);
        self.bodies.extend_from_slice(&self.scratch);
        Ok(self.done.len() as u64)
    }

    fn close(&mut self) -> Result<(), GateError> {
        let mut record = Vec::with_capacity(19 + 18 * self.ids.len() + self.bodies.len());
        record.push(CODEC_VERSION);
        encode_into(&self.ids, &mut record)?;
        encode_into(&(self.ids.len() as u64), &mut record)?;
        record.extend_from_slice(&self.bodies);
        self.done.push((std::mem::take(&mut self.ids), record));
        self.bodies.clear();
        Ok(())
    }

    fn finish(mut self) -> Result<EncodedSegments, GateError> {
        if !self.ids.is_empty() {
            self.close()?;
        }
        Ok(self.done)
    }
}

impl<K: Ord + Clone + Serialize, V: Serialize> TimerQueue<K, V> {
    /// Released records not taken yet would be written as released (their park times are at
    /// or below the watermark) before the caller has them: refused.
    fn check_taken(&self) -> Result<(), GateError> {
        match self.ready.len() {
            0 => Ok(()),
            count => Err(GateError::ReleasedNotTaken { count }),
        }
    }

    fn header(&self, next_segment: u64) -> Result<Vec<u8>, GateError> {
        encode(&Header {
            watermark: self.watermark,
            next_arrival: self.next_arrival,
            next_segment,
            metrics: self.metrics,
        })
    }

    /// The whole queue in its changelog form (module docs), as a fresh changelog would hold
    /// it: the header, every parked record in segments numbered from 0, and every key's late
    /// count. Leaves the queue and its changes as they are.
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] when a key's or value's serde implementation fails;
    /// [`GateError::ReleasedNotTaken`] while records [`raise`](Self::raise) released are not
    /// all taken.
    pub fn to_parts(&self) -> Result<QueueParts<K>, GateError> {
        self.check_taken()?;
        let mut packer = Segments::new(self.segment_bytes);
        for (id, e) in self.parked.iter() {
            packer.push(id, e)?;
        }
        let segments = packer.finish()?;
        let mut parts = Vec::with_capacity(segments.len() + self.late.len());
        let n = segments.len() as u64;
        for (i, (_, record)) in segments.into_iter().enumerate() {
            parts.push((Part::Segment(i as u64), Some(record)));
        }
        for (k, count) in &self.late {
            parts.push((Part::Late(k.clone()), Some(encode(count)?)));
        }
        Ok(QueueParts {
            header: self.header(n)?,
            parts,
        })
    }

    /// The segments to carry forward now (module docs), sparsest first: while the live
    /// segments hold more than [`CARRY_FACTOR`] entries per parked record plus the slack.
    fn to_carry(&self) -> Vec<u64> {
        let (mut entries, parked) = (self.log_entries, self.written_parked);
        let over = |entries: u64, parked: u64| {
            entries
                > CARRY_FACTOR
                    .saturating_mul(parked)
                    .saturating_add(self.carry_slack)
        };
        if !over(entries, parked) {
            return Vec::new();
        }
        let mut by_density: Vec<(u64, Segment)> =
            self.segments.iter().map(|(n, s)| (*n, *s)).collect();
        // live / total ascending, compared without division.
        by_density.sort_by(|(_, a), (_, b)| {
            (u128::from(a.live) * u128::from(b.total))
                .cmp(&(u128::from(b.live) * u128::from(a.total)))
        });
        let mut carry = Vec::new();
        for (n, s) in by_density {
            if !over(entries, parked) {
                break;
            }
            // Its parked entries are written again in the new segment.
            entries = entries - s.total + s.live;
            carry.push(n);
        }
        carry
    }

    /// What changed since the last call (or since the queue was created or rebuilt): the
    /// header; the records parked since and still parked, as new segments (with the parked
    /// records of carried segments); a tombstone for every segment emptied or carried since;
    /// and the late count of each key whose count grew. A record parked and released between
    /// two calls is not mentioned. Written in order with the rest of a task's state in one
    /// transaction, a compacted changelog holding them rebuilds the queue exactly
    /// ([`from_parts`](Self::from_parts)).
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] when a key's or value's serde implementation fails; the
    /// queue and its changes are left as they were then. [`GateError::ReleasedNotTaken`]
    /// while records [`raise`](Self::raise) released are not all taken.
    pub fn take_changes(&mut self) -> Result<QueueParts<K>, GateError> {
        self.check_taken()?;
        let carry = self.to_carry();
        let first = self.next_segment;
        // One pass: each written entry is looked up once, encoded and given its segment; on an
        // encoding error the entries given one get their old segment back.
        let mut packer = Segments::new(self.segment_bytes);
        let mut assigned: Vec<((Id, usize), Option<u64>)> = Vec::new();
        let mut failed = None;
        for &(id, slot) in &self.pending {
            let Some(e) = self.parked.at_mut(id, slot) else {
                continue; // released since it was parked
            };
            if e.segment.is_some() {
                continue;
            }
            match packer.push(id, e) {
                Ok(n) => {
                    assigned.push(((id, slot), None));
                    e.segment = Some(first + n);
                }
                Err(err) => {
                    failed = Some(err);
                    break;
                }
            }
        }
        if failed.is_none() && !carry.is_empty() {
            let carried: BTreeSet<u64> = carry.iter().copied().collect();
            let ids: Vec<(Id, usize)> = self.parked.ids().collect();
            for (id, slot) in ids {
                let e = self.parked.at_mut(id, slot).expect("parked");
                let Some(old) = e.segment.filter(|s| carried.contains(s)) else {
                    continue;
                };
                match packer.push(id, e) {
                    Ok(n) => {
                        assigned.push(((id, slot), Some(old)));
                        e.segment = Some(first + n);
                    }
                    Err(err) => {
                        failed = Some(err);
                        break;
                    }
                }
            }
        }
        let encoded = match failed {
            Some(err) => Err(err),
            None => packer.finish(),
        };
        let late = encoded.and_then(|segments| {
            let mut late = Vec::with_capacity(self.changed_late.len());
            for k in &self.changed_late {
                let count = self.late.get(k).copied().unwrap_or(0);
                late.push((Part::Late(k.clone()), Some(encode(&count)?)));
            }
            let header = self.header(first + segments.len() as u64)?;
            Ok((segments, late, header))
        });
        let (segments, late, header) = match late {
            Ok(x) => x,
            Err(err) => {
                for ((id, slot), old) in assigned {
                    if let Some(e) = self.parked.at_mut(id, slot) {
                        e.segment = old;
                    }
                }
                return Err(err);
            }
        };
        // Nothing fails from here on.
        let mut parts = Vec::with_capacity(segments.len() + carry.len() + self.dead.len());
        for n in &carry {
            if let Some(s) = self.segments.remove(n) {
                self.log_entries -= s.total;
                self.written_parked -= s.live;
            }
        }
        for (seg_ids, record) in segments {
            let n = self.next_segment;
            self.next_segment += 1;
            let count = seg_ids.len() as u64;
            self.segments.insert(
                n,
                Segment {
                    total: count,
                    live: count,
                },
            );
            self.log_entries += count;
            self.written_parked += count;
            parts.push((Part::Segment(n), Some(record)));
        }
        for n in carry.into_iter().chain(self.dead.drain(..)) {
            parts.push((Part::Segment(n), None));
        }
        parts.extend(late);
        self.pending.clear();
        self.changed_late.clear();
        Ok(QueueParts { header, parts })
    }
}

impl<K: Ord + Clone + DeserializeOwned, V: DeserializeOwned> TimerQueue<K, V> {
    /// Rebuilds a queue from its changelog form: the `header` and the latest record of every
    /// part that has one (tombstoned parts left out). An entry of a segment is parked iff its
    /// park time is above the header's watermark; a segment with none left is tombstoned by
    /// the next [`take_changes`](Self::take_changes). The changelog limits are the defaults
    /// ([`with_changelog_limits`](Self::with_changelog_limits)).
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] for an unknown version, truncated or trailing bytes,
    /// bytes that do not decode, a part given twice, a late count of 0, an empty segment or
    /// one numbered at or above the header's next segment, or entries that break an invariant
    /// (a park time below its own event time, an arrival not below the next arrival, an
    /// arrival given twice).
    pub fn from_parts<'a>(
        header: &[u8],
        parts: impl IntoIterator<Item = (Part<K>, &'a [u8])>,
    ) -> Result<Self, GateError> {
        Self::decode_parts(header, parts).map_err(|message| GateError::TimerQueueCodec { message })
    }

    fn decode_parts<'a>(
        header: &[u8],
        parts: impl IntoIterator<Item = (Part<K>, &'a [u8])>,
    ) -> Result<Self, String> {
        let h: Header = decode("header", header)?;
        let mut q = TimerQueue {
            watermark: h.watermark,
            next_arrival: h.next_arrival,
            next_segment: h.next_segment,
            metrics: h.metrics,
            ..TimerQueue::default()
        };
        let mut arrivals = BTreeSet::new();
        for (part, bytes) in parts {
            match part {
                Part::Segment(n) => {
                    if n >= q.next_segment {
                        return Err(format!(
                            "segment {n} is not below the next segment {}",
                            q.next_segment
                        ));
                    }
                    if q.segments.contains_key(&n) || q.dead.contains(&n) {
                        return Err(format!("segment {n} appears twice"));
                    }
                    let entries: Vec<((i64, u64), EntryIn<K, V>)> = decode_segment(bytes)?;
                    let total = entries.len() as u64;
                    let mut live = 0;
                    for ((t, a), e) in entries {
                        if t < e.event_time_ms {
                            return Err(format!(
                                "park time {t} is below the event time {}",
                                e.event_time_ms
                            ));
                        }
                        if a >= q.next_arrival {
                            return Err(format!("arrival {a} is not below the next arrival"));
                        }
                        if !arrivals.insert(a) {
                            return Err(format!("arrival {a} appears twice"));
                        }
                        if q.watermark.is_some_and(|w| t <= w) {
                            // Released: the watermark committed with it passed it.
                            continue;
                        }
                        live += 1;
                        // The queue is rebuilt with no pending records: every entry is written.
                        q.parked.insert(
                            (t, a),
                            Entry {
                                key: e.key,
                                event_time_ms: e.event_time_ms,
                                late: e.late,
                                value: e.value,
                                segment: Some(n),
                            },
                        );
                    }
                    if live == 0 {
                        q.dead.push(n);
                    } else {
                        q.segments.insert(n, Segment { total, live });
                        q.log_entries += total;
                        q.written_parked += live;
                    }
                }
                Part::Late(key) => {
                    let n: u64 = decode("late count", bytes)?;
                    if n == 0 {
                        return Err("a late count of 0".into());
                    }
                    if q.late.insert(key, n).is_some() {
                        return Err("a key's late count appears twice".into());
                    }
                }
            }
        }
        Ok(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times<K, V>(released: &[Released<K, V>]) -> Vec<i64> {
        released.iter().map(|r| r.park_time_ms).collect()
    }

    /// Applies `changes` to a compacted-log model `log` (a part's latest record, tombstones
    /// removing it) and rebuilds the queue from the model.
    fn rebuilt(
        log: &mut BTreeMap<Part<u32>, Vec<u8>>,
        changes: QueueParts<u32>,
    ) -> TimerQueue<u32, u64> {
        for (part, record) in changes.parts {
            match record {
                Some(r) => {
                    log.insert(part, r);
                }
                None => {
                    log.remove(&part);
                }
            }
        }
        TimerQueue::from_parts(
            &changes.header,
            log.iter().map(|(p, r)| (p.clone(), r.as_slice())),
        )
        .unwrap()
    }

    #[test]
    fn interleaved_ascending_channels_and_random_times_leave_in_release_order() {
        // 12 channels ascending in time (runs), then records at scattered times (more runs
        // than kept, so the rest go to the tree), released in steps.
        let mut q: TimerQueue<u32, u64> = TimerQueue::new();
        let mut expected: Vec<(i64, u64)> = Vec::new();
        let mut arrival = 0;
        let mut park = |q: &mut TimerQueue<u32, u64>, t: i64, expected: &mut Vec<(i64, u64)>| {
            q.park(1, t, [], arrival);
            expected.push((t, arrival));
            arrival += 1;
        };
        for i in 0..3_000i64 {
            park(&mut q, (i % 12) * 1_000 + i / 12, &mut expected);
        }
        let mut x: u64 = 12_345;
        for _ in 0..2_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            park(&mut q, (x >> 40) as i64 % 13_000, &mut expected);
        }
        assert!(q.parked.runs.len() == RUNS && !q.parked.order.is_empty());
        expected.sort();
        assert_eq!(q.next_release(), Some(expected[0].0));
        assert_eq!(q.len(), expected.len());
        let parts = q.to_parts().unwrap();
        let back: TimerQueue<u32, u64> = TimerQueue::from_parts(
            &parts.header,
            parts
                .parts
                .iter()
                .map(|(p, r)| (p.clone(), r.as_deref().unwrap())),
        )
        .unwrap();
        assert_eq!(back, q);
        let mut released = Vec::new();
        for w in [-1, 0, 999, 4_321, 4_321, 11_000, i64::MAX] {
            released.extend(q.advance(w).into_iter().map(|r| (r.park_time_ms, r.value)));
            assert_eq!(q.len(), expected.len() - released.len());
            assert!(q.next_release().is_none_or(|t| t > w));
        }
        assert_eq!(released, expected);
    }

    #[test]
    fn records_released_by_raise_are_taken_one_at_a_time_across_slab_chunks() {
        // Several chunks of the slab, slots freed and reused across them.
        let mut q: TimerQueue<u32, u64> = TimerQueue::new();
        let mut log = BTreeMap::new();
        let n = 3 * CHUNK as u64 + 17;
        for i in 0..n {
            // Interleaved times, so releases free slots all over the slab.
            let t = ((i * 7_919) % n) as i64;
            q.park((i % 13) as u32, t, [], i);
        }
        let changes = q.take_changes().unwrap();
        assert_eq!(rebuilt(&mut log, changes), q);
        let half = (n / 2) as i64;
        let due = q.raise(half - 1);
        assert_eq!(due as i64, half);
        assert_eq!(q.released_untaken(), due);
        assert_eq!(q.len(), n as usize - due);
        // Changes are refused until every released record is taken.
        assert_eq!(
            q.take_changes(),
            Err(GateError::ReleasedNotTaken { count: due })
        );
        assert_eq!(
            q.to_parts(),
            Err(GateError::ReleasedNotTaken { count: due })
        );
        let first = q.next_released().unwrap();
        assert_eq!((first.park_time_ms, first.value), (0, 0));
        let mut last = first.park_time_ms;
        let mut taken = 1;
        while let Some(r) = q.next_released() {
            assert!(r.park_time_ms > last, "ascending, each time once");
            assert_eq!(r.value * 7_919 % n, r.park_time_ms as u64);
            last = r.park_time_ms;
            taken += 1;
        }
        assert_eq!((taken, last), (due, half - 1));
        // Freed slots are reused by new records, in every chunk.
        for i in n..n + 5_000 {
            q.park(1, half + (i as i64 % 50), [], i);
        }
        let changes = q.take_changes().unwrap();
        let mut back = rebuilt(&mut log, changes);
        assert_eq!(back, q);
        let rest = q.advance(i64::MAX);
        assert_eq!(rest.len(), n as usize - due + 5_000);
        assert!(
            rest.windows(2)
                .all(|w| (w[0].park_time_ms, w[0].arrival) < (w[1].park_time_ms, w[1].arrival))
        );
        assert_eq!(back.advance(i64::MAX), rest);
        assert!(
            q.is_empty() && q.parked.chunks.is_empty(),
            "the slab is given back"
        );
    }

    #[test]
    fn nothing_is_released_before_a_watermark() {
        let mut q: TimerQueue<u8, ()> = TimerQueue::new();
        assert!(matches!(
            q.park(1, i64::MIN, [], ()),
            Parking::Parked { late: false, .. }
        ));
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_release(), Some(i64::MIN));
    }

    #[test]
    fn releases_in_ascending_time_then_arrival_order() {
        let mut q: TimerQueue<u8, &str> = TimerQueue::new();
        q.park(1, 30, [], "c");
        q.park(2, 10, [], "a1");
        q.park(1, 20, [], "b");
        q.park(3, 10, [], "a2");
        q.park(1, 40, [], "d");
        let r = q.advance(30);
        assert_eq!(
            r.iter().map(|r| r.value).collect::<Vec<_>>(),
            vec!["a1", "a2", "b", "c"]
        );
        assert_eq!(
            r.iter().map(|r| r.arrival).collect::<Vec<_>>(),
            vec![1, 3, 2, 0]
        );
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_release(), Some(40));
        assert!(q.advance(39).is_empty());
        assert_eq!(times(&q.advance(40)), vec![40]);
        assert_eq!(q.metrics().released, 5);
    }

    #[test]
    fn an_effect_with_a_skewed_earlier_time_waits_for_its_parked_cause() {
        let mut q: TimerQueue<&str, &str> = TimerQueue::new();
        let Parking::Parked { park_time_ms, .. } = q.park("in-stock", 100, [], "cause") else {
            panic!("parked");
        };
        // The effect's producer clock is skewed: event time 90, below its cause.
        q.park("sold", 90, [park_time_ms], "effect");
        q.park("other", 95, [], "unrelated");
        assert_eq!(q.metrics().raised, 1);
        let r = q.advance(95);
        assert_eq!(
            r.iter().map(|r| r.value).collect::<Vec<_>>(),
            vec!["unrelated"]
        );
        let r = q.advance(100);
        assert_eq!(
            r.iter().map(|r| r.value).collect::<Vec<_>>(),
            vec!["cause", "effect"]
        );
        assert_eq!((r[1].event_time_ms, r[1].park_time_ms), (90, 100));
    }

    #[test]
    fn late_changed_lists_the_keys_whose_count_grew_since_the_last_changes() {
        let mut q: TimerQueue<u32, u64> = TimerQueue::new();
        assert!(q.advance(100).is_empty());
        q.park(7, 50, [], 1);
        q.park(3, 60, [], 2);
        q.park(7, 70, [], 3);
        q.park(5, 150, [], 4);
        assert_eq!(q.late_changed().collect::<Vec<_>>(), vec![(&3, 1), (&7, 2)]);
        q.take_changes().unwrap();
        assert_eq!(q.late_changed().count(), 0);
        q.park(3, 10, [], 5);
        assert_eq!(q.late_changed().collect::<Vec<_>>(), vec![(&3, 2)]);
        assert_eq!(q.late_by_key().collect::<Vec<_>>(), vec![(&3, 2), (&7, 2)]);
    }

    #[test]
    fn a_record_at_or_below_the_watermark_is_released_at_once_and_late_only_below_it() {
        let mut q: TimerQueue<&str, i32> = TimerQueue::new();
        assert!(q.advance(100).is_empty());
        match q.park("k", 100, [], 1) {
            Parking::Released(r) => assert!(!r.late, "equal to the watermark is in order"),
            other => panic!("expected a release, got {other:?}"),
        }
        match q.park("k", 99, [], 2) {
            Parking::Released(r) => assert!(r.late),
            other => panic!("expected a release, got {other:?}"),
        }
        q.park("j", 50, [], 3);
        q.park("j", 101, [], 4);
        assert_eq!(q.late_for(&"k"), 1);
        assert_eq!(q.late_for(&"j"), 1);
        assert_eq!(q.late_for(&"x"), 0);
        assert_eq!(
            q.late_by_key().collect::<Vec<_>>(),
            vec![(&"j", 1), (&"k", 1)]
        );
        assert_eq!(q.metrics().late, 2);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn a_late_record_behind_a_parked_ancestor_stays_parked_and_counts_late() {
        let mut q: TimerQueue<u8, ()> = TimerQueue::new();
        q.advance(50);
        let Parking::Parked { park_time_ms, .. } = q.park(1, 80, [], ()) else {
            panic!("parked");
        };
        match q.park(2, 40, [park_time_ms], ()) {
            Parking::Parked {
                park_time_ms: 80,
                late: true,
                ..
            } => {}
            other => panic!("expected parked at 80 and late, got {other:?}"),
        }
        let r = q.advance(80);
        assert_eq!(
            r.iter().map(|r| (r.key, r.late)).collect::<Vec<_>>(),
            vec![(1, false), (2, true)]
        );
    }

    #[test]
    fn the_watermark_never_decreases() {
        let mut q: TimerQueue<u8, ()> = TimerQueue::new();
        q.advance(100);
        q.advance(10);
        assert_eq!(q.watermark(), Some(100));
        assert!(matches!(q.park(1, 50, [], ()), Parking::Released(_)));
    }

    #[test]
    fn the_largest_watermark_releases_everything() {
        let mut q: TimerQueue<u8, ()> = TimerQueue::new();
        q.park(1, i64::MAX, [], ());
        q.park(1, 0, [], ());
        assert_eq!(times(&q.advance(i64::MAX)), vec![0, i64::MAX]);
        assert!(q.is_empty());
    }

    /// A compacted changelog: the latest header and the latest record of each part.
    #[derive(Default)]
    struct Log<K> {
        header: Vec<u8>,
        parts: BTreeMap<Part<K>, Vec<u8>>,
        /// Records written, tombstones included.
        writes: usize,
        tombstones: usize,
    }

    impl<K: Ord + Clone> Log<K> {
        fn apply(&mut self, changes: QueueParts<K>) {
            self.header = changes.header;
            for (p, record) in changes.parts {
                self.writes += 1;
                match record {
                    Some(r) => self.parts.insert(p, r),
                    None => {
                        self.tombstones += 1;
                        self.parts.remove(&p)
                    }
                };
            }
        }

        fn rebuild<V: DeserializeOwned>(&self) -> Result<TimerQueue<K, V>, GateError>
        where
            K: DeserializeOwned,
        {
            TimerQueue::from_parts(
                &self.header,
                self.parts.iter().map(|(p, r)| (p.clone(), r.as_slice())),
            )
        }

        /// The ids of every entry of every live segment.
        fn entries(&self) -> Vec<(i64, u64)> {
            self.parts
                .iter()
                .filter(|(p, _)| matches!(p, Part::Segment(_)))
                .flat_map(|(_, r)| segment_ids(r).unwrap())
                .collect()
        }

        fn segments(&self) -> usize {
            self.parts
                .keys()
                .filter(|p| matches!(p, Part::Segment(_)))
                .count()
        }
    }

    fn whole<K: Ord + Clone + Serialize + DeserializeOwned, V: Serialize + DeserializeOwned>(
        q: &TimerQueue<K, V>,
    ) -> Result<TimerQueue<K, V>, GateError> {
        let parts = q.to_parts()?;
        TimerQueue::from_parts(
            &parts.header,
            parts
                .parts
                .iter()
                .map(|(p, r)| (p.clone(), r.as_deref().expect("to_parts has no tombstones"))),
        )
    }

    #[test]
    fn parts_round_trip_and_the_rebuilt_queue_behaves_the_same() {
        let mut q: TimerQueue<String, Vec<u8>> = TimerQueue::new();
        q.park("a".into(), 30, [], vec![1]);
        q.park("b".into(), 10, [20], vec![2]);
        q.advance(15);
        q.park("c".into(), 5, [], vec![3]); // late, released at once
        q.park("d".into(), 25, [], vec![4]);
        let mut back = whole(&q).unwrap();
        assert_eq!(back, q);
        assert_eq!(back.late_for(&"c".to_string()), 1);
        let expected = q.advance(100);
        assert_eq!(back.advance(100), expected);
        assert_eq!(
            expected.iter().map(|r| r.value[0]).collect::<Vec<_>>(),
            vec![2, 4, 1]
        );
        match back.park("e".into(), 1, [], vec![5]) {
            Parking::Released(r) => assert_eq!(r.arrival, 4, "arrivals continue"),
            other => panic!("expected a release, got {other:?}"),
        }
    }

    #[test]
    fn changes_write_one_segment_per_call_and_no_record_per_release() {
        let mut q: TimerQueue<u8, u32> = TimerQueue::new();
        let mut log = Log::default();
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        for i in 0..100u32 {
            q.park((i % 7) as u8, 1_000 + i64::from(i), [], i);
        }
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.writes, 1, "one segment for 100 parked records");
        assert_eq!(log.entries().len(), 100);
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        // Nothing changed: only the header is written.
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.writes, 1);
        // 30 released: nothing but the header (the watermark says which); one late record: one
        // late count.
        assert_eq!(q.advance(1_029).len(), 30);
        q.park(3, 1_000, [], 1_000);
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.writes, 2, "the late count only");
        assert_eq!(
            log.entries().len(),
            100,
            "released entries stay in their segment"
        );
        let back = log.rebuild::<u32>().unwrap();
        assert_eq!(back, q);
        assert_eq!(back.len(), 70);
        // The first segment empties (a tombstone); the two still parked form a second one.
        q.park(1, 5_000, [], 1);
        q.park(2, 2_000, [], 2);
        q.advance(1_500);
        assert_eq!(q.len(), 2);
        log.apply(q.take_changes().unwrap());
        assert_eq!((log.writes, log.tombstones, log.segments()), (4, 1, 1));
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        // Parked and released between two writes: never written.
        let before = log.writes;
        q.park(4, 1_600, [], 4);
        q.advance(1_700);
        log.apply(q.take_changes().unwrap());
        assert_eq!(
            log.writes, before,
            "the record at 1600 left before any write"
        );
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        // Half of the second segment released: nothing written; then all: a tombstone.
        q.advance(2_000);
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.writes, before);
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        q.advance(i64::MAX);
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.tombstones, 2);
        assert_eq!(log.parts.len(), 1, "only the late count is left");
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
    }

    #[test]
    fn a_segment_kept_alive_by_a_far_future_record_is_carried_forward() {
        let mut q: TimerQueue<u8, u32> = TimerQueue::new().with_changelog_limits(SEGMENT_BYTES, 8);
        let mut log = Log::default();
        for i in 0..100u32 {
            q.park(1, 1_000 + i64::from(i), [], i);
        }
        q.park(2, 1_000_000_000, [], 100);
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.segments(), 1);
        // 60 released: 41 of 101 parked, within 4 x 41 + 8: nothing carried.
        q.advance(1_059);
        log.apply(q.take_changes().unwrap());
        assert_eq!((log.writes, log.tombstones), (1, 0));
        // 99 released: 101 entries for 2 parked (> 4 x 2 + 8): the two are carried into a new
        // segment and the old one is tombstoned, in the same changes.
        q.advance(1_098);
        let changes = q.take_changes().unwrap();
        assert_eq!(
            changes
                .parts
                .iter()
                .map(|(p, r)| (p.clone(), r.is_some()))
                .collect::<Vec<_>>(),
            vec![(Part::Segment(1), true), (Part::Segment(0), false)]
        );
        log.apply(changes);
        assert_eq!(
            log.entries(),
            vec![(1_099, 99), (1_000_000_000, 100)],
            "only the parked entries are written again"
        );
        let back = log.rebuild::<u32>().unwrap();
        assert_eq!(back, q);
        assert_eq!(back.len(), 2);
        // New records go to a new segment; the carried one empties and is tombstoned.
        q.park(3, 2_000, [], 101);
        q.advance(1_099);
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        assert_eq!(
            log.entries(),
            vec![(1_099, 99), (1_000_000_000, 100), (2_000, 101)]
        );
        q.advance(2_000);
        log.apply(q.take_changes().unwrap());
        // Segment 1 holds the far-future record, segment 2 emptied.
        assert_eq!(log.entries(), vec![(1_099, 99), (1_000_000_000, 100)]);
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
    }

    #[test]
    fn a_restore_reassembles_the_queue_from_split_segments() {
        // 100-byte segments: a few entries each, and one entry larger than that alone.
        let mut q: TimerQueue<u16, Vec<u8>> = TimerQueue::new().with_changelog_limits(100, 0);
        let mut log = Log::default();
        for i in 0..40u16 {
            // Descending times within a call: release order differs from segment order.
            q.park(i % 3, 10_000 - i64::from(i) * 10, [], vec![i as u8; 12]);
        }
        q.park(7, 20_000, [], vec![9; 300]);
        let changes = q.take_changes().unwrap();
        let sizes: Vec<usize> = changes
            .parts
            .iter()
            .filter_map(|(_, r)| r.as_ref().map(Vec::len))
            .collect();
        assert!(sizes.len() > 5, "split into several segments: {sizes:?}");
        assert!(
            sizes[..sizes.len() - 1].iter().all(|&n| n <= 100),
            "{sizes:?}"
        );
        assert!(
            sizes[sizes.len() - 1] > 300,
            "the large entry alone: {sizes:?}"
        );
        log.apply(changes);
        let mut back = log.rebuild::<Vec<u8>>().unwrap();
        assert_eq!(back, q);
        // Release about half (a segment partly), restore again: exactly the rest, in the same
        // order.
        let released = q.advance(9_815);
        assert_eq!(released.len(), 21);
        log.apply(q.take_changes().unwrap());
        let mut again = log.rebuild::<Vec<u8>>().unwrap();
        assert_eq!(again, q);
        assert_eq!(back.advance(9_815), released);
        let rest = q.advance(i64::MAX);
        assert_eq!(again.advance(i64::MAX), rest);
        assert_eq!(
            rest.iter().map(|r| r.arrival).collect::<Vec<_>>(),
            (0..19).rev().chain([40]).collect::<Vec<u64>>()
        );
    }

    #[test]
    fn corrupt_parts_are_refused_without_panicking() {
        let mut q: TimerQueue<u32, u32> = TimerQueue::new();
        q.park(1, 10, [], 1);
        q.park(2, 20, [], 2);
        q.advance(15);
        q.park(2, 5, [], 3); // late
        q.park(3, 30, [], 4);
        let parts = q.to_parts().unwrap();
        let rebuild = |header: &[u8], parts: &[(Part<u32>, Vec<u8>)]| {
            TimerQueue::<u32, u32>::from_parts(
                header,
                parts.iter().map(|(p, r)| (p.clone(), r.as_slice())),
            )
        };
        let good: Vec<(Part<u32>, Vec<u8>)> = parts
            .parts
            .iter()
            .map(|(p, r)| (p.clone(), r.clone().unwrap()))
            .collect();
        assert_eq!(good.len(), 2, "one segment, one late count");
        assert_eq!(rebuild(&parts.header, &good).unwrap(), q);
        let refused = |header: &[u8], parts: &[(Part<u32>, Vec<u8>)], why: &str| {
            let err = rebuild(header, parts).unwrap_err();
            assert!(matches!(err, GateError::TimerQueueCodec { .. }));
            assert!(err.to_string().contains(why), "{err} does not say {why}");
        };
        refused(&[], &good, "header: empty input");
        let mut wrong_version = parts.header.clone();
        wrong_version[0] = 9;
        refused(&wrong_version, &good, "unknown version 9");
        let mut trailing = parts.header.clone();
        trailing.push(0);
        refused(&trailing, &good, "trailing bytes");
        let twice = [good.clone(), good.clone()].concat();
        refused(&parts.header, &twice, "twice");
        let segment = good[0].1.clone();
        refused(
            &parts.header,
            &[(Part::Segment(1), segment.clone())],
            "not below the next segment",
        );
        // The same entries under another number: arrivals appear twice.
        let mut header_two = q.clone();
        header_two.next_segment = 2;
        let two = header_two.header(2).unwrap();
        refused(
            &two,
            &[
                (Part::Segment(0), segment.clone()),
                (Part::Segment(1), segment.clone()),
            ],
            "arrival 1 appears twice",
        );
        // A header from before the last park: arrivals not below its next arrival.
        let mut earlier = q.clone();
        earlier.next_arrival = 2;
        refused(
            &earlier.header(1).unwrap(),
            &good,
            "not below the next arrival",
        );
        // An entry parked below its own event time.
        let mut low: TimerQueue<u32, u32> = TimerQueue::new();
        low.park(1, 50, [], 1);
        let mut low_parts = low.to_parts().unwrap();
        let low_record = low_parts.parts.remove(0).1.unwrap();
        let ids = segment_ids(&low_record).unwrap();
        assert_eq!(ids, vec![(50, 0)]);
        let mut bad_ids = vec![CODEC_VERSION];
        encode_into(&vec![(40i64, 0u64)], &mut bad_ids).unwrap();
        let rest = &low_record[1 + {
            let mut n = Vec::new();
            encode_into(&ids, &mut n).unwrap();
            n.len()
        }..];
        bad_ids.extend_from_slice(rest);
        refused(
            &low_parts.header,
            &[(Part::Segment(0), bad_ids)],
            "below the event time",
        );
        // Ids and entries in different numbers; no entries at all.
        let mut mismatch = vec![CODEC_VERSION];
        encode_into(&vec![(50i64, 0u64), (60i64, 1u64)], &mut mismatch).unwrap();
        mismatch.extend_from_slice(rest);
        refused(
            &low_parts.header,
            &[(Part::Segment(0), mismatch)],
            "2 ids for 1 entries",
        );
        let mut empty = vec![CODEC_VERSION];
        encode_into(&Vec::<(i64, u64)>::new(), &mut empty).unwrap();
        encode_into(&0u64, &mut empty).unwrap();
        refused(
            &low_parts.header,
            &[(Part::Segment(0), empty)],
            "no entries",
        );
        let zero = [(Part::Late(7), encode(&0u64).unwrap())];
        refused(&parts.header, &zero, "late count of 0");
        // Every truncation and single-byte corruption of every record either rebuilds a queue
        // that keeps the invariants or is refused; none panics.
        for (i, (_, record)) in good.iter().enumerate() {
            for cut in 0..record.len() {
                let mut bad = good.clone();
                bad[i].1.truncate(cut);
                assert!(
                    rebuild(&parts.header, &bad).is_err(),
                    "record {i} cut at {cut}"
                );
            }
            for at in 1..record.len() {
                for v in [0u8, 1, 0x7f, 0xfb, 0xff] {
                    let mut bad = good.clone();
                    bad[i].1[at] = v;
                    if let Ok(mut d) = rebuild(&parts.header, &bad) {
                        let w = d.watermark();
                        let released = d.advance(i64::MAX);
                        assert!(released.iter().all(|r| r.park_time_ms >= r.event_time_ms));
                        assert!(
                            released
                                .iter()
                                .all(|r| w.is_none_or(|w| r.park_time_ms > w))
                        );
                    }
                }
            }
        }
        for cut in 0..parts.header.len() {
            assert!(rebuild(&parts.header[..cut], &good).is_err());
        }
        let _ = segment;
    }
}
