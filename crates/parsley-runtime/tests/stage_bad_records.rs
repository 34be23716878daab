//! Bad records on the real broker: values that do not decode, handler errors and records
//! without a key, under the skip and dead-letter policies — the stage goes on (no restart
//! loop), every input is consumed exactly once, and each dead letter is committed exactly once
//! with the record it carries and its cause. Case C19: keyless records in stages with and
//! without fold state.

use parsley_runtime::{
    DLQ_KIND_HEADER, DLQ_OFFSET_HEADER, DLQ_PARTITION_HEADER, DLQ_STAGE_HEADER, DLQ_TOPIC_HEADER,
    Error, Runtime, RuntimeConfig,
};
use parsley_runtime::{ProcessingError, RecordError};
use parsley_stage::{BadRecordPolicy, Json, Topology, Utf8};
use parsley_testkit::fixtures::{
    CopyRecords, DEADLINE, SumValues, bootstrap, committed_values, create_topic, next_failure,
    raw_producer, read_committed, unique_topic, wait_committed,
};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};

fn sum_topology(app: &str, input: &str, output: &str, policy: BadRecordPolicy) -> Topology {
    Topology::builder(app)
        .stage("sum", SumValues(output.to_string()), |s| {
            s.source(input)
                .sink(output)
                .key_codec(Utf8)
                .output_codec(Utf8)
                .on_bad_record(policy)
        })
        .build()
        .unwrap()
}

/// Writes `records` (key, value, one header) to partition 0 of `topic` and commits them in
/// one transaction (so the log also holds a commit marker).
fn produce(topic: &str, records: &[(Option<&str>, &str)]) {
    let p = raw_producer(Some(&unique_topic("bad-records-producer")));
    p.begin_transaction().unwrap();
    for (i, (key, value)) in records.iter().enumerate() {
        let trace = format!("t{i}");
        let headers = OwnedHeaders::new().insert(Header {
            key: "trace",
            value: Some(trace.as_str()),
        });
        let mut record = BaseRecord::<str, str>::to(topic)
            .partition(0)
            .payload(value)
            .headers(headers);
        if let Some(k) = key {
            record = record.key(k);
        }
        p.send(record).map_err(|(e, _)| e).unwrap();
    }
    p.commit_transaction(DEADLINE).unwrap();
}

/// The inputs of the policy tests: offsets 0..=5.
const INPUTS: [(Option<&str>, &str); 6] = [
    (Some("a"), "1"),
    (Some("a"), "oops"), // the value does not decode
    (Some("a"), "13"),   // the handler fails
    (None, "4"),         // no key in a stage that keeps fold state
    (Some("a"), "2"),
    (Some("b"), "5"),
];

