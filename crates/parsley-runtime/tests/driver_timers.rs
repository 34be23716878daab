//! Keyed event-time timers in the topology test driver: set by a processor, fired once in
//! (time, key) order when the task's watermark reaches them — interleaved with the records
//! the watermark released, in event-time order — and restored from the changelog after a
//! restart.

use std::sync::Arc;

use parsley_runtime::driver::{RawInput, TopologyTestDriver};
use parsley_stage::{
    Error, EventTimeOrder, Processor, RawEmission, RawRecord, RawStep, RawTimer, StageSettings,
    StateChange, Topology, Utf8,
};

/// For each record `k=v` at event time `t`: emits `k: v` and sets a timer for `k` at `t + 10`;
/// each timer emits `k: timer t (watermark w)` and deletes the key's state. The state counts
/// the key's records since its last timer.
struct Reminders;

fn emission(key: &[u8], value: String) -> RawEmission {
    RawEmission {
        topic: Arc::from("out"),
        key: Some(key.to_vec()),
        value: Some(value.into_bytes()),
        timestamp: None,
        headers: None,
    }
}

impl Processor for Reminders {
    fn process(&self, r: RawRecord<'_>, state: Option<&[u8]>) -> Result<RawStep, Error> {
        let key = r.key.unwrap_or_default();
        let seen = state.map_or(0, |s| s[0]) + 1;
        let value = String::from_utf8_lossy(r.value.unwrap_or_default());
        Ok(RawStep {
            emit: vec![emission(
                key,
                format!("{value} (watermark {:?})", r.watermark),
            )],
            state: StateChange::Set(vec![seen]),
            task_state: StateChange::Keep,
            timers: vec![r.timestamp + 10],
            too_late: 0,
        })
    }

    fn on_timer(&self, t: RawTimer<'_>, state: Option<&[u8]>) -> Result<RawStep, Error> {
        let seen = state.map_or(0, |s| s[0]);
        Ok(RawStep {
            emit: vec![emission(
                t.key,
                format!("timer {} after {seen} (watermark {})", t.time, t.watermark),
            )],
            state: StateChange::Delete,
            task_state: StateChange::Keep,
            timers: Vec::new(),
            too_late: 0,
        })
    }

    fn uses_timers(&self) -> bool {
        true
    }
}

fn topology(event_time: bool) -> Result<Topology, parsley_stage::Error> {
    let settings = StageSettings::new().source("events").sink("out");
    let settings = if event_time {
        settings.order_by_event_time(EventTimeOrder::new())
    } else {
        settings
    };
    Topology::builder("app")
        .processor_stage("reminders", Arc::new(Reminders), settings)
        .build()
}

fn pipe(driver: &TopologyTestDriver, key: &str, value: &str, at: i64) {
    driver
        .pipe_raw(
            "events",
            RawInput::new(Some(key.as_bytes()), Some(value.as_bytes())).timestamp(at),
        )
        .unwrap();
}

#[test]
fn timers_fire_once_interleaved_with_the_released_records_in_event_time_order() {
    let driver = TopologyTestDriver::builder(topology(true).unwrap())
        .build()
        .unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    pipe(&driver, "b", "b1", 100); // timer b@110
    pipe(&driver, "a", "a1", 102); // timer a@112
    pipe(&driver, "b", "b2", 100); // timer b@110 again: set once
    assert_eq!(driver.task_metrics("reminders").unwrap()[0].timers, 2);
    pipe(&driver, "c", "c1", 111); // the watermark reaches 111: b's timer (110) first
    assert_eq!(
        out.read_key_values(),
        [
            ("b".to_string(), "b1 (watermark Some(100))".to_string()),
            ("a".into(), "a1 (watermark Some(102))".into()),
            ("b".into(), "b2 (watermark Some(102))".into()),
            ("b".into(), "timer 110 after 2 (watermark 110)".into()),
            ("c".into(), "c1 (watermark Some(111))".into()),
        ]
    );
    assert_eq!(driver.metrics("reminders").unwrap().timers_fired, 1);
    assert_eq!(driver.raw_state("reminders", b"b").unwrap(), None);

    // A timer's emission carries the timer's time as its timestamp.
    pipe(&driver, "c", "c2", 130); // a@112 and c@121 fire, in time order
    let records = out.read_records();
    let fired: Vec<(&str, i64)> = records
        .iter()
        .filter(|r| r.value.starts_with("timer"))
        .map(|r| (r.key.as_str(), r.timestamp))
        .collect();
    assert_eq!(fired, [("a", 112), ("c", 121)]);
    assert_eq!(driver.task_metrics("reminders").unwrap()[0].timers, 1);
}

#[test]
fn timers_survive_a_restart_through_the_changelog() {
    let driver = TopologyTestDriver::builder(topology(true).unwrap())
        .build()
        .unwrap();
    pipe(&driver, "a", "a1", 100);
    pipe(&driver, "b", "b1", 105);
    let changelog = driver.changelog("reminders", 0).unwrap();
    let timers = changelog
        .iter()
        .filter(|(k, _)| k.first() == Some(&0x05))
        .count();
    assert_eq!(timers, 2, "both timers are in the changelog: {changelog:?}");

    driver.restart().unwrap();
    let mut out = driver.output_topic("out", Utf8, Utf8).unwrap();
    out.read_records();
    pipe(&driver, "c", "c1", 200);
    let fired: Vec<String> = out
        .read_values()
        .into_iter()
        .filter(|v| v.starts_with("timer"))
        .collect();
    assert_eq!(
        fired,
        [
            "timer 110 after 1 (watermark 110)",
            "timer 115 after 1 (watermark 115)"
        ]
    );
    // Fired timers are tombstoned: a second restart brings back only c's.
    driver.restart().unwrap();
    assert_eq!(driver.task_metrics("reminders").unwrap()[0].timers, 1);
}

#[test]
fn a_stage_that_sets_timers_must_order_by_event_time() {
    let Err(Error::InvalidTopology { problems }) = topology(false) else {
        panic!("expected an invalid topology");
    };
    assert_eq!(
        problems,
        ["stage \"reminders\" sets event-time timers but does not order by event time"]
    );
}
