//! The bytes of a stage's changelog: the key layout, each record's encoding and decoding, and
//! the fold a restore applies to the records of one partition ([`Restored`]). Pure: no I/O.
//! The runtime (`parsley-runtime`) writes these records in the stage's transaction and reads
//! them back on assignment (the book's specification, §7, "exact restore"); the topic is
//! [`changelog_topic`](crate::changelog_topic).
//!
//! # Layout
//! One compacted topic per stage, `{application}.{stage}.changelog`, with as many partitions as
//! the stage's sources; partition `p` belongs to task `p`. Records:
//! - key `0x00 ++ k` ([`STATE_PREFIX`]), value `v`: the fold state of key `k` (a tombstone
//!   deletes it);
//! - key [`TASK_STATE_KEY`], value the processor's task state
//!   ([`RawStep::task_state`](crate::RawStep::task_state)), a tombstone once deleted;
//! - key [`META_KEY`], value a [`TaskSnapshot`]: the task's sender id and next send sequence,
//!   its node clock, its gate snapshot (baselines, frontiers, look-ahead sets, delivered
//!   sequences) and the input offsets committed with it;
//! - for a stage that orders by event time (the timer queue's changelog form, see
//!   [`parsley_gate::TimerQueue`]):
//!   - key [`EVENT_TIME_KEY`], value an [`EventTimeRecord`]: the task's watermark snapshot,
//!     the names of the topics whose records may be parked and the queue's header, written in
//!     the same transaction as every task snapshot, so both describe the same moment;
//!   - key `0x04 ++ segment number (8 bytes, big-endian)` ([`timer_part_key`]), value one
//!     segment of the timer queue (entries whose value is a [`ParkedRecord`]): the records
//!     parked during one commit interval that were still parked at its commit (several
//!     segments when they exceed the segment size), or carried forward from an older segment;
//!     a tombstone once none of its records is parked. A released record is not written: an
//!     entry is parked iff its park time is above the watermark of the event-time record
//!     committed with it;
//!   - key `0x03 ++ k` ([`timer_part_key`]), value the late count of key `k`;
//!   - key `0x05 ++ time (8 bytes big-endian, sign bit flipped) ++ k` ([`timer_key`]), an
//!     empty value: a keyed timer the processor set for key `k` at that event time, not fired
//!     yet (a tombstone once it fired).
//!
//! - key `0x06 ++ schedule (4 bytes, big-endian)` ([`punctuation_key`]), value a
//!   [`PunctuationRecord`]: where the task's punctuation schedule of that index stands (its
//!   type, interval, next firing time and firings decided but not made yet).
//!
//!   Key `0x02` held one parked record per key in an earlier form (no longer read: a restore
//!   that meets one fails, naming it).
//!
//! # Invariants
//! - Every decoder here takes untrusted bytes: it returns an error naming what is wrong and
//!   never panics, and what it may allocate is bounded (a corrupt length never allocates more
//!   than the decoder's limit).
//! - Every encoder's output decodes to the value encoded; a decoded value encodes to bytes that
//!   decode to the same value. Key encodings are canonical: a key that decodes is the encoding
//!   of what it decodes to.
//! - The keys of the record kinds do not overlap: each key names at most one kind, so the fold
//!   ([`Restored::apply`]) keeps the latest record of every key and never mixes kinds.
//!
//! Beside the rest of the crate: it imports none of its other modules.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use parsley_gate::Part;

mod event_time;
mod punctuation;
mod snapshot;

pub use event_time::{EventTimeRecord, EventTimeState, ParkedRecord};
pub use punctuation::{PunctuationRecord, punctuation_key, punctuation_of};
pub use snapshot::TaskSnapshot;

