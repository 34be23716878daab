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
