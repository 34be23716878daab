//! Sliding windows through the topology test driver: the windows the records define, their
//! aggregates and timestamps as Kafka Streams 4.4 gives them, final results when the watermark
//! passes a window's end, and records too late for every window routed.

use std::time::Duration;

use parsley_runtime::driver::{RawInput, TopologyTestDriver};
use parsley_stage::{Json, Topology, Utf8};

use crate::{LatePolicy, LateRecord, SlidingWindows, StreamsBuilder, Windowed};

/// Per key, `0` and each value folded with `+`, in windows of difference 10 ms and `grace`.
fn sums(updates: bool, grace: u64) -> Topology {
    let b = StreamsBuilder::new("app");
    b.on_late_record(LatePolicy::ToTopic("late".into()));
    let windows = SlidingWindows::of_time_difference_and_grace(
        Duration::from_millis(10),
        Duration::from_millis(grace),
    );
    let w = b
        .stream::<String, String>("in")
        .group_by_key()
        .named("sums")
        .windowed_by(windows);
    let w = if updates { w.emit_updates() } else { w };
    w.aggregate(|| "0".to_string(), |_, v, a| format!("{a}+{v}"))
        .to_stream()
        .to("out");
    b.build().unwrap()
}

fn pipe(driver: &TopologyTestDriver, key: &str, value: &str, at: i64) {
    driver
        .pipe_raw(
            "in",
            RawInput::new(Some(key.as_bytes()), Some(value.as_bytes())).timestamp(at),
        )
        .unwrap();
}

/// Every result from the start, as `key@start/end=value@timestamp`.
fn results(driver: &TopologyTestDriver) -> Vec<String> {
    let mut out = driver.output_topic("out", Json, Utf8).unwrap();
    out.read_records()
        .into_iter()
        .map(|r| {
            let w: Windowed<String> = r.key;
            let v: String = r.value;
            format!("{}@{}/{}={v}@{}", w.key, w.start, w.end, r.timestamp)
        })
        .collect()
}

#[test]
fn a_record_makes_its_left_window_and_the_right_window_of_the_record_before_it() {
    let d = TopologyTestDriver::builder(sums(true, 0)).build().unwrap();
    pipe(&d, "a", "1", 100);
    pipe(&d, "a", "2", 105);
    pipe(&d, "a", "3", 120);
    assert_eq!(
        results(&d),
        [
            // 100: its left window.
            "a@90/100=0+1@100",
            // 105: the right window of 100 (from the initializer), then its left window,
            // which starts from the window that ended before it (100's).
            "a@101/111=0+2@105",
            "a@95/105=0+1+2@105",
            // 120: nothing of 105 lies within 10 ms before it.
            "a@110/120=0+3@120",
        ]
    );
}

#[test]
fn a_record_between_two_takes_its_right_window_from_the_later_records() {
    let d = TopologyTestDriver::builder(sums(true, 20)).build().unwrap();
    pipe(&d, "a", "1", 100);
    pipe(&d, "a", "3", 108);
    // Out of order, within the grace: it joins the windows that hold it, latest first; its
    // left window starts from 100's; its right window [103, 113] holds what the latest window
    // holding it held before it: 108.
    pipe(&d, "a", "2", 102);
    assert_eq!(
        results(&d),
        [
            "a@90/100=0+1@100",
            "a@101/111=0+3@108",
            "a@98/108=0+1+3@108",
            "a@101/111=0+3+2@108",
            "a@98/108=0+1+3+2@108",
            "a@92/102=0+1+2@102",
            "a@103/113=0+3@108",
        ]
    );
}

#[test]
fn final_results_come_once_each_when_the_watermark_passes_the_window_end() {
    let d = TopologyTestDriver::builder(sums(false, 0)).build().unwrap();
    pipe(&d, "a", "1", 100);
    assert_eq!(results(&d), Vec::<String>::new(), "no window closed yet");
    // The watermark at 105 passes [90, 100]'s end.
    pipe(&d, "a", "2", 105);
    assert_eq!(results(&d), ["a@90/100=0+1@100"]);
    // At 120: [95, 105] and [101, 111], in the order they close; b's [110, 120] stays open.
    pipe(&d, "b", "x", 120);
    let closed = [
        "a@90/100=0+1@100",
        "a@95/105=0+1+2@105",
        "a@101/111=0+2@105",
    ];
    assert_eq!(results(&d), closed);
    // Too late for every window it belongs to (105 + 1 + 10 <= 120): routed, never folded.
    pipe(&d, "a", "late", 105);
    let mut late = d.output_topic("late", Utf8, Json).unwrap();
    let late: Vec<LateRecord<String>> = late.read_records().into_iter().map(|r| r.value).collect();
    assert_eq!(late.len(), 1);
    assert_eq!((late[0].value.as_str(), late[0].timestamp), ("late", 105));
    pipe(&d, "b", "y", 200);
    assert_eq!(results(&d)[3..], ["b@110/120=0+x@120"]);
}

#[test]
fn records_before_the_time_difference_share_the_window_from_the_epoch() {
    let d = TopologyTestDriver::builder(sums(true, 0)).build().unwrap();
    pipe(&d, "a", "1", 3);
    pipe(&d, "a", "2", 7);
    assert_eq!(
        results(&d),
        [
            "a@0/10=0+1@3",
            // 7: the right window of 3, then the window from the epoch.
            "a@4/14=0+2@7",
            "a@0/10=0+1+2@7",
        ]
    );
}

#[test]
#[should_panic(expected = "at least 1 ms")]
fn a_time_difference_of_zero_is_refused() {
    SlidingWindows::of_time_difference_with_no_grace(Duration::ZERO);
}

#[test]
fn windows_and_their_timers_survive_a_restart() {
    let d = TopologyTestDriver::builder(sums(false, 0)).build().unwrap();
    pipe(&d, "a", "1", 100);
    pipe(&d, "a", "2", 105);
    d.restart().unwrap();
    pipe(&d, "a", "3", 108);
    pipe(&d, "b", "x", 130);
    assert_eq!(
        results(&d),
        [
            "a@90/100=0+1@100",
            "a@95/105=0+1+2@105",
            "a@98/108=0+1+2+3@108",
            "a@101/111=0+2+3@108",
            "a@106/116=0+3@108",
        ]
    );
}
