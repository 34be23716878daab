//! The gate's evidence on the real broker, `read_committed`: commit markers and
//! aborted records, positions, high watermarks, impossible stamps and their policies,
//! recreated topics, crossed in-flight sends. Cases C01, C03, C04 and C05.

use std::time::{Duration, Instant};

use parsley_clock::{CausalClock, Channel, SenderId, Stamp};
use parsley_gate::{Arrival, Gate, ImpossibleReason};
use parsley_runtime::RecordError;
use parsley_runtime::{
    CausalProducer, CausalProducerConfig, Error, MetricsSnapshot, Runtime, RuntimeConfig, TopicInfo,
};
use parsley_stage::{ImpossiblePolicy, Topology};
use parsley_testkit::fixtures::{
    DEADLINE, admin, bootstrap, commit_group_offsets, committed_consumer, committed_values,
    create_topic, forward_topology, group_offset, next_failure, raw_producer, send_stamped,
    unique_topic, wait_committed, wait_metrics,
};
use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

struct Run {
    app: String,
    out: TopicInfo,
    topology: Topology,
}

fn forward(sources: &[&TopicInfo], policy: ImpossiblePolicy) -> Run {
    let out = create_topic("evidence-out", 1);
    let app = unique_topic("evidence");
    let sources: Vec<&str> = sources.iter().map(|t| t.name.as_str()).collect();
    let topology = forward_topology(&app, &sources, &out.name, policy);
    Run { app, out, topology }
}

impl Run {
    /// Runs the stage until it committed `deliveries`; returns its outputs and counters.
    fn until(&self, deliveries: u64) -> (Vec<String>, MetricsSnapshot) {
        let running = Runtime::new(self.topology.clone(), RuntimeConfig::new(bootstrap()))
            .start()
            .unwrap();
        wait_committed(&running, "forward", deliveries);
        let tasks = running.task_metrics()[0].1.clone();
        let metrics = running.stop().unwrap()[0].1;
        // Each impossible stamp is counted against its task too.
        assert_eq!(
            tasks.iter().map(|t| t.impossible_stamps).sum::<u64>(),
            metrics.impossible_stamps,
            "{tasks:?}"
        );
        (committed_values(&self.out), metrics)
    }

    fn group(&self) -> String {
        format!("{}.forward", self.app)
    }
}

fn txn_producer() -> CausalProducer {
    CausalProducer::new(
        CausalProducerConfig::new(bootstrap()).transactional(unique_topic("evidence-producer")),
    )
    .unwrap()
}

/// Writes `T(values)+C` or `+A`; returns the acknowledged offsets.
fn transaction(p: &mut CausalProducer, topic: &str, values: &[&str], commit: bool) -> Vec<i64> {
    p.begin().unwrap();
    for v in values {
        p.send(topic, b"k", v.as_bytes()).unwrap();
    }
    let acked = p.flush().unwrap();
    if commit {
        p.commit().unwrap();
    } else {
        p.abort().unwrap();
    }
    acked.iter().map(|a| a.coordinate.offset).collect()
}

#[test]
fn c03_commit_abort_commit_delivers_the_committed_records_and_the_frontier_covers_the_marker() {
    let a = create_topic("c03-a", 1);
    let b = create_topic("c03-b", 1);
    let mut p = txn_producer();
    transaction(&mut p, &a.name, &["a", "b"], true);
    transaction(&mut p, &a.name, &["c", "d"], false);
    let f = transaction(&mut p, &a.name, &["e", "f"], true)[1];
    assert_eq!(f, 7, "records 0,1 marker 2, 3,4 marker 5, 6,7 marker 8");
    // A downstream record claims the offset of f.
    let mut q = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    q.observe(Channel::new(a.id, 0).at(f), None);
    q.send(&b.name, b"k", b"g").unwrap();
    q.flush().unwrap();

    let run = forward(&[&a, &b], ImpossiblePolicy::Fail);
    let (out, m) = run.until(5);
    let mut of_a: Vec<&str> = out
        .iter()
        .map(String::as_str)
        .filter(|v| *v != "g")
        .collect();
    of_a.sort();
    assert_eq!(
        of_a,
        ["a", "b", "e", "f"],
        "nothing of the aborted transaction"
    );
    let at = |v: &str| out.iter().position(|x| x == v).unwrap();
    assert!(
        at("f") < at("g"),
        "the claim on f was satisfied first: {out:?}"
    );
    assert_eq!(m.committed_deliveries, 5);
    // The frontier ends at 8, the commit marker: the committed position is the end, 9.
    assert_eq!(group_offset(&run.group(), &a.name, 0), Some(9));
}

