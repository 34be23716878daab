//! The replay check on the real broker: a two-stage event-time pipeline (re-keyed clicks
//! counted per user in windows, every update emitted, the built-in clock) fed while it runs
//! equals its two replays under randomized fetch sizes; a pipeline whose output names its own
//! application differs, and the check names the first difference exactly.

use std::time::Duration;

use parsley_dsl::{StreamsBuilder, TimeWindows};
use parsley_runtime::rdkafka::producer::{BaseRecord, Producer};
use parsley_runtime::{RuntimeConfig, partition_for};
use parsley_stage::EventTimeOrder;
use parsley_testkit::fixtures::{DEADLINE, bootstrap, create_topic, raw_producer};
use parsley_testkit::replay::{BoxError, Entry, Found, ReplayCheck};

const PARTITIONS: i32 = 2;
const USERS: usize = 5;

/// Writes `n` clicks (key: click id, value: user) to `topic`, timestamped now, each to the
/// partition its key hashes to; returns once they are acknowledged.
fn clicks(topic: &str, from: usize, n: usize) -> Result<(), BoxError> {
    let producer = raw_producer(None);
    for i in from..from + n {
        let key = format!("click-{i}");
        let user = format!("u{}", i % USERS);
        producer
            .send(
                BaseRecord::to(topic)
                    .partition(partition_for(key.as_bytes(), PARTITIONS))
                    .key(&key)
                    .payload(&user),
            )
            .map_err(|(e, _)| e)?;
    }
    producer.flush(DEADLINE)?;
    Ok(())
}

#[test]
fn a_windowed_count_behind_a_repartition_equals_its_replays() {
    let input = create_topic("replay-clicks", PARTITIONS);
    let topic = input.name.clone();
    let mut seen = Vec::new();
    let report = ReplayCheck::new(RuntimeConfig::new(bootstrap()), [&input.name])
        .outputs(["counts"])
        .replays(2)
        .seed(3)
        .timeout(DEADLINE)
        .on_run(|r| seen.push(r.name.clone()))
        .run(
            |app, outputs| {
                let builder = StreamsBuilder::new(app);
                builder.event_time(EventTimeOrder::new().clock(1_000));
                builder
                    .stream::<String, String>(&topic)
                    .select_key(|_, user| user.clone())
                    .group_by_key()
                    .named("per-user")
                    // A year: no window closes while the check runs.
                    .windowed_by(TimeWindows::of_size(Duration::from_secs(365 * 86_400)))
                    .emit_updates()
                    .count()
                    .to_stream()
                    .to(&outputs[0]);
                builder.build()
            },
            // Two bursts while the live pipeline runs.
            || {
                clicks(&input.name, 0, 150)?;
                clicks(&input.name, 150, 150)
            },
        )
        .unwrap();
    assert_eq!(seen, ["live", "replay 1", "replay 2"]);
    assert_eq!(report.runs(), 3);
    let live = &report.live;
    assert_eq!(
        (live.records, live.late, live.too_late, live.raised),
        (300, 0, 0, 0),
        "one update per click, in event-time order"
    );
    assert_eq!(live.keys, USERS, "one window per user");
    for r in &report.replays {
        assert!(r.fetch.is_some());
        assert_eq!((r.records, r.keys, r.late, r.raised), (300, USERS, 0, 0));
        assert_eq!(r.comparison.first, None, "{}", r.name);
    }
    assert!(report.identical());
    assert_ne!(report.replays[0].fetch, report.replays[1].fetch);
}

#[test]
fn a_pipeline_whose_output_differs_per_run_is_reported_at_its_first_record() {
    let input = create_topic("replay-names", PARTITIONS);
    let topic = input.name.clone();
    let report = ReplayCheck::new(RuntimeConfig::new(bootstrap()), [&input.name])
        .outputs(["tagged"])
        .replays(1)
        .timeout(DEADLINE)
        .run(
            |app, outputs| {
                let builder = StreamsBuilder::new(app);
                let app = app.to_string();
                builder
                    .stream::<String, String>(&topic)
                    .map_values(move |user| format!("{app}/{user}"))
                    .to(&outputs[0]);
                builder.build()
            },
            || clicks(&input.name, 0, 20),
        )
        .unwrap();
    assert!(!report.identical());
    let (run, d) = report.first_difference().unwrap();
    assert_eq!(run.name, "replay 1");
    assert_eq!(run.comparison.differing_keys, 20, "every key");
    assert_eq!((d.output.as_str(), d.index), ("tagged", 0));
    // Keys in byte order: click-0 comes first.
    assert_eq!(d.key.as_deref(), Some(&b"click-0"[..]));
    let partition = partition_for(b"click-0", PARTITIONS);
    let value = |app: &str| {
        Found::Record(Entry {
            partition,
            value: Some(format!("{app}/u0").into_bytes()),
        })
    };
    assert_eq!(d.live, value(&report.live.application_id));
    assert_eq!(d.replay, value(&run.application_id));
}
