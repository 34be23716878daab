//! Standbys (`RuntimeConfig::standby_replicas`) on the real broker: two instances of a counting
//! stage over two partitions each own one task and keep a warm copy of the other's. When one
//! instance stops, the survivor's restore of the task it takes over starts where its standby
//! had read to — not at offset 0 — and the counts go on exactly; no standby record is thrown
//! away. In memory and with a state directory; without standbys (the negative control) the
//! moved task reads its changelog from offset 0.

use std::path::PathBuf;
use std::time::Instant;

use parsley_runtime::{Running, Runtime, RuntimeConfig, StandbyMetrics, TaskPhase};
use parsley_stage::Topology;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, committed_end_offsets, count_topology, create_topic,
    keys_on_each_partition, raw_producer, read_committed, send_stamped, unique_topic, wait_tasks,
};

/// How the two instances keep their state.
#[derive(Clone, Copy)]
enum Mode {
    /// In memory, with one standby per task.
    Memory,
    /// Under a state directory each, with one standby per task.
    Disk,
    /// In memory, without standbys.
    NoStandby,
}

/// The standbys of stage `count` of `running`.
fn standbys(running: &Running) -> Vec<StandbyMetrics> {
    running
        .standby_metrics()
        .into_iter()
        .find(|(n, _)| n == "count")
        .map(|(_, s)| s)
        .unwrap_or_default()
}

/// Waits until `running` keeps one standby, of a task other than its own, and it has read its
/// changelog partition to at least `end`; returns it.
fn wait_standby(running: &Running, end: i64) -> StandbyMetrics {
    let started = Instant::now();
    loop {
        let owned: Vec<i32> = running.task_metrics()[0]
            .1
            .iter()
            .map(|t| t.partition)
            .collect();
        if let [s] = standbys(running)[..]
            && !owned.contains(&s.partition)
            && s.position >= end
        {
            return s;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no standby at {end} or beyond: {:?}, owning {owned:?}",
            standbys(running)
        );
        let _ = running.next_progress(std::time::Duration::from_millis(20));
    }
}

/// Waits until `output` holds `records` committed records.
fn wait_output(output: &parsley_runtime::TopicInfo, records: i64) {
    let started = Instant::now();
    while committed_end_offsets(output).values().sum::<i64>() < records {
        assert!(started.elapsed() < DEADLINE, "fewer than {records} outputs");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn moved_task(mode: Mode) -> (i64, i64, u64) {
    let input = create_topic("standby-in", 2);
    let output = create_topic("standby-out", 2);
    let app = unique_topic("standby");
    let topology: Topology = count_topology(&app, &input.name, &output.name);
    // Two keys on each partition.
    let keys = keys_on_each_partition(2, 2);
    let plain = raw_producer(None);
    let send = |times: usize| {
        for _ in 0..times {
            for (p, k) in &keys {
                send_stamped(&plain, &input.name, *p, k.as_bytes(), b"x", None);
            }
        }
    };
    let dirs: Vec<PathBuf> = (0..2)
        .map(|_| std::env::temp_dir().join(unique_topic("parsley-standby")))
        .collect();
    let config = |i: usize| {
        let c = RuntimeConfig::new(bootstrap()).instance_id(format!("{app}-{i}"));
        match mode {
            Mode::Memory => c.standby_replicas(1),
            Mode::Disk => c.standby_replicas(1).state_dir(&dirs[i]),
            Mode::NoStandby => c,
        }
    };

    send(25);
    let a = Runtime::new(topology.clone(), config(0)).start().unwrap();
    wait_output(&output, 100);
    let b = Runtime::new(topology.clone(), config(1)).start().unwrap();
    let one_each = |running: &Running| {
        wait_tasks(running, "count", "one task running", |ts| {
            ts.len() == 1 && ts[0].phase == TaskPhase::Running
        })[0]
            .partition
    };
    let (on_a, on_b) = (one_each(&a), one_each(&b));
    assert_ne!(on_a, on_b);
    send(25);
    wait_output(&output, 200);
    let changelog_end = {
        let admin = parsley_runtime::Admin::new(&bootstrap(), DEADLINE).unwrap();
        let name = parsley_runtime::changelog_topic(&topology.stages()[0].group_id(&app));
        admin.high_watermarks(&[(&name, on_a)]).unwrap()[0]
    };
    let warm_at = match mode {
        Mode::NoStandby => {
            assert!(standbys(&b).is_empty());
            0
        }
        _ => wait_standby(&b, changelog_end).position,
    };

    // A stops (a final commit, then it leaves the group): B takes A's task over.
    a.stop().unwrap();
    let moved = wait_tasks(&b, "count", "both tasks running", |ts| {
        ts.len() == 2 && ts.iter().all(|t| t.phase == TaskPhase::Running)
    })
    .into_iter()
    .find(|t| t.partition == on_a)
    .unwrap();
    send(1);
    wait_output(&output, 204);
    let discarded = b
        .metrics()
        .into_iter()
        .find(|(n, _)| n == "count")
        .unwrap()
        .1
        .standby_records_discarded;
    b.stop().unwrap();
    let mut last = std::collections::BTreeMap::new();
    for r in read_committed(&output) {
        let line = String::from_utf8(r.value.unwrap()).unwrap();
        let (k, n) = line.split_once('=').unwrap();
        last.insert(k.to_string(), n.to_string());
    }
    assert!(
        last.values().all(|n| n == "51"),
        "every key counted 51 times, once each: {last:?}"
    );
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    (warm_at, moved.restore_start, discarded)
}

#[test]
fn a_moved_task_restores_from_its_standby_in_memory() {
    let (warm_at, restore_start, discarded) = moved_task(Mode::Memory);
    assert!(warm_at > 0);
    assert!(
        restore_start >= warm_at,
        "the restore starts where the standby had read to ({warm_at}), not at {restore_start}"
    );
    assert_eq!(discarded, 0, "no standby record thrown away");
}

#[test]
fn a_moved_task_restores_from_its_standby_on_disk() {
    let (warm_at, restore_start, discarded) = moved_task(Mode::Disk);
    assert!(warm_at > 0);
    assert!(
        restore_start >= warm_at,
        "the restore starts at the standby's checkpoint ({warm_at}), not at {restore_start}"
    );
    assert_eq!(discarded, 0);
}

#[test]
fn without_standbys_a_moved_task_reads_its_changelog_from_the_start() {
    let (_, restore_start, _) = moved_task(Mode::NoStandby);
    assert_eq!(restore_start, 0);
}
