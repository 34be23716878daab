//! A recoverable abort returns every task to its last commit in memory, on the real broker:
//! the stage goes on with its outputs exactly once (no count lost, none twice) and no task reads
//! its changelog again (`TaskMetrics::rollbacks` counts the returns in memory,
//! `TaskMetrics::restores` the reads, `TaskMetrics::restore_records` what the last one read).
//! With fold state on disk an aborted commit returns in memory too (the store holds exactly the
//! last commit); where a task cannot return in memory — its fold state on disk and a commit it
//! did not hear of, not in the store yet — it is restored from its changelog, as before.
//!
//! Each run: a first instance counts a first half of the input and commits (the changelog then
//! holds a snapshot of every task); a second instance, with a producer fault armed
//! (`ProducerFault`, cargo feature `fault-injection`), restores from the changelog, counts the
//! second half, meets the fault at its first commit with deliveries and recovers.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use parsley_runtime::{
    ProducerFault, Runtime, RuntimeConfig, TaskMetrics, TaskPhase, TopicInfo, partition_for,
};
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, committed_values, count_topology, create_topic, raw_producer,
    send_stamped, unique_topic, wait_committed, wait_metrics, wait_tasks,
};
use rdkafka::producer::Producer;

const KEYS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];
/// Records of each half of the input.
const HALF: usize = 24;

/// What a run left: the committed counts of each key in output order, the task metrics of the
/// second instance once it recovered, and its aborts.
struct Outcome {
    counts: BTreeMap<String, Vec<u64>>,
    tasks: Vec<TaskMetrics>,
    aborts: u64,
}

fn run(fault: ProducerFault, state_dir: Option<&Path>) -> Outcome {
    let input = create_topic("rollback-in", 2);
    let output = create_topic("rollback-out", 2);
    let topology = count_topology(&unique_topic("rollback"), &input.name, &output.name);
    let config = || {
        let c = RuntimeConfig::new(bootstrap());
        match state_dir {
            Some(dir) => c.state_dir(dir),
            None => c,
        }
    };
    // Each half in one transaction: both partitions' records become visible together.
    let send = |from: usize| {
        let p = raw_producer(Some(&unique_topic("rollback-p")));
        p.begin_transaction().unwrap();
        for i in from..from + HALF {
            let key = KEYS[i % KEYS.len()];
            let partition = partition_for(key.as_bytes(), 2);
            send_stamped(&p, &input.name, partition, key.as_bytes(), b"x", None);
        }
        p.commit_transaction(DEADLINE).unwrap();
    };
    let first = Runtime::new(topology.clone(), config()).start().unwrap();
    send(0);
    wait_committed(&first, "count", HALF as u64);
    first.stop().unwrap();

    let second = Runtime::new(topology, config().inject(fault))
        .start()
        .unwrap();
    let restored = wait_tasks(&second, "count", "both tasks restored", |ts| {
        ts.len() == 2 && ts.iter().all(|t| t.phase == TaskPhase::Running)
    });
    assert!(
        restored.iter().all(|t| t.restores == 1 && t.rollbacks == 0),
        "each task read its changelog once at its assignment: {restored:?}"
    );
    if state_dir.is_none() {
        assert!(
            restored.iter().all(|t| t.restore_records > 0),
            "{restored:?}"
        );
    }
    send(HALF);
    let m = wait_metrics(&second, "count", "an abort", |m| m.aborts >= 1);
    // A commit the tasks did not hear of is not counted in the metrics: the output tells.
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed_values(&output).len() < 2 * HALF {
        assert!(
            Instant::now() < deadline,
            "the second half was not committed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let tasks = wait_tasks(
        &second,
        "count",
        "both tasks rebuilt after the abort",
        |ts| {
            ts.len() == 2
                && ts
                    .iter()
                    .all(|t| t.phase == TaskPhase::Running && t.rollbacks + t.restores == 2)
        },
    );
    second.stop().unwrap();
    Outcome {
        counts: counts(&output),
        tasks,
        aborts: m.aborts,
    }
}

/// The counts the stage committed for each key, in output order (`key=n` records).
fn counts(output: &TopicInfo) -> BTreeMap<String, Vec<u64>> {
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in committed_values(output) {
        let (k, n) = line.split_once('=').unwrap();
        counts
            .entry(k.to_string())
            .or_default()
            .push(n.parse().unwrap());
    }
    counts
}

/// Every key counted once per record, in order: nothing lost, nothing twice.
fn assert_exactly_once(o: &Outcome) {
    let per_key = (2 * HALF / KEYS.len()) as u64;
    let expected: BTreeMap<String, Vec<u64>> = KEYS
        .iter()
        .map(|k| (k.to_string(), (1..=per_key).collect()))
        .collect();
    assert_eq!(o.counts, expected);
}

/// The abort's transaction never committed (`INVALID_TXN_STATE` before its offsets): every
/// task returns to the commit of the first instance's restore in memory.
#[test]
fn after_an_aborted_commit_every_task_returns_in_memory_and_reads_no_changelog() {
    let o = run(ProducerFault::InvalidTxnStateAtCommit, None);
    assert_eq!(o.aborts, 1);
    assert_exactly_once(&o);
    for t in &o.tasks {
        assert_eq!(
            (t.rollbacks, t.restores, t.restore_records),
            (1, 1, 0),
            "returned in memory, its changelog read only at its assignment: {t:?}"
        );
    }
}

/// The abort's transaction committed, but the tasks did not hear of it: the group's offsets
/// tell them, and they return to that commit in memory.
#[test]
fn after_a_commit_the_tasks_did_not_hear_of_they_return_to_it_in_memory() {
    let o = run(ProducerFault::UnheardCommit, None);
    assert_eq!(o.aborts, 1);
    assert_exactly_once(&o);
    for t in &o.tasks {
        assert_eq!(
            (t.rollbacks, t.restores, t.restore_records),
            (1, 1, 0),
            "returned in memory, its changelog read only at its assignment: {t:?}"
        );
    }
}

/// Fold state on disk and a commit not heard of: what that commit wrote is not in the state
/// store, so a task that wrote fold state in it is restored from its changelog (from the
/// store's checkpoint), as before; each task is rebuilt once, one way or the other.
#[test]
fn with_fold_state_on_disk_a_commit_not_heard_of_falls_back_to_the_changelog() {
    let dir = std::env::temp_dir().join(unique_topic("parsley-rollback-state"));
    let o = run(ProducerFault::UnheardCommit, Some(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(o.aborts, 1);
    assert_exactly_once(&o);
    assert!(
        o.tasks
            .iter()
            .any(|t| t.restores == 2 && t.rollbacks == 0 && t.restore_records > 0),
        "a task restored from its changelog after the abort: {:?}",
        o.tasks
    );
}

/// Fold state on disk and an aborted commit: the store holds exactly the last commit, so each
/// task drops what it had not committed and returns in memory.
#[test]
fn with_fold_state_on_disk_an_aborted_commit_returns_in_memory() {
    let dir = std::env::temp_dir().join(unique_topic("parsley-rollback-state"));
    let o = run(ProducerFault::InvalidTxnStateAtCommit, Some(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(o.aborts, 1);
    assert_exactly_once(&o);
    for t in &o.tasks {
        assert_eq!(
            (t.rollbacks, t.restores),
            (1, 1),
            "returned in memory, its changelog read only at its assignment: {t:?}"
        );
    }
}
