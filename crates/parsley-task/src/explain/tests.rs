//! The explanation built in memory from a gate, a watermark tracker and the publishing slot;
//! its table and its JSON shape.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use parsley_clock::{Channel, Clock, Coordinate, InFlight, SenderId, SenderTag, Stamp, TopicId};
use parsley_gate::{Arrival, Control, Gate, WatermarkTracker};

use super::*;

fn ch(t: u8, p: i32) -> Channel {
    Channel::new(TopicId::from_bytes([t; 16]), p)
}

/// Topic 1 is `orders`, topic 2 `payments`; others are unknown.
fn names(id: TopicId) -> Option<String> {
    if id == TopicId::from_bytes([1; 16]) {
        Some("orders".into())
    } else if id == TopicId::from_bytes([2; 16]) {
        Some("payments".into())
    } else {
        None
    }
}

fn name(t: u8, p: i32) -> ChannelName {
    channel_name(ch(t, p), &names)
}

/// A record at `offset` with key `key`, claiming `claims` and, as `sender`'s send `seq`,
/// `in_flight`.
fn rec(
    offset: i64,
    key: Option<&[u8]>,
    claims: &[Coordinate],
    in_flight: &[(Channel, u64)],
    sender: Option<(u8, u64)>,
) -> Arrival<Option<Vec<u8>>> {
    Arrival {
        offset,
        timestamp: 0,
        epoch: 1,
        stamp: Some(Stamp {
            sender: sender.map(|(s, seq)| SenderTag {
                sender: SenderId::from_bytes([s; 16]),
                seq,
            }),
            clock: claims.iter().copied().collect::<Clock>(),
            in_flight: in_flight
                .iter()
                .map(|&(channel, seq)| InFlight { channel, seq })
                .collect(),
            acked_through: None,
        }),
        payload: key.map(<[u8]>::to_vec),
    }
}

fn blocked(gate: &Gate<Option<Vec<u8>>>) -> (Vec<BlockedRecord>, usize) {
    blocked_records(gate, |k| k.as_deref(), &names)
}

#[test]
fn a_record_held_for_its_cause_names_the_cause_channel_offset_and_frontier() {
    let (orders, payments) = (ch(1, 0), ch(2, 0));
    let mut gate = Gate::new([orders, payments]);
    gate.seed(orders, 0).unwrap();
    gate.seed(payments, 0).unwrap();
    gate.offer(payments, rec(0, Some(b"sku-1"), &[orders.at(2)], &[], None))
        .unwrap();
    assert!(gate.next_delivery().is_none());
    assert_eq!(
        blocked(&gate),
        (
            vec![BlockedRecord {
                channel: name(2, 0),
                offset: 0,
                key: Some("sku-1".into()),
                waits_for: WaitsFor::Frontier {
                    channel: name(1, 0),
                    offset: 2,
                    frontier: Some(-1),
                },
            }],
            0
        )
    );
    assert_eq!(name(2, 0).to_string(), "payments/0");
    assert_eq!(
        name(2, 0).topic_id,
        "02020202-0202-0202-0202-020202020202",
        "the topic id is kept"
    );
    // The cause arrives: nothing waits any more.
    for o in 0..3 {
        gate.offer(orders, rec(o, None, &[], &[], None)).unwrap();
    }
    while gate.next_delivery().is_some() {}
    assert_eq!(blocked(&gate), (vec![], 0));
}

