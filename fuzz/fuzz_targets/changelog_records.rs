//! Every decoder of a stage's changelog records (`parsley_stage::changelog`) and the fold a
//! restore applies to them, on untrusted bytes:
//! - arbitrary bytes as a task snapshot, as an event-time record, and arbitrary keys and values
//!   folded as a partition's records (`Restored::apply`), each key also read as a timer-queue
//!   key and as a keyed-timer key, then the fold's event-time record and timer-queue parts
//!   rebuilt into a watermark tracker and a timer queue (`EventTimeState::decode`, which
//!   decodes the segments' parked records): nothing panics, a refused record is named (a
//!   message that is not empty), and whatever decodes encodes back to bytes that decode to the
//!   same value (a key, to exactly the same bytes);
//! - a valid task snapshot and a valid event-time state (a tracker restored from arbitrary
//!   evidence, a queue built by arbitrary parks and raises, with keyed timers and fold state)
//!   written as changelog records and folded: the fold holds what was written and the rebuild
//!   gives an equal queue and tracker, also after arbitrary records folded before them (the
//!   latest record of a key wins);
//! - then arbitrary bytes flipped in those records and everything decoded again: nothing
//!   panics, and a state that still rebuilds names the topic of every parked record and
//!   releases its records in ascending `(park time, arrival)` order.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use parsley_clock::{Channel, Clock, SenderId, TopicId};
use parsley_gate::{
    ChannelSnapshot, Control, GateSnapshot, InputSnapshot, TimerQueue, WatermarkSnapshot,
    WatermarkTracker,
};
use parsley_stage::changelog::{
    EVENT_TIME_KEY, EventTimeRecord, EventTimeState, META_KEY, ParkedRecord, Restored,
    STATE_PREFIX, TaskSnapshot, timer_key, timer_of, timer_part_key, timer_part_of,
};

/// Topics 0 and 1 are the stage's sources (partition 0 of each is an event-time input);
/// topic 2 is a former source, still named in the event-time record.
const TOPICS: u8 = 3;
const SOURCES: u8 = 2;

fn topic(i: u8) -> TopicId {
    TopicId::from_halves(1 + i64::from(i % TOPICS), 7)
}

fn channel(i: u8) -> Channel {
    Channel::new(topic(i), i32::from(i / TOPICS % 2))
}

fn sources() -> Vec<(TopicId, String)> {
    (0..SOURCES)
        .map(|i| (topic(i), format!("source-{i}")))
        .collect()
}

fn inputs() -> Vec<Channel> {
    (0..SOURCES).map(|i| Channel::new(topic(i), 0)).collect()
}

/// A task snapshot's parts, any values, made to keep the invariants its writer keeps (a clock
/// keeps its offsets `>= 0`; gate channels ascending, each baseline `>= 0` and frontier in
/// `[baseline - 1, i64::MAX)`, look-ahead offsets above the frontier, senders ascending; the
/// input offsets are the frontiers `+ 1`).
#[derive(Arbitrary, Debug)]
struct Task {
    sender: [u8; 16],
    next_seq: u64,
    clock: Vec<(u8, i64)>,
    gate: Vec<(u8, i64, i64, Vec<i64>, Vec<([u8; 16], u64)>)>,
}

