//! A broker outage longer than the consumer's session: librdkafka declares the assignment lost
//! (the group dropped the member) and revokes it. The stage must not commit then — its
//! generation is gone, and offsets sent without one are accepted by a group without members,
//! a zombie's commit — but abort the open transaction and hand its tasks over, as Kafka
//! Streams does in `onPartitionsLost`. Once the broker is back the stage rejoins, reads the
//! aborted records again and commits each exactly once; it does not stop.
//!
//! Alone in its test binary: it restarts the local broker, which would disturb tests running
//! beside it (cargo runs test binaries one after another). On an external cluster
//! (`$PARSLEY_BOOTSTRAP` pointing elsewhere) there is no broker of ours to restart: it says so
//! and passes.

use std::time::Duration;

use parsley_runtime::{Runtime, RuntimeConfig, TopicSpec};
use parsley_stage::ImpossiblePolicy;
use parsley_testkit::broker;
use parsley_testkit::fixtures::{
    admin, bootstrap, committed_values, forward_topology, raw_producer, send_stamped, unique_topic,
    wait_metrics,
};

#[test]
fn an_assignment_lost_in_an_outage_aborts_the_open_transaction_and_the_stage_carries_on() {
    if broker::uses_external_cluster() {
        eprintln!("skipped: no broker of ours to restart on an external cluster");
        return;
    }
    let admin = admin();
    let input = admin
        .create_topics(&[TopicSpec::new(unique_topic("lost-in"), 1)])
        .unwrap()
        .remove(0);
    let output = admin
        .create_topics(&[TopicSpec::new(unique_topic("lost-out"), 1)])
        .unwrap()
        .remove(0);
    let topology = forward_topology(
        &unique_topic("lost"),
        &[&input.name],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    // A commit interval longer than the test: the transaction holding a, b and c is still
    // open when the session runs out, so the revocation finds work it must not commit.
    let config = RuntimeConfig::new(bootstrap())
        .commit_interval(Duration::from_secs(600))
        .consumer_property("session.timeout.ms", "6000")
        .consumer_property("heartbeat.interval.ms", "1000");
    let running = Runtime::new(topology, config).start().unwrap();
    let p = raw_producer(None);
    for v in ["a", "b", "c"] {
        send_stamped(&p, &input.name, 0, b"k", v.as_bytes(), None);
    }
    wait_metrics(&running, "forward", "3 deliveries", |m| m.delivered >= 3);

    // The broker stays down until librdkafka has declared the assignment lost (its session
    // timer ran out without an answer from the coordinator).
    broker::restart_with(|| {
        wait_metrics(&running, "forward", "a lost assignment", |m| {
            m.lost_assignments >= 1
        });
    })
    .unwrap();
    let p = raw_producer(None);
    for v in ["d", "e"] {
        send_stamped(&p, &input.name, 0, b"k", v.as_bytes(), None);
    }
    // a, b and c again (their transaction was aborted), then d and e.
    let m = wait_metrics(&running, "forward", "8 deliveries", |m| m.delivered >= 8);
    let stopped = running
        .stop()
        .expect("the stage carries on after the lost assignment");
    let last = &stopped[0].1;
    assert_eq!(m.lost_assignments, 1, "{m:?}");
    assert!(m.aborts >= 1, "the open transaction was aborted: {m:?}");
    assert_eq!(
        m.transactions, 0,
        "nothing committed before the stop: {m:?}"
    );
    assert_eq!(last.committed_deliveries, 5, "{last:?}");
    assert_eq!(committed_values(&output), ["a", "b", "c", "d", "e"]);
}