#[test]
fn every_other_reason_of_the_gate_is_named() {
    let (orders, payments, foreign) = (ch(1, 0), ch(2, 0), ch(3, 5));
    let mut gate = Gate::new([orders, payments]);
    gate.seed(payments, 0).unwrap();
    // A claim on a consumed channel not seeded yet; a binary key.
    gate.offer(
        payments,
        rec(0, Some(&[0xff, 0x01]), &[orders.at(0)], &[], None),
    )
    .unwrap();
    assert_eq!(
        blocked(&gate).0,
        vec![BlockedRecord {
            channel: name(2, 0),
            offset: 0,
            key: Some("0xff01".into()),
            waits_for: WaitsFor::Seeding {
                channel: name(1, 0)
            },
        }]
    );
    // Seeded: an in-flight claim of the record's own sender on a consumed channel, and one
    // on a channel the task does not consume (its topic's name unknown here); null keys.
    let mut gate = Gate::new([orders, payments]);
    gate.seed(orders, 0).unwrap();
    gate.seed(payments, 0).unwrap();
    gate.offer(payments, rec(0, None, &[], &[(orders, 3)], Some((7, 4))))
        .unwrap();
    gate.offer(orders, rec(0, None, &[], &[(foreign, 9)], Some((8, 0))))
        .unwrap();
    assert!(gate.next_delivery().is_none());
    let (listed, more) = blocked(&gate);
    assert_eq!(more, 0);
    assert_eq!(
        listed,
        vec![
            BlockedRecord {
                channel: name(1, 0),
                offset: 0,
                key: None,
                waits_for: WaitsFor::HighWatermark {
                    channel: name(3, 5)
                },
            },
            BlockedRecord {
                channel: name(2, 0),
                offset: 0,
                key: None,
                waits_for: WaitsFor::InFlight {
                    sender: "07070707-0707-0707-0707-070707070707".into(),
                    channel: name(1, 0),
                    seq: 3,
                },
            },
        ]
    );
    assert_eq!(
        name(3, 5).to_string(),
        "<03030303-0303-0303-0303-030303030303>/5"
    );
}

#[test]
fn paused_channels_are_listed_with_what_they_hold() {
    let (orders, payments) = (ch(1, 0), ch(2, 0));
    let mut gate = Gate::new([orders, payments]);
    gate.seed(orders, 0).unwrap();
    gate.seed(payments, 0).unwrap();
    gate.offer(orders, rec(0, None, &[payments.at(0)], &[], None))
        .unwrap();
    gate.offer(orders, rec(1, None, &[], &[], None)).unwrap();
    let paused: HashSet<Channel> = [orders].into();
    assert_eq!(
        paused_channels(&gate, &paused, 2, &names),
        vec![PausedChannel {
            channel: name(1, 0),
            held: 2,
            cap: 2
        }]
    );
    assert_eq!(paused_channels(&gate, &HashSet::new(), 2, &names), vec![]);
}

#[test]
fn the_watermark_names_the_input_that_holds_it_and_why() {
    let (orders, payments) = (ch(1, 0), ch(2, 0));
    let mut w = WatermarkTracker::new([orders, payments], None);
    w.start(orders, 1).unwrap();
    w.start(payments, 4).unwrap();
    w.delivered(orders, 0, 1_000).unwrap();
    w.frontier(orders, 0).unwrap();
    w.delivered(payments, 0, 2_000).unwrap();
    w.frontier(payments, 0).unwrap();
    assert_eq!(
        watermark(w.watermark(), 3, w.held_by(), &names),
        WatermarkExplanation {
            watermark_ms: Some(2_000),
            parked: 3,
            held_by: Some(WatermarkHolder::CatchingUp {
                channel: name(2, 0),
                delivered_max_ms: Some(2_000),
                frontier: 0,
                startup_end: Some(4),
            }),
        }
    );
    for o in 1..4 {
        w.delivered(payments, o, 2_000 + o).unwrap();
    }
    w.frontier(payments, 3).unwrap();
    w.fetched_head(orders, 6).unwrap();
    assert_eq!(
        watermark(w.watermark(), 0, w.held_by(), &names).held_by,
        Some(WatermarkHolder::AwaitingLiveHead {
            channel: name(1, 0),
            delivered_max_ms: Some(1_000),
            frontier: 0,
            head: Some(6),
        })
    );
    let mut c = WatermarkTracker::new([orders], Some(Control { lag_ms: 500 }));
    c.start(orders, 0).unwrap();
    c.control(10_000).unwrap();
    assert_eq!(
        watermark(c.watermark(), 0, c.held_by(), &names).held_by,
        Some(WatermarkHolder::Control {
            time_ms: Some(9_500),
            lag_ms: 500
        })
    );
    // The clock's own time, not the watermark it gives.
    let held = watermark(c.watermark(), 0, c.held_by(), &names)
        .held_by
        .unwrap();
    assert_eq!(
        held.to_string(),
        "the control clock: its time 10000 less its lag 500 ms holds event time at 9500"
    );
    let waiting = WatermarkHolder::Control {
        time_ms: None,
        lag_ms: 500,
    };
    assert!(
        waiting
            .to_string()
            .contains("no tick or control record read")
    );
}

