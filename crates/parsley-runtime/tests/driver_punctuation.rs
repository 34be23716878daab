//! Punctuation in the topology test driver: stream-time schedules fire at each multiple of
//! their interval the task's event-time position passes, interleaved with the records in event
//! time; wall-clock schedules fire on the built-in clock's ticks, once per tick past a
//! multiple; a punctuator reads and writes the task's fold state; and both survive a restart
//! through the changelog.

use parsley_runtime::driver::TopologyTestDriver;
use parsley_stage::{
    Error, EventTimeOrder, FoldStates, Handler, HandlerResult, Punctuated, Punctuation,
    PunctuationType, PunctuatorResult, Record, Step, Topology, Utf8,
};

/// Counts each key's records (`a`, `b`, … as keys) and emits `rec {value}` for each.
struct Counter;

impl Handler for Counter {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = u64;

    fn handle(
        &self,
        r: Record<'_, String, String>,
        n: Option<u64>,
    ) -> HandlerResult<String, String, u64> {
        let n = n.unwrap_or(0) + 1;
        Ok(Step::none()
            .emit("out", r.key, format!("rec {}", r.value))
            .set_state(n))
    }
}

/// Emits `p{n} a={a} b={b}` under key `punct`: the counts of keys `a` and `b` read from the
/// task's state, `n` the punctuations so far, kept under key `punct`.
fn report(
    p: Punctuation,
    state: &FoldStates<'_, String, u64>,
) -> PunctuatorResult<String, String, u64> {
    let a = state.get(&"a".to_string())?.unwrap_or(0);
    let b = state.get(&"b".to_string())?.unwrap_or(0);
    let n = state.get(&"punct".to_string())?.unwrap_or(0) + 1;
    assert_eq!(p.partition, 0);
    Ok(Punctuated::none()
        .emit("out", "punct".to_string(), format!("p{n} a={a} b={b}"))
        .set_state("punct".to_string(), n))
}

fn topology(
    order: EventTimeOrder,
    kind: PunctuationType,
    interval_ms: i64,
) -> Result<Topology, Error> {
    Topology::builder("app")
        .stage("counter", Counter, |s| {
            s.source("events")
                .sink("out")
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
                .order_by_event_time(order)
                .schedule(interval_ms, kind, report)
        })
        .build()
}

type Out<'a> = parsley_runtime::driver::OutputTopic<'a, String, String>;

/// `(value, timestamp)` of every record `out` has not read yet.
fn read(out: &mut Out<'_>) -> Vec<(String, i64)> {
    out.read_records()
        .into_iter()
        .map(|r| (r.value, r.timestamp))
        .collect()
}

fn owned(expected: &[(&str, i64)]) -> Vec<(String, i64)> {
    expected.iter().map(|(v, t)| (v.to_string(), *t)).collect()
}

#[test]
fn stream_time_punctuation_fires_at_each_boundary_in_event_time_order_and_survives_a_restart() {
    let driver = TopologyTestDriver::builder(
        topology(EventTimeOrder::new(), PunctuationType::StreamTime, 10).unwrap(),
    )
    .build()
    .unwrap();
    let events = driver.input_topic("events", Utf8, Utf8).unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();

    // The first position (5) arms the schedule: its first boundary is 10.
    events.pipe_at("a".into(), "a1".into(), 5).unwrap();
    assert_eq!(read(&mut out), owned(&[("rec a1", 5)]));
    // Boundary 10 fires before the record at 12, after the one at 5.
    events.pipe_at("b".into(), "b1".into(), 12).unwrap();
    assert_eq!(read(&mut out), owned(&[("p1 a=1 b=0", 10), ("rec b1", 12)]));
    // Several intervals at once: one firing per boundary, each at its boundary.
    events.pipe_at("a".into(), "a2".into(), 47).unwrap();
    assert_eq!(
        read(&mut out),
        owned(&[
            ("p2 a=1 b=1", 20),
            ("p3 a=1 b=1", 30),
            ("p4 a=1 b=1", 40),
            ("rec a2", 47)
        ])
    );
    // A record at a boundary goes first; the punctuation sees it.
    events.pipe_at("b".into(), "b2".into(), 50).unwrap();
    assert_eq!(read(&mut out), owned(&[("rec b2", 50), ("p5 a=2 b=2", 50)]));
    let changelog = driver.changelog("counter", 0).unwrap();
    assert!(
        changelog
            .iter()
            .any(|(k, v)| k == &[0x06, 0, 0, 0, 0] && v.is_some()),
        "the schedule is in the changelog: {changelog:?}"
    );

    // Restored: the punctuator's state and the schedule go on where they were.
    driver.restart().unwrap();
    assert_eq!(
        driver
            .state("counter", &"punct".to_string(), Utf8, parsley_stage::Json)
            .unwrap(),
        Some(5u64)
    );
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    out.read_records();
    events.pipe_at("a".into(), "a3".into(), 65).unwrap();
    assert_eq!(read(&mut out), owned(&[("p6 a=2 b=2", 60), ("rec a3", 65)]));
}