#[test]
fn c01_the_committed_position_after_a_trailing_marker_is_the_end() {
    let a = create_topic("c01", 1);
    let mut p = txn_producer();
    transaction(&mut p, &a.name, &["r0", "r1", "r2"], true);
    let run = forward(&[&a], ImpossiblePolicy::Fail);
    let (out, _) = run.until(3);
    assert_eq!(out, ["r0", "r1", "r2"]);
    assert_eq!(
        group_offset(&run.group(), &a.name, 0),
        Some(4),
        "committed offset 4, not 3: the frontier covers the marker at 3"
    );
}

#[test]
fn a_claim_on_a_commit_marker_is_satisfied_by_position_advance() {
    // a@0, marker@1; the stage's group starts at 1, so after its seed point the partition
    // holds only the marker. A record on b claims a@1, the marker's offset.
    let a = create_topic("marker-a", 1);
    let b = create_topic("marker-b", 1);
    let mut p = txn_producer();
    transaction(&mut p, &a.name, &["a"], true);
    let mut clock = CausalClock::new(SenderId::random());
    clock.learn(Channel::new(a.id, 0).at(1)).unwrap();
    let stamp = clock.stamp(Channel::new(b.id, 0)).unwrap();
    send_stamped(&raw_producer(None), &b.name, 0, b"k", b"g", Some(&stamp));

    let run = forward(&[&a, &b], ImpossiblePolicy::Fail);
    commit_group_offsets(&run.group(), &[(&a.name, 0, 1), (&b.name, 0, 0)]);
    // No new data is written to a: only the position moving over the marker can settle it.
    let (out, _) = run.until(1);
    assert_eq!(out, ["g"]);
    assert_eq!(group_offset(&run.group(), &a.name, 0), Some(2));
}

#[test]
fn c05_the_position_never_runs_ahead_of_the_records_returned() {
    // 50 transactions of 10 records: records at 11k..11k+9, markers at 11k+10.
    let a = create_topic("c05", 1);
    let producer = raw_producer(Some(&unique_topic("c05-producer")));
    for t in 0..50 {
        producer.begin_transaction().unwrap();
        for i in 0..10 {
            let v = format!("{t}-{i}");
            producer
                .send(
                    rdkafka::producer::BaseRecord::to(&a.name)
                        .partition(0)
                        .key("k")
                        .payload(&v),
                )
                .map_err(|(e, _)| e)
                .unwrap();
        }
        producer.commit_transaction(DEADLINE).unwrap();
    }
    let channel = Channel::new(a.id, 0);
    let consumer = committed_consumer();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&a.name, 0, Offset::Offset(0))
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut gate: Gate<i64> = Gate::new([channel]);
    gate.seed(channel, 0).unwrap();
    let mut returned = Vec::new();
    let started = Instant::now();
    let position = |c: &rdkafka::consumer::BaseConsumer| match c
        .position()
        .unwrap()
        .find_partition(&a.name, 0)
        .unwrap()
        .offset()
    {
        Offset::Offset(o) => o,
        other => panic!("no position: {other:?}"),
    };
    while returned.len() < 12 {
        assert!(started.elapsed() < DEADLINE);
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            returned.push(m.offset());
            gate.offer(
                channel,
                Arrival {
                    offset: m.offset(),
                    timestamp: 0,
                    epoch: 1,
                    stamp: None,
                    payload: m.offset(),
                },
            )
            .unwrap();
            let pos = position(&consumer);
            let last = *returned.last().unwrap();
            // Sound evidence: at most the offset after the last record returned, or after a
            // commit marker that immediately follows it — never past a record not returned.
            assert!(
                pos == last + 1 || (pos == last + 2 && (last + 1) % 11 == 10),
                "position {pos} after returning offset {last}"
            );
            gate.position(channel, pos).unwrap();
            while gate.next_delivery().is_some() {}
        }
    }
    assert_eq!(returned, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12]);
    assert_eq!(position(&consumer), 13);
    // A crash here resumes at the first undelivered offset.
    assert_eq!(gate.first_undelivered(&channel), Some(13));
}

