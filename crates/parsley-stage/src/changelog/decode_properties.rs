//! The changelog's decoders on untrusted bytes: a task snapshot, an event-time record (with the
//! timer queue's parts) and every record a restore folds ([`Restored::apply`]) never panic on
//! arbitrary bytes or on a valid record with bytes flipped, and a valid record still
//! round-trips.

use std::collections::BTreeMap;

use parsley_clock::{Channel, SenderId, TopicId};
use parsley_gate::{
    ChannelSnapshot, GateSnapshot, InputSnapshot, Part, TimerQueue, WatermarkSnapshot,
};
use proptest::prelude::*;

use super::{EventTimeRecord, EventTimeState, Restored, TaskSnapshot};

/// A task snapshot with one channel of every part (the changelog's tests share it).
pub(crate) fn snapshot() -> TaskSnapshot {
    let c = Channel::new(TopicId::from_halves(1, 2), 3);
    TaskSnapshot {
        sender: SenderId::from_bytes([7; 16]),
        next_seq: 42,
        clock: [c.at(10)].into_iter().collect(),
        gate: GateSnapshot {
            channels: vec![ChannelSnapshot {
                channel: c,
                baseline: 0,
                frontier: 9,
                lookahead: vec![12, 15],
                delivered: vec![(SenderId::from_bytes([1; 16]), 4)],
            }],
        },
        offsets: vec![(c, 10)],
    }
}

/// `bytes` with `flips` applied: `(index, xor)`, the index taken modulo the length.
fn flipped(mut bytes: Vec<u8>, flips: &[(usize, u8)]) -> Vec<u8> {
    if !bytes.is_empty() {
        for &(at, xor) in flips {
            let at = at % bytes.len();
            bytes[at] ^= xor;
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn a_snapshot_decodes_or_is_refused_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        flips in proptest::collection::vec((any::<usize>(), 1..=255u8), 1..6),
    ) {
        let _ = TaskSnapshot::decode(&bytes);
        let valid = snapshot().encode();
        prop_assert_eq!(TaskSnapshot::decode(&valid).unwrap(), snapshot());
        let _ = TaskSnapshot::decode(&flipped(valid, &flips));
    }

    #[test]
    fn an_event_time_record_decodes_or_is_refused_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        segment in proptest::collection::vec(any::<u8>(), 0..64),
        n in 0u64..4,
        watermark in proptest::option::of(any::<i64>()),
        lookahead in proptest::collection::vec((any::<i64>(), any::<i64>()), 0..4),
        flips in proptest::collection::vec((any::<usize>(), 1..=255u8), 1..6),
    ) {
        let input = Channel::new(TopicId::from_halves(1, 2), 0);
        let mut parts = BTreeMap::new();
        parts.insert(Part::Segment(n), segment);
        parts.insert(Part::Late(b"k".to_vec()), vec![1]);
        let topics = [(input.topic, "in".to_string())];
        let _ = EventTimeRecord::decode(&bytes);
        let _ = EventTimeState::decode(vec![input], None, topics.clone(), &bytes, &parts);
        let _ = EventTimeState::decode(vec![input], None, topics.clone(), &bytes, &BTreeMap::new());
        let valid = EventTimeRecord {
            watermark: WatermarkSnapshot {
                watermark,
                inputs: vec![InputSnapshot { channel: input, prefix_max: watermark, lookahead }],
            },
            topics: topics.to_vec(),
            queue: TimerQueue::<Vec<u8>, super::ParkedRecord>::new().to_parts().unwrap().header,
        };
        let bytes = valid.encode();
        prop_assert_eq!(EventTimeRecord::decode(&bytes).unwrap(), valid);
        let state =
            EventTimeState::decode(vec![input], None, topics.clone(), &bytes, &BTreeMap::new());
        prop_assert!(state.is_ok(), "{:?}", state.err());
        let _ = EventTimeState::decode(vec![input], None, topics, &flipped(bytes, &flips), &parts);
    }

    #[test]
    fn a_restore_folds_any_record_or_names_what_is_wrong(
        records in proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 0..24),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
            ),
            0..32,
        ),
    ) {
        let mut restored = Restored::default();
        for (key, value) in &records {
            if let Err(e) = restored.apply(key, value.as_deref()) {
                prop_assert!(!e.is_empty());
            }
        }
        prop_assert_eq!(restored.records, records.len() as u64);
    }
}
