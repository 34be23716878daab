//! A stamped record passes through a stage on the real broker; the output's stamp claims the
//! consumed coordinate and what the input's stamp claimed. The outbox's waits, and sends made
//! while a transaction commits (kept, then sent in order: the test failed when they were sent
//! at once, the commit's flush finding 129 messages outstanding).

use parsley_runtime::{
    CausalProducer, CausalProducerConfig, Channel, Runtime, RuntimeConfig, partition_for,
};
use parsley_stage::ImpossiblePolicy;
use std::collections::BTreeMap;
use std::time::Duration;

use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, create_topic, forward_topology, raw_producer, read_committed,
    unique_topic, wait_committed,
};
use rdkafka::producer::{BaseRecord, Producer};

#[test]
fn the_output_stamp_claims_the_consumed_coordinate_and_the_inputs_claims() {
    let other = create_topic("stamps-other", 1);
    let input = create_topic("stamps-in", 1);
    let output = create_topic("stamps-out", 1);

    // A plain producer sends a record to `other`, then one to `input` that depends on it.
    let mut producer = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    producer.send(&other.name, b"k", b"cause").unwrap();
    let (_, input_channel) = producer.send(&input.name, b"k", b"effect").unwrap();
    let acked = producer.flush().unwrap();
    let cause = acked[0].coordinate;
    let effect = acked[1].coordinate;
    assert_eq!(cause.channel, Channel::new(other.id, 0));
    assert_eq!(effect.channel, input_channel);

    let topology = forward_topology(
        &unique_topic("stamps"),
        &[&input.name],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "forward", 1);
    let metrics = running.stop().unwrap();
    assert_eq!(metrics[0].1.committed_deliveries, 1);

    let out = read_committed(&output);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].value.as_deref(), Some(&b"effect"[..]));
    let stamp = out[0].stamp.as_ref().expect("outputs are stamped");
    assert!(stamp.sender.is_some(), "the stamp names its sender");
    assert_eq!(
        stamp.clock.get(&effect.channel),
        Some(effect.offset),
        "claims exactly the consumed coordinate"
    );
    assert!(
        stamp.clock.covers(cause),
        "carries the input's claims forward"
    );
}

/// The outbox serves delivery reports on the sending thread: a producer queue far smaller
/// than the sends must block until reports make room (never spin out its timeout), and the
/// commit's flush and the abort, which librdkafka runs on a helper thread, must end once the
/// reports are served. Every send of the committed transaction is acknowledged in order, and
/// nothing of the aborted one is visible.
#[test]
fn a_full_producer_queue_waits_for_reports_and_commit_and_abort_complete() {
    let topic = create_topic("stamps-queue-full", 1);
    let mut p = CausalProducer::new(
        CausalProducerConfig::new(bootstrap())
            .transactional(unique_topic("stamps-queue-full-tx"))
            .property("queue.buffering.max.messages", "4")
            .property("linger.ms", "20"),
    )
    .unwrap();
    p.begin().unwrap();
    for i in 0..300u32 {
        p.send(&topic.name, b"k", format!("v{i}").as_bytes())
            .unwrap();
    }
    let acked = p.commit().unwrap();
    assert_eq!(acked.len(), 300);
    let offsets: Vec<i64> = acked.iter().map(|a| a.coordinate.offset).collect();
    assert_eq!(offsets, (0..300).collect::<Vec<i64>>());
    p.begin().unwrap();
    for i in 300..350u32 {
        p.send(&topic.name, b"k", format!("v{i}").as_bytes())
            .unwrap();
    }
    p.abort().unwrap();
    let values: Vec<Vec<u8>> = read_committed(&topic)
        .into_iter()
        .map(|r| r.value.unwrap())
        .collect();
    let expected: Vec<Vec<u8>> = (0..300u32).map(|i| format!("v{i}").into_bytes()).collect();
    assert_eq!(values, expected);
}

/// Commit overlap (`StageRunner::overlap_batch`): while a transaction commits on a helper
/// thread, the stream thread goes on delivering and keeps each send, stamped, for the next
/// transaction. Committed every 5 ms, 24,000 records over two partitions pass through once
/// each, each key in input order, and on every output channel each sender's sequences rise
/// strictly in offset order: the kept sends went out in the order they were made.
#[test]
fn sends_made_while_a_transaction_commits_go_out_once_in_the_order_made() {
    const PER_PARTITION: usize = 12_000;
    let input = create_topic("overlap-in", 2);
    let output = create_topic("overlap-out", 2);
    let producer = raw_producer(None);
    // 25 keys per partition, each on the partition murmur2 gives it.
    let keys: Vec<Vec<String>> = (0..2)
        .map(|p| {
            (0..)
                .map(|i| format!("k{i}"))
                .filter(|k| partition_for(k.as_bytes(), 2) == p)
                .take(25)
                .collect()
        })
        .collect();
    for n in 0..PER_PARTITION {
        for p in 0..2 {
            let key = keys[p as usize][n % 25].clone();
            let value = format!("{key}:{n}");
            producer
                .send(
                    BaseRecord::to(&input.name)
                        .partition(p)
                        .key(&key)
                        .payload(&value),
                )
                .map_err(|(e, _)| e)
                .expect("send");
        }
        if n % 2_000 == 1_999 {
            producer.flush(DEADLINE).expect("flush");
        }
    }
    producer.flush(DEADLINE).expect("flush");

    let topology = forward_topology(
        &unique_topic("overlap"),
        &[&input.name],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    let total = 2 * PER_PARTITION as u64;
    let config = RuntimeConfig::new(bootstrap()).commit_interval(Duration::from_millis(5));
    let running = Runtime::new(topology, config).start().unwrap();
    wait_committed(&running, "forward", total);
    let m = running.stop().unwrap()[0].1;
    assert_eq!(m.committed_deliveries, total, "{m:?}");
    assert_eq!(m.committed_emissions, total, "{m:?}");
    assert!(
        m.overlapped > 0,
        "no record was taken during a commit, so this run did not test it: {m:?}"
    );

    let out = read_committed(&output);
    assert_eq!(out.len() as u64, total, "each record once");
    let mut next: BTreeMap<String, usize> = BTreeMap::new();
    let mut last_seq = BTreeMap::new();
    for r in &out {
        let value = String::from_utf8(r.value.clone().expect("a value")).expect("UTF-8");
        let (key, n) = value.split_once(':').expect("key:n");
        let n: usize = n.parse().expect("a number");
        let expected = next.entry(key.to_string()).or_insert(n % 25);
        assert_eq!(n, *expected, "{key}: input order");
        *expected += 25;
        let stamp = r.stamp.as_ref().expect("outputs are stamped");
        let sender = stamp.sender.expect("stage stamps carry a sender");
        let seq = sender.seq;
        if let Some(previous) = last_seq.insert((r.partition, sender.sender), seq) {
            assert!(
                seq > previous,
                "partition {} offset {}: sequence {seq} after {previous}",
                r.partition,
                r.offset
            );
        }
    }
}