#[test]
fn c04_aborted_records_in_compressed_batches_are_not_delivered() {
    let a = create_topic("c04", 1);
    let mut p = CausalProducer::new(
        CausalProducerConfig::new(bootstrap())
            .transactional(unique_topic("c04-producer"))
            .property("compression.type", "lz4")
            .property("linger.ms", "100"),
    )
    .unwrap();
    transaction(&mut p, &a.name, &["x0", "x1", "x2", "x3", "x4"], false);
    transaction(&mut p, &a.name, &["k0", "k1", "k2", "k3", "k4"], true);
    let run = forward(&[&a], ImpossiblePolicy::Fail);
    let (out, m) = run.until(5);
    assert_eq!(out, ["k0", "k1", "k2", "k3", "k4"]);
    assert_eq!(m.delivered, 5);
    assert_eq!(
        group_offset(&run.group(), &a.name, 0),
        Some(12),
        "5 aborted + marker, 5 committed + marker"
    );
}

/// `a` with 50 records (LSO = high watermark = 50) and `b` holding `g`, whose stamp claims
/// a@10000, then `h`, a plain record.
fn claim_from_the_future() -> (TopicInfo, TopicInfo, SenderId) {
    let a = create_topic("future-a", 1);
    let b = create_topic("future-b", 1);
    let producer = raw_producer(None);
    for i in 0..50 {
        send_stamped(
            &producer,
            &a.name,
            0,
            b"k",
            format!("a{i}").as_bytes(),
            None,
        );
    }
    let sender = SenderId::random();
    let mut clock = CausalClock::new(sender);
    clock.learn(Channel::new(a.id, 0).at(10_000)).unwrap();
    let stamp = clock.stamp(Channel::new(b.id, 0)).unwrap();
    send_stamped(&producer, &b.name, 0, b"k", b"g", Some(&stamp));
    send_stamped(&producer, &b.name, 0, b"k", b"h", None);
    (a, b, sender)
}

