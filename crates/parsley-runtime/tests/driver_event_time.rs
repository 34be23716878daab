//! Event-time stages in the topology test driver: the runtime's watermark and timer queue,
//! moved only by the evidence the driver hands over — the ends of the partitions, a control
//! stream's records, and the built-in clock's ticks on the driver's time.

use parsley_runtime::driver::TopologyTestDriver;
use parsley_stage::{
    EventTimeOrder, Handler, HandlerError, HandlerResult, Record, Step, Topology, Utf8,
};

/// Forwards every record of `events` to `out`; the control records (topic `ticks`) only move
/// time.
struct Timeline;

impl Handler for Timeline {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> HandlerResult<String, String, ()> {
        if r.topic == "ticks" {
            return Ok(Step::none());
        }
        Ok(Step::none().emit("out", r.key, r.value))
    }
}

fn ledger(order: EventTimeOrder, sources: &[&str]) -> Topology {
    Topology::builder("app")
        .stage("ledger", Timeline, |s| {
            sources
                .iter()
                .fold(s, |s, t| s.source(*t))
                .sink("out")
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
                .order_by_event_time(order)
        })
        .build()
        .unwrap()
}

#[test]
fn a_control_stream_releases_parked_records_in_event_time_order() {
    let driver = TopologyTestDriver::builder(ledger(
        EventTimeOrder::new().control("ticks", 0),
        &["events", "ticks"],
    ))
    .build()
    .unwrap();
    let events = driver.input_topic("events", Utf8, Utf8).unwrap();
    let ticks = driver.input_topic("ticks", Utf8, Utf8).unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();

    events.pipe_at("k".into(), "c".into(), 300).unwrap();
    events.pipe_at("k".into(), "a".into(), 100).unwrap();
    events.pipe_at("j".into(), "b".into(), 200).unwrap();
    assert!(
        out.is_empty(),
        "no control record yet: nothing is released on silence"
    );
    assert_eq!(driver.metrics("ledger").unwrap().parked, 3);

    ticks.pipe_at("t".into(), String::new(), 250).unwrap();
    let released = out.read_records();
    let got: Vec<(&str, i64)> = released
        .iter()
        .map(|r| (r.value.as_str(), r.timestamp))
        .collect();
    assert_eq!(
        got,
        [("a", 100), ("b", 200)],
        "in event time, each with its own"
    );
    ticks.pipe_at("t".into(), String::new(), 1_000).unwrap();
    assert_eq!(out.read_values(), ["c"]);
    let task = &driver.task_metrics("ledger").unwrap()[0];
    assert_eq!(
        (task.watermark_ms, task.parked, task.late),
        (Some(1_000), 0, 0)
    );

    // Behind the watermark: handed over at once, and counted late for its key.
    events.pipe_at("k".into(), "late".into(), 150).unwrap();
    assert_eq!(out.read_values(), ["late"]);
    assert_eq!(driver.metrics("ledger").unwrap().late, 1);
    let late = driver.late_by_key("ledger").unwrap();
    assert_eq!(late.len(), 1);
    assert_eq!((late[0].key.as_slice(), late[0].late), (&b"k"[..], 1));
}

#[test]
fn without_a_control_stream_a_batch_is_released_in_event_time_order() {
    let driver = TopologyTestDriver::builder(ledger(EventTimeOrder::new(), &["events", "more"]))
        .auto_run(false)
        .build()
        .unwrap();
    let events = driver.input_topic("events", Utf8, Utf8).unwrap();
    let more = driver.input_topic("more", Utf8, Utf8).unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    // One partition, offsets in another order than event times.
    events.pipe_at("k".into(), "third".into(), 300).unwrap();
    events.pipe_at("k".into(), "first".into(), 100).unwrap();
    more.pipe_at("j".into(), "second".into(), 200).unwrap();
    driver.run().unwrap();
    assert_eq!(out.read_values(), ["first", "second", "third"]);
    assert_eq!(driver.metrics("ledger").unwrap().late, 0);

    // Every input caught up and at its head: the watermark is the highest event time
    // delivered, so a record arriving below it is released at once and counted.
    driver.set_auto_run(true);
    more.pipe_at("j".into(), "old".into(), 250).unwrap();
    events.pipe_at("k".into(), "new".into(), 400).unwrap();
    assert_eq!(out.read_values(), ["old", "new"]);
    assert_eq!(driver.metrics("ledger").unwrap().late, 1);
}

#[test]
fn parked_records_and_the_watermark_survive_a_restart() {
    let driver = TopologyTestDriver::builder(ledger(
        EventTimeOrder::new().control("ticks", 0),
        &["events", "ticks"],
    ))
    .build()
    .unwrap();
    let events = driver.input_topic("events", Utf8, Utf8).unwrap();
    let ticks = driver.input_topic("ticks", Utf8, Utf8).unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    ticks.pipe_at("t".into(), String::new(), 50).unwrap();
    events.pipe_at("k".into(), "b".into(), 300).unwrap();
    events.pipe_at("k".into(), "a".into(), 100).unwrap();
    assert!(out.is_empty());

    driver.restart().unwrap();
    let task = &driver.task_metrics("ledger").unwrap()[0];
    assert_eq!(
        (task.parked, task.watermark_ms),
        (2, Some(50)),
        "restored, not re-read"
    );
    assert_eq!(
        driver.metrics("ledger").unwrap().fetched,
        3,
        "nothing fetched again"
    );
    ticks.pipe_at("t".into(), String::new(), 1_000).unwrap();
    assert_eq!(out.read_values(), ["a", "b"]);
}

