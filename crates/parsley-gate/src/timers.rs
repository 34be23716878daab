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
//! - the watermark never decreases.
//!
//! # Changelogging
//! [`TimerQueue::to_bytes`] / [`TimerQueue::from_bytes`]: a version byte, then bincode 2
//! (standard configuration) of the parked records, the watermark, the next arrival, the
//! counters and the per-key late counts. Decoding checks every invariant above and never
//! panics on corrupt bytes.
//!
//! Cost: parking and releasing one record are `O(log n)` for `n` parked records.
//!
//! Source: the silence-problem seed (§04 "One: the timer queue is the sort", §06 "What it
//! doesn't promise") and DESIGN.md §5.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::GateError;

/// Version byte of [`TimerQueue::to_bytes`].
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerQueue<K, V> {
    /// Parked records by `(park time, arrival)`; every park time is above `watermark`.
    parked: BTreeMap<(i64, u64), Entry<K, V>>,
    /// The latest watermark passed to [`TimerQueue::advance`]; never decreases.
    watermark: Option<i64>,
    next_arrival: u64,
    /// Late records per key (keys with at least one).
    late: BTreeMap<K, u64>,
    metrics: TimerMetrics,
}

impl<K, V> Default for TimerQueue<K, V> {
    fn default() -> Self {
        TimerQueue {
            parked: BTreeMap::new(),
            watermark: None,
            next_arrival: 0,
            late: BTreeMap::new(),
            metrics: TimerMetrics::default(),
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
    /// ancestors after [`from_bytes`](Self::from_bytes)).
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

#[derive(Serialize)]
struct WireOut<'a, K, V> {
    watermark: Option<i64>,
    next_arrival: u64,
    metrics: TimerMetrics,
    parked: Vec<(i64, u64, &'a Entry<K, V>)>,
    late: Vec<(&'a K, u64)>,
}

#[derive(Deserialize)]
struct WireIn<K, V> {
    watermark: Option<i64>,
    next_arrival: u64,
    metrics: TimerMetrics,
    parked: Vec<(i64, u64, Entry<K, V>)>,
    late: Vec<(K, u64)>,
}

impl<K: Ord + Clone + Serialize, V: Serialize> TimerQueue<K, V> {
    /// Encodes the queue for the changelog (module docs: the format).
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] when a key's or value's serde implementation fails.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GateError> {
        let wire = WireOut {
            watermark: self.watermark,
            next_arrival: self.next_arrival,
            metrics: self.metrics,
            parked: self.parked.iter().map(|((t, a), e)| (*t, *a, e)).collect(),
            late: self.late.iter().map(|(k, n)| (k, *n)).collect(),
        };
        let mut out = vec![CODEC_VERSION];
        bincode::serde::encode_into_std_write(&wire, &mut out, bincode::config::standard())
            .map_err(|e| GateError::TimerQueueCodec {
                message: e.to_string(),
            })?;
        Ok(out)
    }
}

impl<K: Ord + Clone + DeserializeOwned, V: DeserializeOwned> TimerQueue<K, V> {
    /// Decodes a queue written by [`to_bytes`](Self::to_bytes).
    ///
    /// # Errors
    /// [`GateError::TimerQueueCodec`] for an unknown version, truncated or trailing bytes,
    /// bytes that do not decode, or a decoded queue that breaks an invariant (a parked record
    /// at or below the watermark or below its own event time, an arrival not below the next
    /// arrival, a duplicate arrival or key).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, GateError> {
        let bad = |message: String| GateError::TimerQueueCodec { message };
        let (&version, body) = bytes
            .split_first()
            .ok_or_else(|| bad("empty input".into()))?;
        if version != CODEC_VERSION {
            return Err(bad(format!("unknown version {version}")));
        }
        let config = bincode::config::standard().with_limit::<DECODE_LIMIT>();
        let (wire, used): (WireIn<K, V>, usize) =
            bincode::serde::decode_from_slice(body, config).map_err(|e| bad(e.to_string()))?;
        if used != body.len() {
            return Err(bad(format!("{} trailing bytes", body.len() - used)));
        }
        let mut parked = BTreeMap::new();
        let mut arrivals = std::collections::BTreeSet::new();
        for (t, a, e) in wire.parked {
            if wire.watermark.is_some_and(|w| t <= w) {
                return Err(bad(format!(
                    "record parked at {t} is at or below the watermark"
                )));
            }
            if t < e.event_time_ms {
                return Err(bad(format!(
                    "park time {t} is below the event time {}",
                    e.event_time_ms
                )));
            }
            if a >= wire.next_arrival {
                return Err(bad(format!("arrival {a} is not below the next arrival")));
            }
            if !arrivals.insert(a) {
                return Err(bad(format!("arrival {a} appears twice")));
            }
            parked.insert((t, a), e);
        }
        let mut late = BTreeMap::new();
        for (k, n) in wire.late {
            if late.insert(k, n).is_some() {
                return Err(bad("a key's late count appears twice".into()));
            }
        }
        Ok(TimerQueue {
            parked,
            watermark: wire.watermark,
            next_arrival: wire.next_arrival,
            late,
            metrics: wire.metrics,
        })
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

    #[test]
    fn bytes_round_trip_and_the_decoded_queue_behaves_the_same() {
        let mut q: TimerQueue<String, Vec<u8>> = TimerQueue::new();
        q.park("a".into(), 30, [], vec![1]);
        q.park("b".into(), 10, [20], vec![2]);
        q.advance(15);
        q.park("c".into(), 5, [], vec![3]); // late, released at once
        q.park("d".into(), 25, [], vec![4]);
        let bytes = q.to_bytes().unwrap();
        let mut back: TimerQueue<String, Vec<u8>> = TimerQueue::from_bytes(&bytes).unwrap();
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
    fn corrupt_bytes_are_refused_without_panicking() {
        let mut q: TimerQueue<u32, u32> = TimerQueue::new();
        q.park(1, 10, [], 1);
        q.park(2, 20, [], 2);
        let bytes = q.to_bytes().unwrap();
        let decode = |b: &[u8]| TimerQueue::<u32, u32>::from_bytes(b);
        assert!(matches!(
            decode(&[]),
            Err(GateError::TimerQueueCodec { .. })
        ));
        let mut wrong_version = bytes.clone();
        wrong_version[0] = 9;
        assert!(matches!(
            decode(&wrong_version),
            Err(GateError::TimerQueueCodec { .. })
        ));
        for cut in 1..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(decode(&trailing).is_err());
        // Every single-byte corruption either decodes to a queue that keeps the invariants
        // or is refused; none panics.
        for i in 1..bytes.len() {
            for v in [0u8, 1, 0x7f, 0xfb, 0xff] {
                let mut b = bytes.clone();
                b[i] = v;
                if let Ok(mut d) = decode(&b) {
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

    #[test]
    fn a_decoded_queue_that_breaks_an_invariant_is_refused() {
        // Built by hand: a record parked at or below the watermark.
        let wire = WireOut::<u8, u8> {
            watermark: Some(50),
            next_arrival: 1,
            metrics: TimerMetrics::default(),
            parked: vec![(
                40,
                0,
                &Entry {
                    key: 1,
                    event_time_ms: 40,
                    late: false,
                    value: 0,
                },
            )],
            late: vec![],
        };
        let mut bytes = vec![CODEC_VERSION];
        bincode::serde::encode_into_std_write(&wire, &mut bytes, bincode::config::standard())
            .unwrap();
        let err = TimerQueue::<u8, u8>::from_bytes(&bytes).unwrap_err();
        assert!(
            err.to_string().contains("at or below the watermark"),
            "{err}"
        );
    }
}
