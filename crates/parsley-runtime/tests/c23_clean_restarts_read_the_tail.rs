//! Case C23 on the real broker: a clean stop restores nothing. A counting stage keeps its fold
//! state on disk (`RuntimeConfig::state_dir`) and is stopped and started again 20 times: every
//! restart reads only the changelog's tail past its local checkpoint — at most the last commit
//! marker — never the changelog whole. Then its process is killed (`kill -9` of a child
//! process running the stage): the next start restores at most once from the start of the
//! changelog, the start after it reads the tail again, and the counts are the committed ones.
//!
//! "Records restored" is read from the task metrics: a restore reads the changelog from
//! `restore_start` up to `restore_end` (the high watermark taken when it started).

use std::time::Instant;

use parsley_runtime::{Runtime, RuntimeConfig, TaskMetrics, TaskPhase, changelog_topic};
use parsley_stage::Topology;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, count_topology, create_topic, raw_producer, read_committed, send_stamped,
    unique_topic, wait_committed, wait_tasks,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Clean restarts in a row.
const RESTARTS: usize = 20;
/// Keys of the one input partition; each round sends one record of each.
const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

fn counting(app: &str, input: &str, output: &str) -> Topology {
    count_topology(app, input, output)
}

fn config(dir: &std::path::Path) -> RuntimeConfig {
    RuntimeConfig::new(bootstrap())
        .state_dir(dir)
        .instance_id("c23")
}

/// Starts the stage on `dir`, waits until it has committed `deliveries` and its task runs,
/// stops it cleanly and returns the task's metrics (its restore among them).
fn run_once(topology: &Topology, dir: &std::path::Path, deliveries: u64) -> TaskMetrics {
    let running = Runtime::new(topology.clone(), config(dir)).start().unwrap();
    wait_committed(&running, "count", deliveries);
    let tasks = wait_tasks(&running, "count", "the task running", |ts| {
        ts.len() == 1 && ts[0].phase == TaskPhase::Running
    });
    running.stop().unwrap();
    tasks[0]
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

fn expected(count: usize) -> Vec<String> {
    KEYS.iter().map(|k| format!("{k}={count}")).collect()
}

/// Waits until group `group` has committed `offset` on `topic`/0 (read with `require_stable`),
/// asking the coordinator again after each answer.
fn wait_group_offset(group: &str, topic: &str, offset: i64) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let started = Instant::now();
    loop {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, 0);
        let committed = consumer.committed_offsets(tpl, DEADLINE).unwrap();
        let at = committed.elements()[0].offset();
        if at == Offset::Offset(offset) {
            return;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{group} committed {at:?} on {topic}/0, not {offset}"
        );
    }
}

#[test]
fn c23_clean_restarts_read_only_the_changelog_tail_and_a_crash_restores_at_most_once() {
    let input = create_topic("c23-in", 1);
    let output = create_topic("c23-out", 1);
    let app = unique_topic("c23");
    let topology = counting(&app, &input.name, &output.name);
    let group = topology.stage("count").unwrap().group_id(&app);
    let changelog = changelog_topic(&group);
    let admin = parsley_runtime::Admin::new(&bootstrap(), DEADLINE).unwrap();
    let dir = std::env::temp_dir().join(unique_topic("parsley-c23"));
    let plain = raw_producer(None);
    let send_round = || {
        for k in KEYS {
            send_stamped(&plain, &input.name, 0, k.as_bytes(), b"x", None);
        }
    };

    // The first start has nothing to restore.
    send_round();
    let first = run_once(&topology, &dir, KEYS.len() as u64);
    assert_eq!(
        (first.restore_start, first.restore_end),
        (0, 0),
        "{first:?}"
    );

    // 20 clean stops and starts: each reads at most the last commit marker.
    let mut restored = Vec::new();
    for round in 2..=RESTARTS + 1 {
        let end = admin.high_watermarks(&[(&changelog, 0)]).unwrap()[0];
        send_round();
        let t = run_once(&topology, &dir, KEYS.len() as u64);
        assert_eq!(
            t.restore_end, end,
            "round {round}: the restore reads up to the end as the start found it: {t:?}"
        );
        assert!(
            t.restore_start > 0 && t.restore_end - t.restore_start <= 1,
            "round {round}: the restore starts at the checkpoint, at most the commit marker \
             below the changelog's end {end}: {t:?}"
        );
        restored.push(t.restore_end - t.restore_start);
    }
    assert_eq!(last_counts(&output), expected(RESTARTS + 1));
    eprintln!(
        "C23: {RESTARTS} clean restarts read {restored:?} changelog offsets (changelog end {})",
        admin.high_watermarks(&[(&changelog, 0)]).unwrap()[0]
    );

    // A crash: a child process runs the stage on the same directory, counts one more round and
    // commits it, and is killed (SIGKILL: no final commit, no store cleanup).
    send_round();
    let committed = admin.high_watermarks(&[(&input.name, 0)]).unwrap()[0];
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "c23_child_counts_until_killed",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(
            "PARSLEY_C23_CHILD",
            format!("{app},{},{},{}", input.name, output.name, dir.display()),
        )
        .spawn()
        .unwrap();
    wait_group_offset(&group, &input.name, committed);
    child.kill().unwrap();
    let status = child.wait().unwrap();
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "the child was killed: {status:?}");
    }

    // After the crash: the first start restores from the store's checkpoint or, at most
    // once, from the changelog's start; the clean start after it reads the tail again.
    send_round();
    let after_crash = run_once(&topology, &dir, KEYS.len() as u64);
    send_round();
    let after_clean = run_once(&topology, &dir, KEYS.len() as u64);
    eprintln!(
        "C23: after the crash the restore read changelog offsets {}..{}, after the next clean \
         stop {}..{}",
        after_crash.restore_start,
        after_crash.restore_end,
        after_clean.restore_start,
        after_clean.restore_end
    );
    assert!(
        after_clean.restore_start > 0 && after_clean.restore_end - after_clean.restore_start <= 1,
        "a clean stop after the crash restart reads the tail: {after_clean:?}"
    );
    assert_eq!(last_counts(&output), expected(RESTARTS + 4));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child of the crash above: runs the counting stage on the parent's directory until it is
/// killed (bounded, in case the parent died first).
#[test]
#[ignore = "run by c23_clean_restarts_read_only_the_changelog_tail_and_a_crash_restores_at_most_once"]
fn c23_child_counts_until_killed() {
    let Ok(args) = std::env::var("PARSLEY_C23_CHILD") else {
        return;
    };
    let [app, input, output, dir]: [&str; 4] =
        args.split(',').collect::<Vec<_>>().try_into().unwrap();
    let topology = counting(app, input, output);
    let running = Runtime::new(topology, config(std::path::Path::new(dir)))
        .start()
        .unwrap();
    // Killed long before: the parent waits at most DEADLINE for the commit.
    let started = Instant::now();
    while started.elapsed() < DEADLINE * 2 {
        let _ = running.next_progress(DEADLINE);
    }
    let _ = running.stop();
}
