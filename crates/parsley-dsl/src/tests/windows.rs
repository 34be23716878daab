//! Windowed aggregations through the topology test driver: windows close when the task's
//! watermark reaches their end plus grace, each final result is emitted once, state and timers
//! survive a restart, and records too late for every window they belong to are counted and
//! routed, never dropped silently.

use std::time::Duration;

use parsley_runtime::driver::{RawInput, TopologyTestDriver};
use parsley_stage::{Json, Nullable, Topology, Utf8};

use crate::{LatePolicy, LateRecord, SessionWindows, StreamsBuilder, TimeWindows, Windowed};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn pipe(driver: &TopologyTestDriver, topic: &str, key: &str, value: &str, at: i64) {
    driver
        .pipe_raw(
            topic,
            RawInput::new(Some(key.as_bytes()), Some(value.as_bytes())).timestamp(at),
        )
        .unwrap();
}

/// `(key, start, end, value, timestamp)` of every record of `topic` not read yet.
fn results(
    driver: &TopologyTestDriver,
    topic: &str,
    read: &mut usize,
) -> Vec<(String, i64, i64, i64, i64)> {
    let mut out = driver.output_topic(topic, Json, Json).unwrap();
    let all: Vec<_> = out
        .read_records()
        .into_iter()
        .map(|r| {
            let w: Windowed<String> = r.key;
            (w.key, w.start, w.end, r.value, r.timestamp)
        })
        .collect();
    let new = all[*read..].to_vec();
    *read = all.len();
    new
}

fn counts(windows: TimeWindows, late: LatePolicy) -> Topology {
    let b = StreamsBuilder::new("app");
    b.on_late_record(late);
    b.stream::<String, String>("clicks")
        .group_by_key()
        .named("clicks-per-10ms")
        .windowed_by(windows)
        .count()
        .to_stream()
        .to("counts");
    b.build().unwrap()
}

#[test]
fn tumbling_windows_emit_one_final_result_when_the_watermark_passes_their_end() {
    let t = counts(TimeWindows::of_size(ms(10)), LatePolicy::Count);
    assert!(
        t.stages()[0].event_time().is_some(),
        "windows order by event time"
    );
    assert!(
        t.describe()
            .to_string()
            .contains("clicks-per-10ms: windowed count (tumbling 10 ms, grace 0 ms)"),
        "{}",
        t.describe()
    );
    let driver = TopologyTestDriver::builder(t).build().unwrap();
    let mut read = 0;
    pipe(&driver, "clicks", "a", "x", 1);
    pipe(&driver, "clicks", "a", "x", 5);
    pipe(&driver, "clicks", "b", "x", 3); // below the watermark (5), its window still open
    pipe(&driver, "clicks", "a", "x", 9);
    assert!(
        results(&driver, "counts", &mut read).is_empty(),
        "no window closed yet"
    );
    pipe(&driver, "clicks", "a", "x", 10); // the watermark reaches 10: [0, 10) closes
    // Each result carries its window's latest event time, as in Kafka Streams.
    assert_eq!(
        results(&driver, "counts", &mut read),
        [("a".into(), 0, 10, 3, 9), ("b".into(), 0, 10, 1, 3)]
    );
    pipe(&driver, "clicks", "b", "x", 31); // [10, 20) of a closes, at 20
    assert_eq!(
        results(&driver, "counts", &mut read),
        [("a".into(), 10, 20, 1, 10)]
    );
    // A record whose only window closed is too late: counted, not aggregated.
    pipe(&driver, "clicks", "a", "x", 8);
    assert_eq!(driver.metrics("clicks").unwrap().too_late, 1);
    pipe(&driver, "clicks", "a", "x", 45);
    assert_eq!(
        results(&driver, "counts", &mut read),
        [("b".into(), 30, 40, 1, 31)]
    );
    // Closed windows leave no state: only the open window [40, 50) of a is kept.
    let open = driver.raw_states("clicks").unwrap();
    assert_eq!(open.len(), 1, "{open:?}");
}