impl Task {
    fn snapshot(&self) -> TaskSnapshot {
        let mut clock = Clock::new();
        for &(c, o) in self.clock.iter().take(8) {
            let _ = clock.try_observe(channel(c).at(o));
        }
        let mut channels: BTreeMap<Channel, ChannelSnapshot> = BTreeMap::new();
        for (c, baseline, frontier, lookahead, delivered) in self.gate.iter().take(4) {
            let baseline = (*baseline).clamp(0, i64::MAX - 1);
            let frontier = (*frontier).clamp(baseline - 1, i64::MAX - 1);
            let lookahead: BTreeSet<i64> = lookahead
                .iter()
                .take(8)
                .copied()
                .filter(|o| *o > frontier)
                .collect();
            let delivered: BTreeMap<SenderId, u64> = delivered
                .iter()
                .take(4)
                .map(|(s, q)| (SenderId::from_bytes(*s), *q))
                .collect();
            channels.insert(
                channel(*c),
                ChannelSnapshot {
                    channel: channel(*c),
                    baseline,
                    frontier,
                    lookahead: lookahead.into_iter().collect(),
                    delivered: delivered.into_iter().collect(),
                },
            );
        }
        let channels: Vec<ChannelSnapshot> = channels.into_values().collect();
        let offsets = channels
            .iter()
            .map(|c| (c.channel, c.frontier + 1))
            .collect();
        TaskSnapshot {
            sender: SenderId::from_bytes(self.sender),
            next_seq: self.next_seq,
            clock,
            gate: GateSnapshot { channels },
            offsets,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Parks a record of key `key` from topic `topic` at event time `time`, raised to its
    /// ancestors' times.
    Park {
        key: u8,
        topic: u8,
        time: i16,
        ancestors: Vec<i16>,
        offset: i64,
        value: Option<Vec<u8>>,
        sender: Option<([u8; 16], u64)>,
        headers: Vec<(String, Option<Vec<u8>>)>,
    },
    /// Raises the queue's watermark and takes what it released.
    Raise(i16),
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Arbitrary bytes for the task snapshot decoder.
    snapshot: Vec<u8>,
    /// Arbitrary bytes for the event-time record decoder.
    event_time: Vec<u8>,
    /// Arbitrary records folded in order: key, value (`None`: a tombstone).
    records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The valid task snapshot.
    task: Task,
    /// The tracker's committed evidence: watermark, and per input its prefix maximum and
    /// look-ahead `(offset, event time)` pairs.
    watermark: Option<i64>,
    evidence: Vec<(u8, Option<i64>, Vec<(i64, i64)>)>,
    /// The control stream's lag, ms, if any.
    control: Option<i64>,
    /// The valid timer queue.
    ops: Vec<Op>,
    /// Keyed timers and fold state written with them.
    keyed_timers: Vec<(i64, Vec<u8>)>,
    state: Vec<(Vec<u8>, Vec<u8>)>,
    /// `(record index, byte index, xor)`: flips in the valid records' values (index 0 is the
    /// task snapshot, 1 the event-time record, then each timer-queue part in order).
    flips: Vec<(u8, u16, u8)>,
}

/// A key decoder's canonical form: whatever decodes re-encodes to exactly the key.
fn check_key(key: &[u8]) {
    if let Some(part) = timer_part_of(key) {
        match part {
            Ok(p) => assert_eq!(timer_part_key(&p), key, "timer-queue key {p:?}"),
            Err(e) => assert!(!e.is_empty()),
        }
    }
    match timer_of(key) {
        Ok((time, k)) => assert_eq!(timer_key(time, &k), key, "keyed-timer key ({time}, {k:?})"),
        Err(e) => assert!(!e.is_empty()),
    }
}

/// Decodes `bytes` as a task snapshot: a snapshot accepted re-encodes to bytes that decode to
/// it.
fn check_snapshot(bytes: &[u8]) {
    match TaskSnapshot::decode(bytes) {
        Ok(s) => assert_eq!(TaskSnapshot::decode(&s.encode()).as_ref(), Ok(&s)),
        Err(e) => assert!(!e.is_empty()),
    }
}

/// Decodes `bytes` as an event-time record: a record accepted re-encodes to bytes that decode
/// to it.
fn check_event_time(bytes: &[u8]) {
    match EventTimeRecord::decode(bytes) {
        Ok(r) => assert_eq!(EventTimeRecord::decode(&r.encode()).as_ref(), Ok(&r)),
        Err(e) => assert!(!e.is_empty()),
    }
}

/// Folds `records`: each refusal is named, every record counted.
fn fold<'a>(
    restored: &mut Restored,
    records: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
) {
    for (key, value) in records {
        let before = restored.records;
        if let Err(e) = restored.apply(key, value) {
            assert!(!e.is_empty(), "a refusal without a message");
        }
        assert_eq!(restored.records, before + 1);
    }
}

/// Rebuilds the event-time state of `restored`, as a restore does (the record belongs to the
/// snapshot it was committed with); a state that rebuilds names every parked record's topic
/// and releases in ascending `(park time, arrival)` order.
fn rebuild(restored: &Restored, control: Option<Control>) -> Option<EventTimeState> {
    let bytes = restored
        .snapshot
        .as_ref()
        .and(restored.event_time.as_ref())?;
    let state = match EventTimeState::decode(inputs(), control, sources(), bytes, &restored.timers)
    {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.is_empty());
            return None;
        }
    };
    for (_, _, r) in state.queue.parked() {
        let id = TopicId::from_bytes(r.channel.0);
        assert!(
            state.topics.contains_key(&id),
            "a parked record of unnamed topic {id}"
        );
    }
    let mut drained = state.queue.clone();
    drained.raise(i64::MAX);
    let mut last = None;
    while let Some(r) = drained.next_released() {
        let id = (r.park_time_ms, r.arrival);
        assert!(
            last < Some(id),
            "released out of order: {last:?} then {id:?}"
        );
        assert!(
            r.park_time_ms >= r.event_time_ms,
            "a park time below its event time"
        );
        last = Some(id);
    }
    Some(state)
}

/// The valid records in the order they are folded: `keys[i]` with `values[i]`, then `extra`.
fn valid_records<'a>(
    keys: &'a [Vec<u8>],
    values: &'a [Vec<u8>],
    extra: &'a [(Vec<u8>, Option<Vec<u8>>)],
) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> {
    keys.iter()
        .zip(values)
        .map(|(k, v)| (k.as_slice(), Some(v.as_slice())))
        .chain(extra.iter().map(|(k, v)| (k.as_slice(), v.as_deref())))
}

