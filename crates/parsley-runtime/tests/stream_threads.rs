//! Several stream threads per stage (`RuntimeConfig::stream_threads`) on the real broker.
//!
//! - Two threads of one process over a 4-partition input: each is a member of the stage's
//!   group, both own tasks, every key's count comes out exactly once per record, and the
//!   stage's counters are the sum of the threads'.
//! - With state on disk, the two threads share one store: a restart with two threads (the group
//!   spreads the tasks anew, so tasks may move between threads), then one with one thread,
//!   restore every task from its local checkpoint — at most the last commit marker read from
//!   the changelog — and the counts go on.
//!
//! Every wait is on evidence: committed deliveries, the tasks each thread runs, the changelog's
//! end offsets.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parsley_runtime::{
    Admin, Progress, Running, Runtime, RuntimeConfig, TaskMetrics, TaskPhase, changelog_topic,
};
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, count_topology, create_topic, keys_on_each_partition, raw_producer,
    read_committed, send_stamped, unique_topic, wait_committed,
};

const PARTITIONS: i32 = 4;

/// Three keys on each partition, where murmur2 puts them.
fn keys() -> Vec<(i32, String)> {
    keys_on_each_partition(3, PARTITIONS)
}

/// Sends every key `times` times.
fn send(input: &str, keys: &[(i32, String)], times: usize) {
    let plain = raw_producer(None);
    for _ in 0..times {
        for (p, k) in keys {
            send_stamped(&plain, input, *p, k.as_bytes(), b"x", None);
        }
    }
}

/// Every `key=n` line of the output, by key, in offset order per partition.
fn counts(topic: &parsley_runtime::TopicInfo) -> BTreeMap<String, Vec<u64>> {
    let mut by_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in read_committed(topic) {
        let line = String::from_utf8(r.value.unwrap()).unwrap();
        let (k, n) = line.split_once('=').unwrap();
        by_key
            .entry(k.to_string())
            .or_default()
            .push(n.parse().unwrap());
    }
    by_key
}

/// Every task of `count` running, `tasks` of them.
fn all_running(tasks: &[TaskMetrics]) -> bool {
    tasks.len() == PARTITIONS as usize && tasks.iter().all(|t| t.phase == TaskPhase::Running)
}

/// Waits until every task of `count` runs and each of its `threads` threads owns at least one
/// (the group may first give every task to the thread that joined first); returns the tasks and
/// each thread's partitions.
fn wait_spread(running: &Running, threads: usize) -> (Vec<TaskMetrics>, Vec<Vec<i32>>) {
    let started = Instant::now();
    loop {
        let tasks = running.task_metrics().remove(0).1;
        let spread = running.thread_tasks().remove(0).1;
        if all_running(&tasks) && spread.len() == threads && spread.iter().all(|t| !t.is_empty()) {
            return (tasks, spread);
        }
        let left = DEADLINE.saturating_sub(started.elapsed());
        assert!(
            !left.is_zero(),
            "the tasks were not spread over {threads} threads within {DEADLINE:?}: {spread:?}, {tasks:?}"
        );
        if let Some(Progress::Failed { stage, error }) =
            running.next_progress(left.min(Duration::from_millis(20)))
        {
            panic!("stage {stage} failed: {error}")
        }
    }
}