#[test]
fn hopping_windows_with_grace_emit_every_update_and_nothing_when_they_close() {
    let windows = TimeWindows::of_size(ms(10)).advance_by(ms(5)).grace(ms(5));
    let b = StreamsBuilder::new("app");
    b.stream::<String, i64>("amounts")
        .group_by_key()
        .windowed_by(windows)
        .emit_updates()
        .reduce(|a, b| a + b)
        .to_stream()
        .to("sums");
    let driver = TopologyTestDriver::builder(b.build().unwrap())
        .build()
        .unwrap();
    let mut read = 0;
    pipe(&driver, "amounts", "k", "1", 7); // windows [0, 10) and [5, 15)
    pipe(&driver, "amounts", "k", "2", 12); // [5, 15) and [10, 20)
    assert_eq!(
        results(&driver, "sums", &mut read),
        [
            ("k".into(), 0, 10, 1, 7),
            ("k".into(), 5, 15, 1, 7),
            ("k".into(), 5, 15, 3, 12),
            ("k".into(), 10, 20, 2, 12),
        ]
    );
    // In the grace period of [0, 10) (it closes at 15): still counted in.
    pipe(&driver, "amounts", "k", "4", 9);
    assert_eq!(
        results(&driver, "sums", &mut read),
        [("k".into(), 0, 10, 5, 9), ("k".into(), 5, 15, 7, 12)]
    );
    pipe(&driver, "amounts", "k", "0", 20); // opens [15, 25) and [20, 30)
    // The updates, each with its window's latest event time; [0, 10) and [5, 15) close
    // without a result of their own (their last update was their value).
    assert_eq!(
        results(&driver, "sums", &mut read),
        [("k".into(), 15, 25, 0, 20), ("k".into(), 20, 30, 0, 20)]
    );
    // [5, 15) closed at 20: a record for it alone is too late.
    pipe(&driver, "amounts", "k", "9", 14);
    assert_eq!(
        results(&driver, "sums", &mut read),
        [("k".into(), 10, 20, 11, 14)]
    );
    assert_eq!(driver.metrics("amounts").unwrap().timers_fired, 2);
    pipe(&driver, "amounts", "k", "1", 26);
    assert_eq!(
        results(&driver, "sums", &mut read),
        [("k".into(), 20, 30, 1, 26), ("k".into(), 25, 35, 1, 26)]
    );
}

#[test]
fn hopping_windows_start_at_the_epoch_as_in_kafka_streams() {
    // Regression: a record at 0 in 10 ms windows every 5 ms was also counted in [-5, 5),
    // a window Kafka Streams never opens, with a timer and a final result of its own.
    let windows = TimeWindows::of_size(ms(10)).advance_by(ms(5));
    assert_eq!(windows.starts_of(0), [0]);
    assert_eq!(windows.starts_of(4), [0]);
    assert_eq!(windows.starts_of(5), [0, 5]);
    let driver = TopologyTestDriver::builder(counts(windows, LatePolicy::Count))
        .build()
        .unwrap();
    let mut read = 0;
    pipe(&driver, "clicks", "A", "x", 0);
    pipe(&driver, "clicks", "B", "x", 30);
    assert_eq!(
        results(&driver, "counts", &mut read),
        [("A".into(), 0, 10, 1, 0)]
    );
    assert_eq!(driver.metrics("clicks").unwrap().timers_fired, 1);
}

#[test]
fn open_windows_and_their_timers_survive_a_restart() {
    let driver =
        TopologyTestDriver::builder(counts(TimeWindows::of_size(ms(10)), LatePolicy::Count))
            .build()
            .unwrap();
    let mut read = 0;
    pipe(&driver, "clicks", "a", "x", 1);
    pipe(&driver, "clicks", "a", "x", 2);
    driver.restart().unwrap();
    pipe(&driver, "clicks", "a", "x", 3);
    pipe(&driver, "clicks", "b", "x", 11);
    assert_eq!(
        results(&driver, "counts", &mut read),
        [("a".into(), 0, 10, 3, 3)]
    );
    assert_eq!(driver.metrics("clicks").unwrap().timers_fired, 1);
}

