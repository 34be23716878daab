//! Watermark alignment on the real broker (`EventTimeOrder::max_drift_ms`, the book's chapter
//! "Ordering by event time"): an input whose history runs far ahead of another's in event time is
//! held before the gate instead of parked whole (with alignment off, the negative control, it is
//! parked whole); records go to the gate up to the watermark plus the drift, record by record (a
//! hand mutant that hands over everything held parked 14,887 records where one waits); what the
//! consumer fetched of a held input is kept, not fetched again (the negative control is the
//! consumer pausing the partition, which drops its prefetched records); records held at a
//! revocation are read again by the next owner.
//!
//! The event time of a record is its Kafka record timestamp; the tests write explicit
//! timestamps relative to a base one hour in the past. Every stage forwards `key@t` values
//! unchanged, so its output topic is its release order.

use std::time::Duration;

mod common;

use common::{base, enqueue, only_task};
use parsley_runtime::Runtime;
use parsley_runtime::{Running, RuntimeConfig, StatisticsSink, TaskMetrics};
use parsley_stage::EventTimeOrder;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, committed_values, create_topic, forward_topology_with, raw_producer,
    unique_topic, wait_committed, wait_tasks,
};
use rdkafka::producer::{BaseProducer, Producer};

/// Records held for watermark alignment over every task of `running` (`Running::explain`).
fn held_records(running: &Running) -> u64 {
    running
        .explain()
        .stages
        .iter()
        .flat_map(|s| &s.tasks)
        .flat_map(|t| &t.ahead)
        .map(|a| a.held_records)
        .sum()
}

/// Input `a` holds records a second of event time apart. Input `b` has one committed record at
/// 0.5 s, then an open transaction with 20 records from 1,000 s on: `b` cannot be read past
/// it, so it holds the watermark at 0.5 s while `a` runs ahead. Once `ready` holds of the task
/// (the stage has run ahead as far as it will), `b`'s transaction is committed; once all
/// `records` outputs are committed, `before_stop` runs. Returns the release order, the stage's
/// metrics and its task's.
fn run_ahead(
    order: EventTimeOrder,
    a: &str,
    base: i64,
    config: RuntimeConfig,
    records: usize,
    ready: impl Fn(&TaskMetrics, &parsley_runtime::MetricsSnapshot) -> bool,
    before_stop: impl FnOnce(),
) -> (Vec<String>, parsley_runtime::MetricsSnapshot, TaskMetrics) {
    let (b, tx) = behind_a_transaction(base);
    let out = create_topic("evt-align-out", 1);
    let topology =
        forward_topology_with(&unique_topic("evt-align"), &[a, &b.name], &out.name, |s| {
            s.order_by_event_time(order)
        });
    let running = Runtime::new(topology, config).start().unwrap();
    let started = std::time::Instant::now();
    loop {
        let tasks = running.task_metrics()[0].1.clone();
        if let [task] = tasks[..]
            && ready(&task, &running.metrics()[0].1)
        {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "not ready: {tasks:?}");
        std::thread::park_timeout(Duration::from_millis(20));
    }
    tx.commit_transaction(DEADLINE).unwrap();
    wait_committed(&running, "forward", records as u64);
    before_stop();
    let task = only_task(&running.task_metrics()[0].1);
    let metrics = running.stop().unwrap()[0].1;
    (committed_values(&out), metrics, task)
}

/// Input `b` of [`run_ahead`]: one committed record at 0.5 s, then 20 records from 1,000 s on
/// in a transaction left open (commit it with the producer returned).
fn behind_a_transaction(base: i64) -> (parsley_runtime::TopicInfo, BaseProducer) {
    let b = create_topic("evt-align-b", 1);
    let p = raw_producer(None);
    enqueue(&p, &b.name, "b", "b@00000", base + 500);
    p.flush(DEADLINE).unwrap();
    let tx = raw_producer(Some(&unique_topic("evt-align-tx")));
    tx.begin_transaction().unwrap();
    for i in 1..=20i64 {
        enqueue(
            &tx,
            &b.name,
            "b",
            &format!("b@{:05}", i * 1_000),
            base + i * 1_000_000,
        );
    }
    tx.flush(DEADLINE).unwrap();
    (b, tx)
}

/// Writes `n` records to `a`, a second of event time apart from `base`.
fn write_ahead(a: &str, base: i64, n: i64) {
    let p = raw_producer(None);
    for i in 0..n {
        enqueue(&p, a, "a", &format!("a@{i:05}"), base + i * 1_000);
    }
    p.flush(DEADLINE).unwrap();
}

/// `true` when the release order is event-time order.
fn in_order(values: &[String]) -> bool {
    let times: Vec<&str> = values.iter().map(|v| &v[2..7]).collect();
    times.windows(2).all(|w| w[0] <= w[1])
}

