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
//! - every part whose record differs from the one last returned by
//!   [`TimerQueue::take_changes`] (or rebuilt by [`TimerQueue::from_parts`]) is in the
//!   changed sets.
//!
//! # Changelogging, per record
//! A queue holding days of history is large, so it is never written whole. Its changelog form
//! ([`QueueParts`]) is a small **header** (watermark, next arrival, counters), one record per
//! **parked record** ([`Part::Timer`], identified by its `(park time, arrival)`: the timer of
//! Flink's keyed timer service) holding its key, event time, late flag and value, and one
//! record per **key with late records** ([`Part::Late`]) holding its count.
//! [`TimerQueue::take_changes`] returns what changed since the last call: a parked record is
//! written once, a released one becomes a tombstone, and one parked and released between two
//! calls (the steady live case, released within the lag) is never written at all. A compacted
//! changelog therefore holds one record per parked record and per late key.
//! [`TimerQueue::from_parts`] rebuilds the queue from the header and the latest record of each
//! part. Each record is a version byte, then bincode 2 (standard configuration). Decoding
//! checks every invariant below across all parts and never panics on corrupt bytes.
//!
//! Cost: parking and releasing one record are `O(log n)` for `n` parked records; each
//! changelog write is one record per change.
//!
//! Source: the silence-problem seed (§04 "One: the timer queue is the sort", §06 "What it
//! doesn't promise") and DESIGN.md §5.

use std::collections::{BTreeMap, BTreeSet};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::GateError;

/// Version byte of every changelog record ([`TimerQueue::to_parts`]).
const CODEC_VERSION: u8 = 1;
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry<K, V> {
    key: K,
    event_time_ms: i64,
    late: bool,
    value: V,
}

/// The event-time sort of one task (module docs: the release rule and the late count).
///
/// `K` is the record key (late records are counted per key), `V` what the caller needs back.
#[derive(Debug, Clone)]
pub struct TimerQueue<K, V> {
    /// Parked records by `(park time, arrival)`; every park time is above `watermark`.
    parked: BTreeMap<(i64, u64), Entry<K, V>>,
    /// The latest watermark passed to [`TimerQueue::advance`]; never decreases.
    watermark: Option<i64>,
    next_arrival: u64,
    /// Late records per key (keys with at least one).
    late: BTreeMap<K, u64>,
    metrics: TimerMetrics,
    /// Parked records changed since the last [`take_changes`](TimerQueue::take_changes):
    /// `false` for one parked since (not in the changelog yet), `true` for one released since
    /// that is in the changelog (a tombstone is due).
    changed_timers: BTreeMap<(i64, u64), bool>,
    /// Keys whose late count grew since the last [`take_changes`](TimerQueue::take_changes).
    changed_late: BTreeSet<K>,
}

/// Two queues are equal when they hold the same records, watermark, arrivals, counters and late
/// counts; which keys changed since the last changelog write is not compared.
impl<K: PartialEq, V: PartialEq> PartialEq for TimerQueue<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.parked == other.parked
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
            parked: BTreeMap::new(),
            watermark: None,
            next_arrival: 0,
            late: BTreeMap::new(),
            metrics: TimerMetrics::default(),
            changed_timers: BTreeMap::new(),
            changed_late: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Clone, V> TimerQueue<K, V> {
    /// An empty queue with no watermark: nothing is released before the first
    /// [`advance`](Self::advance).
    pub fn new() -> Self {
        Self::default()
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
        self.changed_timers.insert((park_time_ms, arrival), false);
        self.parked.insert(
            (park_time_ms, arrival),
            Entry {
                key,
                event_time_ms,
                late,
                value,
            },
        );
        Parking::Parked {
            park_time_ms,
            arrival,
            late,
        }
    }

    /// Raises the watermark to `watermark_ms` (ms since the epoch) and releases every parked
    /// record whose park time is at or below it, in ascending `(park time, arrival)` order. A
    /// watermark below the current one changes nothing (the queue's watermark never
    /// decreases).
    pub fn advance(&mut self, watermark_ms: i64) -> Vec<Released<K, V>> {
        let w = self.watermark.map_or(watermark_ms, |w| w.max(watermark_ms));
        self.watermark = Some(w);
        let rest = match w.checked_add(1) {
            Some(next) => self.parked.split_off(&(next, 0)),
            None => BTreeMap::new(),
        };
        let due = std::mem::replace(&mut self.parked, rest);
        self.metrics.released += due.len() as u64;
        for id in due.keys() {
            // Parked since the last changes were taken: never written, nothing to delete.
            if self.changed_timers.remove(id).is_none() {
                self.changed_timers.insert(*id, true);
            }
        }
        due.into_iter()
            .map(|((park_time_ms, arrival), e)| Released {
                key: e.key,
                event_time_ms: e.event_time_ms,
                park_time_ms,
                arrival,
                late: e.late,
                value: e.value,
            })
            .collect()
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
        self.parked.iter().map(|((t, _), e)| (*t, &e.key, &e.value))
    }

    /// The smallest park time, ms: the watermark the next release needs.
    pub fn next_release(&self) -> Option<i64> {
        self.parked.keys().next().map(|(t, _)| *t)
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
}

/// The queue-wide part of the changelog form ([`TimerQueue::to_parts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Header {
    watermark: Option<i64>,
    next_arrival: u64,
    metrics: TimerMetrics,
}