#[test]
fn a_claim_beyond_the_high_watermark_fails_the_task_by_default() {
    let (a, b, sender) = claim_from_the_future();
    let run = forward(&[&a, &b], ImpossiblePolicy::Fail);
    let running = Runtime::new(run.topology.clone(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let error = next_failure(&running);
    let _ = running.stop();
    let channel = Channel::new(a.id, 0);
    assert!(
        matches!(
            &*error,
            Error::Record(RecordError::ImpossibleStamp { topic, stamp, .. })
                if *topic == b.name
                    && stamp.record == Channel::new(b.id, 0).at(0)
                    && stamp.claim == channel.at(10_000)
                    && stamp.sender.map(|s| s.sender) == Some(sender)
                    && stamp.reason == ImpossibleReason::BeyondHighWatermark { high_watermark: 50 }
        ),
        "names the record, the claim, the sender and the evidence: {error:?}"
    );
    assert_eq!(
        group_offset(&run.group(), &b.name, 0).unwrap_or(0),
        0,
        "g is not committed: nothing lost"
    );
}

#[test]
fn a_claim_beyond_the_high_watermark_is_delivered_and_counted_when_the_stage_says_so() {
    let (a, b, _) = claim_from_the_future();
    let run = forward(&[&a, &b], ImpossiblePolicy::DeliverAndCount);
    let (out, m) = run.until(52);
    assert!(out.contains(&"g".to_string()) && out.contains(&"h".to_string()));
    assert_eq!(out.len(), 52);
    assert_eq!(m.impossible_stamps, 1);
}

#[test]
fn a_claim_beyond_the_high_watermark_goes_to_the_dead_letter_topic_when_the_stage_says_so() {
    let (a, b, _) = claim_from_the_future();
    let dlq = create_topic("evidence-dlq", 1);
    let run = forward(
        &[&a, &b],
        ImpossiblePolicy::DeadLetter {
            topic: dlq.name.clone(),
        },
    );
    let (out, m) = run.until(52);
    assert_eq!(out.len(), 51, "everything but g reached the handler");
    assert!(!out.contains(&"g".to_string()));
    assert_eq!((m.impossible_stamps, m.dead_lettered), (1, 1));
    // The dead-lettered record names its source and why.
    let consumer = committed_consumer();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&dlq.name, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let started = Instant::now();
    let m = loop {
        assert!(
            started.elapsed() < DEADLINE,
            "nothing in the dead-letter topic"
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            break m.unwrap().detach();
        }
    };
    assert_eq!(m.payload(), Some(&b"g"[..]));
    let headers = m.headers().unwrap();
    let header = |k: &str| {
        headers
            .iter()
            .find(|h| h.key == k)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
    };
    assert_eq!(
        header(parsley_runtime::DLQ_SOURCE_HEADER).as_deref(),
        Some(format!("{}/0@0", b.name).as_str())
    );
    assert!(
        header(parsley_runtime::DLQ_REASON_HEADER)
            .unwrap()
            .contains("high watermark 50")
    );
}

#[test]
fn claims_on_a_recreated_topics_old_channel_are_ignored_and_the_new_channel_seeds_afresh() {
    let admin = admin();
    let a_old = create_topic("recreated-a", 1);
    let b = create_topic("recreated-b", 1);
    let mut p = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    p.send(&a_old.name, b"k", b"x").unwrap();
    p.flush().unwrap();
    admin.delete_topics(&[&a_old.name]).unwrap();
    let a_new = admin
        .create_topics(&[parsley_runtime::TopicSpec::new(&a_old.name, 1)])
        .unwrap()
        .remove(0);
    assert_ne!(a_new.id, a_old.id);
    // y claims x, on the old channel; z is the first record of the new incarnation.
    let mut p = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    p.observe(Channel::new(a_old.id, 0).at(0), None);
    p.send(&b.name, b"k", b"y").unwrap();
    p.flush().unwrap();
    p.send(&a_new.name, b"k", b"z").unwrap();
    p.flush().unwrap();

    let run = forward(&[&a_new, &b], ImpossiblePolicy::Fail);
    // y is delivered although nothing of the old channel ever will be; z (which claims y)
    // comes after it.
    let (out, _) = run.until(2);
    assert_eq!(out, ["y", "z"]);
    assert_eq!(group_offset(&run.group(), &a_new.name, 0), Some(1));
}

#[test]
fn crossed_in_flight_sends_of_two_transactional_producers_are_delivered_by_look_ahead() {
    // The book's specification, §4: X sends r to c' then r2 to c; Y sends z to c then h to c'. The
    // appends land crossed: c = [r2, z], c' = [h, r]. Strict per-channel FIFO would wait in a
    // cycle.
    let c = create_topic("crossed-c", 1);
    let c2 = create_topic("crossed-c2", 1);
    let (ch, ch2) = (Channel::new(c.id, 0), Channel::new(c2.id, 0));
    let x = raw_producer(Some(&unique_topic("crossed-x")));
    let y = raw_producer(Some(&unique_topic("crossed-y")));
    let mut xc = CausalClock::transactional(SenderId::random());
    let mut yc = CausalClock::transactional(SenderId::random());
    let r: Stamp = xc.stamp(ch2).unwrap();
    let r2 = xc.stamp(ch).unwrap();
    let z = yc.stamp(ch).unwrap();
    let h = yc.stamp(ch2).unwrap();
    assert_eq!(r2.in_flight.len(), 1, "r2 claims r in flight");
    assert_eq!(h.in_flight.len(), 1, "h claims z in flight");
    x.begin_transaction().unwrap();
    y.begin_transaction().unwrap();
    send_stamped(&x, &c.name, 0, b"k", b"r2", Some(&r2));
    send_stamped(&y, &c.name, 0, b"k", b"z", Some(&z));
    send_stamped(&y, &c2.name, 0, b"k", b"h", Some(&h));
    send_stamped(&x, &c2.name, 0, b"k", b"r", Some(&r));
    x.commit_transaction(DEADLINE).unwrap();
    y.commit_transaction(DEADLINE).unwrap();

    let run = forward(&[&c, &c2], ImpossiblePolicy::Fail);
    let (out, m) = run.until(4);
    let at = |v: &str| out.iter().position(|x| x == v).unwrap();
    assert_eq!(out.len(), 4, "nothing deadlocks: {out:?}");
    assert!(at("r") < at("r2"), "r before r2: {out:?}");
    assert!(at("z") < at("h"), "z before h: {out:?}");
    assert!(m.lookahead >= 1, "resolved by look-ahead: {m:?}");
}

#[test]
fn a_full_channel_an_in_flight_claim_needs_spills_and_refetches_what_it_dropped() {
    // c1 = [w, f1..f5, r], cap 3. `w` claims c0@0 = X's `r2`, which claims X's `r` in flight.
    // The stage fetches c1's first six records while X's transaction is open (c0 shows
    // nothing): c1 is full and paused. Then X appends `r` and commits: `r2` needs c1 read on,
    // so c1 spills f1..f5 (the blocked head `w` stays), reads `r`, and re-fetches the stubs.
    let c0 = create_topic("spill-c0", 1);
    let c1 = create_topic("spill-c1", 1);
    let (ch0, ch1) = (Channel::new(c0.id, 0), Channel::new(c1.id, 0));
    let x = raw_producer(Some(&unique_topic("spill-x")));
    let w = raw_producer(None);
    let mut xc = CausalClock::transactional(SenderId::random());
    let r = xc.stamp(ch1).unwrap();
    let r2 = xc.stamp(ch0).unwrap();
    assert_eq!(r2.in_flight.len(), 1, "r2 claims r in flight");
    x.begin_transaction().unwrap();
    send_stamped(&x, &c0.name, 0, b"k", b"r2", Some(&r2));
    let claims_r2 = Stamp::new(None, [ch0.at(0)].into_iter().collect());
    send_stamped(&w, &c1.name, 0, b"k", b"w", Some(&claims_r2));
    let fillers = ["f1", "f2", "f3", "f4", "f5"];
    for f in fillers {
        send_stamped(&w, &c1.name, 0, b"k", f.as_bytes(), None);
    }

    let run = forward(&[&c0, &c1], ImpossiblePolicy::Fail);
    let mut config = RuntimeConfig::new(bootstrap());
    config.max_queued_per_channel = 3;
    let running = Runtime::new(run.topology.clone(), config).start().unwrap();
    let m = wait_metrics(&running, "forward", "six fetched records", |m| {
        m.fetched >= 6
    });
    assert_eq!((m.delivered, m.spilled), (0, 0), "w waits for r2: {m:?}");

    send_stamped(&x, &c1.name, 0, b"k", b"r", Some(&r));
    x.commit_transaction(DEADLINE).unwrap();
    wait_committed(&running, "forward", 8);
    // The committed position comes to cover everything, the commit markers included: the
    // consumer passes X's marker at c1@7 on a fetch after `r`, and the stage commits that move
    // at its next interval (an offsets-only transaction when nothing was delivered since).
    let started = std::time::Instant::now();
    let ends = || {
        (
            group_offset(&run.group(), &c0.name, 0),
            group_offset(&run.group(), &c1.name, 0),
        )
    };
    while ends() != (Some(2), Some(8)) {
        assert!(
            started.elapsed() < DEADLINE,
            "committed offsets {:?}",
            ends()
        );
        if let Some(parsley_runtime::Progress::Failed { error, .. }) =
            running.next_progress(std::time::Duration::from_millis(50))
        {
            panic!("the stage failed: {error}");
        }
    }
    let m = running.stop().unwrap()[0].1;
    let out = committed_values(&run.out);
    assert_eq!(out, ["r", "r2", "w", "f1", "f2", "f3", "f4", "f5"], "{m:?}");
    assert_eq!((m.spilled, m.refetched), (5, 5), "{m:?}");
    assert!(m.lookahead >= 1, "r is pulled ahead of the stubs: {m:?}");
    assert_eq!(
        ends(),
        (Some(2), Some(8)),
        "nothing moves them back at the stop"
    );
}
