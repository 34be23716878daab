//! The topology test driver's errors, bad-record policies and restarts: the typed errors the
//! runtime stops a stage with, `Skip` and `DeadLetter` as on the broker, and tasks rebuilt from
//! their in-memory changelog.

use parsley_runtime::driver::{RawInput, TopologyTestDriver};
use parsley_runtime::{
    DLQ_KIND_HEADER, DLQ_OFFSET_HEADER, DLQ_PARTITION_HEADER, DLQ_REASON_HEADER, DLQ_SOURCE_HEADER,
    DLQ_STAGE_HEADER, DLQ_TOPIC_HEADER, Error,
};
use parsley_runtime::{ProcessingError, RecordError};
use parsley_stage::{BadRecordPolicy, Json, KeyPartitioning, Topology, Utf8};
use parsley_testkit::fixtures::{CountKeys, SumValues, key_on, utf8_stage};

/// One stage `sum` reading `in` (UTF-8 keys, JSON `u32` values) into `out`, under `policy`.
fn sum_topology(policy: BadRecordPolicy) -> Topology {
    Topology::builder("app")
        .stage("sum", SumValues("out".into()), |s| {
            s.source("in")
                .sink("out")
                .key_codec(Utf8)
                .output_codec(Utf8)
                .on_bad_record(policy)
        })
        .build()
        .unwrap()
}

fn count_topology() -> Topology {
    Topology::builder("shop")
        .stage("count", CountKeys::new("counts"), |s| {
            utf8_stage(s, &["orders"], &["counts"])
        })
        .build()
        .unwrap()
}

#[test]
fn skip_counts_each_bad_record_by_kind_and_goes_on() {
    let driver = TopologyTestDriver::builder(sum_topology(BadRecordPolicy::Skip))
        .build()
        .unwrap();
    let input = driver.input_topic("in", Utf8, Json).unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    input.pipe("a".to_string(), 5u32).unwrap();
    driver
        .pipe_raw("in", RawInput::new(Some(b"a"), Some(b"not a number")))
        .unwrap();
    input.pipe("a".to_string(), 13).unwrap(); // the handler fails on 13
    input.pipe_value(7).unwrap(); // no key: the stage keeps state by key
    input.pipe("a".to_string(), 1).unwrap();
    assert_eq!(out.read_values(), ["a=5", "a=6"]);
    let m = driver.metrics("sum").unwrap();
    assert_eq!(
        (
            m.bad_records.value_decode,
            m.bad_records.handler,
            m.bad_records.missing_key,
            m.bad_records.total()
        ),
        (1, 1, 1, 3)
    );
    assert_eq!((m.skipped, m.dead_lettered), (3, 0));
    // A skipped record counts as processed: delivered and committed.
    assert_eq!((m.delivered, m.committed_deliveries), (5, 5));
    assert_eq!(
        driver.state("sum", &"a".to_string(), Utf8, Json).unwrap(),
        Some(6u32)
    );
    assert_eq!(driver.failure("sum").unwrap().map(|e| e.to_string()), None);
}

