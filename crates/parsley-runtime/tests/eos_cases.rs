//! Exactly-once cases on the real broker: C06 (an offsets-only
//! transaction), C07 (a member joining while a transactional offset commit is pending waits
//! for it), C08 (a timed-out transaction is aborted and redone exactly once, no crash
//! loop), C09 (a zombie is fenced at its offset commit; nothing of it becomes visible; a
//! fenced stage gives up without taking its transactional id back), C10 (a transaction that
//! dies between the state write and the commit — here the handler fails with the transaction
//! open; the `kill -9` variant belongs to the fault injection suite), C11 (a recreated topic does
//! not inherit its old offsets) and C12 (retention below the committed offset, or overtaking a
//! running stage, is an error naming the lost range).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parsley_runtime::{CrashPoint, Error, Runtime, RuntimeConfig, TopicInfo, changelog_topic};
use parsley_runtime::{KafkaError, ProcessingError, RecordError};
use parsley_stage::{Handler, HandlerResult, ImpossiblePolicy, Record, Step, Topology, Utf8};
use parsley_testkit::fixtures::{
    CountKeys, DEADLINE, admin, bootstrap, committed_values, count_topology, create_topic,
    forward_topology, group_offset, next_failure, raw_producer, run_until, send_stamped,
    unique_topic, wait_committed,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::Producer;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

fn send_values(topic: &TopicInfo, values: impl IntoIterator<Item = String>) {
    let p = raw_producer(None);
    for v in values {
        send_stamped(&p, &topic.name, 0, b"k", v.as_bytes(), None);
    }
}

/// Starts `topology` and returns the error its stage fails with.
fn failure(topology: &Topology) -> Arc<Error> {
    let running = Runtime::new(topology.clone(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let error = next_failure(&running);
    let _ = running.stop();
    error
}

/// Consumes everything and emits nothing.
struct Sink;

impl Handler for Sink {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        _: Record<'_, String, String>,
        _: Option<()>,
    ) -> HandlerResult<String, String, ()> {
        Ok(Step::none())
    }
}

#[test]
fn c06_an_offsets_only_transaction_commits_the_offset() {
    let input = create_topic("c06-in", 1);
    send_values(&input, (0..5).map(|i| i.to_string()));

    // The raw client: begin, send offsets {in-0: 5}, produce nothing, commit.
    let group = unique_topic("c06-raw");
    let p = raw_producer(Some(&unique_topic("c06-p")));
    let member: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", &group)
        .create()
        .unwrap();
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset(&input.name, 0, Offset::Offset(5))
        .unwrap();
    p.begin_transaction().unwrap();
    p.send_offsets_to_transaction(&offsets, &member.group_metadata().unwrap(), DEADLINE)
        .unwrap();
    p.commit_transaction(DEADLINE).unwrap();
    assert_eq!(group_offset(&group, &input.name, 0), Some(5));

    // A stage whose handler emits nothing commits its input offsets all the same.
    let app = unique_topic("c06");
    let topology = Topology::builder(&app)
        .stage("sink", Sink, |s| {
            s.source(&input.name)
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap();
    let m = run_until(&topology, "sink", 5);
    assert_eq!((m.committed_deliveries, m.committed_emissions), (5, 0));
    assert_eq!(
        group_offset(&format!("{app}.sink"), &input.name, 0),
        Some(5)
    );
}

/// Counts records per key and emits `key=count`; fails once on the first record whose value
/// is `boom` (the stage dies with its transaction open).
#[test]
fn c10_a_transaction_that_dies_before_its_commit_leaves_state_and_outputs_as_committed() {
    let input = create_topic("c10-in", 1);
    let output = create_topic("c10-out", 1);
    let p = raw_producer(None);
    for k in ["k1", "k2", "k3"] {
        send_stamped(&p, &input.name, 0, k.as_bytes(), b"x", None);
    }
    let app = unique_topic("c10");
    let build = |died: bool| {
        Topology::builder(&app)
            .stage(
                "count",
                if died {
                    CountKeys::new(&output.name)
                } else {
                    CountKeys::failing_once_on(&output.name, "boom")
                },
                |s| {
                    s.source(&input.name)
                        .sink(&output.name)
                        .key_codec(Utf8)
                        .value_codec(Utf8)
                        .output_codec(Utf8)
                },
            )
            .build()
            .unwrap()
    };
    // T1: k1..k3, committed.
    run_until(&build(true), "count", 3);
    // T2: k4 (a new key) then `boom`, in one transaction that dies before its commit.
    send_stamped(&p, &input.name, 0, b"k4", b"x", None);
    send_stamped(&p, &input.name, 0, b"k1", b"boom", None);
    let error = failure(&build(false));
    assert!(
        matches!(
            &*error,
            Error::Processing(ProcessingError::Stage(parsley_stage::Error::Handler { source, .. }))
                if source.to_string() == "dying before the commit"
        ),
        "{error:?}"
    );
    assert_eq!(
        committed_values(&output),
        ["k1=1", "k2=1", "k3=1"],
        "nothing of T2 is visible"
    );
    // After the restart the state is k1..k3 as committed; k4 is processed exactly once.
    run_until(&build(true), "count", 2);
    assert_eq!(
        committed_values(&output),
        ["k1=1", "k2=1", "k3=1", "k4=1", "k1=2"]
    );
}

#[test]
fn c11_a_recreated_topic_does_not_inherit_its_old_offsets() {
    let name = unique_topic("c11-t");
    let admin = admin();
    let t = admin
        .create_topics(&[parsley_runtime::TopicSpec::new(&name, 1)])
        .unwrap()
        .remove(0);
    let output = create_topic("c11-out", 1);
    send_values(&t, (0..100).map(|i| format!("old{i}")));
    let topology = forward_topology(
        &unique_topic("c11"),
        &[&name],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    run_until(&topology, "forward", 100);

    admin.delete_topics(&[&name]).unwrap();
    let t2 = admin
        .create_topics(&[parsley_runtime::TopicSpec::new(&name, 1)])
        .unwrap()
        .remove(0);
    assert_ne!(t2.id, t.id, "a recreated topic gets a new id");
    send_values(&t2, (0..10).map(|i| format!("new{i}")));
    let m = run_until(&topology, "forward", 10);
    assert_eq!(m.committed_deliveries, 10, "{m:?}");
    let out = committed_values(&output);
    assert_eq!(out.len(), 110);
    assert_eq!(
        out[100..],
        (0..10).map(|i| format!("new{i}")).collect::<Vec<_>>()[..]
    );
}

#[test]
fn c12_retention_below_the_committed_offset_is_an_error_naming_the_lost_range() {
    let input = create_topic("c12-in", 1);
    let output = create_topic("c12-out", 1);
    send_values(&input, (0..5).map(|i| i.to_string()));
    let topology = forward_topology(
        &unique_topic("c12"),
        &[&input.name],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    run_until(&topology, "forward", 5);
    send_values(&input, (5..105).map(|i| i.to_string()));
    assert_eq!(admin().delete_records(&input.name, 0, 50).unwrap(), 50);

    let error = failure(&topology);
    assert!(
        matches!(
            &*error,
            Error::Record(RecordError::RecordsLost { topic, partition: 0, from: 5, log_start: 50 })
                if *topic == input.name
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("[5, 50)"), "{error}");
    // Nothing was delivered past the gap.
    assert_eq!(committed_values(&output).len(), 5);
}

/// C12 while the stage runs: retention overtakes a task that has not fetched its records
/// yet. The consumer is kept from fetching ahead (one queued record at most, about 1 KB per
/// fetch) while the handler holds the first record; 200 records are written and then deleted.
/// The stage stops with `RecordsLost` naming the channel and the range from the offset after
/// the last record it delivered up to the new log start — never a jump.
#[test]
fn c12_retention_overtaking_a_running_stage_is_an_error_naming_the_lost_range() {
    let input = create_topic("c12r-in", 1);
    let output = create_topic("c12r-out", 1);
    send_values(&input, ["0", "1"].map(String::from));
    let (handler, held, release, seen) = HoldFirst::new(&output.name);
    let topology = Topology::builder(unique_topic("c12r"))
        .stage("forward", handler, |s| {
            s.source(&input.name)
                .sink(&output.name)
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap();
    let config = RuntimeConfig::new(bootstrap())
        .consumer_property("queued.min.messages", "1")
        .consumer_property("max.partition.fetch.bytes", "1000");
    let running = Runtime::new(topology, config).start().unwrap();
    held.recv_timeout(DEADLINE)
        .expect("the stage delivers the first record");
    send_values(&input, (2..202).map(|i| format!("x{i}")));
    assert_eq!(admin().delete_records(&input.name, 0, 202).unwrap(), 202);
    release.send(()).unwrap();

    let error = next_failure(&running);
    let _ = running.stop();
    let seen = seen.lock().unwrap().clone();
    let from = seen.last().unwrap() + 1;
    assert_eq!(
        seen,
        (0..from).collect::<Vec<_>>(),
        "delivered in order up to the gap"
    );
    assert!(
        (2..202).contains(&from),
        "the consumer had not fetched the deleted records: {from}"
    );
    assert!(
        matches!(
            &*error,
            Error::Record(RecordError::RecordsLost { topic, partition: 0, from: f, log_start: 202 })
                if *topic == input.name && *f == from
        ),
        "{error:?}"
    );
}

/// Forwards every record; sleeps past the producer's transaction timeout once, on the first
/// record whose value is `stall` (the injected fault of case C08).
struct StallOnce {
    out: String,
    stalled: AtomicBool,
    stall: std::time::Duration,
}

impl Handler for StallOnce {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> HandlerResult<String, String, ()> {
        if r.value == "stall" && !self.stalled.swap(true, Ordering::SeqCst) {
            std::thread::sleep(self.stall);
        }
        Ok(Step::none().emit(self.out.as_str(), r.key, r.value))
    }
}

#[test]
fn c08_a_timed_out_transaction_is_aborted_and_redone_exactly_once() {
    let input = create_topic("c08-in", 1);
    let output = create_topic("c08-out", 1);
    send_values(&input, ["a", "stall", "b"].map(String::from));
    let topology = Topology::builder(unique_topic("c08"))
        .stage(
            "forward",
            StallOnce {
                out: output.name.clone(),
                stalled: AtomicBool::new(false),
                // The fault: longer than the 5 s transaction timeout plus the broker's 1 s
                // abort sweep (the test broker's setting).
                stall: std::time::Duration::from_secs(7),
            },
            |s| {
                s.source(&input.name)
                    .sink(&output.name)
                    .key_codec(Utf8)
                    .value_codec(Utf8)
                    .output_codec(Utf8)
            },
        )
        .build()
        .unwrap();
    let config =
        RuntimeConfig::new(bootstrap()).producer_property("transaction.timeout.ms", "5000");
    let running = Runtime::new(topology, config).start().unwrap();
    let m = wait_committed(&running, "forward", 3);
    let m = running.stop().map(|v| v[0].1).unwrap_or(m);
    assert!(
        m.aborts >= 1,
        "the timed-out transaction was aborted: {m:?}"
    );
    assert_eq!(committed_values(&output), ["a", "stall", "b"], "{m:?}");
}

#[test]
fn c09_a_zombie_is_fenced_at_its_offset_commit_and_nothing_of_it_becomes_visible() {
    let input = create_topic("c09-in", 1);
    let output = create_topic("c09-out", 1);
    send_values(&input, (0..5).map(|i| i.to_string()));
    let id = unique_topic("app-stage-0");
    let group = unique_topic("c09-group");
    let member: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", &group)
        .create()
        .unwrap();
    let p1 = raw_producer(Some(&id));
    p1.begin_transaction().unwrap();
    send_stamped(&p1, &output.name, 0, b"k", b"zombie", None);
    // P2 takes the transactional id: P1 is now a zombie.
    let _p2 = raw_producer(Some(&id));
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset(&input.name, 0, Offset::Offset(5))
        .unwrap();
    let err = p1
        .send_offsets_to_transaction(&offsets, &member.group_metadata().unwrap(), DEADLINE)
        .and_then(|()| p1.commit_transaction(DEADLINE))
        .expect_err("a zombie cannot commit");
    let fatal = match &err {
        rdkafka::error::KafkaError::Transaction(t) => t.is_fatal(),
        _ => false,
    };
    assert!(fatal, "fenced is fatal for the zombie: {err}");
    assert!(
        committed_values(&output).is_empty(),
        "nothing of the zombie is visible"
    );
    assert_eq!(
        group_offset(&group, &input.name, 0),
        None,
        "offsets unchanged"
    );
}

/// The counting stage of the `kill` variant of C10 (`CountKeys` that never fails), reading
/// `input` and writing `output`, run as instance `c10-kill`: a restart with that instance id
/// aborts whatever transaction a dead process left open when it initialises.
fn c10_counting(app: &str, input: &str, output: &str) -> (Topology, RuntimeConfig) {
    let topology = count_topology(app, input, output);
    // The dead process stays a group member until its session times out: a short one lets
    // the restart join within seconds.
    let mut config = RuntimeConfig::new(bootstrap())
        .consumer_property("session.timeout.ms", "6000")
        .consumer_property("heartbeat.interval.ms", "1000");
    config.instance_id = "c10-kill".to_string();
    (topology, config)
}

/// The child process of
/// `c10_a_process_killed_between_its_changelog_write_and_its_commit_restores_the_committed_state`:
/// runs the counting stage armed with [`CrashPoint::AfterChangelog`] until the crash point
/// aborts the process. Does nothing unless that test starts it.
#[test]
#[ignore = "a child process of the C10 kill test, started by it"]
fn c10_child_counts_until_the_fault_aborts_the_process() {
    let Ok(names) = std::env::var("PARSLEY_C10_CHILD") else {
        return;
    };
    let names: Vec<&str> = names.split(',').collect();
    let (topology, config) = c10_counting(names[0], names[1], names[2]);
    let config = config.crash_at(CrashPoint::AfterChangelog);
    let running = Runtime::new(topology, config).start().unwrap();
    let error = next_failure(&running);
    panic!("the crash point did not abort the process; the stage failed instead: {error}");
}

/// The keys of every record in partition 0 of `topic` up to its high watermark, read
/// `read_uncommitted`: what open and aborted transactions appended too.
fn uncommitted_keys(topic: &str) -> Vec<Vec<u8>> {
    let end = admin().high_watermarks(&[(topic, 0)]).unwrap()[0];
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique_topic("uncommitted-reader"))
        .set("isolation.level", "read_uncommitted")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let started = std::time::Instant::now();
    let mut keys = Vec::new();
    let mut next = 0;
    while next < end {
        assert!(
            started.elapsed() < DEADLINE,
            "{topic} read up to {next} of {end}"
        );
        if let Some(m) = consumer.poll(std::time::Duration::from_millis(100)) {
            let m = m.unwrap();
            keys.push(m.key().unwrap_or_default().to_vec());
            next = m.offset() + 1;
        }
    }
    keys
}

/// C10 with a real crash: T1 counts k1..k3 and commits; T2 counts k4 (a new key), its state
/// record reaches the changelog, and the process dies before the offsets and the commit
/// ([`CrashPoint::AfterChangelog`]: `abort()`, no cleanup, as `kill -9`). After the
/// restart the state is k1..k3 as committed, and k4 is counted exactly once.
#[test]
fn c10_a_process_killed_between_its_changelog_write_and_its_commit_restores_the_committed_state() {
    use std::os::unix::process::ExitStatusExt;
    let input = create_topic("c10k-in", 1);
    let output = create_topic("c10k-out", 1);
    let p = raw_producer(None);
    for k in ["k1", "k2", "k3"] {
        send_stamped(&p, &input.name, 0, k.as_bytes(), b"x", None);
    }
    let app = unique_topic("c10k");
    let (topology, config) = c10_counting(&app, &input.name, &output.name);
    let running = Runtime::new(topology.clone(), config.clone())
        .start()
        .unwrap();
    wait_committed(&running, "count", 3);
    running.stop().unwrap();

    send_stamped(&p, &input.name, 0, b"k4", b"x", None);
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "c10_child_counts_until_the_fault_aborts_the_process",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(
            "PARSLEY_C10_CHILD",
            format!("{app},{},{}", input.name, output.name),
        )
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(6), "the child aborted: {status:?}");
    // The crash came after the state write: k4's state record is in the changelog, in the
    // transaction that died.
    let changelog = changelog_topic(&topology.stage("count").unwrap().group_id(&app));
    let state_k4 = [&[0u8][..], b"k4"].concat();
    assert!(
        uncommitted_keys(&changelog).contains(&state_k4),
        "k4's state record was written before the crash"
    );
    assert_eq!(committed_values(&output), ["k1=1", "k2=1", "k3=1"]);

    let running = Runtime::new(topology, config).start().unwrap();
    wait_committed(&running, "count", 1);
    running.stop().unwrap();
    assert_eq!(
        committed_values(&output),
        ["k1=1", "k2=1", "k3=1", "k4=1"],
        "k4 counted exactly once, from the committed state"
    );
}

/// Forwards every record and notes its offset; on the first, reports that it holds it (the
/// stage's transaction is open, and its consumer is not polled) and waits until the test lets
/// it go.
struct HoldFirst {
    out: String,
    held: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    first: AtomicBool,
    seen: std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
}

impl HoldFirst {
    /// The handler, the receiver of its "held" report, the sender that lets it go, and the
    /// offsets it saw.
    #[allow(clippy::type_complexity)]
    fn new(
        out: &str,
    ) -> (
        Self,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
        std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
    ) {
        let (held_tx, held) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let handler = HoldFirst {
            out: out.to_string(),
            held: std::sync::Mutex::new(held_tx),
            release: std::sync::Mutex::new(release_rx),
            first: AtomicBool::new(false),
            seen: seen.clone(),
        };
        (handler, held, release, seen)
    }
}

impl Handler for HoldFirst {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> HandlerResult<String, String, ()> {
        self.seen.lock().unwrap().push(r.offset);
        if !self.first.swap(true, Ordering::SeqCst) {
            self.held.lock().unwrap().send(()).unwrap();
            self.release.lock().unwrap().recv_timeout(DEADLINE)?;
        }
        Ok(Step::none().emit(self.out.as_str(), r.key, r.value))
    }
}

/// C09 with a Parsley stage as the zombie: another producer initialises the stage's
/// transactional id while the stage's transaction is open (seconds old, far below its 60 s
/// timeout, so the coordinator did not fence it). The stage ends with `KafkaError::Fenced` and
/// gives up without taking the id back: the producer that fenced it still commits afterwards.
/// Nothing of the stage becomes visible and the group's offsets are unchanged.
#[test]
fn c09_a_fenced_stage_gives_up_its_tasks_without_taking_the_transactional_id_back() {
    let input = create_topic("c09s-in", 1);
    let output = create_topic("c09s-out", 1);
    send_values(&input, ["a", "b"].map(String::from));
    let (handler, held, release, _) = HoldFirst::new(&output.name);
    let app = unique_topic("c09s");
    let topology = Topology::builder(&app)
        .stage("forward", handler, |s| {
            s.source(&input.name)
                .sink(&output.name)
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap();
    let group = topology.stage("forward").unwrap().group_id(&app);
    let mut config = RuntimeConfig::new(bootstrap());
    config.instance_id = "twin".to_string();
    let id = config.transactional_id(&group);
    let running = Runtime::new(topology, config).start().unwrap();
    held.recv_timeout(DEADLINE)
        .expect("the stage delivers the first record");
    // Another process running as the same instance: its producer fences the stage's.
    let p2 = raw_producer(Some(&id));
    release.send(()).unwrap();

    let error = next_failure(&running);
    assert!(
        matches!(
            &*error,
            Error::Kafka(KafkaError::Fenced { transactional_id, open_ms, timeout_ms: 60_000, .. })
                if *transactional_id == id && *open_ms < 60_000
        ),
        "{error:?}"
    );
    assert!(error.is_fenced() && error.is_fatal(), "{error:?}");
    let _ = running.stop();
    // The stage did not take the id back: the producer that fenced it still commits.
    p2.begin_transaction().unwrap();
    send_stamped(&p2, &output.name, 0, b"k", b"p2", None);
    p2.commit_transaction(DEADLINE)
        .expect("the live owner of the transactional id is not fenced in turn");
    assert_eq!(
        committed_values(&output),
        ["p2"],
        "nothing of the zombie stage is visible"
    );
    assert_eq!(
        group_offset(&group, &input.name, 0),
        None,
        "offsets unchanged"
    );
}

/// Waits until consumer group `group` is stable with one member: the stage has joined and its
/// assignment is being handled.
fn wait_group_stable(group: &str) {
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        let list = probe
            .client()
            .fetch_group_list(Some(group), DEADLINE)
            .unwrap();
        if list
            .groups()
            .iter()
            .any(|g| g.state() == "Stable" && g.members().len() == 1)
        {
            return;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "group {group} never became stable"
        );
        // Group state is only observable by asking again.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// C07: a transaction of P holds offsets {in-0: 10} for the stage's group, open, while the
/// stage joins; `commit` decides how it ends. Returns what the stage forwarded.
fn c07(commit: bool) -> Vec<String> {
    let input = create_topic("c07-in", 1);
    let output = create_topic("c07-out", 1);
    send_values(&input, (0..15).map(|i| format!("r{i:02}")));
    let app = unique_topic("c07");
    let group = format!("{app}.forward");
    parsley_testkit::fixtures::commit_group_offsets(&group, &[(&input.name, 0, 3)]);
    let member: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", &group)
        .create()
        .unwrap();
    let p = raw_producer(Some(&unique_topic("c07-p")));
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset(&input.name, 0, Offset::Offset(10))
        .unwrap();
    p.begin_transaction().unwrap();
    p.send_offsets_to_transaction(&offsets, &member.group_metadata().unwrap(), DEADLINE)
        .unwrap();

    let topology = forward_topology(&app, &[&input.name], &output.name, ImpossiblePolicy::Fail);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_group_stable(&group);
    if commit {
        p.commit_transaction(DEADLINE).unwrap();
    } else {
        p.abort_transaction(DEADLINE).unwrap();
    }
    let expected = if commit { 5 } else { 12 };
    wait_committed(&running, "forward", expected);
    running.stop().unwrap();
    committed_values(&output)
}

#[test]
fn c07_a_member_joining_while_an_offset_commit_is_pending_waits_for_it() {
    let committed = c07(true);
    assert_eq!(
        committed,
        (10..15).map(|i| format!("r{i:02}")).collect::<Vec<_>>()
    );
    let aborted = c07(false);
    assert_eq!(
        aborted,
        (3..15).map(|i| format!("r{i:02}")).collect::<Vec<_>>()
    );
}

/// A forward stage over a new one-partition topic `prefix-in` (holding `a`) into
/// `prefix-out`, running once it committed `a`; `change` then alters the source topic, and the
/// stage's first failure is returned with the two topics.
fn source_changed(
    prefix: &str,
    change: impl FnOnce(&TopicInfo),
) -> (Arc<Error>, TopicInfo, TopicInfo) {
    let input = create_topic(&format!("{prefix}-in"), 1);
    let output = create_topic(&format!("{prefix}-out"), 1);
    send_values(&input, ["a".to_string()]);
    let topology = forward_topology(
        &unique_topic(prefix),
        &[&input.name],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "forward", 1);
    change(&input);
    let error = next_failure(&running);
    let _ = running.stop();
    (error, input, output)
}

/// A source deleted while the stage runs stops it with `SourceDeleted` naming the stage and
/// the topic (it was a bare "polling: UnknownTopicOrPartition"); nothing is resumed on a
/// topic created again under the name (case C11 covers the restart).
#[test]
fn a_source_deleted_while_the_stage_runs_stops_it_with_a_clear_error() {
    let (error, input, output) = source_changed("deleted", |input| {
        admin().delete_topics(&[&input.name]).unwrap();
    });
    assert!(
        matches!(
            &*error,
            Error::Record(RecordError::SourceDeleted { stage, topic }) if stage == "forward" && *topic == input.name
        ),
        "{error:?}"
    );
    assert_eq!(committed_values(&output), ["a"]);
}

/// A source deleted and created again under its name while the stage runs (back to back, so
/// the stage may or may not see the gap between them) stops it with a typed error naming the
/// topic — `SourceChanged` with the old and the new topic id, or `SourceDeleted` when the gap
/// was seen — never a stall, and records written to the new topic are not taken as the old
/// topic's.
#[test]
fn a_source_recreated_while_the_stage_runs_stops_it_naming_the_old_and_new_ids() {
    let mut new_id = None;
    let (error, input, output) = source_changed("recreated", |input| {
        let admin = admin();
        admin.delete_topics(&[&input.name]).unwrap();
        let t = admin
            .create_topics(&[parsley_runtime::TopicSpec::new(&input.name, 1)])
            .unwrap()
            .remove(0);
        send_values(&t, ["new".to_string()]);
        new_id = Some(t.id);
    });
    match &*error {
        Error::Record(RecordError::SourceChanged {
            stage,
            topic,
            recreated: true,
            ids,
            ..
        }) => {
            assert_eq!((stage.as_str(), topic), ("forward", &input.name));
            assert_eq!(*ids, (input.id, new_id.unwrap()), "old and new ids");
            assert!(error.to_string().contains(&new_id.unwrap().to_string()));
        }
        Error::Record(RecordError::SourceDeleted { stage, topic }) => {
            assert_eq!((stage.as_str(), topic), ("forward", &input.name));
        }
        other => panic!("expected SourceChanged or SourceDeleted, got {other}"),
    }
    assert_eq!(committed_values(&output), ["a"], "nothing of the new topic");
}

#[test]
fn a_source_whose_partition_count_changes_stops_the_stage_with_a_clear_error() {
    let (error, input, _) = source_changed("grow", |input| {
        admin().add_partitions(&input.name, 2).unwrap();
    });
    assert!(
        matches!(
            &*error,
            Error::Record(RecordError::SourceChanged { topic, partitions: (1, 2), .. }) if *topic == input.name
        ),
        "{error:?}"
    );
}