/// A parked record's changelog record (its id is its [`Part::Timer`]).
#[derive(Serialize)]
struct TimerOut<'a, K, V> {
    key: &'a K,
    event_time_ms: i64,
    late: bool,
    value: &'a V,
}

#[derive(Deserialize)]
struct TimerIn<K, V> {
    key: K,
    event_time_ms: i64,
    late: bool,
    value: V,
}

/// What one changelog record of a queue describes (module docs: changelogging).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part<K> {
    /// One parked record, identified by its release position.
    Timer {
        /// Its park time, ms since the epoch.
        park_time_ms: i64,
        /// Its arrival number.
        arrival: u64,
    },
    /// The late count of one key.
    Late(K),
}

/// The changelog form of a queue, or of what changed in it since the last
/// [`take_changes`](TimerQueue::take_changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueParts<K> {
    /// The queue-wide record: watermark, next arrival, counters.
    pub header: Vec<u8>,
    /// Each part's record, or `None` when the part is gone (a released record: a tombstone).
    pub parts: Vec<(Part<K>, Option<Vec<u8>>)>,
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, GateError> {
    let mut out = vec![CODEC_VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, bincode::config::standard()).map_err(
        |e| GateError::TimerQueueCodec {
            message: e.to_string(),
        },
    )?;
    Ok(out)
}

fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, String> {
    let (&version, body) = bytes
        .split_first()
        .ok_or_else(|| format!("{what}: empty input"))?;
    if version != CODEC_VERSION {
        return Err(format!("{what}: unknown version {version}"));
    }
    let config = bincode::config::standard().with_limit::<DECODE_LIMIT>();
    let (value, used): (T, usize) =
        bincode::serde::decode_from_slice(body, config).map_err(|e| format!("{what}: {e}"))?;
    if used != body.len() {
        return Err(format!("{what}: {} trailing bytes", body.len() - used));
    }
    Ok(value)
}

impl<K: Ord + Clone + Serialize, V: Serialize> TimerQueue<K, V> {
    fn header(&self) -> Result<Vec<u8>, GateError> {
        encode(&Header {
            watermark: self.watermark,
            next_arrival: self.next_arrival,
            metrics: self.metrics,
        })
    }

    fn part(&self, part: &Part<K>) -> Result<Option<Vec<u8>>, GateError> {
        match part {
            Part::Timer {
                park_time_ms,
                arrival,
            } => self
                .parked
                .get(&(*park_time_ms, *arrival))
                .map(|e| {
                    encode(&TimerOut {
                        key: &e.key,
                        event_time_ms: e.event_time_ms,
                        late: e.late,
                        value: &e.value,
                    })
                })
                .transpose(),
            Part::Late(key) => self.late.get(key).map(encode).transpose(),
        }
    }

    /// The whole queue in its changelog form (module docs): the header and the record of every
    /// parked record and of every key's late count. Leaves the changes as they are.
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] when a key's or value's serde implementation fails.
    pub fn to_parts(&self) -> Result<QueueParts<K>, GateError> {
        self.parts_of(self.parked.keys(), self.late.keys())
    }

    /// The header and the record of the parked records `timers` and of the late counts of
    /// `late`, in that order.
    fn parts_of<'a>(
        &self,
        timers: impl Iterator<Item = &'a (i64, u64)>,
        late: impl Iterator<Item = &'a K>,
    ) -> Result<QueueParts<K>, GateError>
    where
        K: 'a,
    {
        let timers = timers.map(|&(park_time_ms, arrival)| Part::Timer {
            park_time_ms,
            arrival,
        });
        let mut parts = Vec::new();
        for p in timers.chain(late.map(|k| Part::Late(k.clone()))) {
            let record = self.part(&p)?;
            parts.push((p, record));
        }
        Ok(QueueParts {
            header: self.header()?,
            parts,
        })
    }

    /// What changed since the last call (or since the queue was created or rebuilt): the
    /// header, the record of each record parked since and still parked, a tombstone for each
    /// record released since that an earlier call returned, and the late count of each key
    /// whose count grew. A record parked and released between two calls is not mentioned.
    /// Written in order with the rest of a task's state in one transaction, these keep a
    /// compacted changelog equal to [`to_parts`](Self::to_parts).
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] when a key's or value's serde implementation fails; the
    /// changes are kept then.
    pub fn take_changes(&mut self) -> Result<QueueParts<K>, GateError> {
        let parts = self.parts_of(self.changed_timers.keys(), self.changed_late.iter())?;
        self.changed_timers.clear();
        self.changed_late.clear();
        Ok(parts)
    }
}