#[test]
fn dead_letter_sends_each_bad_record_with_its_headers_and_goes_on() {
    let policy = BadRecordPolicy::DeadLetter {
        topic: "dlq".into(),
    };
    let driver = TopologyTestDriver::builder(sum_topology(policy))
        .partitions("dlq", 2)
        .build()
        .unwrap();
    let input = driver.input_topic("in", Utf8, Json).unwrap();
    input.pipe("a".to_string(), 5u32).unwrap();
    driver
        .pipe_raw(
            "in",
            RawInput::new(Some(b"a"), Some(b"not a number")).header("trace", b"t-1"),
        )
        .unwrap();
    input.pipe("b".to_string(), 13).unwrap();
    input.pipe("a".to_string(), 2).unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    assert_eq!(out.read_values(), ["a=5", "a=7"]);

    let mut dlq = driver.output_topic("dlq", Utf8, Utf8).unwrap();
    let first = dlq.read_raw_record().unwrap();
    assert_eq!(first.key.as_deref(), Some(&b"a"[..]));
    assert_eq!(first.value.as_deref(), Some(&b"not a number"[..]));
    assert_eq!(first.partition, parsley_runtime::partition_for(b"a", 2));
    for (header, value) in [
        (DLQ_SOURCE_HEADER, "in/0@1"),
        (DLQ_STAGE_HEADER, "sum"),
        (DLQ_TOPIC_HEADER, "in"),
        (DLQ_PARTITION_HEADER, "0"),
        (DLQ_OFFSET_HEADER, "1"),
        (DLQ_KIND_HEADER, "value-decode"),
        ("trace", "t-1"),
    ] {
        assert_eq!(first.header(header).as_deref(), Some(value), "{header}");
    }
    assert!(
        first
            .header(DLQ_REASON_HEADER)
            .unwrap()
            .contains("cannot decode the value of in/0@1"),
        "{first:?}"
    );
    assert!(
        first.stamp.is_some(),
        "stamped by the task that dead-lettered it"
    );
    let second = dlq.read_raw_record().unwrap();
    assert_eq!(second.header(DLQ_KIND_HEADER).as_deref(), Some("handler"));
    assert!(
        second
            .header(DLQ_REASON_HEADER)
            .unwrap()
            .contains("unlucky")
    );
    assert!(dlq.read_raw_record().is_none());

    let m = driver.metrics("sum").unwrap();
    assert_eq!(
        (m.dead_lettered, m.skipped, m.bad_records.total()),
        (2, 0, 2)
    );
    // Emissions are the handler's two outputs, sent and committed alike; the two dead letters
    // are counted apart (and the four records as deliveries).
    assert_eq!(
        (m.emitted, m.committed_emissions, m.committed_deliveries),
        (2, 2, 4)
    );
    assert_eq!(
        driver.state("sum", &"b".to_string(), Utf8, Json).unwrap(),
        None::<u32>
    );
}

#[test]
fn a_failing_handler_stops_the_stage_with_its_typed_error_until_a_restart() {
    let topology = Topology::builder("shop")
        .stage("count", CountKeys::failing_once_on("counts", "boom"), |s| {
            utf8_stage(s, &["orders"], &["counts"])
        })
        .build()
        .unwrap();
    let driver = TopologyTestDriver::builder(topology).build().unwrap();
    let orders = driver.input_topic("orders", Utf8, Utf8).unwrap();
    let mut counts = driver.output_topic("counts", Utf8, Utf8).unwrap();
    orders.pipe("a".into(), "x".into()).unwrap();
    let err = orders.pipe("a".into(), "boom".into()).unwrap_err();
    assert!(
        matches!(&err, Error::StageFailed { stage, .. } if stage == "count"),
        "{err}"
    );
    assert!(
        matches!(err.stage_error(), Error::Processing(ProcessingError::Stage(parsley_stage::Error::Handler { stage, topic, partition: 0, offset: 1, .. }))
            if stage == "count" && topic == "orders"),
        "{err}"
    );
    assert!(err.is_fatal());
    // Stopped: the next record is not delivered, and every run says why.
    assert!(orders.pipe("a".into(), "y".into()).is_err());
    assert_eq!(counts.read_values(), ["a=1"]);
    assert!(driver.failure("count").unwrap().is_some());
    assert_eq!(driver.metrics("count").unwrap().aborts, 1);

    // The restart reads the failed record again (its offset was not committed); this handler
    // fails only once.
    driver.restart().unwrap();
    let records = counts.read_records();
    let lines: Vec<&str> = records.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(lines, ["a=2", "a=3"]);
    assert_eq!(
        driver.state("count", &"a".to_string(), Utf8, Json).unwrap(),
        Some(3u64)
    );
    assert!(driver.failure("count").unwrap().is_none());
}

