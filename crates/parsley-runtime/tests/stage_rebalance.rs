//! Rebalancing on the real broker: two instances of one application in one group. A revoked
//! task commits what it delivered before it is handed over; tasks move with their state; every
//! input reaches the output exactly once.

use std::time::Duration;

use parsley_runtime::{Runtime, RuntimeConfig};
use parsley_stage::ImpossiblePolicy;
use parsley_testkit::fixtures::{
    bootstrap, create_topic, forward_topology, raw_producer, read_committed, send_stamped,
    unique_topic, wait_metrics,
};

fn config(instance: &str, commit_interval: Duration) -> RuntimeConfig {
    let mut c = RuntimeConfig::new(bootstrap()).commit_interval(commit_interval);
    c.instance_id = instance.to_string();
    c
}

#[test]
fn a_revoked_task_commits_what_it_delivered_before_the_handover() {
    let input = create_topic("rebalance-in", 2);
    let output = create_topic("rebalance-out", 2);
    let p = raw_producer(None);
    let send = |range: std::ops::Range<u32>| {
        for i in range {
            let v = format!("v{i:03}");
            send_stamped(
                &p,
                &input.name,
                (i % 2) as i32,
                v.as_bytes(),
                v.as_bytes(),
                None,
            );
        }
    };
    send(0..200);
    let topology = forward_topology(
        &unique_topic("rebalance"),
        &[&input.name],
        &output.name,
        ImpossiblePolicy::Fail,
    );

    // Instance a delivers everything but, with a ten-minute commit interval, commits nothing.
    let a = Runtime::new(topology.clone(), config("a", Duration::from_secs(600)))
        .start()
        .unwrap();
    let m = wait_metrics(&a, "forward", "200 deliveries", |m| m.delivered >= 200);
    assert_eq!(m.committed_deliveries, 0, "{m:?}");

    // Instance b joins: the group rebalances and a's tasks are revoked — a commits first.
    let b = Runtime::new(topology, config("b", Duration::from_millis(100)))
        .start()
        .unwrap();
    let m = wait_metrics(&a, "forward", "200 committed deliveries", |m| {
        m.committed_deliveries >= 200
    });
    assert_eq!(m.aborts, 0, "nothing delivered was thrown away: {m:?}");

    // Both instances work on (a still commits only when it stops): every input reaches the
    // output exactly once.
    send(200..300);
    let delivered_by_a = |r: &parsley_runtime::Running| {
        r.metrics()
            .into_iter()
            .find(|(n, _)| n == "forward")
            .map_or(0, |(_, m)| m.delivered)
    };
    wait_metrics(&b, "forward", "the rest", |mb| {
        mb.committed_deliveries + delivered_by_a(&a) >= 300
    });
    let ma = a.stop().unwrap()[0].1;
    let mb = b.stop().unwrap()[0].1;
    assert_eq!(
        ma.committed_deliveries + mb.committed_deliveries,
        300,
        "{ma:?} {mb:?}"
    );
    let mut out: Vec<String> = read_committed(&output)
        .into_iter()
        .map(|r| String::from_utf8(r.value.unwrap()).unwrap())
        .collect();
    out.sort();
    let expected: Vec<String> = (0..300).map(|i| format!("v{i:03}")).collect();
    assert_eq!(out, expected);
}
