//! "Why is it waiting?" on the real broker (`Running::explain`, `GET /explain`):
//! - a record held for a missing cause is explained with exactly that cause (its channel, by
//!   topic name, and offset), in memory and over HTTP; once the cause is written the
//!   explanation is empty;
//! - an event-time watermark held by a slow input names that input, catching up with its
//!   history; once it has caught up nothing holds the watermark;
//! - an input caught up with its history whose latest records are fetched but held (their
//!   cause is in an open transaction) holds the watermark behind its live head, and is named
//!   with that head (its last stable offset);
//! - a restore held by a transaction open on the changelog partition names the partition and
//!   both offsets while the stream thread is busy restoring (the last snapshot, not fresh), and
//!   is gone once the transaction ends and the task runs.
//!
//! The waits are made deterministic by open transactions, not by timing: a record written in
//! a transaction that stays open is invisible to the stage's `read_committed` consumer (the
//! partition's last stable offset stays below it) until the test commits it. Every wait is on
//! evidence — the explanation itself, polled until a deadline, and committed deliveries.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parsley_runtime::{
    BlockedRecord, ChannelName, Explanation, RestoreWait, Running, Runtime, RuntimeConfig,
    StageExplanation, TaskExplanation, TopicInfo, TopicSpec, WaitsFor, WatermarkExplanation,
    WatermarkHolder, changelog_topic,
};
use parsley_stage::{EventTimeOrder, ImpossiblePolicy};
use parsley_testkit::fixtures::{
    DEADLINE, admin, bootstrap, create_topic, forward_topology, forward_topology_with,
    raw_producer, send_stamped, unique_topic, wait_committed,
};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn on_port_0() -> RuntimeConfig {
    RuntimeConfig::new(bootstrap()).metrics_address(([127, 0, 0, 1], 0))
}

/// `topic`'s partition 0 as the explanation names it.
fn named(topic: &TopicInfo) -> ChannelName {
    ChannelName {
        topic: Some(topic.name.clone()),
        partition: 0,
        topic_id: topic.id.to_string(),
    }
}

/// Asks `running` why it waits until the one stage's tasks satisfy `done` in a fresh
/// snapshot, and returns that explanation.
///
/// # Panics
/// When a stage fails, or `done` does not hold within the deadline.
fn explain_until(
    running: &Running,
    what: &str,
    done: impl Fn(&[TaskExplanation]) -> bool,
) -> Explanation {
    explain_until_stage(running, what, |s| s.fresh && done(&s.tasks))
}

/// Asks `running` why it waits until its one stage's explanation satisfies `done`, and returns
/// that explanation.
///
/// # Panics
/// When a stage fails, or `done` does not hold within the deadline.
fn explain_until_stage(
    running: &Running,
    what: &str,
    done: impl Fn(&StageExplanation) -> bool,
) -> Explanation {
    let started = Instant::now();
    loop {
        // Each call waits for the stream thread's next snapshot (at most `ANSWER_WITHIN`): it
        // paces the loop.
        let e = running.explain();
        if done(&e.stages[0]) {
            return e;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "not {what} within {DEADLINE:?}: {e:#?}"
        );
        if let Some(parsley_runtime::Progress::Failed { stage, error }) =
            running.next_progress(std::time::Duration::ZERO)
        {
            panic!("stage {stage} failed: {error}")
        }
    }
}

