//! Ordering by event time on the real broker (the book's specification, §5): catch-up from Kafka's
//! evidence (an empty partition, a log ending in a commit marker: case C02), a restart in the
//! middle of history that restores the timer queue (changelogged in segments) and does
//! not wait for processed data, a late record released at once and counted, per-key event-time
//! order over two inputs of different lengths, a control stream whose record timestamps minus
//! the lag move the watermark, cases C13 (the first fetch must not move the watermark) and C14
//! (an empty partition adds no bound and no infinity), an effect stamped with an earlier event
//! time than its cause (a skewed upstream clock) that still leaves after it, history
//! parked and released while transactions commit (commit overlap), and an input another stage
//! writes, whose writer stopped with its committed offset short of a trailing commit marker.
//!
//! Mutation checks run by hand (each made the named test fail): parking without the ancestors'
//! park times (the skew test: `k@100` came out first); an input with nothing delivered left out
//! of the minimum (C13: `a`'s records were released before `b` committed); the minimum of an
//! empty set taken as +infinity (C14: a watermark of `i64::MAX`); segments not split (the
//! several-segment restart: the broker refused the 2 MB changelog record, `MessageSizeTooLarge`).
//!
//! The overlap test failed when a send made during a commit was sent at once instead of kept
//! (the commit's flush found 45,008 messages outstanding and the stage stopped).
//!
//! The stopped-writer test failed while the upstream wait compared the writer's committed
//! offset with its source's LSO alone: `down` stayed catching up with both records parked.
//!
//! Watermark alignment is tested in `event_time_alignment.rs`.
//!
//! The event time of a record is its Kafka record timestamp; the tests write explicit
//! timestamps relative to a base one hour in the past (time-based retention never sees them
//! as old). Every stage forwards `key@t` values unchanged, so its output topic is its release
//! order.

use std::collections::BTreeMap;
use std::time::Duration;

mod common;

use common::{base, enqueue, only_task};

use parsley_clock::{Channel, Clock, STAMP_HEADER, Stamp, codec};
use parsley_runtime::{LateKey, Runtime, RuntimeConfig, TaskPhase, changelog_topic};
use parsley_stage::{EventTimeOrder, Topology};
use parsley_testkit::fixtures::{
    DEADLINE, Forward, admin, bootstrap, committed_values, create_topic, forward_topology_with,
    raw_producer, read_committed, run_until, unique_topic, utf8_stage, wait_committed, wait_tasks,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// Sends `key@t` to partition 0 of `topic` with record timestamp `base + t` and waits for its
/// acknowledgement (in the producer's open transaction, if any).
fn send_at(producer: &BaseProducer, topic: &str, base: i64, key: &str, t: i64) {
    send_stamped_at(producer, topic, base, key, t, None);
}

/// [`send_at`] with `stamp` in the stamp header.
fn send_stamped_at(
    producer: &BaseProducer,
    topic: &str,
    base: i64,
    key: &str,
    t: i64,
    stamp: Option<&Stamp>,
) {
    let value = format!("{key}@{t}");
    let stamp = stamp.map(codec::encode);
    let mut record = BaseRecord::to(topic)
        .partition(0)
        .key(key)
        .payload(&value)
        .timestamp(base + t);
    if let Some(b) = &stamp {
        record = record.headers(OwnedHeaders::new().insert(Header {
            key: STAMP_HEADER,
            value: Some(b.as_slice()),
        }));
    }
    producer.send(record).map_err(|(e, _)| e).expect("send");
    producer.flush(DEADLINE).expect("flush");
}

/// One stage, `forward`, reading `sources` in event-time order and forwarding to `sink`.
fn ordered(app: &str, sources: &[&str], sink: &str) -> Topology {
    forward_topology_with(app, sources, sink, |s| {
        s.order_by_event_time(EventTimeOrder::new())
    })
}

#[test]
fn a_partition_empty_at_startup_is_caught_up_at_once() {
    let base = base();
    let empty = create_topic("evt-empty", 1);
    let full = create_topic("evt-full", 1);
    let out = create_topic("evt-empty-out", 1);
    let p = raw_producer(None);
    for t in [100, 150, 200] {
        send_at(&p, &full.name, base, "k", t);
    }
    let topology = ordered(
        &unique_topic("evt-empty"),
        &[&empty.name, &full.name],
        &out.name,
    );
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    // Without the empty partition caught up, it would hold the watermark with no evidence and
    // nothing would be released.
    wait_committed(&running, "forward", 3);
    let task = only_task(&wait_tasks(&running, "forward", "nothing parked", |t| {
        t.len() == 1 && t[0].parked == 0 && t[0].delivered == 3
    }));
    assert_eq!(task.catching_up, 0, "{task:?}");
    assert_eq!(task.watermark_ms, Some(base + 200), "{task:?}");
    assert_eq!(task.late, 0, "{task:?}");
    running.stop().unwrap();
    assert_eq!(committed_values(&out), ["k@100", "k@150", "k@200"]);
}

/// Case C02: `a` is `T(100, 200) + C`, its end offset 3 is reached only by the frontier moving
/// over the commit marker. Until `a` is caught up it stays in the minimum at 200 and `b@300`
/// stays parked.
#[test]
fn c02_a_transactional_partition_ending_in_a_commit_marker_is_caught_up() {
    let base = base();
    let a = create_topic("evt-c02-a", 1);
    let b = create_topic("evt-c02-b", 1);
    let out = create_topic("evt-c02-out", 1);
    let tx = raw_producer(Some(&unique_topic("evt-c02-tx")));
    tx.begin_transaction().unwrap();
    send_at(&tx, &a.name, base, "k", 100);
    send_at(&tx, &a.name, base, "k", 200);
    tx.commit_transaction(DEADLINE).unwrap();
    let p = raw_producer(None);
    send_at(&p, &b.name, base, "k", 150);
    send_at(&p, &b.name, base, "k", 300);
    let topology = ordered(&unique_topic("evt-c02"), &[&a.name, &b.name], &out.name);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "forward", 4);
    let task = only_task(&wait_tasks(&running, "forward", "all released", |t| {
        t.len() == 1 && t[0].parked == 0 && t[0].delivered == 4
    }));
    assert_eq!(task.catching_up, 0, "{task:?}");
    assert_eq!(task.watermark_ms, Some(base + 300), "{task:?}");
    assert_eq!(task.late, 0, "{task:?}");
    running.stop().unwrap();
    assert_eq!(committed_values(&out), ["k@100", "k@150", "k@200", "k@300"]);
}

