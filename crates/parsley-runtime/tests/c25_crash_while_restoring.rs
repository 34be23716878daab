//! Case C25 on the real broker: a crash while tasks are still restoring after a rebalance
//! leaves no input partition without an owner. Instance `a` counts keys over two partitions
//! and commits; instance `b` joins, the group gives it a partition, and its process aborts
//! while it restores that partition's task from the changelog (`CrashPoint::DuringRestore`:
//! changelog read, task not yet running, nothing committed by `b`). After `b` restarts,
//! records written to both partitions are all counted and the group's committed offset of
//! every partition reaches its end: none was silently left without an owner, and the counts
//! are exact.

use std::time::{Duration, Instant};

use parsley_runtime::{CrashPoint, Runtime, RuntimeConfig};
use parsley_stage::Topology;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, committed_end_offsets, committed_values, count_topology, create_topic,
    group_offset, key_on, next_failure, raw_producer, send_stamped, unique_topic, wait_committed,
};

fn counting(app: &str, input: &str, output: &str, instance: &str) -> (Topology, RuntimeConfig) {
    let topology = count_topology(app, input, output);
    // A dead member stays in the group until its session times out: a short one.
    let config = RuntimeConfig::new(bootstrap())
        .consumer_property("session.timeout.ms", "6000")
        .consumer_property("heartbeat.interval.ms", "1000")
        .instance_id(instance);
    (topology, config)
}

/// Writes `rounds` records of the first key of each partition (two partitions).
fn write(input: &str, keys: &[String; 2], rounds: usize) {
    let producer = raw_producer(None);
    for _ in 0..rounds {
        for (p, k) in keys.iter().enumerate() {
            send_stamped(&producer, input, p as i32, k.as_bytes(), b"x", None);
        }
    }
}

#[test]
fn c25_a_crash_while_restoring_after_a_rebalance_leaves_no_partition_without_an_owner() {
    use std::os::unix::process::ExitStatusExt;
    let input = create_topic("c25-in", 2);
    let output = create_topic("c25-out", 1);
    let keys = [key_on(0, 2), key_on(1, 2)];
    write(&input.name, &keys, 5);
    let app = unique_topic("c25");
    let group = format!("{app}.count");

    let (topology, config) = counting(&app, &input.name, &output.name, "c25-a");
    let a = Runtime::new(topology.clone(), config).start().unwrap();
    wait_committed(&a, "count", 10);

    // `b` joins; the rebalance gives it a partition whose changelog holds a's state; it dies
    // while restoring that task.
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "c25_child_joins_and_dies_while_restoring",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(
            "PARSLEY_C25_CHILD",
            format!("{app},{},{}", input.name, output.name),
        )
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(6), "the child aborted: {status:?}");

    // `b` restarts; more records arrive on both partitions.
    let (_, config) = counting(&app, &input.name, &output.name, "c25-b");
    let b = Runtime::new(topology, config).start().unwrap();
    write(&input.name, &keys, 3);
    let ends = committed_end_offsets(&input);
    let started = Instant::now();
    while (0..2).any(|p| group_offset(&group, &input.name, p) != Some(ends[&p])) {
        assert!(
            started.elapsed() < DEADLINE,
            "not every partition consumed to its end {ends:?}: {:?}",
            (0..2)
                .map(|p| group_offset(&group, &input.name, p))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    a.stop().unwrap();
    b.stop().unwrap();
    // Each key's counts, each exactly once: 1..=8 (5 before, 3 after).
    let values = committed_values(&output);
    for k in &keys {
        let counts: Vec<String> = values
            .iter()
            .filter(|v| v.starts_with(&format!("{k}=")))
            .cloned()
            .collect();
        let expected: Vec<String> = (1..=8).map(|n| format!("{k}={n}")).collect();
        assert_eq!(counts, expected, "{k}");
    }
}

/// The child of the test above: instance `b`, armed with [`CrashPoint::DuringRestore`], until
/// the crash point aborts the process while it restores a task.
#[test]
#[ignore = "a child process of the C25 test, started by it"]
fn c25_child_joins_and_dies_while_restoring() {
    let Ok(names) = std::env::var("PARSLEY_C25_CHILD") else {
        return;
    };
    let names: Vec<&str> = names.split(',').collect();
    let (topology, config) = counting(names[0], names[1], names[2], "c25-b");
    let config = config.crash_at(CrashPoint::DuringRestore);
    let running = Runtime::new(topology, config).start().unwrap();
    let error = next_failure(&running);
    panic!("the crash point did not abort the process; the stage failed instead: {error}");
}
