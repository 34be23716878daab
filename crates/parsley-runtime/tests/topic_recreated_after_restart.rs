//! A source topic deleted and recreated while a stage runs, after a broker restart: the old
//! topic's partitions then have leader epochs above zero and the new topic's start again at
//! zero, which a client can take for stale metadata and wait on without an error. The stage
//! must stop with a typed error naming the topic (`SourceChanged` with its old and new ids, or
//! `SourceDeleted`), not stall.
//!
//! Alone in its test binary: it restarts the local broker, which would disturb tests running
//! beside it (cargo runs test binaries one after another). On an external cluster
//! (`$PARSLEY_BOOTSTRAP` pointing elsewhere) there is no broker of ours to restart: it says so
//! and passes.

use std::time::{Duration, Instant};

use parsley_runtime::RecordError;
use parsley_runtime::{Error, Runtime, RuntimeConfig, TopicSpec};
use parsley_stage::ImpossiblePolicy;
use parsley_testkit::broker;
use parsley_testkit::fixtures::{
    DEADLINE, admin, bootstrap, committed_values, forward_topology, next_failure, raw_producer,
    send_stamped, unique_topic, wait_committed,
};

#[test]
fn a_source_recreated_after_a_broker_restart_stops_the_stage_naming_it() {
    if broker::uses_external_cluster() {
        eprintln!("skipped: no broker of ours to restart on an external cluster");
        return;
    }
    let name = unique_topic("epoch-in");
    let admin = admin();
    let old = admin
        .create_topics(&[TopicSpec::new(&name, 1)])
        .unwrap()
        .remove(0);
    let output = admin
        .create_topics(&[TopicSpec::new(unique_topic("epoch-out"), 1)])
        .unwrap()
        .remove(0);
    let p = raw_producer(None);
    send_stamped(&p, &name, 0, b"k", b"before", None);
    // The restart gives the topic's partition a leader epoch above zero.
    broker::restart().unwrap();
    send_stamped(&p, &name, 0, b"k", b"after-restart", None);

    let topology = forward_topology(
        &unique_topic("epoch"),
        &[&name],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "forward", 2);
    let recreated_at = Instant::now();
    admin.delete_topics(&[&name]).unwrap();
    let new = admin
        .create_topics(&[TopicSpec::new(&name, 1)])
        .unwrap()
        .remove(0);
    send_stamped(&p, &name, 0, b"k", b"new", None);
    let error = next_failure(&running);
    let took = recreated_at.elapsed();
    let _ = running.stop();
    eprintln!("stopped {took:?} after the recreation: {error}");
    match &*error {
        Error::Record(RecordError::SourceChanged {
            topic,
            recreated: true,
            ids,
            ..
        }) => {
            assert_eq!(*topic, name);
            assert_eq!(*ids, (old.id, new.id));
        }
        Error::Record(RecordError::SourceDeleted { topic, .. }) => assert_eq!(*topic, name),
        other => panic!("expected SourceChanged or SourceDeleted, got {other}"),
    }
    assert!(took < DEADLINE - Duration::from_secs(1), "{took:?}");
    assert_eq!(committed_values(&output), ["before", "after-restart"]);
}