/// Aligned (a drift of 1 s), `a` is held after the poll batch that took it ahead, so the
/// timer queue holds at most about one poll batch of it (2,000 records), not all of it; with
/// alignment off (the negative control) all of `a` waits in the queue until `b` moves. The
/// release order is event-time order either way.
#[test]
fn an_input_running_ahead_in_event_time_is_paused_not_parked_whole() {
    let base = base() - 30_000_000;
    let a = create_topic("evt-align-a", 1);
    write_ahead(&a.name, base, 20_000);

    // Ready once `a` was held (the stage cannot move further until `b` does).
    let (values, m, task) = run_ahead(
        EventTimeOrder::new().max_drift_ms(1_000),
        &a.name,
        base,
        RuntimeConfig::new(bootstrap()),
        20_021,
        |_, m| m.aligned > 0,
        || {},
    );
    assert_eq!(values.len(), 20_021);
    assert!(in_order(&values), "released in event-time order");
    assert_eq!(m.late, 0, "{m:?}");
    assert!(
        task.max_parked <= 2_100,
        "aligned: about one poll batch of a waits: {task:?}"
    );

    // Ready once every record of `a` but the first (released at b's 0.5 s) is parked.
    let (values, m, task) = run_ahead(
        EventTimeOrder::new().unaligned(),
        &a.name,
        base,
        RuntimeConfig::new(bootstrap()),
        20_021,
        |t, _| t.parked >= 19_999,
        || {},
    );
    assert_eq!(values.len(), 20_021);
    assert!(in_order(&values), "released in event-time order");
    assert_eq!(m.aligned, 0, "{m:?}");
    assert!(
        task.max_parked >= 19_999,
        "negative control: unaligned, all of a waits in the queue: {task:?}"
    );
}

/// Aligned, an input goes to the gate record by record up to its bound, the watermark plus the
/// drift: `b` stops at 3,000 s (its rest behind an open transaction), so the watermark stops
/// there, and of `a` (a record a second) only the record at 3,001 s waits in the timer queue;
/// the rest of `a` is held before the gate. Once the transaction commits, every record leaves
/// in event-time order. Letting a held input hand over everything it held as soon as its bound
/// admits any of it (an input held whole) parked 14,887 of `a`'s records here.
#[test]
fn an_aligned_input_goes_to_the_gate_up_to_the_watermark_plus_the_drift() {
    let base = base() - 30_000_000;
    let a = create_topic("evt-bound-a", 1);
    write_ahead(&a.name, base, 20_000);
    let b = create_topic("evt-bound-b", 1);
    let p = raw_producer(None);
    enqueue(&p, &b.name, "b", "b@00000", base + 500);
    enqueue(&p, &b.name, "b", "b@03000", base + 3_000_000);
    p.flush(DEADLINE).unwrap();
    let tx = raw_producer(Some(&unique_topic("evt-bound-tx")));
    tx.begin_transaction().unwrap();
    for i in 4..=23i64 {
        let t = i * 1_000;
        enqueue(&tx, &b.name, "b", &format!("b@{t:05}"), base + t * 1_000);
    }
    tx.flush(DEADLINE).unwrap();
    let out = create_topic("evt-bound-out", 1);
    let topology = forward_topology_with(
        &unique_topic("evt-bound"),
        &[&a.name, &b.name],
        &out.name,
        |s| s.order_by_event_time(EventTimeOrder::new().max_drift_ms(1_000)),
    );
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let task = only_task(&wait_tasks(&running, "forward", "b at 3,000 s", |t| {
        t.len() == 1 && t[0].watermark_ms == Some(base + 3_000_000)
    }));
    assert_eq!(task.parked, 1, "only a@3001 s waits: {task:?}");
    let held = held_records(&running);
    assert!(held > 0, "the rest of a is held");
    tx.commit_transaction(DEADLINE).unwrap();
    wait_committed(&running, "forward", 20_022);
    let m = running.stop().unwrap()[0].1;
    let values = committed_values(&out);
    assert_eq!(values.len(), 20_022);
    assert!(in_order(&values), "released in event-time order");
    assert_eq!(m.late, 0, "{m:?}");
}

/// What the consumer fetched of an input held for alignment is kept: `a`'s 5,000 records (one
/// fetch response) are held after the poll batch that took `a` ahead and offered once `b`
/// moves, each fetched from the broker once. Pausing the partition instead (what alignment did
/// before records were held) drops the prefetched rest of the response, and the resume fetches
/// it again: measured 8,000 fetched for these 5,000 records.
#[test]
fn an_input_held_for_alignment_keeps_what_the_consumer_fetched() {
    let base = base() - 30_000_000;
    let a = create_topic("evt-hold-a", 1);
    write_ahead(&a.name, base, 5_000);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let sink = StatisticsSink::new(move |json| {
        let _ = tx.send(String::from_utf8_lossy(json).into_owned());
    });
    let config = RuntimeConfig::new(bootstrap()).statistics(Duration::from_millis(20), sink);
    let (values, m, _) = run_ahead(
        EventTimeOrder::new().max_drift_ms(1_000),
        &a.name,
        base,
        config,
        5_021,
        |_, m| m.aligned > 0,
        || {
            // Every record is committed, so fetched: the second consumer document from now on
            // (the first may have been taken just before) counts every fetch.
            while rx.try_recv().is_ok() {}
            let mut documents = 0;
            let fetched = loop {
                let json = rx.recv_timeout(DEADLINE).expect("consumer statistics");
                if let Some(n) = consumer_figure(&json, &a.name, 0, "rxmsgs") {
                    documents += 1;
                    if documents == 2 {
                        break n;
                    }
                }
            };
            assert_eq!(fetched, 5_000, "each record of a fetched once");
        },
    );
    assert!(m.aligned > 0, "a was held: {m:?}");
    assert_eq!(values.len(), 5_021);
    assert!(in_order(&values), "released in event-time order");
}