/// `b` ends in an open transaction at startup, so it cannot be caught up: the first run
/// releases up to `b`'s delivered 20 and commits 30 and 50 parked. After the transaction
/// commits, the restarted task restores the queue and the watermark, finds `a` caught up at
/// once (its committed frontier reaches its end) and reads only `b`'s new record.
#[test]
fn a_restart_mid_history_restores_the_queue_and_does_not_wait_for_processed_data() {
    let base = base();
    let a = create_topic("evt-restart-a", 1);
    let b = create_topic("evt-restart-b", 1);
    let out = create_topic("evt-restart-out", 1);
    let p = raw_producer(None);
    for t in [10, 30, 50] {
        send_at(&p, &a.name, base, "k", t);
    }
    send_at(&p, &b.name, base, "k", 20);
    let tx = raw_producer(Some(&unique_topic("evt-restart-tx")));
    tx.begin_transaction().unwrap();
    send_at(&tx, &b.name, base, "k", 40);

    let app = unique_topic("evt-restart");
    let topology = ordered(&app, &[&a.name, &b.name], &out.name);
    let running = Runtime::new(topology.clone(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "forward", 2);
    let task = only_task(&wait_tasks(&running, "forward", "30 and 50 parked", |t| {
        t.len() == 1 && t[0].parked == 2 && t[0].delivered == 2
    }));
    assert_eq!(
        task.catching_up, 1,
        "b waits for its open transaction: {task:?}"
    );
    assert_eq!(task.watermark_ms, Some(base + 20), "{task:?}");
    let first = running.stop().unwrap()[0].1;
    assert_eq!(first.fetched, 4, "{first:?}");
    assert_eq!(first.committed_deliveries, 2, "{first:?}");
    assert_eq!(first.parked, 2, "{first:?}");
    assert_eq!(committed_values(&out), ["k@10", "k@20"]);
    let (parked, segments) = parked_in_changelog(&app, &topology, Some(base + 20));
    assert_eq!(
        parked,
        [base + 30, base + 50],
        "the changelog's segments hold the two parked records"
    );
    // Parked in one poll batch, so in one segment, unless a commit fell between them.
    assert!((1..=2).contains(&segments), "{segments} segments");

    tx.commit_transaction(DEADLINE).unwrap();
    let second = run_until(&topology, "forward", 3);
    assert_eq!(second.fetched, 1, "only b's new record is read: {second:?}");
    assert_eq!(second.committed_deliveries, 3, "{second:?}");
    assert_eq!(second.parked, 0, "{second:?}");
    assert_eq!(second.late, 0, "{second:?}");
    assert_eq!(
        committed_values(&out),
        ["k@10", "k@20", "k@30", "k@40", "k@50"]
    );
    assert_eq!(
        parked_in_changelog(&app, &topology, Some(base + 50)),
        (Vec::new(), 0),
        "the segment of released records is tombstoned"
    );
}

/// A queue larger than one changelog segment (512 KiB): 4,000 records of about 500 bytes on
/// `a` stay parked while `b` waits for an open transaction, and are committed in several
/// segments. The restarted task restores all of them from the changelog (it reads only `b`'s
/// new record) and, once `b` commits, releases everything in event-time order, none late;
/// then no segment is left.
#[test]
fn a_restart_restores_a_queue_written_in_several_segments() {
    const N: i64 = 4_000;
    let base = base();
    let a = create_topic("evt-big-a", 1);
    let b = create_topic("evt-big-b", 1);
    let out = create_topic("evt-big-out", 1);
    let p = raw_producer(None);
    let pad = "x".repeat(450);
    for i in 0..N {
        let t = 10 + i;
        let value = format!("k{}@{t}:{pad}", i % 50);
        let key = format!("k{}", i % 50);
        enqueue(&p, &a.name, &key, &value, base + t);
        if i % 1_000 == 999 {
            p.flush(DEADLINE).expect("flush");
        }
    }
    p.flush(DEADLINE).expect("flush");
    send_at(&p, &b.name, base, "k", 1);
    let tx = raw_producer(Some(&unique_topic("evt-big-tx")));
    tx.begin_transaction().unwrap();
    send_at(&tx, &b.name, base, "k", 2);

    let app = unique_topic("evt-big");
    let topology = ordered(&app, &[&a.name, &b.name], &out.name);
    let running = Runtime::new(topology.clone(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "forward", 1);
    wait_tasks(&running, "forward", "all of a parked", |t| {
        t.len() == 1 && t[0].parked == N as u64
    });
    let first = running.stop().unwrap()[0].1;
    assert_eq!(first.committed_deliveries, 1, "only b@1: {first:?}");
    assert_eq!(first.parked, N as u64, "{first:?}");
    let (parked, segments) = parked_in_changelog(&app, &topology, Some(base + 1));
    assert_eq!(parked, (10..10 + N).map(|t| base + t).collect::<Vec<_>>());
    assert!(segments >= 3, "{segments} segments for about 2 MB");

    tx.commit_transaction(DEADLINE).unwrap();
    let second = run_until(&topology, "forward", N as u64 + 1);
    assert_eq!(second.fetched, 1, "only b's new record is read: {second:?}");
    assert_eq!(second.committed_deliveries, N as u64 + 1, "{second:?}");
    assert_eq!(second.parked, 0, "{second:?}");
    assert_eq!(second.late, 0, "{second:?}");
    let times: Vec<i64> = committed_values(&out)
        .iter()
        .map(|v| {
            let t = v.split_once('@').expect("key@t").1;
            t.split(':').next().unwrap().parse().expect("a time")
        })
        .collect();
    let expected: Vec<i64> = [1, 2].into_iter().chain(10..10 + N).collect();
    assert_eq!(times, expected, "event-time order, each record once");
    assert_eq!(
        parked_in_changelog(&app, &topology, Some(base + 9 + N)),
        (Vec::new(), 0),
        "every segment tombstoned"
    );
}

/// The park times of the records that the live segments of the stage's changelog hold after
/// compaction (the latest record of each segment key `0x04 ++ number`, tombstones removed),
/// ascending, and the number of live segments. Every entry must be above `watermark` (the
/// task's committed watermark): a segment whose entries are all released is tombstoned.
fn parked_in_changelog(
    app: &str,
    topology: &Topology,
    watermark: Option<i64>,
) -> (Vec<i64>, usize) {
    let name = changelog_topic(&topology.stages()[0].group_id(app));
    let topic = admin().describe_topics(&[name.as_str()]).unwrap().remove(0);
    let mut latest = BTreeMap::new();
    for r in read_committed(&topic) {
        let key = r.key.expect("changelog records have keys");
        assert_ne!(
            key.first(),
            Some(&0x02),
            "no per-record timer keys: {key:?}"
        );
        latest.insert(key, r.value);
    }
    let segments: Vec<Vec<u8>> = latest
        .into_iter()
        .filter(|(k, v)| k.first() == Some(&0x04) && v.is_some())
        .map(|(k, v)| {
            assert_eq!(k.len(), 9, "{k:?}");
            v.unwrap()
        })
        .collect();
    let mut times: Vec<i64> = segments
        .iter()
        .flat_map(|v| parsley_gate::segment_ids(v).unwrap())
        .map(|(t, _)| t)
        .collect();
    times.sort();
    assert!(
        times.iter().any(|t| watermark.is_none_or(|w| *t > w)) || segments.is_empty(),
        "a live segment holds a parked record: {times:?} above {watermark:?}"
    );
    (times, segments.len())
}

/// With no control stream, once every input is caught up and at its head the watermark is the
/// highest delivered event time: a record produced later with an earlier event time is
/// released at once and counted late; a later one is released on arrival.
#[test]
fn a_record_behind_the_watermark_is_released_at_once_and_counted_late() {
    let base = base();
    let a = create_topic("evt-late", 1);
    let out = create_topic("evt-late-out", 1);
    let p = raw_producer(None);
    send_at(&p, &a.name, base, "k", 100);
    send_at(&p, &a.name, base, "k", 200);
    let topology = ordered(&unique_topic("evt-late"), &[&a.name], &out.name);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "forward", 2);
    wait_tasks(&running, "forward", "watermark at 200", |t| {
        t.len() == 1 && t[0].watermark_ms == Some(base + 200)
    });
    send_at(&p, &a.name, base, "k", 150);
    let m = wait_committed(&running, "forward", 3);
    assert_eq!(m.late, 1, "{m:?}");
    send_at(&p, &a.name, base, "k", 300);
    let m = wait_committed(&running, "forward", 4);
    assert_eq!(m.late, 1, "{m:?}");
    let task = only_task(&wait_tasks(&running, "forward", "all released", |t| {
        t.len() == 1 && t[0].delivered == 4
    }));
    assert_eq!(task.late, 1, "{task:?}");
    assert_eq!(task.parked, 0, "{task:?}");
    assert_eq!(task.watermark_ms, Some(base + 300), "{task:?}");
    running.stop().unwrap();
    assert_eq!(committed_values(&out), ["k@100", "k@200", "k@150", "k@300"]);
}

/// The violation counter per key (the book's specification, §5): three records behind the
/// watermark, two of key `k` and one of `j`, are counted against their keys — and the counts are
/// the task's state: a new runtime that restores the task reports them although it saw nothing
/// late.
#[test]
fn the_violation_counter_counts_late_records_per_key_and_is_restored_with_the_task() {
    let base = base();
    let a = create_topic("evt-latekey", 1);
    let out = create_topic("evt-latekey-out", 1);
    let p = raw_producer(None);
    send_at(&p, &a.name, base, "k", 100);
    send_at(&p, &a.name, base, "j", 200);
    let topology = ordered(&unique_topic("evt-latekey"), &[&a.name], &out.name);
    let running = Runtime::new(topology.clone(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_tasks(&running, "forward", "watermark at 200", |t| {
        t.len() == 1 && t[0].watermark_ms == Some(base + 200)
    });
    for (key, t) in [("k", 150), ("j", 120), ("k", 170), ("j", 300)] {
        send_at(&p, &a.name, base, key, t);
    }
    let m = wait_committed(&running, "forward", 6);
    assert_eq!(m.late, 3, "{m:?}");
    let expected = vec![(
        "forward".to_string(),
        vec![
            LateKey {
                partition: 0,
                key: b"j".to_vec(),
                late: 1,
            },
            LateKey {
                partition: 0,
                key: b"k".to_vec(),
                late: 2,
            },
        ],
    )];
    assert_eq!(running.late_by_key(), expected);
    running.stop().unwrap();

    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let task = only_task(&wait_tasks(&running, "forward", "task restored", |t| {
        t.len() == 1 && t[0].phase == TaskPhase::Running
    }));
    assert_eq!(task.late, 0, "this instance saw nothing late: {task:?}");
    assert_eq!(running.late_by_key(), expected);
    running.stop().unwrap();
    assert_eq!(
        committed_values(&out),
        ["k@100", "j@200", "k@150", "j@120", "k@170", "j@300"]
    );
}

/// Two inputs of one task with histories of different lengths (5 and 2 records), two keys:
/// whatever the fetches return first, the records leave in event-time order.
#[test]
fn history_on_two_partitions_of_different_lengths_is_released_in_event_time_order() {
    let base = base();
    let a = create_topic("evt-order-a", 1);
    let b = create_topic("evt-order-b", 1);
    let out = create_topic("evt-order-out", 1);
    let p = raw_producer(None);
    for (key, t) in [("k1", 10), ("k2", 30), ("k1", 50), ("k2", 70), ("k1", 90)] {
        send_at(&p, &a.name, base, key, t);
    }
    for (key, t) in [("k2", 20), ("k1", 40)] {
        send_at(&p, &b.name, base, key, t);
    }
    let topology = ordered(&unique_topic("evt-order"), &[&a.name, &b.name], &out.name);
    let m = run_until(&topology, "forward", 7);
    assert_eq!(m.late, 0, "{m:?}");
    assert_eq!(m.parked, 0, "{m:?}");
    let values = committed_values(&out);
    assert_eq!(
        values,
        [
            "k1@10", "k2@20", "k2@30", "k1@40", "k1@50", "k2@70", "k1@90"
        ]
    );
    let of = |key: &str| -> Vec<&str> {
        values
            .iter()
            .map(String::as_str)
            .filter(|v| v.starts_with(key))
            .collect()
    };
    assert_eq!(of("k1@"), ["k1@10", "k1@40", "k1@50", "k1@90"]);
    assert_eq!(of("k2@"), ["k2@20", "k2@30", "k2@70"]);
    // Each output carries the event time of the record that caused it (timestamp
    // propagation), not the moment it was produced.
    let times: Vec<Option<i64>> = read_committed(&out).iter().map(|r| r.timestamp).collect();
    let expected: Vec<Option<i64>> = [10, 20, 30, 40, 50, 70, 90]
        .iter()
        .map(|t| Some(base + t))
        .collect();
    assert_eq!(times, expected);
}

/// A control stream (a source with no event time, lag 500 ms): nothing is released before its
/// first record; each control record moves the watermark to its timestamp minus the lag and
/// is forwarded at once; a live record waits for the control clock.
#[test]
fn a_control_stream_moves_the_watermark_to_its_timestamps_minus_the_lag() {
    let base = base();
    let a = create_topic("evt-ctl-a", 1);
    let ctl = create_topic("evt-ctl-c", 1);
    let out = create_topic("evt-ctl-out", 1);
    let p = raw_producer(None);
    send_at(&p, &a.name, base, "k", 100);
    send_at(&p, &a.name, base, "k", 200);
    let topology = forward_topology_with(
        &unique_topic("evt-ctl"),
        &[&a.name, &ctl.name],
        &out.name,
        |s| s.order_by_event_time(EventTimeOrder::new().control(&ctl.name, 500)),
    );
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let task = only_task(&wait_tasks(&running, "forward", "both parked", |t| {
        t.len() == 1 && t[0].parked == 2 && t[0].catching_up == 0
    }));
    assert_eq!(task.watermark_ms, None, "no control tick yet: {task:?}");
    assert_eq!(task.delivered, 0, "{task:?}");

    send_at(&p, &ctl.name, base, "c", 1_000);
    wait_committed(&running, "forward", 3);
    send_at(&p, &a.name, base, "k", 700);
    let task = only_task(&wait_tasks(&running, "forward", "700 parked", |t| {
        t.len() == 1 && t[0].parked == 1
    }));
    assert_eq!(task.watermark_ms, Some(base + 500), "{task:?}");
    send_at(&p, &ctl.name, base, "c", 1_300);
    let m = wait_committed(&running, "forward", 5);
    assert_eq!(m.late, 0, "{m:?}");
    let task = only_task(&wait_tasks(&running, "forward", "all released", |t| {
        t.len() == 1 && t[0].parked == 0 && t[0].delivered == 5
    }));
    assert_eq!(task.watermark_ms, Some(base + 800), "{task:?}");
    running.stop().unwrap();
    assert_eq!(
        committed_values(&out),
        ["c@1000", "k@100", "k@200", "c@1300", "k@700"]
    );
}

/// Case C13 (FLINK-26018): one task, two inputs; `a` holds event times 100–200, `b` holds
/// 0–50, no lateness allowed. To make "the first fetches return only `a`" certain rather than
/// likely, `b`'s history sits in a transaction that is still open at startup: its records are
/// in the log (the startup end counts them) but a `read_committed` fetch returns none of them.
/// While `b` has delivered nothing it holds the watermark at its lowest value, so every record
/// of `a` stays parked; after the commit every record leaves in event-time order, none late.
#[test]
fn c13_the_first_fetch_does_not_move_the_watermark_past_a_partition_still_reading_history() {
    let base = base();
    let a = create_topic("evt-c13-a", 1);
    let b = create_topic("evt-c13-b", 1);
    let out = create_topic("evt-c13-out", 1);
    let p = raw_producer(None);
    let a_times: Vec<i64> = (100..=200).step_by(2).collect();
    let b_times: Vec<i64> = (0..=50).collect();
    for &t in &a_times {
        send_at(&p, &a.name, base, "k", t);
    }
    let tx = raw_producer(Some(&unique_topic("evt-c13-tx")));
    tx.begin_transaction().unwrap();
    for &t in &b_times {
        send_at(&tx, &b.name, base, "k", t);
    }
    let topology = ordered(&unique_topic("evt-c13"), &[&a.name, &b.name], &out.name);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let na = a_times.len() as u64;
    // `delivered` counts hand-overs to the handler: none while the queue holds everything.
    let task = only_task(&wait_tasks(&running, "forward", "a parked", |t| {
        t.len() == 1 && t[0].parked == na
    }));
    assert_eq!(task.delivered, 0, "all of a stays parked: {task:?}");
    assert_eq!(task.watermark_ms, None, "{task:?}");
    assert_eq!(task.catching_up, 1, "b is still reading history: {task:?}");
    tx.commit_transaction(DEADLINE).unwrap();
    let n = na + b_times.len() as u64;
    wait_committed(&running, "forward", n);
    let task = only_task(&wait_tasks(&running, "forward", "all released", |t| {
        t.len() == 1 && t[0].delivered == n && t[0].parked == 0
    }));
    assert_eq!(task.late, 0, "{task:?}");
    running.stop().unwrap();
    let expected: Vec<String> = b_times
        .iter()
        .chain(&a_times)
        .map(|t| format!("k@{t}"))
        .collect();
    assert_eq!(committed_values(&out), expected);
}

/// Case C14 (FLINK-8001): `empty` has never been written (end offset 0), `a` holds event times
/// 0–100. The empty input is caught up at once and does not hold the watermark; nor does it
/// push the watermark to +infinity: after 150 arrives on `a`, the watermark is 150 (at most
/// the highest delivered time) and no record is late.
#[test]
fn c14_an_empty_partition_adds_no_bound_and_no_infinity() {
    let base = base();
    let empty = create_topic("evt-c14-empty", 1);
    let a = create_topic("evt-c14-a", 1);
    let out = create_topic("evt-c14-out", 1);
    let p = raw_producer(None);
    for t in (0..=100).step_by(10) {
        send_at(&p, &a.name, base, "k", t);
    }
    let topology = ordered(&unique_topic("evt-c14"), &[&empty.name, &a.name], &out.name);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "forward", 11);
    let task = only_task(&wait_tasks(&running, "forward", "history released", |t| {
        t.len() == 1 && t[0].delivered == 11 && t[0].parked == 0
    }));
    assert_eq!(task.watermark_ms, Some(base + 100), "{task:?}");
    send_at(&p, &a.name, base, "k", 150);
    wait_committed(&running, "forward", 12);
    let task = only_task(&wait_tasks(&running, "forward", "150 released", |t| {
        t.len() == 1 && t[0].delivered == 12 && t[0].parked == 0
    }));
    assert_eq!(task.catching_up, 0, "{task:?}");
    assert_eq!(task.watermark_ms, Some(base + 150), "{task:?}");
    assert_eq!(task.late, 0, "{task:?}");
    running.stop().unwrap();
    let expected: Vec<String> = (0..=100)
        .step_by(10)
        .chain([150])
        .map(|t| format!("k@{t}"))
        .collect();
    assert_eq!(committed_values(&out), expected);
}

/// An effect whose upstream clock is skewed: `b@100` is stamped as caused by `a@500` (its
/// stamp claims `a`'s offset 0). The gate holds it until the cause is delivered; the timer
/// queue parks it at its cause's park time, 500, not at 100, so it leaves after the cause —
/// and after the unrelated `j@300`, which the gate held behind it on `b`. Sorting by event time
/// alone would release the effect first.
#[test]
fn an_effect_stamped_earlier_than_its_cause_is_never_released_before_the_cause() {
    let base = base();
    let a = create_topic("evt-skew-a", 1);
    let b = create_topic("evt-skew-b", 1);
    let out = create_topic("evt-skew-out", 1);
    let p = raw_producer(None);
    // The effect is appended first, so the gate sees it before its cause whatever the fetch
    // order.
    let cause = Clock::try_from_sorted(vec![(Channel::new(a.id, 0), 0)]).unwrap();
    send_stamped_at(&p, &b.name, base, "k", 100, Some(&Stamp::new(None, cause)));
    send_at(&p, &b.name, base, "j", 300);
    send_at(&p, &a.name, base, "k", 500);
    let topology = ordered(&unique_topic("evt-skew"), &[&a.name, &b.name], &out.name);
    let m = run_until(&topology, "forward", 3);
    assert_eq!(m.late, 0, "{m:?}");
    assert_eq!(
        m.raised, 1,
        "the effect was parked at its cause's time: {m:?}"
    );
    assert_eq!(committed_values(&out), ["j@300", "k@500", "k@100"]);
}

/// Parking goes on while a transaction commits (the commit's round trips on a helper thread,
/// `StageRunner::overlap_batch`): three inputs of interleaved history and a control stream
/// whose record arrives during catch-up, committed every 5 ms so that many commits find
/// records ready. Every record leaves once, in event-time order; the control record once;
/// nothing late; and records were in fact taken during commits.
#[test]
fn history_parked_while_transactions_commit_leaves_once_in_event_time_order() {
    const PER_INPUT: i64 = 15_000;
    let base = base();
    let inputs: Vec<_> = (0..3)
        .map(|i| create_topic(&format!("evt-overlap-{i}"), 1))
        .collect();
    let ctl = create_topic("evt-overlap-c", 1);
    let out = create_topic("evt-overlap-out", 1);
    let p = raw_producer(None);
    for n in 0..PER_INPUT {
        for (i, topic) in inputs.iter().enumerate() {
            // Input i holds the times 3n + i: every input is needed for every step of the
            // watermark.
            let t = 10 + 3 * n + i as i64;
            let key = format!("k{}", n % 40);
            let value = format!("{key}@{t}");
            enqueue(&p, &topic.name, &key, &value, base + t);
        }
        if n % 2_000 == 1_999 {
            p.flush(DEADLINE).expect("flush");
        }
    }
    p.flush(DEADLINE).expect("flush");
    // The control clock far ahead of the history: once every input is caught up, the whole
    // history leaves.
    send_at(&p, &ctl.name, base, "c", 3_600_000);

    let names: Vec<&str> = inputs
        .iter()
        .map(|t| t.name.as_str())
        .chain([ctl.name.as_str()])
        .collect();
    let topology = forward_topology_with(&unique_topic("evt-overlap"), &names, &out.name, |s| {
        s.order_by_event_time(EventTimeOrder::new().control(&ctl.name, 0))
    });
    let total = 3 * PER_INPUT as u64 + 1;
    let config = RuntimeConfig::new(bootstrap()).commit_interval(Duration::from_millis(5));
    let running = Runtime::new(topology, config).start().unwrap();
    wait_committed(&running, "forward", total);
    let m = running.stop().unwrap()[0].1;
    assert_eq!(m.committed_deliveries, total, "{m:?}");
    assert_eq!(m.late, 0, "{m:?}");
    assert_eq!(m.parked, 0, "{m:?}");
    assert!(
        m.overlapped > 0,
        "no record was taken during a commit, so this run did not test it: {m:?}"
    );
    let values = committed_values(&out);
    let (control, events): (Vec<&String>, Vec<&String>) =
        values.iter().partition(|v| v.starts_with("c@"));
    assert_eq!(control, ["c@3600000"]);
    let times: Vec<i64> = events
        .iter()
        .map(|v| v.split_once('@').expect("key@t").1.parse().expect("a time"))
        .collect();
    let expected: Vec<i64> = (10..10 + 3 * PER_INPUT).collect();
    assert_eq!(times.len(), expected.len());
    let first_wrong = times.iter().zip(&expected).position(|(a, b)| a != b);
    assert_eq!(first_wrong, None, "event-time order, each record once");
}

/// Commits `offset` on partition 0 of `topic` for `group`, as a consumer that never joins it.
fn commit_group_offset(group: &str, topic: &str, offset: i64) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))
        .unwrap();
    consumer.commit(&tpl, CommitMode::Sync).expect("commit");
}