#[test]
fn two_threads_share_the_tasks_and_count_every_record_once() {
    let input = create_topic("threads-in", PARTITIONS);
    let output = create_topic("threads-out", PARTITIONS);
    let app = unique_topic("threads");
    let keys = keys();
    send(&input.name, &keys, 3);
    let sent = 5 * keys.len() as u64;

    let config = RuntimeConfig::new(bootstrap()).stream_threads(2);
    let running = Runtime::new(count_topology(&app, &input.name, &output.name), config)
        .start()
        .unwrap();
    // Both threads own tasks, each task on one thread; then records for every task.
    let (_, threads) = wait_spread(&running, 2);
    send(&input.name, &keys, 2);
    wait_committed(&running, "count", sent);
    let mut all: Vec<i32> = threads.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..PARTITIONS).collect::<Vec<_>>(), "{threads:?}");

    // The stage's counters are the threads' summed, and count each record once.
    let (_, per_thread) = running
        .thread_metrics()
        .into_iter()
        .find(|(n, _)| n == "count")
        .unwrap();
    let (_, total) = running
        .metrics()
        .into_iter()
        .find(|(n, _)| n == "count")
        .unwrap();
    assert_eq!(per_thread.len(), 2);
    assert!(
        per_thread.iter().all(|m| m.committed_deliveries > 0),
        "{per_thread:?}"
    );
    let delivered: u64 = per_thread.iter().map(|m| m.delivered).sum();
    let committed: u64 = per_thread.iter().map(|m| m.committed_deliveries).sum();
    let transactions: u64 = per_thread.iter().map(|m| m.transactions).sum();
    assert_eq!(total.delivered, delivered);
    assert_eq!(total.committed_deliveries, committed);
    assert_eq!(total.transactions, transactions);
    assert_eq!(
        total.committed_deliveries, sent,
        "every record committed once: {total:?}"
    );

    let stopped = running.stop().unwrap();
    assert_eq!(stopped[0].1.committed_deliveries, sent);

    // Each key counted 1..=5 in order, exactly once each.
    let by_key = counts(&output);
    assert_eq!(by_key.len(), keys.len(), "{by_key:?}");
    for (k, ns) in &by_key {
        assert_eq!(ns, &[1, 2, 3, 4, 5], "key {k}");
    }
}

#[test]
fn threads_share_one_state_store_and_a_restart_reads_only_the_tail() {
    let input = create_topic("threads-disk-in", PARTITIONS);
    let output = create_topic("threads-disk-out", PARTITIONS);
    let app = unique_topic("threads-disk");
    let topology = count_topology(&app, &input.name, &output.name);
    let dir = std::env::temp_dir().join(unique_topic("parsley-threads-state"));
    let keys = keys();
    let changelog = changelog_topic(&topology.stages()[0].group_id(&app));
    let admin = Admin::new(&bootstrap(), DEADLINE).unwrap();
    let changelog_ends = || {
        let partitions: Vec<(&str, i32)> =
            (0..PARTITIONS).map(|p| (changelog.as_str(), p)).collect();
        admin.high_watermarks(&partitions).unwrap()
    };
    // Runs with `threads` threads until `deliveries` more are committed; the tasks once all
    // run, and how they were spread over the threads.
    let run = |threads: usize, deliveries: u64| {
        let config = RuntimeConfig::new(bootstrap())
            .state_dir(&dir)
            .stream_threads(threads);
        let running = Runtime::new(topology.clone(), config).start().unwrap();
        wait_committed(&running, "count", deliveries);
        let (tasks, spread) = wait_spread(&running, threads);
        running.stop().unwrap();
        (tasks, spread)
    };

    send(&input.name, &keys, 3);
    let (first, spread) = run(2, 3 * keys.len() as u64);
    // From 0 at a task's first assignment; from its checkpoint when the group gave every task
    // to the thread that joined first and then moved some to the other thread.
    assert!(
        first
            .iter()
            .all(|t| t.restore_start == 0 || t.restore_end - t.restore_start <= 1),
        "{first:?}"
    );
    assert!(spread.iter().all(|t| !t.is_empty()), "{spread:?}");

    // Two threads again: whichever thread each task lands on, it finds its keyspace.
    let ends = changelog_ends();
    send(&input.name, &keys, 2);
    let (second, spread) = run(2, 2 * keys.len() as u64);
    assert!(spread.iter().all(|t| !t.is_empty()), "{spread:?}");
    for t in &second {
        let end = ends[t.partition as usize];
        assert!(
            t.restore_start > 0 && end - t.restore_start <= 1,
            "the restore starts at the checkpoint, at most the commit marker below the end \
             {end}: {t:?}"
        );
    }

    // One thread on the store two threads wrote: the same.
    let ends = changelog_ends();
    send(&input.name, &keys, 1);
    let (third, _) = run(1, keys.len() as u64);
    for t in &third {
        let end = ends[t.partition as usize];
        assert!(
            t.restore_start > 0 && end - t.restore_start <= 1,
            "one thread restores from the checkpoint too ({end}): {t:?}"
        );
    }
    let by_key = counts(&output);
    assert_eq!(by_key.len(), keys.len());
    for (k, ns) in &by_key {
        assert_eq!(
            ns,
            &[1, 2, 3, 4, 5, 6],
            "key {k}: the counts go on from disk"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
