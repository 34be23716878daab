//! Fold state on disk (`RuntimeConfig::state_dir`) on the real broker: the counts continue
//! across restarts with the state served from the local store, a restart with the store reads
//! only the changelog's tail (at most the last commit marker), and a start without the store
//! (another directory) reads the changelog whole and reaches the same counts.

use parsley_runtime::{Admin, Runtime, RuntimeConfig, TaskMetrics, TaskPhase, changelog_topic};
use parsley_stage::Topology;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, count_topology, create_topic, keys_on_each_partition, raw_producer,
    read_committed, send_stamped, unique_topic, wait_committed, wait_tasks,
};

/// Runs `topology` with its state under `dir` until `deliveries` more are committed; returns
/// both tasks' metrics once they run, then stops.
fn run(topology: &Topology, dir: &std::path::Path, deliveries: u64) -> Vec<TaskMetrics> {
    let config = RuntimeConfig::new(bootstrap()).state_dir(dir);
    let running = Runtime::new(topology.clone(), config).start().unwrap();
    wait_committed(&running, "count", deliveries);
    let tasks = wait_tasks(&running, "count", "both tasks running", |ts| {
        ts.len() == 2 && ts.iter().all(|t| t.phase == TaskPhase::Running)
    });
    running.stop().unwrap();
    tasks
}

/// The last count of every key in the output, as `key=count`, sorted.
fn last_counts(topic: &parsley_runtime::TopicInfo) -> Vec<String> {
    let mut last = std::collections::BTreeMap::new();
    for r in read_committed(topic) {
        let line = String::from_utf8(r.value.unwrap()).unwrap();
        let (k, n) = line.split_once('=').unwrap();
        last.insert(k.to_string(), n.parse::<u64>().unwrap());
    }
    last.into_iter().map(|(k, n)| format!("{k}={n}")).collect()
}

#[test]
fn fold_state_on_disk_survives_restarts_and_a_restart_reads_only_the_tail() {
    let input = create_topic("disk-in", 2);
    let output = create_topic("disk-out", 2);
    let app = unique_topic("disk");
    let topology = count_topology(&app, &input.name, &output.name);
    let dir = std::env::temp_dir().join(unique_topic("parsley-state"));
    let plain = raw_producer(None);
    // Four keys on each partition, where murmur2 puts them.
    let keys = keys_on_each_partition(4, 2);
    let send = |times: usize| {
        for _ in 0..times {
            for (p, k) in &keys {
                send_stamped(&plain, &input.name, *p, k.as_bytes(), b"x", None);
            }
        }
    };
    send(5);
    let first = run(&topology, &dir, 40);
    assert!(first.iter().all(|t| t.restore_start == 0), "{first:?}");

    // The changelog as the next start finds it.
    let changelog = changelog_topic(&topology.stages()[0].group_id(&app));
    let admin = Admin::new(&bootstrap(), DEADLINE).unwrap();
    let ends = admin
        .high_watermarks(&[(&changelog, 0), (&changelog, 1)])
        .unwrap();
    send(2);
    let second = run(&topology, &dir, 16);
    for t in &second {
        let end = ends[t.partition as usize];
        assert!(
            t.restore_start > 0 && end - t.restore_start <= 1,
            "the restore starts at the checkpoint, at most the commit marker below the end \
             {end}: {t:?}"
        );
    }
    let expected: Vec<String> = keys.iter().map(|(_, k)| format!("{k}=7")).collect();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(
        last_counts(&output),
        expected_sorted,
        "counts served from disk"
    );

    // Without the store (another directory), the changelog is read whole: the same state.
    let elsewhere = std::env::temp_dir().join(unique_topic("parsley-state"));
    send(1);
    let third = run(&topology, &elsewhere, 8);
    assert!(third.iter().all(|t| t.restore_start == 0), "{third:?}");
    let expected: Vec<String> = expected_sorted
        .iter()
        .map(|l| l.replace("=7", "=8"))
        .collect();
    assert_eq!(last_counts(&output), expected);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&elsewhere);
}