#[test]
fn a_record_too_late_for_its_windows_goes_to_the_late_topic_with_its_window_and_watermark() {
    let t = counts(
        TimeWindows::of_size(ms(10)),
        LatePolicy::ToTopic("late-clicks".into()),
    );
    assert!(t.stages()[0].sinks().contains(&"late-clicks".to_string()));
    let driver = TopologyTestDriver::builder(t).build().unwrap();
    pipe(&driver, "clicks", "a", "x", 15);
    pipe(&driver, "clicks", "a", "late", 4);
    let mut late = driver.output_topic("late-clicks", Utf8, Json).unwrap();
    let records: Vec<(String, LateRecord<String>)> = late.read_key_values();
    assert_eq!(
        records,
        [(
            "a".to_string(),
            LateRecord {
                value: "late".to_string(),
                timestamp: 4,
                operator: "clicks-per-10ms".to_string(),
                window_start: 0,
                window_end: 10,
                watermark: 15,
            }
        )]
    );
    assert_eq!(driver.metrics("clicks").unwrap().too_late, 1);
}

#[test]
fn window_starts_cover_every_window_that_holds_a_time() {
    let tumbling = TimeWindows::of_size(ms(10));
    assert_eq!(tumbling.starts_of(0), [0]);
    assert_eq!(tumbling.starts_of(9), [0]);
    assert_eq!(tumbling.starts_of(10), [10]);
    let hopping = TimeWindows::of_size(ms(10)).advance_by(ms(3));
    assert_eq!(hopping.starts_of(10), [3, 6, 9]);
    assert_eq!(hopping.starts_of(2), [0]);
    assert_eq!(TimeWindows::of_size(ms(1)).starts_of(i64::MAX), [i64::MAX]);
}

#[test]
fn sessions_merge_within_the_gap_and_close_once_nothing_can_extend_them() {
    let b = StreamsBuilder::new("app");
    b.stream::<String, String>("clicks")
        .group_by_key()
        .named("visits")
        .windowed_by(SessionWindows::with_inactivity_gap(ms(10)))
        .count()
        .to_stream()
        .to("visits");
    let t = b.build().unwrap();
    assert!(
        t.describe()
            .to_string()
            .contains("visits: session count (gap 10 ms, grace 0 ms)")
    );
    let driver = TopologyTestDriver::builder(t).build().unwrap();
    let mut read = 0;
    pipe(&driver, "clicks", "a", "x", 100);
    pipe(&driver, "clicks", "a", "x", 108); // within the gap: [100, 108]
    pipe(&driver, "clicks", "b", "x", 109);
    pipe(&driver, "clicks", "a", "x", 118); // [100, 118]
    assert!(results(&driver, "visits", &mut read).is_empty());
    // b's [109, 109] could be extended up to 119: it closes at 120. A session's result
    // carries its end as its timestamp, as in Kafka Streams.
    pipe(&driver, "clicks", "b", "x", 125);
    assert_eq!(
        results(&driver, "visits", &mut read),
        [("b".into(), 109, 109, 1, 109)]
    );
    pipe(&driver, "clicks", "b", "x", 128); // b: [125, 128]
    assert!(
        results(&driver, "visits", &mut read).is_empty(),
        "a closes at 129"
    );
    pipe(&driver, "clicks", "b", "x", 129);
    assert_eq!(
        results(&driver, "visits", &mut read),
        [("a".into(), 100, 118, 3, 118)]
    );
    // No open session of a within the gap, and its own would be closed: too late.
    pipe(&driver, "clicks", "a", "x", 105);
    assert_eq!(driver.metrics("clicks").unwrap().too_late, 1);
    pipe(&driver, "clicks", "b", "x", 140); // beyond the gap: b's [125, 129] closes at 140
    assert_eq!(
        results(&driver, "visits", &mut read),
        [("b".into(), 125, 129, 3, 129)]
    );
    // Within the gap of a's closed [100, 118] but a session of its own would still be open:
    // it would extend a session whose final result is out, so it is too late too.
    pipe(&driver, "clicks", "a", "x", 127);
    assert_eq!(driver.metrics("clicks").unwrap().too_late, 2);
    pipe(&driver, "clicks", "b", "x", 160);
    assert_eq!(
        results(&driver, "visits", &mut read),
        [("b".into(), 140, 140, 1, 140)],
        "a opened nothing"
    );
}