#[test]
fn bad_records_are_dead_lettered_once_each_and_the_stage_goes_on() {
    let input = create_topic("bad-in", 1);
    let output = create_topic("bad-out", 1);
    let dlq = create_topic("bad-dlq", 1);
    produce(&input.name, &INPUTS);
    let app = unique_topic("bad-dlq-app");
    let policy = BadRecordPolicy::DeadLetter {
        topic: dlq.name.clone(),
    };
    let topology = sum_topology(&app, &input.name, &output.name, policy);
    let running = Runtime::new(topology.clone(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let m = wait_committed(&running, "sum", 6);
    running.stop().unwrap();
    assert_eq!(committed_values(&output), ["a=1", "a=3", "b=5"]);
    assert_eq!(
        (
            m.bad_records.value_decode,
            m.bad_records.handler,
            m.bad_records.missing_key
        ),
        (1, 1, 1)
    );
    assert_eq!((m.dead_lettered, m.skipped, m.aborts), (3, 0, 0));

    let letters = read_committed(&dlq);
    /// Key, value, kind header and offset header of a dead letter.
    type Letter<'a> = (Option<&'a [u8]>, &'a [u8], String, String);
    let got: Vec<Letter<'_>> = letters
        .iter()
        .map(|r| {
            (
                r.key.as_deref(),
                r.value.as_deref().unwrap(),
                r.header(DLQ_KIND_HEADER).unwrap(),
                r.header(DLQ_OFFSET_HEADER).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                Some(&b"a"[..]),
                &b"oops"[..],
                "value-decode".into(),
                "1".into()
            ),
            (Some(&b"a"[..]), &b"13"[..], "handler".into(), "2".into()),
            (None, &b"4"[..], "missing-key".into(), "3".into()),
        ]
    );
    for (r, trace) in letters.iter().zip(["t1", "t2", "t3"]) {
        assert_eq!(
            r.header("trace").as_deref(),
            Some(trace),
            "original header kept"
        );
        assert_eq!(r.header(DLQ_STAGE_HEADER).as_deref(), Some("sum"));
        assert_eq!(r.header(DLQ_TOPIC_HEADER), Some(input.name.clone()));
        assert_eq!(r.header(DLQ_PARTITION_HEADER).as_deref(), Some("0"));
        let stamp = r.stamp.as_ref().expect("stamped by the stage");
        let claimed = stamp.clock.get(&parsley_clock::Channel::new(input.id, 0));
        assert!(
            claimed >= Some(r.header(DLQ_OFFSET_HEADER).unwrap().parse().unwrap()),
            "a dead letter claims the record it carries: {stamp:?}"
        );
    }

    // A restart reads on from the committed offsets: nothing is written twice.
    produce(&input.name, &[(Some("a"), "10")]);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "sum", 1);
    running.stop().unwrap();
    assert_eq!(committed_values(&output), ["a=1", "a=3", "b=5", "a=13"]);
    assert_eq!(read_committed(&dlq).len(), 3);
}

#[test]
fn bad_records_are_skipped_and_counted_and_the_stage_goes_on() {
    let input = create_topic("skip-in", 1);
    let output = create_topic("skip-out", 1);
    produce(&input.name, &INPUTS);
    let app = unique_topic("skip-app");
    let topology = sum_topology(&app, &input.name, &output.name, BadRecordPolicy::Skip);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let m = wait_committed(&running, "sum", 6);
    running.stop().unwrap();
    assert_eq!(committed_values(&output), ["a=1", "a=3", "b=5"]);
    assert_eq!(
        (m.bad_records.total(), m.skipped, m.dead_lettered),
        (3, 3, 0)
    );
    assert_eq!((m.committed_deliveries, m.aborts), (6, 0));
}

#[test]
fn under_fail_a_handler_error_stops_the_stage_naming_the_record() {
    let input = create_topic("fail-in", 1);
    let output = create_topic("fail-out", 1);
    produce(&input.name, &[(Some("a"), "1"), (Some("a"), "13")]);
    let app = unique_topic("fail-app");
    let topology = sum_topology(&app, &input.name, &output.name, BadRecordPolicy::Fail);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let failure = next_failure(&running);
    assert!(
        matches!(&*failure, Error::Processing(ProcessingError::Stage(parsley_stage::Error::Handler { topic, offset: 1, .. })) if *topic == input.name),
        "{failure}"
    );
    let _ = running.stop();
}

#[test]
fn c19_keyless_records_pass_a_stateless_stage_and_stop_a_stateful_one() {
    let input = create_topic("c19-in", 1);
    let copied = create_topic("c19-copy", 1);
    let summed = create_topic("c19-sum", 1);
    // T(x1, x2, x3) + C: three records without a key, then the commit marker.
    produce(&input.name, &[(None, "1"), (None, "2"), (None, "3")]);
    let app = unique_topic("c19");
    let topology = Topology::builder(&app)
        .stage("copy", CopyRecords(copied.name.clone()), |s| {
            s.source(&input.name)
                .sink(&copied.name)
                .key_codec(Json)
                .value_codec(Utf8)
                .output_codec(Utf8)
        })
        .stage("sum", SumValues(summed.name.clone()), |s| {
            s.source(&input.name)
                .sink(&summed.name)
                .key_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap();
    let runtime = Runtime::new(topology, RuntimeConfig::new(bootstrap()));
    // The stage without fold state delivers all three and emits them, still without a key.
    let running = runtime.start_stages(&["copy"]).unwrap();
    wait_committed(&running, "copy", 3);
    running.stop().unwrap();
    let out = read_committed(&copied);
    assert_eq!(
        out.iter()
            .map(|r| (r.key.clone(), r.value.clone().unwrap()))
            .collect::<Vec<_>>(),
        [
            (None, b"1".to_vec()),
            (None, b"2".to_vec()),
            (None, b"3".to_vec())
        ]
    );
    // The stage with fold state stops at the first, naming it (the default policy, fail).
    let running = runtime.start_stages(&["sum"]).unwrap();
    let failure = next_failure(&running);
    assert!(
        matches!(&*failure, Error::Record(RecordError::KeylessRecord { stage, topic, partition: 0, offset: 0 }) if stage == "sum" && *topic == input.name),
        "{failure}"
    );
    let _ = running.stop();
    assert!(read_committed(&summed).is_empty());
}