#[test]
fn wall_clock_punctuation_fires_on_the_ticks_read_back_once_per_tick_past_a_multiple() {
    let driver = TopologyTestDriver::builder(
        topology(
            EventTimeOrder::new().clock(500),
            PunctuationType::WallClockTime,
            1_000,
        )
        .unwrap(),
    )
    .start_time_ms(10_000)
    .build()
    .unwrap();
    let events = driver.input_topic("events", Utf8, Utf8).unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();

    // The first tick (10,000) arms the schedule: next at 11,000.
    events.pipe_at("a".into(), "a1".into(), 10_400).unwrap();
    events.pipe_at("b".into(), "b1".into(), 10_600).unwrap();
    driver.advance_time(900).unwrap();
    assert_eq!(read(&mut out), owned(&[("rec a1", 10_400)]));
    // The tick at 11,000 fires it at 11,000, in event time at 11,000 - 500: after `a1`,
    // before `b1`.
    driver.advance_time(100).unwrap();
    assert_eq!(read(&mut out), owned(&[("p1 a=1 b=0", 11_000)]));
    driver.advance_time(100).unwrap();
    assert_eq!(read(&mut out), owned(&[("rec b1", 10_600)]));
    // One tick past two multiples (12,000 and 13,000): one firing, at the tick's time.
    driver.advance_time(2_400).unwrap();
    assert_eq!(read(&mut out), owned(&[("p2 a=1 b=1", 13_500)]));

    // Restored: next at 14,000, the count at 2.
    driver.restart().unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    out.read_records();
    driver.advance_time(400).unwrap();
    assert!(
        read(&mut out).is_empty(),
        "13,900 is below the next multiple"
    );
    driver.advance_time(100).unwrap();
    assert_eq!(read(&mut out), owned(&[("p3 a=1 b=1", 14_000)]));
    assert_eq!(
        driver
            .state("counter", &"punct".to_string(), Utf8, parsley_stage::Json)
            .unwrap(),
        Some(3u64)
    );
}

#[test]
fn schedules_need_their_time_and_a_positive_interval() {
    let problems = |order, kind, interval| match topology(order, kind, interval) {
        Err(Error::InvalidTopology { problems }) => problems,
        other => panic!("expected an invalid topology, got {:?}", other.map(|_| ())),
    };
    assert_eq!(
        problems(EventTimeOrder::new(), PunctuationType::WallClockTime, 10),
        [
            "stage \"counter\": punctuation schedule 0 is on wall-clock time but the stage has no \
          built-in clock (EventTimeOrder::clock)"
        ]
    );
    assert_eq!(
        problems(
            EventTimeOrder::new().clock(0),
            PunctuationType::StreamTime,
            0
        ),
        ["stage \"counter\": punctuation schedule 0: interval 0 ms is not positive"]
    );
    let unordered = Topology::builder("app")
        .stage("counter", Counter, |s| {
            s.source("events")
                .sink("out")
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
                .schedule(10, PunctuationType::StreamTime, report)
        })
        .build();
    assert!(matches!(unordered, Err(Error::InvalidTopology { problems })
        if problems == ["stage \"counter\": punctuation schedule 0 is on stream time but the \
                         stage does not order by event time"]));
}