/// A transactional producer with one record (timestamp `timestamp_ms`, ms since the epoch)
/// sent to partition 0 of `topic` in a transaction
/// left open: the record is appended, and invisible to `read_committed` consumers until the
/// caller commits.
fn open_transaction_with_one_record(topic: &str, timestamp_ms: i64) -> BaseProducer {
    let producer = raw_producer(Some(&unique_topic("explain-txn")));
    producer.begin_transaction().expect("begin");
    producer
        .send(
            BaseRecord::to(topic)
                .partition(0)
                .key("held")
                .payload("cause")
                .timestamp(timestamp_ms),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    producer.flush(DEADLINE).expect("acknowledged");
    producer
}

/// Writes each `(topic, key, timestamp ms)` to partition 0, the key as value, and waits for the
/// acknowledgements.
fn send_at(records: &[(&TopicInfo, &str, i64)]) {
    let producer = raw_producer(None);
    for &(topic, key, timestamp) in records {
        producer
            .send(
                BaseRecord::to(&topic.name)
                    .partition(0)
                    .key(key)
                    .payload(key)
                    .timestamp(timestamp),
            )
            .map_err(|(e, _)| e)
            .expect("send");
    }
    producer.flush(DEADLINE).expect("acknowledged");
}

/// Starts stage `forward` of a new application named after `app`, forwarding `fast` and `slow`
/// to `out` in event-time order.
fn start_in_event_time_order(
    app: &str,
    fast: &TopicInfo,
    slow: &TopicInfo,
    out: &TopicInfo,
) -> Running {
    let topology = forward_topology_with(
        &unique_topic(app),
        &[fast.name.as_str(), slow.name.as_str()],
        &out.name,
        // Unaligned: the fast input is read to its end (an aligned stage would pause it as
        // soon as it delivered, and the test would depend on how the records were batched).
        |s| s.order_by_event_time(EventTimeOrder::new().unaligned()),
    );
    Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn a_record_held_for_its_cause_names_the_cause_until_it_is_written() {
    let effects = create_topic("explain-effects", 1);
    let causes = create_topic("explain-causes", 1);
    let out = create_topic("explain-out", 1);
    // Two records of effects and one of causes come first, and are delivered; the cause,
    // causes@1, is appended in a transaction that stays open.
    let plain = raw_producer(None);
    send_stamped(&plain, &effects.name, 0, b"x", b"before", None);
    send_stamped(&plain, &effects.name, 0, b"y", b"before", None);
    send_stamped(&plain, &causes.name, 0, b"z", b"before", None);
    let cause_writer = open_transaction_with_one_record(&causes.name, now_ms());
    let topology = forward_topology(
        &unique_topic("explain"),
        &[effects.name.as_str(), causes.name.as_str()],
        &out.name,
        ImpossiblePolicy::Fail,
    );
    let running = Runtime::new(topology, on_port_0()).start().unwrap();
    let address = running.metrics_address().unwrap();
    // The records before it are delivered and committed.
    wait_committed(&running, "forward", 3);
    // The effect, effects@2, claims causes@1.
    let cause = parsley_runtime::Channel::new(causes.id, 0).at(1);
    let stamp = parsley_runtime::Stamp::new(None, [cause].into_iter().collect());
    send_stamped(&plain, &effects.name, 0, b"sku-1", b"effect", Some(&stamp));

    let expected = vec![TaskExplanation {
        blocked: vec![BlockedRecord {
            channel: named(&effects),
            offset: 2,
            key: Some("sku-1".into()),
            waits_for: WaitsFor::Frontier {
                channel: named(&causes),
                offset: 1,
                // causes@0 is delivered; causes@1 is not readable yet.
                frontier: Some(0),
            },
        }],
        ..TaskExplanation::new(0)
    }];
    let e = explain_until(&running, "the effect blocked", |tasks| {
        tasks.iter().any(|t| !t.blocked.is_empty())
    });
    assert_eq!(e.stages[0].stage, "forward");
    assert_eq!(e.stages[0].tasks, expected);
    // The table `cargo xtask inspect` prints: a header, then this one row.
    let rows: Vec<Vec<String>> = e
        .to_string()
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    let row = format!(
        "forward 0 {}/0 2 sku-1 cause {}/0@1 (delivered through 0)",
        effects.name, causes.name
    );
    assert_eq!(rows.len(), 2, "{e}");
    assert_eq!(
        rows[1],
        row.split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    );
    // The same over HTTP, as JSON.
    let r = minreq::get(format!("http://{address}/explain"))
        .with_timeout(30)
        .send()
        .expect("GET /explain");
    assert_eq!(r.status_code, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let served: Explanation = serde_json::from_str(r.as_str().unwrap()).expect("JSON");
    assert_eq!(served.stages.len(), 1);
    assert!(served.stages[0].fresh);
    assert_eq!(served.stages[0].tasks, expected);
    let json: serde_json::Value = serde_json::from_str(r.as_str().unwrap()).unwrap();
    assert_eq!(
        json["stages"][0]["tasks"][0]["blocked"][0]["waits_for"]["reason"],
        "frontier"
    );

    // The cause is written: both records are delivered and nothing waits.
    cause_writer.commit_transaction(DEADLINE).expect("commit");
    wait_committed(&running, "forward", 5);
    explain_until(&running, "nothing waiting", |tasks| {
        tasks == [TaskExplanation::new(0)]
    });
    running.stop().unwrap();
}

#[test]
fn a_watermark_held_by_a_slow_input_names_that_input() {
    let fast = create_topic("explain-fast", 1);
    let slow = create_topic("explain-slow", 1);
    let out = create_topic("explain-et-out", 1);
    // The slow input's history, slow@0, is in a transaction that stays open: the stage reads
    // its startup end (1) but cannot read up to it.
    let base = now_ms() - 3_600_000;
    let slow_writer = open_transaction_with_one_record(&slow.name, base + 150);
    send_at(&[(&fast, "a", base + 100), (&fast, "b", base + 200)]);
    let running = start_in_event_time_order("explain-et", &fast, &slow, &out);

    // Both fast records are delivered and parked; the slow input holds the watermark.
    let e = explain_until(&running, "both fast records parked", |tasks| {
        tasks
            .first()
            .and_then(|t| t.event_time.as_ref())
            .is_some_and(|et| et.parked == 2)
    });
    assert_eq!(
        e.stages[0].tasks,
        vec![TaskExplanation {
            event_time: Some(WatermarkExplanation {
                watermark_ms: None,
                parked: 2,
                held_by: Some(WatermarkHolder::CatchingUp {
                    channel: named(&slow),
                    delivered_max_ms: None,
                    frontier: -1,
                    startup_end: Some(1),
                }),
            }),
            ..TaskExplanation::new(0)
        }]
    );
    assert!(!e.is_idle());

    // The slow input's history is committed: it catches up, all three records are released,
    // and nothing holds the watermark (no control stream: every input is at its live head).
    slow_writer.commit_transaction(DEADLINE).expect("commit");
    wait_committed(&running, "forward", 3);
    let e = explain_until(&running, "nothing parked", |tasks| {
        tasks
            .first()
            .and_then(|t| t.event_time.as_ref())
            .is_some_and(|et| et.parked == 0)
    });
    let et = e.stages[0].tasks[0].event_time.clone().unwrap();
    assert_eq!(et.held_by, None);
    assert_eq!(et.watermark_ms, Some(base + 200));
    assert!(e.is_idle());
    running.stop().unwrap();
}

#[test]
fn a_restore_held_by_an_open_transaction_is_explained_until_the_transaction_ends() {
    let input = create_topic("explain-restore-in", 1);
    let output = create_topic("explain-restore-out", 1);
    let app = unique_topic("explain-restore");
    let changelog = changelog_topic(&format!("{app}.forward"));
    admin()
        .create_topics(&[TopicSpec::new(&changelog, 1).config("cleanup.policy", "compact")])
        .unwrap();
    // Another producer opens a transaction on the changelog partition and leaves it open.
    let other = raw_producer(Some(&unique_topic("explain-restore-txn")));
    other.begin_transaction().unwrap();
    send_stamped(&other, &changelog, 0, b"\x00k", b"1", None);
    let topology = forward_topology(
        &app,
        &[input.name.as_str()],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    // Long enough for the restore not to give up while the test looks at it.
    let mut config = RuntimeConfig::new(bootstrap());
    config.timeout = DEADLINE;
    let running = Runtime::new(topology, config).start().unwrap();

    let e = explain_until_stage(&running, "the restore held", |s| {
        s.tasks.iter().any(|t| t.restore.is_some())
    });
    assert_eq!(
        e.stages[0].tasks,
        vec![TaskExplanation {
            restore: Some(RestoreWait {
                changelog: changelog.clone(),
                partition: 0,
                last_stable_offset: 0,
                high_watermark: 1,
                // Not a Parsley stage: it names itself on no changelog record.
                producer: None,
            }),
            ..TaskExplanation::new(0)
        }]
    );
    assert!(!e.stages[0].fresh, "the stream thread is restoring");
    assert!(!e.is_idle());

    other.abort_transaction(DEADLINE).unwrap();
    explain_until(&running, "the task running, nothing waiting", |tasks| {
        tasks == [TaskExplanation::new(0)]
    });
    running.stop().unwrap();
}

#[test]
fn a_watermark_held_by_an_input_behind_its_live_head_names_it_and_its_head() {
    let fast = create_topic("explain-head-fast", 1);
    let slow = create_topic("explain-head-slow", 1);
    let out = create_topic("explain-head-out", 1);
    let base = now_ms() - 3_600_000;
    send_at(&[(&fast, "a", base + 100), (&slow, "s", base + 150)]);
    let running = start_in_event_time_order("explain-head", &fast, &slow, &out);
    // Both inputs are read to their heads: nothing holds the watermark.
    wait_committed(&running, "forward", 2);
    explain_until(&running, "nothing holding the watermark", |tasks| {
        tasks
            .first()
            .and_then(|t| t.event_time.as_ref())
            .is_some_and(|et| et.held_by.is_none())
    });

    // slow@1 is appended in a transaction that stays open; fast@1 claims it, so fast@1 is
    // fetched and held: fast's live head (its last stable offset, 2) is beyond what it
    // delivered (through 0), and fast holds the watermark.
    let slow_writer = open_transaction_with_one_record(&slow.name, base + 300);
    let cause = parsley_runtime::Channel::new(slow.id, 0).at(1);
    let stamp = parsley_runtime::Stamp::new(None, [cause].into_iter().collect());
    send_stamped(&raw_producer(None), &fast.name, 0, b"b", b"b", Some(&stamp));
    let expected = vec![TaskExplanation {
        blocked: vec![BlockedRecord {
            channel: named(&fast),
            offset: 1,
            key: Some("b".into()),
            waits_for: WaitsFor::Frontier {
                channel: named(&slow),
                offset: 1,
                frontier: Some(0),
            },
        }],
        event_time: Some(WatermarkExplanation {
            watermark_ms: Some(base + 150),
            parked: 0,
            held_by: Some(WatermarkHolder::AwaitingLiveHead {
                channel: named(&fast),
                delivered_max_ms: Some(base + 100),
                frontier: 0,
                head: Some(2),
            }),
        }),
        ..TaskExplanation::new(0)
    }];
    explain_until(&running, "fast behind its live head", |tasks| {
        tasks == expected.as_slice()
    });

    // The cause is committed: both records are delivered and nothing holds the watermark.
    slow_writer.commit_transaction(DEADLINE).expect("commit");
    wait_committed(&running, "forward", 4);
    let e = explain_until(&running, "nothing holding the watermark", |tasks| {
        tasks
            .first()
            .and_then(|t| t.event_time.as_ref())
            .is_some_and(|et| et.held_by.is_none())
    });
    assert!(e.is_idle(), "{e:#?}");
    running.stop().unwrap();
}