fuzz_target!(|input: Input| {
    // Arbitrary bytes to every decoder.
    check_snapshot(&input.snapshot);
    check_event_time(&input.event_time);
    let records: Vec<(&[u8], Option<&[u8]>)> = input
        .records
        .iter()
        .take(64)
        .map(|(k, v)| (k.as_slice(), v.as_deref()))
        .collect();
    for (key, _) in &records {
        check_key(key);
    }
    let control = input.control.map(|lag_ms| Control {
        lag_ms: lag_ms.max(0),
    });
    let mut arbitrary = Restored::default();
    fold(&mut arbitrary, records.iter().copied());
    rebuild(&arbitrary, control);

    // A valid task snapshot and event-time state, written as changelog records.
    let snapshot = input.task.snapshot();
    let evidence = WatermarkSnapshot {
        watermark: input.watermark,
        inputs: input
            .evidence
            .iter()
            .take(SOURCES.into())
            .map(|(i, prefix_max, lookahead)| InputSnapshot {
                channel: Channel::new(topic(i % SOURCES), 0),
                prefix_max: *prefix_max,
                lookahead: lookahead.iter().take(8).copied().collect(),
            })
            .collect(),
    };
    let Ok(tracker) = WatermarkTracker::restore(inputs(), control, &evidence) else {
        return;
    };
    let mut queue: TimerQueue<Vec<u8>, ParkedRecord> =
        TimerQueue::new().with_changelog_limits(512, 4);
    for op in input.ops.iter().take(64) {
        match op {
            Op::Park {
                key,
                topic: t,
                time,
                ancestors,
                offset,
                value,
                sender,
                headers,
            } => {
                let record = ParkedRecord {
                    channel: (topic(*t).to_bytes(), 0),
                    offset: *offset,
                    timestamp: i64::from(*time),
                    keyless: *key == 0,
                    value: value.clone(),
                    sender: *sender,
                    headers: headers
                        .iter()
                        .take(4)
                        .map(|(k, v)| (k.clone().into(), v.clone()))
                        .collect(),
                };
                let _ = queue.park(
                    vec![*key % 8],
                    i64::from(*time),
                    ancestors.iter().take(4).map(|&a| i64::from(a)),
                    record,
                );
            }
            Op::Raise(w) => {
                queue.raise(i64::from(*w));
            }
        }
        while queue.next_released().is_some() {}
    }
    let written = queue
        .to_parts()
        .expect("a queue with every release taken writes itself");
    let names: Vec<(TopicId, String)> = (0..TOPICS)
        .map(|i| (topic(i), format!("topic-{i}")))
        .collect();
    let event_time = EventTimeRecord {
        watermark: tracker.snapshot(),
        topics: names,
        queue: written.header,
    };
    let mut values: Vec<Vec<u8>> = vec![snapshot.encode(), event_time.encode()];
    let mut keys: Vec<Vec<u8>> = vec![META_KEY.to_vec(), EVENT_TIME_KEY.to_vec()];
    for (part, bytes) in written.parts {
        let Some(bytes) = bytes else { continue };
        keys.push(timer_part_key(&part));
        values.push(bytes);
    }
    let mut valid = Restored::default();
    let mut extra: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
    for (time, key) in input.keyed_timers.iter().take(8) {
        extra.push((timer_key(*time, key), Some(Vec::new())));
    }
    for (key, value) in input.state.iter().take(8) {
        let mut k = vec![STATE_PREFIX];
        k.extend_from_slice(key);
        extra.push((k, Some(value.clone())));
    }
    for (key, _) in valid_records(&keys, &values, &extra) {
        check_key(key);
    }
    fold(&mut valid, valid_records(&keys, &values, &extra));
    assert_eq!(
        valid.snapshot.as_ref(),
        Some(&snapshot),
        "the task snapshot read back"
    );
    assert_eq!(
        EventTimeRecord::decode(&values[1]).as_ref(),
        Ok(&event_time)
    );
    assert_eq!(valid.keyed_timers.len(), {
        let mut t: Vec<_> = input.keyed_timers.iter().take(8).collect();
        t.sort();
        t.dedup();
        t.len()
    });
    let state = rebuild(&valid, control).expect("a valid event-time state rebuilds");
    assert!(
        state.queue == queue,
        "the rebuilt queue differs from the one written"
    );
    assert_eq!(
        state.tracker.snapshot(),
        tracker.snapshot(),
        "the rebuilt tracker differs"
    );

    // The same records after arbitrary ones: the latest of each key wins.
    fold(&mut arbitrary, valid_records(&keys, &values, &extra));
    assert_eq!(arbitrary.snapshot.as_ref(), Some(&snapshot));
    assert_eq!(arbitrary.event_time.as_ref(), Some(&values[1]));
    rebuild(&arbitrary, control);

    // Flipped bytes.
    for &(record, at, xor) in input.flips.iter().take(16) {
        let bytes = &mut values[usize::from(record) % keys.len()];
        if !bytes.is_empty() {
            let at = usize::from(at) % bytes.len();
            bytes[at] ^= xor;
        }
    }
    check_snapshot(&values[0]);
    check_event_time(&values[1]);
    let mut flipped = Restored::default();
    fold(&mut flipped, valid_records(&keys, &values, &extra));
    rebuild(&flipped, control);
});