/// `down` orders by event time and reads `mid`, which `up` writes from `in`: `mid`'s history
/// ends where `up`'s does, so it waits for `up`'s group to have consumed `in` (module
/// `stage::upstream`). `in` is `T(k@100, k@200) + C` then `T(k@300) + A`: records at 0 and 1,
/// the commit marker at 2, an aborted record at 3, the abort marker at 4, LSO 5. `up` is not
/// running: its group's committed offset is what a stage stopped after committing its last
/// record, before a later commit carried it over the markers, leaves for ever. At 1 a
/// committed record is not consumed and `down` waits; at 2 only markers and an aborted record
/// are left, and `down` must not wait for ever (it did: the inventory demo's ledger behind its
/// stopped first stage, every record parked).
#[test]
fn an_input_whose_writer_stopped_short_of_a_trailing_marker_is_caught_up() {
    let base = base();
    let input = create_topic("evt-up-in", 1);
    let mid = create_topic("evt-up-mid", 1);
    let out = create_topic("evt-up-out", 1);
    let app = unique_topic("evt-up");
    let tx = raw_producer(Some(&unique_topic("evt-up-tx")));
    tx.begin_transaction().unwrap();
    send_at(&tx, &input.name, base, "k", 100);
    send_at(&tx, &input.name, base, "k", 200);
    tx.commit_transaction(DEADLINE).unwrap();
    tx.begin_transaction().unwrap();
    send_at(&tx, &input.name, base, "k", 300);
    tx.abort_transaction(DEADLINE).unwrap();
    // The abort marker is written after the producer's call returns (the coordinator writes
    // markers partition by partition): the LSO is 5 once it is, read until then.
    let waited = std::time::Instant::now();
    loop {
        let lso = admin()
            .last_stable_offsets(&[(input.name.as_str(), 0)])
            .unwrap();
        if lso == [5] {
            break;
        }
        assert!(
            waited.elapsed() < DEADLINE,
            "LSO {lso:?}, not 5, after {DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // What `up` wrote for the two committed records.
    let p = raw_producer(None);
    send_at(&p, &mid.name, base, "k", 100);
    send_at(&p, &mid.name, base, "k", 200);
    let topology = Topology::builder(&app)
        .stage("up", Forward(mid.name.clone()), |s| {
            utf8_stage(s, &[&input.name], &[&mid.name])
        })
        .stage("down", Forward(out.name.clone()), |s| {
            utf8_stage(s, &[&mid.name], &[&out.name]).order_by_event_time(EventTimeOrder::new())
        })
        .build()
        .unwrap();
    let up_group = format!("{app}.up");
    commit_group_offset(&up_group, &input.name, 1);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start_stages(&["down"])
        .unwrap();
    wait_tasks(&running, "down", "both records parked", |t| {
        t.len() == 1 && t[0].parked == 2
    });
    // Several looks at `up`'s progress (one per commit interval, 100 ms): record 1 is not
    // consumed, so `mid` is still catching up and nothing leaves.
    std::thread::sleep(Duration::from_millis(1_000));
    let task = only_task(&wait_tasks(&running, "down", "one task", |t| t.len() == 1));
    assert_eq!((task.catching_up, task.parked), (1, 2), "{task:?}");
    commit_group_offset(&up_group, &input.name, 2);
    wait_committed(&running, "down", 2);
    let task = only_task(&wait_tasks(&running, "down", "all released", |t| {
        t.len() == 1 && t[0].parked == 0
    }));
    assert_eq!(task.catching_up, 0, "{task:?}");
    assert_eq!(task.watermark_ms, Some(base + 200), "{task:?}");
    running.stop().unwrap();
    assert_eq!(committed_values(&out), ["k@100", "k@200"]);
}
