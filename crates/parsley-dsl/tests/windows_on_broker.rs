//! Windows on the real broker: a tumbling count over a history written before the start gives
//! exactly one final result per key and closed window, with the count the input gives; the
//! windows still open when the runtime stops close after a restart with the records from
//! before it (their state and keyed timers come back from the changelog); on live traffic with
//! the built-in clock, windows close when the clock passes them, with no further input; a
//! sliding count gives one final result per window the records define, each with the records
//! within the time difference; a suppressed table emits each key's latest value once per limit
//! of event time.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parsley_dsl::{SlidingWindows, StreamsBuilder, TimeWindows, Windowed};
use parsley_runtime::{Runtime, RuntimeConfig, partition_for};
use parsley_stage::EventTimeOrder;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, create_topic, raw_producer, read_committed, unique_topic, wait_committed,
};
use rdkafka::producer::{BaseRecord, Producer};

const PARTITIONS: i32 = 2;
const WINDOW_MS: i64 = 1_000;

/// Writes `records` (user, event time) to `topic`, each to the partition its key hashes to.
fn write(topic: &str, records: &[(String, i64)]) {
    let producer = raw_producer(None);
    for (user, at) in records {
        producer
            .send(
                BaseRecord::to(topic)
                    .partition(partition_for(user.as_bytes(), PARTITIONS))
                    .key(user.as_str())
                    .payload("click")
                    .timestamp(*at),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(DEADLINE).unwrap();
}

/// The final count of every (user, window start) closed by the watermark of each partition's
/// task: a window closes when its task's watermark (the highest event time it delivered)
/// reaches its end.
fn expected(records: &[(String, i64)]) -> BTreeMap<(String, i64), i64> {
    let mut watermark = BTreeMap::<i32, i64>::new();
    for (user, at) in records {
        let p = partition_for(user.as_bytes(), PARTITIONS);
        let w = watermark.entry(p).or_insert(i64::MIN);
        *w = (*w).max(*at);
    }
    let mut counts = BTreeMap::new();
    for (user, at) in records {
        let start = at - at.rem_euclid(WINDOW_MS);
        if start + WINDOW_MS <= watermark[&partition_for(user.as_bytes(), PARTITIONS)] {
            *counts.entry((user.clone(), start)).or_insert(0) += 1;
        }
    }
    counts
}

/// Every final result in `topic`: (user, window start) → counts, in the order written.
fn finals(topic: &parsley_runtime::TopicInfo) -> BTreeMap<(String, i64), Vec<i64>> {
    let mut out = BTreeMap::<(String, i64), Vec<i64>>::new();
    for r in read_committed(topic) {
        let w: Windowed<String> = serde_json::from_slice(&r.key.unwrap()).unwrap();
        assert_eq!(w.end - w.start, WINDOW_MS);
        let n: i64 = serde_json::from_slice(&r.value.unwrap()).unwrap();
        out.entry((w.key, w.start)).or_default().push(n);
    }
    out
}

#[test]
fn tumbling_windows_give_one_final_count_each_and_survive_a_restart() {
    let clicks = create_topic("win-clicks", PARTITIONS);
    let counts = create_topic("win-counts", PARTITIONS);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let base = now - 600_000;
    let base = base - base.rem_euclid(WINDOW_MS);
    // 600 clicks of 6 users over 30 windows, event times out of order within each window.
    let first: Vec<(String, i64)> = (0..600i64)
        .map(|i| {
            (
                format!("u{}", i % 6),
                base + (i / 20) * WINDOW_MS + (i * 7919) % WINDOW_MS,
            )
        })
        .collect();
    write(&clicks.name, &first);

    let app = unique_topic("win-app");
    let topology = || {
        let b = StreamsBuilder::new(app.clone());
        b.stream::<String, String>(&clicks.name)
            .group_by_key()
            .named("per-second")
            .windowed_by(TimeWindows::of_size(Duration::from_millis(
                WINDOW_MS as u64,
            )))
            .count()
            .to_stream()
            .to(&counts.name);
        b.build().unwrap()
    };
    let running = Runtime::new(topology(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let m = wait_committed(&running, &clicks.name, first.len() as u64);
    running.stop().unwrap();
    let before = expected(&first);
    assert!(before.len() > 100, "{} windows closed", before.len());
    assert_eq!(m.too_late, 0);
    let got = finals(&counts);
    assert_eq!(
        got,
        before.iter().map(|(k, n)| (k.clone(), vec![*n])).collect(),
        "one final count per closed window, none for open ones"
    );

    // Later clicks close the windows that were open at the stop: their counts include the
    // clicks from before the restart.
    let second: Vec<(String, i64)> = (0..60i64)
        .map(|i| (format!("u{}", i % 6), base + 40 * WINDOW_MS + i))
        .collect();
    write(&clicks.name, &second);
    let running = Runtime::new(topology(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, &clicks.name, second.len() as u64);
    running.stop().unwrap();
    let all: Vec<(String, i64)> = first.iter().chain(&second).cloned().collect();
    let after = expected(&all);
    assert_eq!(
        finals(&counts),
        after.iter().map(|(k, n)| (k.clone(), vec![*n])).collect(),
        "each window exactly once, with every click of its window"
    );
}

#[test]
fn live_windows_close_on_the_built_in_clock_with_no_further_input() {
    let clicks = create_topic("win-live", PARTITIONS);
    let counts = create_topic("win-live-counts", PARTITIONS);
    let app = unique_topic("win-live-app");
    let b = StreamsBuilder::new(app.clone());
    // The lag covers the records' way to the task on a loaded machine: a record that reaches
    // its task more than the lag after its event time is late (and this test would fail).
    b.event_time(EventTimeOrder::new().clock(2_000).tick_interval_ms(50));
    b.stream::<String, String>(&clicks.name)
        .group_by_key()
        .named("per-half-second")
        .windowed_by(TimeWindows::of_size(Duration::from_millis(500)))
        .count()
        .to_stream()
        .to(&counts.name);
    let running = Runtime::new(b.build().unwrap(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    // Live clicks with event times over the next 1.2 s: parked until the clock (wall time
    // minus 2 s) passes them, and their windows closed by the clock alone — nothing is
    // written after them.
    let start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let live: Vec<(String, i64)> = (0..60i64)
        .map(|i| (format!("u{}", i % 6), start + i * 20))
        .collect();
    write(&clicks.name, &live);
    let mut windows = BTreeMap::<(String, i64), i64>::new();
    for (user, at) in &live {
        *windows
            .entry((user.clone(), at - at.rem_euclid(500)))
            .or_insert(0) += 1;
    }
    // Wait for the evidence: every window's final result committed.
    let deadline = std::time::Instant::now() + DEADLINE;
    let mut got = BTreeMap::<(String, i64), Vec<i64>>::new();
    while got.values().map(Vec::len).sum::<usize>() < windows.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} windows closed",
            got.len(),
            windows.len()
        );
        got = BTreeMap::new();
        for r in read_committed(&counts) {
            let w: Windowed<String> = serde_json::from_slice(&r.key.unwrap()).unwrap();
            let n: i64 = serde_json::from_slice(&r.value.unwrap()).unwrap();
            got.entry((w.key, w.start)).or_default().push(n);
        }
    }
    let m = running
        .metrics()
        .into_iter()
        .find(|(s, _)| *s == clicks.name)
        .unwrap()
        .1;
    running.stop().unwrap();
    assert_eq!(m.too_late, 0);
    assert_eq!(m.late, 0);
    assert_eq!(
        got,
        windows.iter().map(|(k, n)| (k.clone(), vec![*n])).collect(),
        "each window once, closed by the clock"
    );
}

#[test]
fn sliding_windows_give_one_final_count_per_window_the_records_define() {
    const DIFFERENCE_MS: i64 = 1_000;
    let clicks = create_topic("win-slide-clicks", PARTITIONS);
    let counts = create_topic("win-slide-counts", PARTITIONS);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let base = now - 600_000;
    // 300 clicks of 5 users over 30 s, written out of event-time order: the task releases the
    // history in event-time order.
    let records: Vec<(String, i64)> = (0..300i64)
        .map(|i| (format!("u{}", i % 5), base + (i * 7919) % 30_000))
        .collect();
    write(&clicks.name, &records);

    // The windows the records define, per user: each record's left window [t - d, t], and its
    // right window [t + 1, t + 1 + d] when a later record lies within d after it; each counts
    // the user's records within it. Closed: its end before its task's watermark, the highest
    // event time of the partition.
    let mut by_user = BTreeMap::<String, Vec<i64>>::new();
    let mut watermark = BTreeMap::<i32, i64>::new();
    for (user, at) in &records {
        by_user.entry(user.clone()).or_default().push(*at);
        let w = watermark
            .entry(partition_for(user.as_bytes(), PARTITIONS))
            .or_insert(i64::MIN);
        *w = (*w).max(*at);
    }
    let mut expected = BTreeMap::<(String, i64), Vec<i64>>::new();
    for (user, times) in &by_user {
        let w = watermark[&partition_for(user.as_bytes(), PARTITIONS)];
        let mut starts: Vec<i64> = times.iter().map(|t| t - DIFFERENCE_MS).collect();
        starts.extend(
            times
                .iter()
                .filter(|t| times.iter().any(|u| u > t && *u <= *t + DIFFERENCE_MS))
                .map(|t| t + 1),
        );
        for start in starts {
            let count = times
                .iter()
                .filter(|t| (start..=start + DIFFERENCE_MS).contains(t))
                .count() as i64;
            if start + DIFFERENCE_MS < w {
                expected.insert((user.clone(), start), vec![count]);
            }
        }
    }

    let app = unique_topic("win-slide-app");
    let b = StreamsBuilder::new(app);
    b.stream::<String, String>(&clicks.name)
        .group_by_key()
        .named("per-second-sliding")
        .windowed_by(SlidingWindows::of_time_difference_with_no_grace(
            Duration::from_millis(DIFFERENCE_MS as u64),
        ))
        .count()
        .to_stream()
        .to(&counts.name);
    let running = Runtime::new(b.build().unwrap(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let m = wait_committed(&running, &clicks.name, records.len() as u64);
    running.stop().unwrap();
    assert_eq!(m.too_late, 0);
    assert!(expected.len() > 300, "{} windows closed", expected.len());
    let mut got = BTreeMap::<(String, i64), Vec<i64>>::new();
    for r in read_committed(&counts) {
        let w: Windowed<String> = serde_json::from_slice(&r.key.unwrap()).unwrap();
        assert_eq!(w.end - w.start, DIFFERENCE_MS, "[start, start + d]");
        let n: i64 = serde_json::from_slice(&r.value.unwrap()).unwrap();
        got.entry((w.key, w.start)).or_default().push(n);
    }
    assert_eq!(got, expected, "one final count per closed window");
}

#[test]
fn a_suppressed_table_emits_each_keys_latest_value_once_per_limit_of_event_time() {
    const LIMIT_MS: i64 = 2_000;
    let stock = create_topic("win-suppress-stock", PARTITIONS);
    let out = create_topic("win-suppress-out", PARTITIONS);
    let base = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 600_000;
    // 240 stock levels of 6 items over 30 s, written out of event-time order.
    let records: Vec<(String, String, i64)> = (0..240i64)
        .map(|i| {
            let at = base + (i * 7919) % 30_000;
            (format!("item-{}", i % 6), format!("{i}"), at)
        })
        .collect();
    let producer = raw_producer(None);
    for (item, level, at) in &records {
        producer
            .send(
                BaseRecord::to(&stock.name)
                    .partition(partition_for(item.as_bytes(), PARTITIONS))
                    .key(item.as_str())
                    .payload(level.as_str())
                    .timestamp(*at),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(DEADLINE).unwrap();

    // Per partition, in event-time order (offset order among equal times): a buffer opened at
    // `t` is emitted with its latest value once a record after `t + limit` comes, or when the
    // partition's watermark (its highest event time) reaches `t + limit`.
    let mut expected = BTreeMap::<String, Vec<(String, i64)>>::new();
    for p in 0..PARTITIONS {
        let mut mine: Vec<&(String, String, i64)> = records
            .iter()
            .filter(|(item, _, _)| partition_for(item.as_bytes(), PARTITIONS) == p)
            .collect();
        mine.sort_by_key(|(_, _, at)| *at);
        let watermark = mine.last().map_or(i64::MIN, |r| r.2);
        // item → (since, latest level, its time)
        let mut open = BTreeMap::<String, (i64, String, i64)>::new();
        let mut emit_due = |open: &mut BTreeMap<String, (i64, String, i64)>,
                            due: &dyn Fn(i64) -> bool| {
            open.retain(|item, (since, level, at)| {
                if due(*since + LIMIT_MS) {
                    expected
                        .entry(item.clone())
                        .or_default()
                        .push((level.clone(), *at));
                    false
                } else {
                    true
                }
            });
        };
        for (item, level, at) in mine {
            emit_due(&mut open, &|due| due < *at);
            let entry = open
                .entry(item.clone())
                .or_insert((*at, String::new(), *at));
            entry.1 = level.clone();
            entry.2 = *at;
        }
        emit_due(&mut open, &|due| due <= watermark);
    }

    let app = unique_topic("win-suppress-app");
    let b = StreamsBuilder::new(app);
    b.table::<String, String>(&stock.name)
        .suppress(parsley_dsl::Suppressed::until_time_limit(
            Duration::from_millis(LIMIT_MS as u64),
        ))
        .to_stream()
        .to(&out.name);
    let running = Runtime::new(b.build().unwrap(), RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, &stock.name, records.len() as u64);
    running.stop().unwrap();
    let mut got = BTreeMap::<String, Vec<(String, i64)>>::new();
    for r in read_committed(&out) {
        got.entry(String::from_utf8(r.key.unwrap()).unwrap())
            .or_default()
            .push((
                String::from_utf8(r.value.unwrap()).unwrap(),
                r.timestamp.unwrap(),
            ));
    }
    let emitted: usize = expected.values().map(Vec::len).sum();
    assert!(
        (30..240).contains(&emitted),
        "{emitted} of 240 updates emitted"
    );
    assert_eq!(got, expected, "each item's emissions, in order");
}
