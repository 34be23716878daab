//! An event-time stage behind a repartition topic, on the real broker. Every task of the
//! stage before it writes every partition of the topic, so the topic's event times interleave
//! within a partition, and while that stage reads its history the topic is short. Started
//! before the stage that writes its input, the window stage waits until that stage has
//! committed the history its sources held, parks the repartitioned history whole and takes it
//! in event-time order: none late, none parked behind another task's records.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parsley_dsl::{StreamsBuilder, TimeWindows, Windowed};
use parsley_runtime::{Runtime, RuntimeConfig, partition_for};
use parsley_stage::EventTimeOrder;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, create_topic, raw_producer, read_committed, unique_topic, wait_committed,
    wait_metrics,
};
use rdkafka::producer::{BaseRecord, Producer};
use serde::{Deserialize, Serialize};

const PARTITIONS: i32 = 4;
const PER_PARTITION: usize = 500;
const USERS: usize = 6;

/// A click: who, and when (its event time, also the record timestamp), ms since the epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Click {
    user: String,
    at: i64,
}

#[test]
fn a_window_behind_a_repartition_waits_for_the_writing_stage_and_takes_its_history_in_event_time_order()
 {
    let clicks = create_topic("xs-clicks", PARTITIONS);
    let out = create_topic("xs-out", PARTITIONS);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let base = now - 120_000;
    // Partition p holds 100 × (p + 1) clicks evenly over the same 8 s: each partition in
    // event-time order, the partitions interleaved in time, and read at equal fetch sizes the
    // sparser ones run ahead in event time.
    let mut keys: Vec<Vec<String>> = vec![Vec::new(); PARTITIONS as usize];
    for n in 0.. {
        let key = format!("click-{n}");
        let p = partition_for(key.as_bytes(), PARTITIONS) as usize;
        if keys[p].len() < PER_PARTITION * (p + 1) {
            keys[p].push(key);
        }
        if (0..keys.len()).all(|p| keys[p].len() == PER_PARTITION * (p + 1)) {
            break;
        }
    }
    let producer = raw_producer(None);
    let mut expected = BTreeMap::<(String, i64), Vec<i64>>::new();
    let mut total = 0u64;
    for (p, keys) in keys.iter().enumerate() {
        for (j, key) in keys.iter().enumerate() {
            let click = Click {
                user: format!("u{}", (j + p) % USERS),
                at: base + (j as i64) * 8_000 / keys.len() as i64,
            };
            let hour = click.at - click.at.rem_euclid(3_600_000);
            expected
                .entry((click.user.clone(), hour))
                .or_default()
                .push(click.at);
            let value = serde_json::to_vec(&click).unwrap();
            producer
                .send(
                    BaseRecord::to(&clicks.name)
                        .partition(p as i32)
                        .key(key)
                        .payload(&value)
                        .timestamp(click.at),
                )
                .map_err(|(e, _)| e)
                .unwrap();
            total += 1;
        }
    }
    producer.flush(DEADLINE).unwrap();
    for times in expected.values_mut() {
        times.sort_unstable();
    }

    let app = unique_topic("xs-app");
    let builder = StreamsBuilder::new(app.clone());
    builder.event_time(EventTimeOrder::new().clock(1_000));
    builder
        .stream::<String, Click>(&clicks.name)
        .select_key(|_, c| c.user.clone())
        .group_by_key()
        .named("per-user")
        .windowed_by(TimeWindows::of_size(Duration::from_secs(3_600)))
        .emit_updates()
        .aggregate(Vec::<i64>::new, |_, c, mut times| {
            times.push(c.at);
            times
        })
        .to_stream()
        .to(&out.name);
    let topology = builder.build().unwrap();
    // Small fetches and short transactions: the writing stage takes its partitions a few
    // records at a time, so its tasks' outputs interleave in every partition of the
    // repartition topic, and its later outputs claim its earlier, acknowledged ones by offset
    // — an offset above other tasks' records with later event times.
    let runtime = Runtime::new(
        topology,
        RuntimeConfig::new(bootstrap())
            .consumer_property("max.partition.fetch.bytes", "2048")
            .commit_interval(Duration::from_millis(10)),
    );
    // The window stage first: its clock runs (a tick read back) before any record reaches the
    // repartition topic, whose end at its start is 0.
    let window = runtime.start_stages(&["per-user"]).unwrap();
    wait_metrics(&window, "per-user", "a tick read back", |m| {
        m.ticks_read > 0
    });
    let writer = runtime.start_stages(&[clicks.name.as_str()]).unwrap();
    wait_committed(&writer, &clicks.name, total);
    let m = wait_committed(&window, "per-user", total);
    writer.stop().unwrap();
    window.stop().unwrap();

    assert_eq!(
        (m.late, m.raised, m.too_late),
        (0, 0, 0),
        "nothing late, nothing parked behind another task's records: {m:?}"
    );
    // Every update of a window lists its clicks so far in event-time order, and the last one
    // lists all of them.
    let mut last = BTreeMap::<(String, i64), Vec<i64>>::new();
    for r in read_committed(&out) {
        let w: Windowed<String> = serde_json::from_slice(&r.key.unwrap()).unwrap();
        let times: Vec<i64> = serde_json::from_slice(&r.value.unwrap()).unwrap();
        assert!(
            times.is_sorted(),
            "{} in window {}: out of event-time order: {times:?}",
            w.key,
            w.start
        );
        last.insert((w.key, w.start), times);
    }
    assert_eq!(last, expected);
}
