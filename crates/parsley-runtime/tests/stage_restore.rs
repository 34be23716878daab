//! Exact restore from the stage's changelog on the real broker (DESIGN.md §7): fold state, the
//! task's sender incarnation and sequence, and deliveries made ahead of partition order survive
//! a restart; a changelog that disagrees with the group's committed offsets is an error.

use parsley_clock::{CausalClock, Channel, SenderId, Stamp};
use parsley_runtime::{Admin, Runtime, RuntimeConfig, TaskPhase, changelog_topic};
use parsley_stage::{Handler, HandlerResult, ImpossiblePolicy, Record, Step, Topology, Utf8};
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, commit_group_offsets, committed_values, create_topic, forward_topology,
    next_failure, raw_producer, read_committed, run_until, send_stamped, unique_topic,
    wait_committed, wait_tasks,
};
use rdkafka::producer::Producer;

/// Counts the records of each key and emits the running count.
struct Count(String);

impl Handler for Count {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = u64;

    fn handle(
        &self,
        r: Record<'_, String, String>,
        state: Option<u64>,
    ) -> HandlerResult<String, String, u64> {
        let n = state.unwrap_or(0) + 1;
        Ok(Step::none()
            .set_state(n)
            .emit(&self.0, r.key, n.to_string()))
    }
}