#[test]
fn a_restart_keeps_the_state_and_continues_the_senders_sequence() {
    let driver = TopologyTestDriver::builder(count_topology())
        .build()
        .unwrap();
    let orders = driver.input_topic("orders", Utf8, Utf8).unwrap();
    let mut counts = driver.output_topic("counts", Utf8, Utf8).unwrap();
    for key in ["a", "a", "b"] {
        orders.pipe(key.into(), "x".into()).unwrap();
    }
    let before = counts.read_records();
    let sender = before[0].stamp.as_ref().unwrap().sender.unwrap().sender;
    let changelog = driver.changelog("count", 0).unwrap();
    assert!(
        changelog
            .iter()
            .any(|(k, v)| k == b"\x00a" && v.as_deref() == Some(&b"2"[..])),
        "the fold state is in the changelog: {changelog:?}"
    );

    driver.restart().unwrap();
    assert_eq!(
        driver.state("count", &"a".to_string(), Utf8, Json).unwrap(),
        Some(2u64)
    );
    assert!(counts.is_empty(), "nothing is delivered again");
    orders.pipe("a".into(), "x".into()).unwrap();
    orders.pipe("b".into(), "x".into()).unwrap();
    let after = counts.read_records();
    let lines: Vec<&str> = after.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(lines, ["a=3", "b=2"]);
    let tags: Vec<_> = before
        .iter()
        .chain(&after)
        .map(|r| r.stamp.as_ref().unwrap().sender.unwrap())
        .collect();
    assert!(
        tags.iter().all(|t| t.sender == sender),
        "one incarnation: {tags:?}"
    );
    let seqs: Vec<u64> = tags.iter().map(|t| t.seq).collect();
    assert_eq!(seqs, [0, 1, 2, 3, 4], "the sequence goes on");
    // The restored sender knows its sends from before the restart were acknowledged; the stamp
    // of a record to `counts` leaves `counts` out (the record's own coordinate supersedes it).
    let counts_channel = parsley_clock::Channel::new(driver.topic("counts").unwrap().id, 0);
    let stamp = after[0].stamp.as_ref().unwrap();
    assert_eq!(stamp.acked_through, Some(2));
    assert_eq!(stamp.clock.get(&counts_channel), None);
    assert_eq!(driver.metrics("count").unwrap().committed_deliveries, 5);
}

#[test]
fn a_key_on_another_partition_than_murmur2_gives_stops_the_stage() {
    let driver = TopologyTestDriver::builder(count_topology())
        .partitions("orders", 2)
        .build()
        .unwrap();
    let key = key_on(0, 2);
    let err = driver
        .pipe_raw(
            "orders",
            RawInput::new(Some(key.as_bytes()), Some(b"x")).partition(1),
        )
        .unwrap_err();
    assert!(
        matches!(err.stage_error(), Error::Record(RecordError::KeyPartitionMismatch { stage, topic, partition: 1, offset: 0, key: k, expected: 0, partitions: 2, .. })
            if stage == "count" && topic == "orders" && *k == format!("{key:?}")),
        "{err}"
    );

    // A source its writers partition some other way on purpose is not checked.
    let topology = Topology::builder("shop")
        .stage("count", CountKeys::new("counts"), |s| {
            utf8_stage(s, &["orders"], &["counts"])
                .key_partitioning("orders", KeyPartitioning::Unchecked)
        })
        .build()
        .unwrap();
    let driver = TopologyTestDriver::builder(topology)
        .partitions("orders", 2)
        .build()
        .unwrap();
    driver
        .pipe_raw(
            "orders",
            RawInput::new(Some(key.as_bytes()), Some(b"x")).partition(1),
        )
        .unwrap();
    let mut counts = driver.output_topic("counts", Utf8, Utf8).unwrap();
    assert_eq!(counts.read_values(), [format!("{key}=1")]);
}
