//! `process_with`: a `process` operator's punctuators through the topology test driver. They
//! read and write the handler's state of any key, their emissions go through the operators
//! after it, stamped with the punctuation's time, in event-time order with the records; both
//! types of schedule survive a restart.

use parsley_runtime::driver::TopologyTestDriver;
use parsley_stage::{
    EventTimeOrder, FoldStates, Handler, HandlerResult, Punctuated, PunctuationType,
    PunctuatorResult, Record, Step, Utf8,
};

use crate::StreamsBuilder;

/// Counts each key's records; emits `rec {value}`.
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
        Ok(Step::none()
            .emit("", r.key, format!("rec {}", r.value))
            .set_state(n.unwrap_or(0) + 1))
    }
}

/// `p{n} a={a} b={b}` under key `punct`, `n` kept as the state of key `punct`.
fn report(
    _: parsley_stage::Punctuation,
    state: &FoldStates<'_, String, u64>,
) -> PunctuatorResult<String, String, u64> {
    let a = state.get(&"a".to_string())?.unwrap_or(0);
    let b = state.get(&"b".to_string())?.unwrap_or(0);
    let n = state.get(&"punct".to_string())?.unwrap_or(0) + 1;
    Ok(Punctuated::none()
        .emit("", "punct".to_string(), format!("p{n} a={a} b={b}"))
        .set_state("punct".to_string(), n))
}

fn driver(order: EventTimeOrder, kind: PunctuationType, interval_ms: i64) -> TopologyTestDriver {
    let builder = StreamsBuilder::new("app");
    builder.event_time(order);
    builder
        .stream::<String, String>("events")
        .process_with(Counter, |s| s.schedule(interval_ms, kind, report))
        .map_values(|v| format!("{v}!"))
        .to("out");
    TopologyTestDriver::builder(builder.build().unwrap())
        .start_time_ms(10_000)
        .build()
        .unwrap()
}

fn read(driver: &TopologyTestDriver) -> Vec<(String, i64)> {
    driver
        .output_topic("out", Utf8, Utf8)
        .unwrap()
        .read_records()
        .into_iter()
        .map(|r| (r.value, r.timestamp))
        .collect()
}

fn owned(expected: &[(&str, i64)]) -> Vec<(String, i64)> {
    expected.iter().map(|(v, t)| (v.to_string(), *t)).collect()
}

#[test]
fn a_stream_time_punctuator_reads_and_writes_the_handlers_state_and_survives_a_restart() {
    let driver = driver(EventTimeOrder::new(), PunctuationType::StreamTime, 10);
    let events = driver.input_topic("events", Utf8, Utf8).unwrap();
    events.pipe_at("a".into(), "a1".into(), 5).unwrap();
    events.pipe_at("b".into(), "b1".into(), 27).unwrap();
    let mut seen = read(&driver);
    assert_eq!(
        seen,
        owned(&[
            ("rec a1!", 5),
            ("p1 a=1 b=0!", 10),
            ("p2 a=1 b=0!", 20),
            ("rec b1!", 27)
        ])
    );
    driver.restart().unwrap();
    events.pipe_at("a".into(), "a2".into(), 30).unwrap();
    let all = read(&driver);
    seen.extend(owned(&[("rec a2!", 30), ("p3 a=2 b=1!", 30)]));
    assert_eq!(all, seen);
    // The punctuator's count is a slot of key `punct`'s state, beside nothing else.
    let raw = driver
        .raw_state("events", b"punct")
        .unwrap()
        .expect("state of punct");
    assert_eq!(
        crate::read_slot::<u64>(&raw, "process-0001").unwrap(),
        Some(3)
    );
}

#[test]
fn a_wall_clock_punctuator_fires_on_the_ticks() {
    let driver = driver(
        EventTimeOrder::new().clock(500),
        PunctuationType::WallClockTime,
        1_000,
    );
    let events = driver.input_topic("events", Utf8, Utf8).unwrap();
    events.pipe_at("a".into(), "a1".into(), 10_400).unwrap();
    driver.advance_time(1_000).unwrap();
    assert_eq!(
        read(&driver),
        owned(&[("rec a1!", 10_400), ("p1 a=1 b=0!", 11_000)])
    );
    driver.restart().unwrap();
    driver.advance_time(1_000).unwrap();
    assert_eq!(
        read(&driver)
            .into_iter()
            .filter(|(v, _)| v.starts_with('p'))
            .collect::<Vec<_>>(),
        owned(&[("p1 a=1 b=0!", 11_000), ("p2 a=1 b=0!", 12_000)])
    );
}