/// Forwards every record of `events` and `more` to `out`; any other topic is an error, which
/// stops the stage: the built-in clock's ticks must never reach it.
struct NoTicks;

impl Handler for NoTicks {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> HandlerResult<String, String, ()> {
        if r.topic != "events" && r.topic != "more" {
            return Err(HandlerError::from(format!("the handler saw {}", r.topic)));
        }
        Ok(Step::none().emit("out", r.key, r.value))
    }
}

/// Stage `ledger` of application `app` over `events` and `more`, with the built-in clock at a
/// lag of 500 ms and the default tick interval (100 ms).
fn clocked() -> Topology {
    Topology::builder("app")
        .stage("ledger", NoTicks, |s| {
            s.source("events")
                .source("more")
                .sink("out")
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
                .order_by_event_time(EventTimeOrder::new().clock(500))
        })
        .build()
        .unwrap()
}

/// `(value, timestamp)` of every record `out` has not read yet.
fn released(
    out: &mut parsley_runtime::driver::OutputTopic<'_, String, String>,
) -> Vec<(String, i64)> {
    out.read_records()
        .into_iter()
        .map(|r| (r.value, r.timestamp))
        .collect()
}

#[test]
fn the_built_in_clock_releases_live_records_in_event_time_order_as_the_drivers_time_moves() {
    let driver = TopologyTestDriver::builder(clocked())
        .start_time_ms(10_000)
        .build()
        .unwrap();
    let events = driver.input_topic("events", Utf8, Utf8).unwrap();
    let more = driver.input_topic("more", Utf8, Utf8).unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    let mut clock = driver.output_topic("app-ledger-clock", Utf8, Utf8).unwrap();

    // The first turn writes a tick at the driver's time: the watermark is 10,000 - 500.
    events.pipe_at("k".into(), "c".into(), 10_300).unwrap();
    events.pipe_at("k".into(), "a".into(), 10_100).unwrap();
    more.pipe_at("j".into(), "b".into(), 10_200).unwrap();
    assert!(out.is_empty());
    let task = &driver.task_metrics("ledger").unwrap()[0];
    assert_eq!(
        (task.parked, task.watermark_ms, task.ticks),
        (3, Some(9_500), 1)
    );

    // Nothing is released while the time does not move, nor before a whole interval passed.
    driver.run().unwrap();
    driver.advance_time(99).unwrap();
    assert!(out.is_empty());
    assert_eq!(driver.metrics("ledger").unwrap().ticks, 1);

    // 10,600 - 500 = 10,100: `a`; then one record per interval, in event-time order across
    // both inputs, each with its own event time.
    driver.advance_time(501).unwrap();
    assert_eq!(released(&mut out), [("a".to_string(), 10_100)]);
    driver.advance_time(100).unwrap();
    assert_eq!(released(&mut out), [("b".to_string(), 10_200)]);
    driver.advance_time(100).unwrap();
    assert_eq!(released(&mut out), [("c".to_string(), 10_300)]);

    let m = driver.metrics("ledger").unwrap();
    assert_eq!(
        (m.ticks, m.ticks_read, m.delivered, m.late, m.parked),
        (4, 4, 3, 0, 0),
        "ticks are read back and never delivered: {m:?}"
    );
    // The ticks: the driver's time, the task's partition as key, an empty value, no stamp.
    let ticks = clock.read_records();
    let seen: Vec<(i64, &str, &str, bool)> = ticks
        .iter()
        .map(|r| {
            (
                r.timestamp,
                r.key.as_str(),
                r.value.as_str(),
                r.headers.is_empty(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (10_000, "0", "", true),
            (10_600, "0", "", true),
            (10_700, "0", "", true),
            (10_800, "0", "", true),
        ]
    );
}

#[test]
fn parked_records_and_the_built_in_clock_resume_after_a_restart() {
    let driver = TopologyTestDriver::builder(clocked())
        .start_time_ms(10_000)
        .build()
        .unwrap();
    let events = driver.input_topic("events", Utf8, Utf8).unwrap();
    let more = driver.input_topic("more", Utf8, Utf8).unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    events.pipe_at("k".into(), "b".into(), 10_700).unwrap();
    more.pipe_at("j".into(), "a".into(), 10_600).unwrap();
    driver.advance_time(600).unwrap();
    assert_eq!(
        driver.task_metrics("ledger").unwrap()[0].watermark_ms,
        Some(10_100)
    );
    assert!(out.is_empty());

    // Stopped: a record arrives meanwhile. Restored, the task finds both parked records and the
    // watermark, reads the new record and ticks again at once, at the time now.
    driver.set_auto_run(false);
    events.pipe_at("k".into(), "c".into(), 10_650).unwrap();
    driver.restart().unwrap();
    driver.run().unwrap();
    let task = &driver.task_metrics("ledger").unwrap()[0];
    assert_eq!(
        (task.parked, task.watermark_ms, task.ticks),
        (3, Some(10_100), 1),
        "restored, then one tick at 10,600"
    );
    assert!(out.is_empty());
    driver.set_auto_run(true);
    driver.advance_time(700).unwrap();
    assert_eq!(
        released(&mut out),
        [
            ("a".to_string(), 10_600),
            ("c".to_string(), 10_650),
            ("b".to_string(), 10_700)
        ]
    );
    assert_eq!(driver.metrics("ledger").unwrap().late, 0);
}
