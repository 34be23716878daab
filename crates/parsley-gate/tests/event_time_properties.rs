//! Properties of the catch-up tracker, the event-time watermark and the timer queue
//! (the book's specification, §5), over random evidence sequences.

use std::collections::{BTreeMap, HashMap};

use parsley_clock::{Channel, TopicId};
use parsley_gate::{
    CARRY_FACTOR, CatchUp, Control, InputState, Parking, Part, TimerQueue, WatermarkTracker,
    segment_ids,
};
use proptest::prelude::*;

fn channels() -> [Channel; 3] {
    let (t1, t2) = (TopicId::from_bytes([1; 16]), TopicId::from_bytes([2; 16]));
    [
        Channel::new(t1, 0),
        Channel::new(t1, 1),
        Channel::new(t2, 0),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Start(usize, i64),
    Delivered(usize, i64, i64),
    /// Raise the frontier by this much.
    Frontier(usize, i64),
    FetchedHead(usize, i64),
    Control(i64),
}

fn op() -> impl Strategy<Value = Op> {
    // Control readings are rare so that rises before the first one are explored.
    prop_oneof![
        2 => (0..3usize, 0..20i64).prop_map(|(c, e)| Op::Start(c, e)),
        4 => (0..3usize, 0..30i64, -50..1_000i64).prop_map(|(c, o, t)| Op::Delivered(c, o, t)),
        4 => (0..3usize, 0..4i64).prop_map(|(c, d)| Op::Frontier(c, d)),
        2 => (0..3usize, 0..30i64).prop_map(|(c, h)| Op::FetchedHead(c, h)),
        1 => (0..1_200i64).prop_map(Op::Control),
    ]
}

fn apply(w: &mut WatermarkTracker, op: &Op) {
    let cs = channels();
    let _ = match *op {
        Op::Start(c, e) => w.start(cs[c], e),
        Op::Delivered(c, o, t) => w.delivered(cs[c], o, t),
        Op::Frontier(c, d) => {
            let f = w.catch_up().progress(&cs[c]).unwrap().frontier;
            w.frontier(cs[c], f + d)
        }
        Op::FetchedHead(c, h) => w.fetched_head(cs[c], h),
        Op::Control(t) => w.control(t),
    };
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The watermark never decreases, with or without a control stream.
    #[test]
    fn the_watermark_never_decreases(
        ops in prop::collection::vec(op(), 0..80),
        lag in prop::option::of(0..300i64),
    ) {
        let mut w = WatermarkTracker::new(channels(), lag.map(|lag_ms| Control { lag_ms }));
        let mut last = None;
        for op in &ops {
            apply(&mut w, op);
            let now = w.watermark();
            prop_assert!(now >= last, "{last:?} -> {now:?} after {op:?}");
            last = now;
        }
    }

    /// Whenever the watermark rises while some input is in the minimum, it rises no higher
    /// than the delivered-prefix maximum of every input in the minimum (an input with nothing
    /// delivered forbids any rise), nor above the control stream's processing time minus lag.
    #[test]
    fn a_rise_never_passes_an_input_in_the_minimum_or_the_control_clock(
        ops in prop::collection::vec(op(), 0..80),
        lag in prop::option::of(0..300i64),
    ) {
        let mut w = WatermarkTracker::new(channels(), lag.map(|lag_ms| Control { lag_ms }));
        let mut control_now: Option<i64> = None;
        for op in &ops {
            let before = w.watermark();
            apply(&mut w, op);
            if let (Op::Control(t), Some(lag)) = (op, lag) {
                control_now = Some(control_now.map_or(t - lag, |c| c.max(t - lag)));
            }
            let after = w.watermark();
            if after <= before {
                continue;
            }
            let after = after.unwrap();
            for c in channels() {
                if w.in_minimum(&c) {
                    let max = w.delivered_max(&c);
                    prop_assert!(
                        max.is_some_and(|m| after <= m),
                        "rose to {after} past {c} ({:?}, delivered max {max:?})",
                        w.state(&c)
                    );
                }
            }
            if lag.is_some() {
                prop_assert!(control_now.is_some_and(|c| after <= c), "past the control clock");
            }
        }
    }

    /// Caught up is exactly `frontier + 1 >= startup end`, never undone by a later frontier,
    /// and a topic is caught up exactly when all its channels are.
    #[test]
    fn caught_up_follows_the_frontier_and_the_startup_end(
        ends in prop::array::uniform3(0..20i64),
        steps in prop::collection::vec((0..3usize, 0..5i64), 0..40),
    ) {
        let cs = channels();
        let mut t = CatchUp::new(cs);
        for (c, e) in cs.iter().zip(ends) {
            t.start(*c, e).unwrap();
        }
        let mut frontier = [-1i64; 3];
        for (i, d) in steps {
            let was = t.caught_up(&cs[i]);
            frontier[i] += d;
            t.frontier(cs[i], frontier[i]).unwrap();
            prop_assert!(!was || t.caught_up(&cs[i]));
            for k in 0..3 {
                prop_assert_eq!(t.caught_up(&cs[k]), frontier[k] + 1 >= ends[k]);
            }
            prop_assert_eq!(
                t.topic_caught_up(cs[0].topic),
                t.caught_up(&cs[0]) && t.caught_up(&cs[1])
            );
            prop_assert_eq!(t.topic_caught_up(cs[2].topic), t.caught_up(&cs[2]));
            prop_assert_eq!(t.all_caught_up(), (0..3).all(|k| t.caught_up(&cs[k])));
        }
    }
}

/// History: per channel, records with non-decreasing event times (the source's producers);
/// each offset is a record or a gap (commit marker, aborted record). Interleaving: which
/// channel the runtime hears from next, and when heads and the control clock arrive.
#[derive(Debug, Clone)]
struct History {
    /// Per channel: `Some(event time)` for a record, `None` for a gap.
    logs: Vec<Vec<Option<i64>>>,
    /// Channel picks; each step delivers (or skips a gap on) the picked channel.
    schedule: Vec<usize>,
    lag: Option<i64>,
}

fn history() -> impl Strategy<Value = History> {
    let log =
        prop::collection::vec((prop::bool::weighted(0.8), 0..20i64), 0..25).prop_map(|steps| {
            let mut t = 0;
            steps
                .into_iter()
                .map(|(record, dt)| {
                    t += dt;
                    record.then_some(t)
                })
                .collect::<Vec<_>>()
        });
    (
        prop::collection::vec(log, 3),
        prop::collection::vec(0..3usize, 0..120),
        prop::option::of(0..100i64),
    )
        .prop_map(|(logs, schedule, lag)| History {
            logs,
            schedule,
            lag,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Completeness: reading the history that existed at start, in any interleaving of the
    /// channels, with gaps bridged by the frontier and a control clock running far ahead, no
    /// record is late and the timer queue releases everything in event-time order.
    #[test]
    fn history_is_released_in_event_time_order_with_nothing_late(h in history()) {
        let cs = channels();
        let mut w = WatermarkTracker::new(cs, h.lag.map(|lag_ms| Control { lag_ms }));
        let mut q: TimerQueue<usize, (usize, i64)> = TimerQueue::new();
        let mut next = [0usize; 3];
        let mut released = Vec::new();
        for (c, log) in cs.iter().zip(&h.logs) {
            w.start(*c, log.len() as i64).unwrap();
        }
        if h.lag.is_some() {
            w.control(1_000_000).unwrap();
        }
        let rest = (0..3).flat_map(|c| std::iter::repeat_n(c, h.logs[c].len()));
        for c in h.schedule.iter().copied().chain(rest) {
            let Some(entry) = h.logs[c].get(next[c]) else { continue };
            let offset = next[c] as i64;
            next[c] += 1;
            if let Some(t) = *entry {
                prop_assert!(w.watermark().is_none_or(|wm| t >= wm), "late: {c}@{offset} t={t}");
                w.delivered(cs[c], offset, t).unwrap();
                if let Parking::Released(r) = q.park(c, t, [], (c, offset)) {
                    released.push(r);
                }
            }
            w.frontier(cs[c], offset).unwrap();
            if let Some(wm) = w.watermark() {
                released.extend(q.advance(wm));
            }
        }
        prop_assert!(w.all_caught_up());
        released.extend(q.advance(i64::MAX));
        prop_assert_eq!(q.metrics().late, 0);
        let times: Vec<i64> = released.iter().map(|r| r.event_time_ms).collect();
        prop_assert!(times.is_sorted(), "{times:?}");
        let total = h.logs.iter().flatten().filter(|e| e.is_some()).count();
        prop_assert_eq!(released.len(), total);
        if h.lag.is_some() {
            for c in cs {
                prop_assert_eq!(w.state(&c), Some(InputState::Left));
            }
            prop_assert_eq!(w.watermark(), Some(1_000_000 - h.lag.unwrap()));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// An unordered input (several writers interleaved in one channel: its event times go up
    /// and down) marked as such holds the watermark until it is caught up: history read in any
    /// interleaving still leaves in event-time order, nothing late.
    #[test]
    fn an_unordered_inputs_history_is_released_in_event_time_order_with_nothing_late(
        h in history(),
        times in prop::collection::vec(0..500i64, 0..25),
    ) {
        let cs = channels();
        let mut logs = h.logs.clone();
        logs[0] = times.iter().map(|t| Some(*t)).collect();
        let mut w = WatermarkTracker::new(cs, h.lag.map(|lag_ms| Control { lag_ms }));
        w.unordered(cs[0]).unwrap();
        let mut q: TimerQueue<usize, (usize, i64)> = TimerQueue::new();
        let mut next = [0usize; 3];
        let mut released = Vec::new();
        for (c, log) in cs.iter().zip(&logs) {
            w.start(*c, log.len() as i64).unwrap();
        }
        if h.lag.is_some() {
            w.control(1_000_000).unwrap();
        }
        let rest = (0..3).flat_map(|c| std::iter::repeat_n(c, logs[c].len()));
        for c in h.schedule.iter().copied().chain(rest) {
            let Some(entry) = logs[c].get(next[c]) else { continue };
            let offset = next[c] as i64;
            next[c] += 1;
            if let Some(t) = *entry {
                prop_assert!(w.watermark().is_none_or(|wm| t >= wm), "late: {c}@{offset} t={t}");
                w.delivered(cs[c], offset, t).unwrap();
                if let Parking::Released(r) = q.park(c, t, [], (c, offset)) {
                    released.push(r);
                }
            }
            w.frontier(cs[c], offset).unwrap();
            if let Some(wm) = w.watermark() {
                released.extend(q.advance(wm));
            }
        }
        released.extend(q.advance(i64::MAX));
        prop_assert_eq!(q.metrics().late, 0);
        let times: Vec<i64> = released.iter().map(|r| r.event_time_ms).collect();
        prop_assert!(times.is_sorted(), "{times:?}");
        prop_assert_eq!(released.len(), logs.iter().flatten().filter(|e| e.is_some()).count());
    }
}

#[derive(Debug, Clone)]
enum QueueOp {
    /// Park with this event time, key, and ancestors chosen among earlier parks by index.
    Park(i64, u8, Vec<prop::sample::Index>),
    Advance(i64),
    /// Write the changes to a compacted changelog and continue with the queue rebuilt from it.
    RoundTrip,
}

fn queue_op() -> impl Strategy<Value = QueueOp> {
    prop_oneof![
        6 => (0..200i64, 0..4u8, prop::collection::vec(any::<prop::sample::Index>(), 0..3))
            .prop_map(|(t, k, a)| QueueOp::Park(t, k, a)),
        2 => (0..220i64).prop_map(QueueOp::Advance),
        1 => Just(QueueOp::RoundTrip),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A released record is never released before any of its causal ancestors; each advance
    /// releases in ascending (park time, arrival) order, exactly the records at or below the
    /// watermark; every record comes out once. Writing the changes to a model of a compacted
    /// changelog at any point (small segments, so records split across several, and a small
    /// carry slack, so segments are carried forward) and rebuilding from it gives the same
    /// queue; the changelog's live segments hold every parked record exactly once, and no more
    /// than CARRY_FACTOR entries per parked record plus the slack.
    #[test]
    fn the_timer_queue_keeps_causal_order_and_releases_everything(
        ops in prop::collection::vec(queue_op(), 0..160),
        segment_bytes in prop_oneof![1usize..120, 120usize..2_000],
        slack in 0u64..6,
    ) {
        let mut q: TimerQueue<u8, usize> =
            TimerQueue::new().with_changelog_limits(segment_bytes, slack);
        let mut log: BTreeMap<Part<u8>, Vec<u8>> = BTreeMap::new();
        // Per parked record (by arrival): its park time and ancestors.
        let mut park_times: Vec<i64> = Vec::new();
        let mut ancestors: Vec<Vec<usize>> = Vec::new();
        let mut release_order: HashMap<usize, usize> = HashMap::new();
        let note = |id: usize, order: &mut HashMap<usize, usize>| {
            let n = order.len();
            prop_assert!(order.insert(id, n).is_none(), "released twice: {id}");
            Ok(())
        };
        for op in ops.iter().chain([QueueOp::Advance(i64::MAX), QueueOp::RoundTrip].iter()) {
            match op {
                QueueOp::Park(t, k, picks) => {
                    let id = park_times.len();
                    let anc: Vec<usize> = if id == 0 {
                        Vec::new()
                    } else {
                        picks.iter().map(|p| p.index(id)).collect()
                    };
                    let times: Vec<i64> = anc.iter().map(|a| park_times[*a]).collect();
                    let expected = times.iter().copied().fold(*t, i64::max);
                    match q.park(*k, *t, times, id) {
                        Parking::Parked { park_time_ms, arrival, .. } => {
                            prop_assert_eq!(park_time_ms, expected);
                            prop_assert_eq!(arrival, id as u64);
                            prop_assert!(q.watermark().is_none_or(|w| park_time_ms > w));
                        }
                        Parking::Released(r) => {
                            prop_assert_eq!(r.park_time_ms, expected);
                            prop_assert!(q.watermark().is_some_and(|w| r.park_time_ms <= w));
                            note(id, &mut release_order)?;
                        }
                    }
                    park_times.push(expected);
                    ancestors.push(anc);
                }
                QueueOp::Advance(wm) => {
                    let out = q.advance(*wm);
                    let w = q.watermark().unwrap();
                    let keys: Vec<(i64, u64)> =
                        out.iter().map(|r| (r.park_time_ms, r.arrival)).collect();
                    prop_assert!(keys.is_sorted());
                    prop_assert!(out.iter().all(|r| r.park_time_ms <= w));
                    prop_assert!(q.next_release().is_none_or(|n| n > w));
                    for r in out {
                        note(r.value, &mut release_order)?;
                    }
                }
                QueueOp::RoundTrip => {
                    let changes = q.take_changes().unwrap();
                    let header = changes.header.clone();
                    for (part, record) in changes.parts {
                        match record {
                            Some(r) => log.insert(part, r),
                            None => log.remove(&part),
                        };
                    }
                    let back: TimerQueue<u8, usize> = TimerQueue::from_parts(
                        &header,
                        log.iter().map(|(p, r)| (p.clone(), r.as_slice())),
                    )
                    .unwrap();
                    prop_assert_eq!(&back, &q);
                    // The live segments: every parked record exactly once, bounded.
                    let w = q.watermark();
                    let mut entries: Vec<(i64, u64)> = log
                        .iter()
                        .filter(|(p, _)| matches!(p, Part::Segment(_)))
                        .flat_map(|(_, r)| segment_ids(r).unwrap())
                        .collect();
                    let total = entries.len() as u64;
                    entries.retain(|(t, _)| w.is_none_or(|w| *t > w));
                    entries.sort();
                    let parked: Vec<(i64, u64)> = back_ids(&q);
                    prop_assert_eq!(&entries, &parked);
                    prop_assert!(
                        total <= CARRY_FACTOR * parked.len() as u64 + slack,
                        "{} entries in the log for {} parked", total, parked.len()
                    );
                    // Every live segment still holds a parked record.
                    for (p, r) in &log {
                        if matches!(p, Part::Segment(_)) {
                            prop_assert!(
                                segment_ids(r).unwrap().iter().any(|(t, _)| w.is_none_or(|w| *t > w)),
                                "segment {:?} is live but empty", p
                            );
                        }
                    }
                    q = back.with_changelog_limits(segment_bytes, slack);
                }
            }
        }
        prop_assert!(q.is_empty());
        prop_assert!(log.keys().all(|p| !matches!(p, Part::Segment(_))), "every segment tombstoned");
        prop_assert_eq!(release_order.len(), park_times.len());
        for (id, anc) in ancestors.iter().enumerate() {
            for a in anc {
                prop_assert!(
                    release_order[a] < release_order[&id],
                    "{id} released before its ancestor {a}"
                );
            }
        }
    }
}

/// The ids `(park time, arrival)` of the parked records of `q`, ascending.
fn back_ids(q: &TimerQueue<u8, usize>) -> Vec<(i64, u64)> {
    let mut ids: Vec<(i64, u64)> = q.parked().map(|(t, _, v)| (t, *v as u64)).collect();
    ids.sort();
    ids
}
