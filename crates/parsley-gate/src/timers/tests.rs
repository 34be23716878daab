//! Unit tests of the timer queue: release order, late records, the slab and runs, and the
//! changelog (segments, carrying, restores, corrupt parts).

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::codec::{CODEC_VERSION, encode, encode_into};
use super::sort::{CHUNK, RUNS};
use super::*;
use crate::error::GateError;

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