/// A figure of the consumer's partition `partition` of `topic` (`rxmsgs`, `app_offset`, ...) in
/// a consumer's statistics document; `None` in a producer's or without it.
fn consumer_figure(json: &str, topic: &str, partition: i32, figure: &str) -> Option<i64> {
    let doc: serde_json::Value = serde_json::from_str(json).expect("a statistics document");
    if doc["type"] != "consumer" {
        return None;
    }
    doc["topics"][topic]["partitions"][partition.to_string()][figure].as_i64()
}

/// The consumer group's rebalances so far (`cgrp.rebalance_cnt`: each assignment and each
/// revocation) in a consumer's statistics document.
fn rebalances(json: &str) -> Option<i64> {
    let doc: serde_json::Value = serde_json::from_str(json).expect("a statistics document");
    (doc["type"] == "consumer")
        .then(|| doc["cgrp"]["rebalance_cnt"].as_i64())
        .flatten()
}

/// Records held for alignment when the task is revoked are not lost and not released twice:
/// instance `x` has taken all 5,000 records of `a` from its consumer (`app_offset`) but offered
/// fewer to the gate (held); instance `y` joins, `x` goes through the revocation and stops; `y`
/// reads `a` again from the committed offsets. Every record reaches the output once, in
/// event-time order.
#[test]
fn records_held_at_a_revocation_are_read_again_by_the_next_owner() {
    let base = base() - 30_000_000;
    let a = create_topic("evt-held-revoked-a", 1);
    write_ahead(&a.name, base, 5_000);
    let (b, tx) = behind_a_transaction(base);
    let out = create_topic("evt-held-revoked-out", 1);
    let topology = forward_topology_with(
        &unique_topic("evt-held-revoked"),
        &[&a.name, &b.name],
        &out.name,
        |s| s.order_by_event_time(EventTimeOrder::new().max_drift_ms(1_000)),
    );
    let (docs, rx) = std::sync::mpsc::channel::<String>();
    let sink = StatisticsSink::new(move |json| {
        let _ = docs.send(String::from_utf8_lossy(json).into_owned());
    });
    let config = |instance: &str| {
        let mut c = RuntimeConfig::new(bootstrap());
        c.instance_id = instance.to_string();
        c
    };
    let x = Runtime::new(
        topology.clone(),
        config("x").statistics(Duration::from_millis(20), sink),
    )
    .start()
    .unwrap();
    // x's consumer has returned every record of `a`...
    let started = std::time::Instant::now();
    loop {
        let json = rx.recv_timeout(DEADLINE).expect("consumer statistics");
        if consumer_figure(&json, &a.name, 0, "app_offset") == Some(5_000) {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "a not read to its end");
    }
    // ... and its gate has seen fewer: the rest is held, and `explain` says how many.
    let m = x.metrics()[0].1;
    assert!(m.aligned > 0, "{m:?}");
    assert!(m.fetched < 5_001, "records of a held: {m:?}");
    let held = held_records(&x);
    assert!(held > 0 && held <= 5_000, "{held} records of a held");

    // y joins: x's task is revoked (and maybe assigned again) with records held.
    let y = Runtime::new(topology, config("y")).start().unwrap();
    loop {
        let json = rx.recv_timeout(DEADLINE).expect("consumer statistics");
        if rebalances(&json).is_some_and(|n| n >= 3) {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "x saw no revocation");
    }
    x.stop().unwrap();
    tx.commit_transaction(DEADLINE).unwrap();
    let values = loop {
        let values = committed_values(&out);
        if values.len() >= 5_021 {
            break values;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{} of 5,021 out",
            values.len()
        );
        std::thread::park_timeout(Duration::from_millis(50));
    };
    y.stop().unwrap();
    let mut expected: Vec<String> = (0..5_000).map(|i| format!("a@{i:05}")).collect();
    expected.extend((0..=20).map(|i| format!("b@{:05}", i * 1_000)));
    let mut sorted = values.clone();
    sorted.sort();
    expected.sort();
    assert_eq!(sorted, expected, "every record once");
    assert!(in_order(&values), "released in event-time order");
}