#[test]
fn session_updates_retract_merged_sessions_and_aggregate_from_the_initializer() {
    let b = StreamsBuilder::new("app");
    b.stream::<String, String>("words")
        .group_by_key()
        .windowed_by(SessionWindows::with_inactivity_gap(ms(5)).grace(ms(2)))
        .emit_updates()
        .aggregate(
            || "0".to_string(),
            |_, w, acc| acc + &w,
            |_, a, b| a + "|" + &b,
        )
        .to_change_stream()
        .to("sentences");
    let driver = TopologyTestDriver::builder(b.build().unwrap())
        .build()
        .unwrap();
    pipe(&driver, "words", "k", "a", 10);
    pipe(&driver, "words", "k", "c", 16); // 6 ms later: a session of its own
    pipe(&driver, "words", "k", "b", 13); // within 5 ms of both: a b c
    let mut out = driver
        .output_topic("sentences", Json, Nullable(Utf8))
        .unwrap();
    let changes: Vec<(Windowed<String>, Option<String>)> = out.read_key_values();
    let w = |start, end| Windowed {
        key: "k".to_string(),
        start,
        end,
    };
    // As in Kafka Streams: the record starts from the initializer, merges the sessions it
    // joins into it (the earlier first), then is aggregated.
    assert_eq!(
        changes,
        [
            (w(10, 10), Some("0a".into())),
            (w(16, 16), Some("0c".into())),
            (w(10, 10), None),
            (w(16, 16), None),
            (w(10, 16), Some("0|0a|0cb".into())),
        ]
    );
    // Closes at 16 + 5 + 1 + 2 = 24, with no result of its own: its last update was it.
    pipe(&driver, "words", "j", "x", 24);
    assert_eq!(out.read_key_values().len(), 1, "j's own session only");
}

#[test]
fn a_session_aggregate_that_merges_starts_from_the_initializer_as_in_kafka_streams() {
    // Regression: with initializer "0", aggregator `agg+v` and merger `a+b`, gap 500 ms,
    // Kafka Streams gives `0+0+1+2` both when 2 comes after 1 and when it comes before.
    for (first, second) in [(10, 15), (600, 599)] {
        let b = StreamsBuilder::new("app");
        b.stream::<String, String>("in")
            .group_by_key()
            .windowed_by(SessionWindows::with_inactivity_gap(ms(500)))
            .aggregate(
                || "0".to_string(),
                |_, v, agg| format!("{agg}+{v}"),
                |_, a, b| format!("{a}+{b}"),
            )
            .to_stream()
            .to("out");
        let driver = TopologyTestDriver::builder(b.build().unwrap())
            .build()
            .unwrap();
        pipe(&driver, "in", "k", "1", first);
        pipe(&driver, "in", "k", "2", second);
        pipe(&driver, "in", "other", "x", 2_000);
        let mut out = driver.output_topic("out", Json, Utf8).unwrap();
        let finals: Vec<(Windowed<String>, String)> = out.read_key_values();
        assert_eq!(finals.len(), 1, "{finals:?}");
        assert_eq!(finals[0].1, "0+0+1+2", "records at {first} then {second}");
        assert_eq!(
            (finals[0].0.start, finals[0].0.end),
            (first.min(second), first.max(second))
        );
    }
}

/// The final results of `clicks` (user, event time) through a tumbling count, piped one run
/// per record, or all appended first and taken as one backlog.
fn finals_of(clicks: &[(&str, i64)], backlog: bool) -> Vec<(String, i64, i64, i64, i64)> {
    let driver =
        TopologyTestDriver::builder(counts(TimeWindows::of_size(ms(10)), LatePolicy::Count))
            .auto_run(!backlog)
            .build()
            .unwrap();
    for (user, at) in clicks {
        pipe(&driver, "clicks", user, "x", *at);
    }
    driver.run().unwrap();
    assert_eq!(driver.metrics("clicks").unwrap().too_late, 0);
    let mut read = 0;
    results(&driver, "counts", &mut read)
}

#[test]
fn a_backlog_released_at_once_gives_the_same_windows_as_records_one_by_one() {
    let clicks: Vec<(&str, i64)> = (0..200i64)
        .map(|i| {
            (
                ["a", "b", "c"][(i % 3) as usize],
                (i * 37) % 97 + (i / 50) * 100,
            )
        })
        .collect();
    // One by one, records below the watermark are late; as a backlog, history is released
    // in event-time order. Compare a history whose order the two share: sorted by time.
    let mut sorted = clicks.clone();
    sorted.sort_by_key(|(_, t)| *t);
    let one_by_one = finals_of(&sorted, false);
    let backlog = finals_of(&clicks, true);
    assert!(one_by_one.len() > 30, "{}", one_by_one.len());
    assert_eq!(backlog, one_by_one);
}
