//! Exact restore from the stage's changelog on the real broker (the book's specification, §7): fold
//! state, the task's sender incarnation and sequence, and deliveries made ahead of partition order
//! survive a restart; a changelog that disagrees with the group's committed offsets is an error; a
//! task restored while the previous owner's last commit is still pending (its changelog records
//! above the last stable offset, its offsets an unstable commit) waits for it and gets exactly that
//! commit.

use parsley_clock::{CausalClock, Channel, SenderId, Stamp};
use parsley_runtime::{Admin, Error, Runtime, RuntimeConfig, TaskPhase, changelog_topic};
use parsley_runtime::{KafkaError, ProcessingError};
use parsley_stage::{Handler, HandlerResult, ImpossiblePolicy, Record, Step, Topology, Utf8};
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, commit_group_offsets, committed_end_offsets, committed_values,
    create_topic, forward_topology, group_offset, key_on, next_failure, raw_producer,
    read_committed, run_until, send_stamped, unique_topic, wait_committed, wait_tasks,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

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
            .emit(self.0.as_str(), r.key, n.to_string()))
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
    let at = |offset: i64| vec![format!("{}/0@{offset}", input.name)];
    assert!(
        matches!(
            &*failure,
            Error::Processing(ProcessingError::RestoreMismatch { stage, partition: 0, changelog, group })
                if stage == "count" && *changelog == at(4) && *group == at(1)
        ),
        "{failure:?}"
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
        let key = key_on(partition, 2);
        for _ in 0..n {
            send_stamped(&plain, &input.name, partition, key.as_bytes(), b"x", None);
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
        send_stamped(&plain, &input.name, 0, key_on(0, 2).as_bytes(), b"x", None);
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

/// A runtime configuration for instance `instance` whose blocking Kafka calls (the committed
/// offsets fetch of an assignment and the changelog restore among them) give up after
/// `timeout`.
fn instance(instance: &str, timeout: std::time::Duration) -> RuntimeConfig {
    let mut c = RuntimeConfig::new(bootstrap());
    c.instance_id = instance.to_string();
    c.timeout = timeout;
    c
}

/// `(key, value)` of every committed record of `topic`, as UTF-8, in offset order.
fn keyed(topic: &parsley_runtime::TopicInfo) -> Vec<(String, String)> {
    read_committed(topic)
        .into_iter()
        .map(|r| {
            (
                String::from_utf8(r.key.unwrap()).unwrap(),
                String::from_utf8(r.value.unwrap()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_task_restored_while_the_last_commit_is_pending_gets_exactly_that_commit() {
    // While the markers of the previous owner's last commit T_n are being written, a reader
    // sees: T_n's changelog records in the log but above the last stable offset (LSO), and
    // T_n's input offsets as a *pending* transactional offset commit, the group's stable
    // offset still being T_{n-1}'s. EndTxn returns before the markers are written, but on a
    // single broker they land within milliseconds and nothing outside the broker can hold
    // them back, so this test holds that picture open with two transactions of its own:
    // - X1, begun after T_{n-1} and before T_n, writes one record (a poisoned fold state) to
    //   the changelog partition and stays open: T_n's committed records sit above the LSO;
    // - the group's stable offset is set back to T_{n-1}'s and X2 holds T_n's offset as a
    //   pending transactional commit.
    // It then proves each wait with the failure a reader that waits must hit while the hold
    // lasts, and restores after the hold ends. How each wrong reader fails:
    // - offsets read without `require_stable` return T_{n-1}'s offset at once: phase 1 then
    //   fails in the restore (or, if the restore also stops at the LSO, restores T_{n-1}
    //   consistently and runs), not in the committed offsets fetch;
    // - a restore that stops at the LSO (or at an end read before T_n's markers) returns
    //   T_{n-1}'s snapshot, committed with offset 3, against the group's 6: phase 2 fails
    //   with a restore mismatch instead of waiting at the held offset;
    // - a restore reading uncommitted records takes the poisoned count (a=1000): phase 3
    //   emits a=1001, not 4.
    let input = create_topic("pending-in", 1);
    let output = create_topic("pending-out", 1);
    let app = unique_topic("pending");
    let group = format!("{app}.count");
    let changelog = parsley_runtime::changelog_topic(&group);
    let topology = count_topology(&app, &input.name, &output.name);
    let plain = raw_producer(None);
    let send = |keys: &[&str]| {
        for k in keys {
            send_stamped(&plain, &input.name, 0, k.as_bytes(), b"x", None);
        }
    };
    let admin = parsley_testkit::fixtures::admin();
    let changelog_hw = || admin.high_watermarks(&[(&changelog, 0)]).unwrap()[0];

    // Instance a: T_{n-1} covers a, b, a (offset 3; a=2, b=1).
    let a = Runtime::new(topology.clone(), instance("a", DEADLINE))
        .start()
        .unwrap();
    send(&["a", "b", "a"]);
    wait_committed(&a, "count", 3);
    // X1 opens a transaction on the changelog partition, between T_{n-1} and T_n.
    let x1 = raw_producer(Some(&unique_topic("pending-x1")));
    x1.begin_transaction().unwrap();
    send_stamped(&x1, &changelog, 0, b"\x00a", b"1000", None);
    let held = changelog_hw() - 1;
    // T_n: b, c, a (offset 6; a=3, b=2, c=1), committed above X1's open record.
    send(&["b", "c", "a"]);
    wait_committed(&a, "count", 6);
    let ma = a.stop().unwrap()[0].1;
    assert_eq!(ma.committed_deliveries, 6, "{ma:?}");
    assert_eq!(group_offset(&group, &input.name, 0), Some(6));
    let end = changelog_hw();
    let changelog_info = admin.describe_topics(&[&changelog]).unwrap().remove(0);
    assert_eq!(
        committed_end_offsets(&changelog_info)[&0],
        held,
        "the LSO is held below T_n's changelog records (high watermark {end})"
    );
    assert!(end > held + 1, "T_n wrote above the held offset: {end}");

    // The group's stable offset is T_{n-1}'s; X2 holds T_n's as a pending commit.
    commit_group_offsets(&group, &[(&input.name, 0, 3)]);
    let x2 = raw_producer(Some(&unique_topic("pending-x2")));
    let member: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", &group)
        .create()
        .unwrap();
    let mut pending = TopicPartitionList::new();
    pending
        .add_partition_offset(&input.name, 0, Offset::Offset(6))
        .unwrap();
    x2.begin_transaction().unwrap();
    x2.send_offsets_to_transaction(&pending, &member.group_metadata().unwrap(), DEADLINE)
        .unwrap();

    // Phase 1: instance b waits on the pending offset commit (until its 5 s deadline)
    // instead of starting from the stable offset 3.
    let wait = std::time::Duration::from_secs(5);
    let b = Runtime::new(topology.clone(), instance("b", wait))
        .start()
        .unwrap();
    let failure = next_failure(&b);
    let _ = b.stop();
    assert!(
        matches!(&*failure, Error::Kafka(KafkaError::Client { operation, .. }) if operation == "reading committed offsets"),
        "{failure:?}"
    );

    // Phase 2: T_n's offset is stable; b's restore aims at the high watermark and waits at
    // the held offset for T_n's changelog records instead of stopping at the LSO — and its
    // error says so: X1's open transaction holds the last stable offset below the end.
    x2.commit_transaction(DEADLINE).unwrap();
    assert_eq!(group_offset(&group, &input.name, 0), Some(6));
    assert_eq!(
        changelog_hw(),
        end,
        "nothing was written to the changelog since T_n"
    );
    let b = Runtime::new(topology.clone(), instance("b", wait))
        .start()
        .unwrap();
    let failure = next_failure(&b);
    let _ = b.stop();
    assert!(
        matches!(
            &*failure,
            Error::Processing(ProcessingError::RestoreBlocked { topic, partition: 0, last_stable_offset, high_watermark, timeout, .. })
                if *topic == changelog
                    && *last_stable_offset == held
                    && *high_watermark == end
                    && *timeout == wait
        ),
        "{failure:?}"
    );

    // Phase 3: X1 ends (aborted: its record is never state); b restores exactly T_n, starts
    // at offset 6 and continues T_n's counts and T_n's sender sequence.
    x1.abort_transaction(DEADLINE).unwrap();
    let b = Runtime::new(topology, instance("b", DEADLINE))
        .start()
        .unwrap();
    send(&["a", "c", "d"]);
    wait_committed(&b, "count", 3);
    let mb = b.stop().unwrap()[0].1;
    assert_eq!(mb.committed_deliveries, 3, "b started at offset 6: {mb:?}");
    assert_eq!(group_offset(&group, &input.name, 0), Some(9));
    let pairs = |s: &[(&str, &str)]| -> Vec<(String, String)> {
        s.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        keyed(&output),
        pairs(&[
            ("a", "1"),
            ("b", "1"),
            ("a", "2"),
            ("b", "2"),
            ("c", "1"),
            ("a", "3"),
            // b's first outputs continue T_n's state (a=3, c=1). From T_{n-1}'s state and
            // offset b would first count b, c, a again (b=2, c=1, a=3 twice); from the poison,
            // a=1001.
            ("a", "4"),
            ("c", "2"),
            ("d", "1"),
        ])
    );
    let tags: Vec<_> = read_committed(&output)
        .iter()
        .map(|r| r.stamp.as_ref().unwrap().sender.unwrap())
        .collect();
    assert!(tags.iter().all(|t| t.sender == tags[0].sender), "{tags:?}");
    assert_eq!(
        tags.iter().map(|t| t.seq).collect::<Vec<_>>(),
        (0..9).collect::<Vec<u64>>(),
        "b continues T_n's send sequence"
    );
}

#[test]
fn a_changelog_the_cleaner_compacted_restores_the_same_state() {
    // Segments that roll at every commit and a cleaner that takes any dirty segment: the
    // changelog of twenty commits of one key is compacted while the stage is stopped, and the
    // restart counts on from 20.
    let input = create_topic("compacted-in", 1);
    let output = create_topic("compacted-out", 1);
    let app = unique_topic("compacted");
    let topology = count_topology(&app, &input.name, &output.name);
    let config = || {
        RuntimeConfig::new(bootstrap())
            .changelog_property("segment.ms", "100")
            .changelog_property("min.cleanable.dirty.ratio", "0.01")
    };
    let plain = raw_producer(None);
    let running = Runtime::new(topology.clone(), config()).start().unwrap();
    for n in 1..=20 {
        send_stamped(&plain, &input.name, 0, b"a", b"x", None);
        // One record per transaction: every commit writes the key's count again.
        wait_committed(&running, "count", n);
    }
    running.stop().unwrap();

    let changelog = changelog_topic(&topology.stages()[0].group_id(&app));
    let admin = Admin::new(&bootstrap(), DEADLINE).unwrap();
    let configs = admin.topic_config(&changelog).unwrap();
    let config_of = |key: &str| {
        configs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    // The user's settings over the runtime's defaults, the defaults where the user is silent.
    assert_eq!(config_of("segment.ms"), Some("100"), "{configs:?}");
    assert_eq!(config_of("min.cleanable.dirty.ratio"), Some("0.01"));
    assert_eq!(config_of("segment.bytes"), Some("67108864"));
    assert_eq!(config_of("cleanup.policy"), Some("compact"));

    let info = admin.describe_topics(&[&changelog]).unwrap().remove(0);
    let written = read_committed(&info).len();
    assert!(written >= 20, "a record of key a per commit: {written}");
    let started = std::time::Instant::now();
    let compacted = loop {
        let now = read_committed(&info).len();
        if now < written {
            break now;
        }
        // The cleaner looks for dirty logs every 15 s (the broker's `log.cleaner.backoff.ms`).
        assert!(
            started.elapsed() < 2 * DEADLINE,
            "the cleaner left the changelog's {written} records whole"
        );
        // Only reading the log again shows the cleaner's work.
        std::thread::sleep(std::time::Duration::from_millis(500));
    };

    send_stamped(&plain, &input.name, 0, b"a", b"x", None);
    let running = Runtime::new(topology, config()).start().unwrap();
    wait_committed(&running, "count", 1);
    running.stop().unwrap();
    let counts = committed_values(&output);
    assert_eq!(
        counts.last().map(String::as_str),
        Some("21"),
        "restored from {compacted} of {written} changelog records: {counts:?}"
    );
}
