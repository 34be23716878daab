//! Kafka Streams' answers, kept as the DSL's own tests: each case here is one the differential
//! comparison with Kafka Streams 4.4 (`cargo xtask conformance`) checks, with the value
//! Kafka Streams gives — output timestamps, partner order, what a table forwards, what a
//! repartition takes — and the state written before timestamps were kept, read as it was.

use std::collections::BTreeMap;
use std::time::Duration;

use parsley_runtime::driver::{RawInput, TopologyTestDriver};
use parsley_stage::{
    BadRecordPolicy, Emission, Handler, HandlerResult, Nullable, Record, Step, Topology, Utf8,
};
use serde::Serialize;

use super::process_once;
use crate::{JoinWindows, StreamsBuilder, TimeWindows, read_slot};

fn driver(topology: Topology) -> TopologyTestDriver {
    TopologyTestDriver::builder(topology).build().unwrap()
}

fn pipe(driver: &TopologyTestDriver, topic: &str, key: Option<&str>, value: Option<&str>, at: i64) {
    driver
        .pipe_raw(
            topic,
            RawInput::new(key.map(str::as_bytes), value.map(str::as_bytes)).timestamp(at),
        )
        .unwrap();
}

/// Every record of `topic` as `key=value@timestamp` (`-` for a tombstone).
fn records(driver: &TopologyTestDriver, topic: &str) -> Vec<String> {
    let mut out = driver.output_topic(topic, Utf8, Nullable(Utf8)).unwrap();
    out.read_records()
        .into_iter()
        .map(|r| {
            let value: Option<String> = r.value;
            format!(
                "{}={}@{}",
                r.key,
                value.as_deref().unwrap_or("-"),
                r.timestamp
            )
        })
        .collect()
}

#[test]
fn an_aggregate_carries_the_latest_timestamp_of_its_records() {
    let b = StreamsBuilder::new("app");
    b.stream::<String, String>("in")
        .group_by_key()
        .named("n")
        .count()
        .to_stream()
        .to("out");
    let d = driver(b.build().unwrap());
    pipe(&d, "in", Some("c"), Some("x"), 5);
    pipe(&d, "in", Some("c"), Some("x"), 3); // earlier: the aggregate keeps 5
    pipe(&d, "in", Some("c"), Some("x"), 9);
    assert_eq!(records(&d, "out"), ["c=1@5", "c=2@5", "c=3@9"]);
    // Restored with the state: the timestamp is kept with the aggregate.
    d.restart().unwrap();
    pipe(&d, "in", Some("c"), Some("x"), 7);
    assert_eq!(records(&d, "out")[3..], ["c=4@9"]);
}

#[test]
fn a_table_table_join_result_carries_the_later_timestamp_of_its_sides() {
    let b = StreamsBuilder::new("app");
    let l = b.table::<String, String>("l");
    let r = b.table::<String, String>("r");
    l.join(&r, |a, b| format!("{a}/{b}"))
        .to_change_stream()
        .to("out");
    let d = driver(b.build().unwrap());
    pipe(&d, "r", Some("k"), Some("x"), 20);
    pipe(&d, "l", Some("k"), Some("1"), 10); // the right side is later
    pipe(&d, "l", Some("k"), Some("2"), 30);
    pipe(&d, "r", Some("k"), Some("y"), 25);
    pipe(&d, "l", Some("k"), None, 26); // the deletion: the later of 26 and 25
    assert_eq!(
        records(&d, "out"),
        ["k=1/x@20", "k=2/x@30", "k=2/y@30", "k=-@26"]
    );
}

#[test]
fn a_stream_stream_join_takes_partners_in_event_time_order_with_the_later_timestamp() {
    let b = StreamsBuilder::new("app");
    let l = b.stream::<String, String>("l");
    let r = b.stream::<String, String>("r");
    l.join_windowed(
        &r,
        JoinWindows::of_time_difference(Duration::from_millis(5)),
        |a, b| format!("{a}/{b}"),
    )
    .to("out");
    let d = driver(b.build().unwrap());
    pipe(&d, "r", Some("a"), Some("late"), 3);
    pipe(&d, "r", Some("a"), Some("early"), 0);
    pipe(&d, "l", Some("a"), Some("x"), 1);
    // Partners by their event time (as Kafka Streams' window store gives them), each result
    // at the later of its two timestamps.
    assert_eq!(records(&d, "out"), ["a=x/early@1", "a=x/late@3"]);
}

#[test]
fn a_source_table_forwards_an_unchanged_value_as_kafka_streams_4_4_does() {
    // Kafka Streams 4.4 forwards `A=1@10` and `A=1@12` both: its emit-on-change (KIP-557) is
    // switched off. A tombstone for a key the table does not hold is not forwarded.
    let b = StreamsBuilder::new("app");
    b.table::<String, String>("t").to_change_stream().to("out");
    let d = driver(b.build().unwrap());
    pipe(&d, "t", Some("A"), Some("1"), 10);
    pipe(&d, "t", Some("A"), Some("1"), 12);
    pipe(&d, "t", Some("B"), None, 13);
    pipe(&d, "t", Some("A"), Some("1"), 11); // out of order: forwarded too
    assert_eq!(records(&d, "out"), ["A=1@10", "A=1@12", "A=1@11"]);
}