fn count_topology(app: &str, input: &str, output: &str) -> Topology {
    Topology::builder(app)
        .stage("count", Count(output.to_string()), |s| {
            s.source(input)
                .sink(output)
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap()
}

#[test]
fn fold_state_sender_and_sequence_survive_a_restart() {
    let input = create_topic("restore-in", 1);
    let output = create_topic("restore-out", 1);
    let topology = count_topology(&unique_topic("restore"), &input.name, &output.name);
    let plain = raw_producer(None);
    for _ in 0..5 {
        send_stamped(&plain, &input.name, 0, b"a", b"x", None);
    }
    run_until(&topology, "count", 5);
    for _ in 0..3 {
        send_stamped(&plain, &input.name, 0, b"a", b"x", None);
    }
    let m = run_until(&topology, "count", 3);
    assert_eq!(m.committed_deliveries, 3, "only the new records: {m:?}");

    let out = read_committed(&output);
    let counts: Vec<String> = out
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect();
    assert_eq!(counts, ["1", "2", "3", "4", "5", "6", "7", "8"]);
    // One incarnation across the restart: the same sender, its sequence continued.
    let tags: Vec<_> = out
        .iter()
        .map(|r| r.stamp.as_ref().unwrap().sender.unwrap())
        .collect();
    assert!(tags.iter().all(|t| t.sender == tags[0].sender), "{tags:?}");
    let seqs: Vec<u64> = tags.iter().map(|t| t.seq).collect();
    assert_eq!(seqs, (0..8).collect::<Vec<u64>>());
}

#[test]
fn a_delivery_ahead_of_partition_order_is_not_delivered_again_after_a_restart() {
    // c = [r2, marker, z (open)], c2 = [h, r, marker]. `r2` claims X's `r` in flight, so `r`
    // is delivered ahead of `h`, which waits for c@2 = `z` of Y's open transaction. The first
    // run commits with c2's frontier below `h` and `r` in the look-ahead set; after Y commits,
    // the second run restores that set and delivers `z` and `h` — not `r` again.
    let c = create_topic("ahead-c", 1);
    let c2 = create_topic("ahead-c2", 1);
    let out = create_topic("ahead-out", 1);
    let (ch, ch2) = (Channel::new(c.id, 0), Channel::new(c2.id, 0));
    let x = raw_producer(Some(&unique_topic("ahead-x")));
    let y = raw_producer(Some(&unique_topic("ahead-y")));
    let w = raw_producer(None);
    let mut xc = CausalClock::transactional(SenderId::random());
    let r = xc.stamp(ch2).unwrap();
    let r2 = xc.stamp(ch).unwrap();
    x.begin_transaction().unwrap();
    send_stamped(&x, &c.name, 0, b"k", b"r2", Some(&r2));
    let claims_z = Stamp::new(None, [ch.at(2)].into_iter().collect());
    send_stamped(&w, &c2.name, 0, b"k", b"h", Some(&claims_z));
    send_stamped(&x, &c2.name, 0, b"k", b"r", Some(&r));
    x.commit_transaction(DEADLINE).unwrap();
    y.begin_transaction().unwrap();
    send_stamped(&y, &c.name, 0, b"k", b"z", None);

    let topology = forward_topology(
        &unique_topic("ahead"),
        &[&c.name, &c2.name],
        &out.name,
        ImpossiblePolicy::Fail,
    );
    let first = run_until(&topology, "forward", 2);
    assert!(first.lookahead >= 1, "r went ahead of h: {first:?}");
    assert_eq!(committed_values(&out), ["r", "r2"]);

    y.commit_transaction(DEADLINE).unwrap();
    let second = run_until(&topology, "forward", 2);
    assert_eq!(second.committed_deliveries, 2, "{second:?}");
    assert_eq!(committed_values(&out), ["r", "r2", "z", "h"]);
}

#[test]
fn a_changelog_that_disagrees_with_the_committed_offsets_is_an_error() {
    let input = create_topic("mismatch-in", 1);
    let output = create_topic("mismatch-out", 1);
    let app = unique_topic("mismatch");
    let topology = count_topology(&app, &input.name, &output.name);
    let plain = raw_producer(None);
    for _ in 0..4 {
        send_stamped(&plain, &input.name, 0, b"a", b"x", None);
    }
    run_until(&topology, "count", 4);
    // Something else moves the group's offset back: the changelog's snapshot was committed
    // with offset 4, so restoring it would count records 2..4 twice.
    commit_group_offsets(&format!("{app}.count"), &[(&input.name, 0, 1)]);

    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let failure = next_failure(&running);
    assert!(
        failure.contains("committed with input offsets")
            && failure.contains("@4")
            && failure.contains("@1"),
        "{failure}"
    );
    let _ = running.stop();
}

#[test]
fn task_metrics_report_restore_progress_deliveries_and_frontier_lag() {
    let input = create_topic("task-metrics-in", 2);
    let output = create_topic("task-metrics-out", 2);
    let app = unique_topic("task-metrics");
    let topology = count_topology(&app, &input.name, &output.name);
    // A plain producer writes no commit markers: a caught-up channel has a lag of exactly 0.
    let plain = raw_producer(None);
    for (partition, n) in [(0, 5), (1, 3)] {
        for _ in 0..n {
            send_stamped(&plain, &input.name, partition, b"a", b"x", None);
        }
    }
    run_until(&topology, "count", 8);
    // The changelog as the second run's restore finds it: nothing writes in between.
    let changelog = changelog_topic(&topology.stages()[0].group_id(&app));
    let admin = Admin::new(&bootstrap(), DEADLINE).unwrap();
    let ends = admin
        .high_watermarks(&[(&changelog, 0), (&changelog, 1)])
        .unwrap();
    assert!(
        ends.iter().all(|&e| e >= 2),
        "state and snapshot per task: {ends:?}"
    );
    for _ in 0..2 {
        send_stamped(&plain, &input.name, 0, b"a", b"x", None);
    }

    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "count", 2);
    let tasks = wait_tasks(
        &running,
        "count",
        "a frontier lag of 0 on both tasks",
        |ts| ts.len() == 2 && ts.iter().all(|t| t.frontier_lag == Some(0)),
    );
    running.stop().unwrap();
    for (t, end) in tasks.iter().zip(&ends) {
        assert_eq!(t.phase, TaskPhase::Running, "{t:?}");
        assert_eq!((t.restore_position, t.restore_end), (*end, *end), "{t:?}");
        assert_eq!(
            (t.impossible_stamps, t.held, t.blocked_heads),
            (0, 0, 0),
            "{t:?}"
        );
    }
    let delivered: Vec<(i32, u64)> = tasks.iter().map(|t| (t.partition, t.delivered)).collect();
    assert_eq!(
        delivered,
        [(0, 2), (1, 0)],
        "only the new records, on task 0"
    );
}
