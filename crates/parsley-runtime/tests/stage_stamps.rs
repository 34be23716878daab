//! A stamped record passes through a stage on the real broker; the output's stamp claims the
//! consumed coordinate and what the input's stamp claimed.

use parsley_clock::Channel;
use parsley_runtime::{CausalProducer, CausalProducerConfig, Runtime, RuntimeConfig};
use parsley_stage::ImpossiblePolicy;
use parsley_testkit::fixtures::{
    bootstrap, create_topic, forward_topology, read_committed, unique_topic, wait_committed,
};

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