fn repartitioned(policy: BadRecordPolicy) -> Topology {
    let b = StreamsBuilder::new("app");
    b.on_bad_record(policy);
    b.stream::<Option<String>, String>("in")
        .repartition()
        .to("out");
    b.build().unwrap()
}

#[test]
fn a_record_without_a_key_at_a_repartition_is_a_missing_key_bad_record() {
    // Skipped under `Skip`, as Kafka Streams drops it, and counted.
    let d = driver(repartitioned(BadRecordPolicy::Skip));
    pipe(&d, "in", None, Some("lost"), 1);
    pipe(&d, "in", Some("k"), Some("kept"), 2);
    let mut out = d.output_topic("out", Nullable(Utf8), Utf8).unwrap();
    assert_eq!(out.read_values(), ["kept"]);
    assert_eq!(d.metrics("in").unwrap().bad_records.missing_key, 1);
    // Under `Fail` (the default), the stage stops naming the record.
    let d = driver(repartitioned(BadRecordPolicy::Fail));
    let err = d
        .pipe_raw("in", RawInput::new(None, Some(b"lost")).timestamp(1))
        .unwrap_err();
    assert!(
        matches!(
            err.stage_error(),
            parsley_runtime::Error::Processing(parsley_runtime::ProcessingError::Stage(
                parsley_stage::Error::Missing {
                    part: parsley_stage::Part::Key,
                    offset: 0,
                    ..
                }
            ))
        ),
        "{err:?}"
    );
}

/// Emits each record's value at a timestamp it names: `value@ms`.
struct AtTime;

impl Handler for AtTime {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> HandlerResult<String, String, ()> {
        let (value, at) = r.value.split_once('@').expect("value@ms");
        let at: i64 = at.parse().expect("ms");
        let mut step = Step::none();
        step.emit
            .push(Emission::to("unused", r.key, value.to_string()).at(at));
        Ok(step)
    }
}

#[test]
fn an_emission_that_sets_its_timestamp_keeps_it_downstream() {
    let b = StreamsBuilder::new("app");
    b.stream::<String, String>("in").process(AtTime).to("out");
    let d = driver(b.build().unwrap());
    pipe(&d, "in", Some("k"), Some("v@42"), 7);
    assert_eq!(records(&d, "out"), ["k=v@42"]);
}

/// Version 1 of the DSL's state encoding: slots without timestamps.
fn v1_state(slots: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let pairs: Vec<(String, serde_bytes::ByteBuf)> = slots
        .iter()
        .map(|(n, b)| (n.to_string(), serde_bytes::ByteBuf::from(b.clone())))
        .collect();
    let mut raw = vec![1];
    raw.extend(encoded(&pairs));
    raw
}

fn encoded<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).unwrap()
}

#[test]
fn open_windows_and_table_joins_written_before_timestamps_are_read_as_they_were() {
    // A time-windowed count's open windows as version 1 kept them: key, and count by start.
    #[derive(Serialize)]
    struct OpenV1 {
        key: String,
        windows: BTreeMap<i64, i64>,
    }
    let b = StreamsBuilder::new("app");
    b.stream::<String, String>("in")
        .group_by_key()
        .named("w")
        .windowed_by(TimeWindows::of_size(Duration::from_millis(10)))
        .emit_updates()
        .count()
        .to_stream()
        .to("out");
    let t = b.build().unwrap();
    // The record `process_once` hands over is at 1,000 ms: in the window [1000, 1010).
    let old = v1_state(&[(
        "w",
        encoded(&OpenV1 {
            key: "k".into(),
            windows: BTreeMap::from([(1_000, 2)]),
        }),
    )]);
    // The window counted on from 2: the state was read in its old shape, and is written in
    // the new one, each window with its timestamp.
    let step = process_once(&t, "in", ("in", 0), (Some("k"), Some("x")), Some(&old)).unwrap();
    let parsley_stage::StateChange::Set(new) = step else {
        panic!("the window's state is written anew")
    };
    assert_eq!(new[0], 2, "written as version 2");
    type Open = (String, BTreeMap<i64, (i64, i64)>);
    let open: Option<Open> = read_slot(&new, "w").unwrap();
    assert_eq!(
        open,
        Some(("k".into(), BTreeMap::from([(1_000, (3, 1_000))])))
    );

    // A table–table join's two sides as version 1 kept them, without timestamps.
    let b = StreamsBuilder::new("app");
    let l = b.table::<String, String>("l");
    let r = b.table::<String, String>("r");
    l.named("j")
        .join(&r, |a, b| format!("{a}/{b}"))
        .to_change_stream()
        .to("out");
    let t = b.build().unwrap();
    let sides: (Option<String>, Option<String>) = (None, Some("x".into()));
    let old = v1_state(&[("j", encoded(&sides))]);
    let step = process_once(&t, "l", ("l", 0), (Some("k"), Some("1")), Some(&old)).unwrap();
    let parsley_stage::StateChange::Set(new) = step else {
        panic!("the join's state is written anew")
    };
    // The right side kept, its timestamp unknown (-1: any update is later).
    type Sides = (Option<(String, i64)>, Option<(String, i64)>);
    let sides: Option<Sides> = read_slot(&new, "j").unwrap();
    assert_eq!(
        sides,
        Some((Some(("1".into(), 1_000)), Some(("x".into(), -1))))
    );
}