impl<K: Ord + Clone + DeserializeOwned, V: DeserializeOwned> TimerQueue<K, V> {
    /// Rebuilds a queue from its changelog form: the `header` and the latest record of every
    /// part that has one (tombstoned parts left out). Nothing counts as changed afterwards.
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] for an unknown version, truncated or trailing bytes,
    /// bytes that do not decode, a part given twice, a late count of 0, or records that break
    /// an invariant (a parked record at or below the watermark or below its own event time, an
    /// arrival not below the next arrival, an arrival given twice).
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
            metrics: h.metrics,
            ..TimerQueue::default()
        };
        let mut arrivals = BTreeSet::new();
        for (part, bytes) in parts {
            match part {
                Part::Timer {
                    park_time_ms: t,
                    arrival: a,
                } => {
                    let e: TimerIn<K, V> = decode("parked record", bytes)?;
                    if q.watermark.is_some_and(|w| t <= w) {
                        return Err(format!("record parked at {t} is at or below the watermark"));
                    }
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
                    q.parked.insert(
                        (t, a),
                        Entry {
                            key: e.key,
                            event_time_ms: e.event_time_ms,
                            late: e.late,
                            value: e.value,
                        },
                    );
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
    }

    impl<K: Ord + Clone> Log<K> {
        fn apply(&mut self, changes: QueueParts<K>) {
            self.header = changes.header;
            for (p, record) in changes.parts {
                self.writes += 1;
                match record {
                    Some(r) => self.parts.insert(p, r),
                    None => self.parts.remove(&p),
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
    fn changes_keep_a_compacted_changelog_equal_to_the_queue_and_write_each_record_once() {
        let mut q: TimerQueue<u8, u32> = TimerQueue::new();
        let mut log = Log::default();
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        for i in 0..100u32 {
            q.park((i % 7) as u8, 1_000 + i64::from(i), [], i);
        }
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.writes, 100, "one record per parked record");
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        // Nothing changed: only the header is written.
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.writes, 100);
        // 30 released: 30 tombstones; one late record: one late count.
        assert_eq!(q.advance(1_029).len(), 30);
        q.park(3, 1_000, [], 1_000);
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.writes, 131);
        assert_eq!(log.parts.len(), 71, "70 parked, 1 late count");
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        // Parked and released between two writes: never written.
        q.park(1, 5_000, [], 1);
        q.park(2, 2_000, [], 2);
        q.advance(1_500);
        assert_eq!(q.len(), 2);
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        let before = log.writes;
        q.park(4, 1_600, [], 4);
        q.advance(1_700);
        log.apply(q.take_changes().unwrap());
        assert_eq!(
            log.writes, before,
            "the record at 1600 left before any write"
        );
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
        q.advance(i64::MAX);
        log.apply(q.take_changes().unwrap());
        assert_eq!(log.parts.len(), 1, "only the late count is left");
        assert_eq!(log.rebuild::<u32>().unwrap(), q);
    }

    #[test]
    fn corrupt_parts_are_refused_without_panicking() {
        let mut q: TimerQueue<u32, u32> = TimerQueue::new();
        q.park(1, 10, [], 1);
        q.park(2, 20, [], 2);
        q.advance(15);
        q.park(2, 5, [], 3); // late
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
        assert_eq!(good.len(), 2);
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
        // A record parked at or below the watermark (15).
        let (Part::Timer { arrival, .. }, record) = &good[0] else {
            panic!("{good:?}")
        };
        let low = [(
            Part::Timer {
                park_time_ms: 15,
                arrival: *arrival,
            },
            record.clone(),
        )];
        refused(&parts.header, &low, "at or below the watermark");
        let future = [(
            Part::Timer {
                park_time_ms: 20,
                arrival: 9,
            },
            record.clone(),
        )];
        refused(&parts.header, &future, "not below the next arrival");
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
    }
}