/// Key prefix of fold-state records: `0x00 ++ k` holds the fold state of key `k`.
pub const STATE_PREFIX: u8 = 0x00;
/// Key of the task snapshot record ([`TaskSnapshot`]).
pub const META_KEY: &[u8] = b"\x01parsley.task";
/// Key of the processor's task state: state of the task that belongs to no key.
pub const TASK_STATE_KEY: &[u8] = b"\x01parsley.task_state";
/// Key of the event-time record of a stage that orders by event time ([`EventTimeRecord`]),
/// always written with the task snapshot.
pub const EVENT_TIME_KEY: &[u8] = b"\x01parsley.event_time";
/// Key prefix of a parked record of the timer queue in the earlier, per-record form (refused).
const OLD_TIMER_PREFIX: u8 = 0x02;
/// Key prefix of a key's late count: `0x03 ++ k`.
pub const LATE_PREFIX: u8 = 0x03;
/// Key prefix of a segment of the timer queue: `0x04 ++ n` (8 bytes, big-endian).
pub const SEGMENT_PREFIX: u8 = 0x04;
/// Key prefix of a keyed timer: `0x05 ++ time ++ k` ([`timer_key`]).
pub const TIMER_PREFIX: u8 = 0x05;
/// Key prefix of a punctuation schedule's record: `0x06 ++ schedule` ([`punctuation_key`]).
pub const PUNCTUATION_PREFIX: u8 = 0x06;

/// The changelog key of a part of a task's timer queue (module docs: the layout): `0x04 ++ n`
/// (9 bytes) for segment `n`, `0x03 ++ k` for the late count of key `k`. Segment keys sort by
/// segment number.
pub fn timer_part_key(part: &Part<Vec<u8>>) -> Vec<u8> {
    match part {
        Part::Segment(n) => {
            let mut key = Vec::with_capacity(9);
            key.push(SEGMENT_PREFIX);
            key.extend_from_slice(&n.to_be_bytes());
            key
        }
        Part::Late(k) => {
            let mut key = Vec::with_capacity(1 + k.len());
            key.push(LATE_PREFIX);
            key.extend_from_slice(k);
            key
        }
    }
}

/// The part of a timer queue that changelog key `key` names ([`timer_part_key`]'s inverse):
/// `None` for a key that is not a timer-queue key.
///
/// # Errors
/// `Some(Err(message))` for a segment key of the wrong length, or a key of the earlier
/// per-record form.
pub fn timer_part_of(key: &[u8]) -> Option<Result<Part<Vec<u8>>, String>> {
    match key.split_first() {
        Some((&SEGMENT_PREFIX, rest)) => Some(match <[u8; 8]>::try_from(rest) {
            Ok(b) => Ok(Part::Segment(u64::from_be_bytes(b))),
            Err(_) => Err(format!("a segment key of {} bytes instead of 9", key.len())),
        }),
        Some((&LATE_PREFIX, k)) => Some(Ok(Part::Late(k.to_vec()))),
        Some((&OLD_TIMER_PREFIX, _)) => Some(Err(
            "a parked record in the earlier per-record form of the timer queue's changelog \
             (written by an older Parsley; not read by this one)"
                .into(),
        )),
        _ => None,
    }
}