#[test]
fn at_most_the_listed_maximum_of_blocked_records_is_listed_and_the_rest_counted() {
    // Only the head of a queue (or a pulled record) is tracked: block the head of each of
    // many channels, all waiting for orders@0.
    let orders = ch(1, 0);
    let channels: Vec<Channel> = (0..MAX_BLOCKED_LISTED as i32 + 3)
        .map(|p| Channel::new(TopicId::from_bytes([4; 16]), p))
        .collect();
    let mut gate = Gate::new(channels.iter().copied().chain([orders]));
    gate.seed(orders, 0).unwrap();
    for c in &channels {
        gate.seed(*c, 0).unwrap();
        gate.offer(*c, rec(0, None, &[orders.at(0)], &[], None))
            .unwrap();
    }
    let (listed, more) = blocked(&gate);
    assert_eq!((listed.len(), more), (MAX_BLOCKED_LISTED, 3));
    assert_eq!(listed[0].channel, channel_name(channels[0], &names));
}

fn task(partition: i32, blocked: Vec<BlockedRecord>) -> TaskExplanation {
    TaskExplanation {
        blocked,
        ..TaskExplanation::new(partition)
    }
}

#[test]
fn a_request_is_answered_by_the_next_snapshot_or_by_the_last_one_after_the_wait() {
    let slot = Explained::default();
    assert!(!slot.wanted(), "nobody asked");
    // Nobody publishes: the answer comes after the wait, not fresh, never taken.
    let started = Instant::now();
    let e = explain([("s", &slot, false)], Duration::from_millis(50));
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!(
        e.stages,
        vec![StageExplanation {
            stage: "s".into(),
            taken_at_ms: None,
            fresh: false,
            tasks: vec![]
        }]
    );
    assert!(
        slot.wanted(),
        "the request stays until the stream thread takes it"
    );
    assert!(!slot.wanted(), "taken once");
    // A stream thread that answers.
    std::thread::scope(|s| {
        s.spawn(|| {
            while !slot.wanted() {
                std::thread::yield_now();
            }
            slot.publish(vec![task(3, vec![])]);
        });
        let e = explain([("s", &slot, false)], Duration::from_secs(30));
        assert!(e.stages[0].fresh);
        assert!(e.stages[0].taken_at_ms.is_some());
        assert_eq!(e.stages[0].tasks, vec![task(3, vec![])]);
        assert!(e.is_idle());
    });
    // An ended stage is not waited for: its last snapshot, not fresh.
    let started = Instant::now();
    let e = explain([("s", &slot, true)], Duration::from_secs(30));
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!e.stages[0].fresh);
    assert_eq!(e.stages[0].tasks, vec![task(3, vec![])]);
}

fn restore_wait() -> RestoreWait {
    RestoreWait {
        changelog: "app.stage-changelog".into(),
        partition: 1,
        last_stable_offset: 7,
        high_watermark: 9,
        producer: Some("app.stage.0".into()),
    }
}

#[test]
fn a_restore_wait_is_shown_with_its_task_until_cleared() {
    let slot = Explained::default();
    slot.publish(vec![task(0, vec![])]);
    slot.set_restore(1, Some(restore_wait()));
    let e = explain([("s", &slot, true)], Duration::ZERO);
    let mut restoring = TaskExplanation::new(1);
    restoring.restore = Some(restore_wait());
    assert_eq!(e.stages[0].tasks, vec![task(0, vec![]), restoring]);
    assert!(!e.is_idle());
    slot.set_restore(1, None);
    let e = explain([("s", &slot, true)], Duration::ZERO);
    assert_eq!(e.stages[0].tasks, vec![task(0, vec![])]);
}

/// An explanation with one of each kind of row.
fn sample() -> Explanation {
    let mut t0 = task(
        0,
        vec![BlockedRecord {
            channel: name(2, 0),
            offset: 0,
            key: Some("sku-1".into()),
            waits_for: WaitsFor::Frontier {
                channel: name(1, 0),
                offset: 2,
                frontier: Some(-1),
            },
        }],
    );
    t0.paused = vec![PausedChannel {
        channel: name(1, 0),
        held: 10_000,
        cap: 10_000,
    }];
    t0.ahead = vec![
        AheadChannel {
            channel: name(1, 1),
            drift_ms: Some(61_500),
            max_drift_ms: 60_000,
            held_records: 1_234,
        },
        AheadChannel {
            channel: name(1, 2),
            drift_ms: None,
            max_drift_ms: 60_000,
            held_records: 0,
        },
    ];
    t0.event_time = Some(WatermarkExplanation {
        watermark_ms: None,
        parked: 4,
        held_by: Some(WatermarkHolder::CatchingUp {
            channel: name(2, 0),
            delivered_max_ms: None,
            frontier: -1,
            startup_end: Some(1),
        }),
    });
    let mut t1 = TaskExplanation::new(1);
    t1.restore = Some(restore_wait());
    Explanation {
        stages: vec![StageExplanation {
            stage: "join".into(),
            taken_at_ms: Some(1_700_000_000_000),
            fresh: true,
            tasks: vec![t0, t1],
        }],
    }
}

#[test]
fn the_table_has_one_row_per_wait() {
    assert_eq!(
        sample().to_string(),
        "\
STAGE  TASK  CHANNEL                OFFSET  KEY    WAITS FOR
join   0     payments/0             0       sku-1  cause orders/0@2 (delivered through -1)
join   0     orders/0               -       -      paused by backpressure: holds 10000 of cap 10000
join   0     orders/1               -       -      held by watermark alignment: 61500 ms ahead of the watermark (limit 60000 ms), 1234 records held
join   0     orders/2               -       -      held by watermark alignment: the watermark has no value yet (limit 60000 ms), 0 records held
join   0     payments/0             0       -      watermark none (4 parked) held by payments/0 catching up: delivered through -1 of startup end 1 (max event time nothing)
join   1     app.stage-changelog/1  7       -      restore: an open transaction of app.stage.0 pins the last stable offset 7 below the high watermark 9
"
    );
    let idle = Explanation {
        stages: vec![StageExplanation {
            stage: "join".into(),
            taken_at_ms: None,
            fresh: false,
            tasks: vec![TaskExplanation::new(0)],
        }],
    };
    assert_eq!(
        idle.to_string(),
        "nothing waits (1 stage(s) did not answer: last snapshot shown)\n"
    );
}

#[test]
fn the_json_shape_is_stable_and_reads_back() {
    let e = sample();
    let json = serde_json::to_value(&e).unwrap();
    let blocked = &json["stages"][0]["tasks"][0]["blocked"][0];
    assert_eq!(
        blocked,
        &serde_json::json!({
            "channel": {"topic": "payments", "partition": 0, "topic_id": "02020202-0202-0202-0202-020202020202"},
            "offset": 0,
            "key": "sku-1",
            "waits_for": {
                "reason": "frontier",
                "channel": {"topic": "orders", "partition": 0, "topic_id": "01010101-0101-0101-0101-010101010101"},
                "offset": 2,
                "frontier": -1
            }
        })
    );
    assert_eq!(
        json["stages"][0]["tasks"][0]["event_time"]["held_by"]["kind"],
        "catching_up"
    );
    let back: Explanation = serde_json::from_value(json).unwrap();
    assert_eq!(back, e);
}

#[test]
fn a_task_reading_its_global_table_to_its_end_waits_and_says_so() {
    let mut t = TaskExplanation::new(0);
    assert!(t.is_idle());
    t.bootstrap = vec![BootstrapChannel {
        channel: name(1, 2),
        position: Some(40),
        end: 100,
    }];
    assert!(!t.is_idle(), "its other sources wait");
    let e = Explanation {
        stages: vec![StageExplanation {
            stage: "s".into(),
            taken_at_ms: Some(1),
            fresh: true,
            tasks: vec![t.clone()],
        }],
    };
    let text = e.to_string();
    assert!(text.contains("orders/2"), "{text}");
    assert!(
        text.contains("global table read to its end offset 100 before the task's first join"),
        "{text}"
    );
    // The field is new: a snapshot written without it reads as no bootstrap.
    let mut json = serde_json::to_value(&t).unwrap();
    json.as_object_mut().unwrap().remove("bootstrap");
    let read: TaskExplanation = serde_json::from_value(json).unwrap();
    assert!(read.bootstrap.is_empty());
}