/// The changelog key of the keyed timer `(time, key)`, `time` in ms since the epoch:
/// `0x05 ++ time ++ key`, the time as 8 bytes big-endian with the sign bit flipped, so keys
/// sort by time, then by key.
pub fn timer_key(time: i64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + key.len());
    out.push(TIMER_PREFIX);
    out.extend_from_slice(&((time as u64) ^ (1 << 63)).to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The keyed timer `(time ms, key)` of a changelog key `0x05 ++ …` (the prefix included;
/// [`timer_key`]'s inverse).
///
/// # Errors
/// A key that does not start with [`TIMER_PREFIX`] or is too short to hold a time, named.
pub fn timer_of(changelog_key: &[u8]) -> Result<(i64, Vec<u8>), String> {
    match changelog_key {
        [TIMER_PREFIX, rest @ ..] if rest.len() >= 8 => {
            let (time, key) = rest.split_at(8);
            let bits = u64::from_be_bytes(time.try_into().expect("8 bytes"));
            Ok(((bits ^ (1 << 63)) as i64, key.to_vec()))
        }
        [TIMER_PREFIX, ..] => Err(format!(
            "a timer key of {} bytes, fewer than 9",
            changelog_key.len()
        )),
        _ => Err(format!(
            "a timer key that does not start with {TIMER_PREFIX:#04x}"
        )),
    }
}

/// The bytes of a fold state key or value: up to 16 inline (no allocation, no pointer to
/// follow when the map compares or rehashes a key), longer ones on the heap. Hashes and
/// compares as its slice does, so a map of them is looked up by `&[u8]`.
pub type StateBytes = smallvec::SmallVec<[u8; 16]>;

/// `bytes` as [`StateBytes`]: inline when they fit, else the vector's own buffer (no copy).
pub fn state_bytes(bytes: Vec<u8>) -> StateBytes {
    if bytes.len() <= 16 {
        StateBytes::from_slice(&bytes)
    } else {
        StateBytes::from_vec(bytes)
    }
}

/// Fold state by key bytes: a hash map whose hasher is foldhash, seeded at random per process
/// (record keys come from outside: a fixed hash would let a producer make them collide).
pub type StateMap = HashMap<StateBytes, StateBytes, foldhash::quality::RandomState>;

/// How many entries of a map of fold state [`heap_bytes`] looks at.
pub const HEAP_SAMPLE: usize = 64;

/// The heap bytes held outside a map's table by its entries' keys and values longer than 16
/// bytes (their own buffers, at capacity), for the memory bound: exact for a map of at most
/// [`HEAP_SAMPLE`] entries, else the mean of its first [`HEAP_SAMPLE`] entries times `len`. A
/// hash map's iteration order follows its keys' hashes, seeded at random, so the first entries
/// are a sample of no particular key; a few values far larger than the rest may be missed by
/// it. `entries` yields each key and its value (`None`: a deletion), `len` is their number.
pub fn heap_bytes<'a>(
    len: usize,
    entries: impl Iterator<Item = (&'a StateBytes, Option<&'a StateBytes>)>,
) -> u64 {
    let own = |b: &StateBytes| if b.spilled() { b.capacity() } else { 0 };
    let (mut seen, mut bytes) = (0usize, 0usize);
    for (k, v) in entries.take(HEAP_SAMPLE) {
        seen += 1;
        bytes += own(k) + v.map_or(0, own);
    }
    match seen {
        0 => 0,
        n if n >= len => bytes as u64,
        n => (bytes as u64).saturating_mul(len as u64) / n as u64,
    }
}

/// What a changelog partition holds once its records are folded in offset order
/// ([`Restored::apply`]): the latest record of each key, tombstoned keys removed. Values are
/// kept undecoded except the task snapshot's; the event-time record and the timer queue's
/// parts are decoded together, against the stage's topology ([`EventTimeState::decode`]).
#[derive(Debug, Default)]
pub struct Restored {
    /// Fold state by key (`k` of `0x00 ++ k`).
    pub state: StateMap,
    /// The latest task snapshot, if the task ever committed.
    pub snapshot: Option<TaskSnapshot>,
    /// The latest event-time record (undecoded), if one was ever written.
    pub event_time: Option<Vec<u8>>,
    /// The processor's task state, if it has one.
    pub task_state: Option<Vec<u8>>,
    /// The latest record of every part of the timer queue that has one (undecoded).
    pub timers: BTreeMap<Part<Vec<u8>>, Vec<u8>>,
    /// The processor's keyed timers set at the last commit: (time ms, key).
    pub keyed_timers: BTreeSet<(i64, Vec<u8>)>,
    /// Where each punctuation schedule stood at the last commit, by schedule index.
    pub punctuations: BTreeMap<u32, PunctuationRecord>,
    /// Records folded, including those refused.
    pub records: u64,
    /// Whether fold-state records are left out of [`Restored::state`] (kept elsewhere: on
    /// disk). Default `false`.
    pub state_elsewhere: bool,
}

impl Restored {
    /// What a task keeps of its changelog to return to its last commit without reading it
    /// again: everything folded but the fold state (`state_elsewhere` set, so fold-state
    /// records folded into it later are left out too), no record counted. Folding into it the
    /// records of each transaction that commits keeps it equal to what a restore of the
    /// committed changelog folds, fold state aside.
    pub fn image(&self) -> Restored {
        Restored {
            state: StateMap::default(),
            snapshot: self.snapshot.clone(),
            event_time: self.event_time.clone(),
            task_state: self.task_state.clone(),
            timers: self.timers.clone(),
            keyed_timers: self.keyed_timers.clone(),
            punctuations: self.punctuations.clone(),
            records: 0,
            state_elsewhere: true,
        }
    }

    /// Folds one changelog record (`value` `None`: a tombstone) into what the partition holds:
    /// the latest record of each key wins, a tombstone removes its key. A task snapshot is
    /// decoded here; the other values are kept as they are.
    ///
    /// # Errors
    /// What is wrong with the record: an unknown key, a snapshot or event-time record without
    /// a value, a snapshot or a timer key that does not decode. The message is never empty;
    /// what was folded before stays.
    pub fn apply(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), String> {
        self.records += 1;
        if key == META_KEY {
            let value = value.ok_or("task snapshot without a value")?;
            self.snapshot = Some(TaskSnapshot::decode(value)?);
        } else if key == EVENT_TIME_KEY {
            let value = value.ok_or("event-time record without a value")?;
            self.event_time = Some(value.to_vec());
        } else if key == TASK_STATE_KEY {
            self.task_state = value.map(<[u8]>::to_vec);
        } else if let Some((&STATE_PREFIX, k)) = key.split_first() {
            if self.state_elsewhere {
                return Ok(());
            }
            match value {
                Some(v) => self
                    .state
                    .insert(StateBytes::from_slice(k), StateBytes::from_slice(v)),
                None => self.state.remove(k),
            };
        } else if key.first() == Some(&TIMER_PREFIX) {
            let timer = timer_of(key)?;
            match value {
                Some(_) => self.keyed_timers.insert(timer),
                None => self.keyed_timers.remove(&timer),
            };
        } else if key.first() == Some(&PUNCTUATION_PREFIX) {
            let schedule = punctuation_of(key)?;
            match value {
                Some(v) => self
                    .punctuations
                    .insert(schedule, PunctuationRecord::decode(v)?),
                None => self.punctuations.remove(&schedule),
            };
        } else if let Some(part) = timer_part_of(key) {
            let part = part?;
            match value {
                Some(v) => self.timers.insert(part, v.to_vec()),
                None => self.timers.remove(&part),
            };
        } else {
            return Err(format!("unknown key {key:?}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod decode_properties;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_bytes_counts_only_buffers_beyond_the_inline_sixteen_bytes() {
        let mut map = StateMap::default();
        map.insert(state_bytes(b"short".to_vec()), state_bytes(vec![1; 16]));
        assert_eq!(
            heap_bytes(map.len(), map.iter().map(|(k, v)| (k, Some(v)))),
            0
        );
        map.insert(state_bytes(vec![2; 40]), state_bytes(vec![3; 100]));
        let exact = heap_bytes(map.len(), map.iter().map(|(k, v)| (k, Some(v))));
        assert_eq!(exact, 140, "the 40-byte key and the 100-byte value");
        // A deletion's missing value counts nothing.
        let k = state_bytes(vec![4; 20]);
        assert_eq!(heap_bytes(1, std::iter::once((&k, None))), 20);
    }

    #[test]
    fn heap_bytes_of_a_large_map_scales_its_sample() {
        let mut map = StateMap::default();
        for i in 0..10_000u32 {
            // 4-byte keys inline, 32-byte values on the heap.
            map.insert(
                state_bytes(i.to_be_bytes().to_vec()),
                state_bytes(vec![0; 32]),
            );
        }
        let estimate = heap_bytes(map.len(), map.iter().map(|(k, v)| (k, Some(v))));
        assert_eq!(
            estimate, 320_000,
            "every value alike: the sample's mean is exact"
        );
    }

    #[test]
    fn timer_part_keys_round_trip_and_old_keys_are_refused() {
        let parts = [
            Part::Late(Vec::new()),
            Part::Late(b"product-1".to_vec()),
            Part::Segment(0),
            Part::Segment(1),
            Part::Segment(u64::MAX),
        ];
        let keys: Vec<Vec<u8>> = parts.iter().map(timer_part_key).collect();
        assert!(keys.is_sorted(), "segments sort by number: {keys:?}");
        for (p, k) in parts.iter().zip(&keys) {
            assert_eq!(timer_part_of(k), Some(Ok(p.clone())));
        }
        assert_eq!(
            timer_part_of(&keys[3][..8]),
            Some(Err("a segment key of 8 bytes instead of 9".into()))
        );
        let mut old = vec![OLD_TIMER_PREFIX];
        old.extend_from_slice(&[0; 16]);
        assert!(
            matches!(timer_part_of(&old), Some(Err(m)) if m.contains("earlier per-record form"))
        );
        assert_eq!(timer_part_of(META_KEY), None);
        assert_eq!(timer_part_of(EVENT_TIME_KEY), None);
        assert_eq!(timer_part_of(TASK_STATE_KEY), None);
        assert_eq!(timer_part_of(&[STATE_PREFIX, 1]), None);
        assert_eq!(timer_part_of(&[TIMER_PREFIX, 1]), None);
    }

    #[test]
    fn keyed_timer_keys_sort_by_time_and_read_back() {
        let timers = [
            (i64::MIN, b"a".to_vec()),
            (-1, b"b".to_vec()),
            (0, Vec::new()),
            (5, b"a".to_vec()),
            (i64::MAX, b"z".to_vec()),
        ];
        let keys: Vec<Vec<u8>> = timers.iter().map(|(t, k)| timer_key(*t, k)).collect();
        assert!(keys.is_sorted(), "{keys:?}");
        for (timer, key) in timers.iter().zip(&keys) {
            assert_eq!(timer_of(key).as_ref(), Ok(timer));
        }
        assert_eq!(
            timer_of(&[TIMER_PREFIX, 1, 2]),
            Err("a timer key of 3 bytes, fewer than 9".to_string())
        );
        assert!(timer_of(&[LATE_PREFIX; 9]).unwrap_err().contains("0x05"));
    }

    #[test]
    fn state_bytes_up_to_sixteen_are_inline_and_longer_keep_their_buffer() {
        let short = state_bytes(b"0123456789abcdef".to_vec());
        assert_eq!(&short[..], b"0123456789abcdef");
        assert!(!short.spilled(), "16 bytes fit inline");
        let long = b"0123456789abcdefg".to_vec();
        let at = long.as_ptr();
        let long = state_bytes(long);
        assert_eq!(&long[..], b"0123456789abcdefg");
        assert!(long.spilled());
        assert_eq!(long.as_ptr(), at, "17 bytes keep the vector's buffer");
        let mut map = StateMap::default();
        map.insert(long.clone(), short.clone());
        assert_eq!(map.get(&b"0123456789abcdefg"[..]), Some(&short));
    }

    #[test]
    fn the_fold_keeps_the_latest_record_of_each_key_and_names_an_unknown_one() {
        let mut r = Restored::default();
        r.apply(&[STATE_PREFIX, b'k'], Some(b"1")).unwrap();
        r.apply(&[STATE_PREFIX, b'k'], Some(b"2")).unwrap();
        r.apply(&[STATE_PREFIX, b'j'], Some(b"3")).unwrap();
        r.apply(&[STATE_PREFIX, b'j'], None).unwrap();
        assert_eq!(
            r.state,
            StateMap::from_iter([(b"k"[..].into(), b"2"[..].into())])
        );
        r.apply(&timer_key(7, b"k"), Some(&[])).unwrap();
        r.apply(&timer_key(8, b"k"), Some(&[])).unwrap();
        r.apply(&timer_key(7, b"k"), None).unwrap();
        assert_eq!(r.keyed_timers, BTreeSet::from([(8, b"k".to_vec())]));
        r.apply(&timer_part_key(&Part::Segment(3)), Some(b"s"))
            .unwrap();
        r.apply(&timer_part_key(&Part::Late(b"k".to_vec())), Some(b"l"))
            .unwrap();
        r.apply(&timer_part_key(&Part::Late(b"k".to_vec())), None)
            .unwrap();
        assert_eq!(
            r.timers,
            BTreeMap::from([(Part::Segment(3), b"s".to_vec())])
        );
        assert_eq!(
            r.apply(EVENT_TIME_KEY, None).unwrap_err(),
            "event-time record without a value"
        );
        assert_eq!(
            r.apply(META_KEY, None).unwrap_err(),
            "task snapshot without a value"
        );
        r.apply(TASK_STATE_KEY, Some(b"t1")).unwrap();
        r.apply(TASK_STATE_KEY, Some(b"t2")).unwrap();
        assert_eq!(r.task_state.as_deref(), Some(&b"t2"[..]));
        r.apply(TASK_STATE_KEY, None).unwrap();
        assert_eq!(r.task_state, None);
        assert!(r.apply(b"\x09", None).unwrap_err().contains("unknown key"));
        let p = PunctuationRecord {
            kind: 0,
            interval_ms: 10,
            next: Some(20),
            pending: Vec::new(),
        };
        r.apply(&punctuation_key(1), Some(&p.encode())).unwrap();
        assert_eq!(r.punctuations, BTreeMap::from([(1, p)]));
        assert!(r.apply(&punctuation_key(1), Some(b"x")).is_err());
        r.apply(&punctuation_key(1), None).unwrap();
        assert!(r.punctuations.is_empty());
        assert_eq!(r.records, 19);
    }
}
