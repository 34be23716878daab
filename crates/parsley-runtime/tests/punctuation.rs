//! Punctuation on the real broker (`StageBuilder::schedule`).
//!
//! - **Stream time**: records with fixed event times go through a stage ordered by event time;
//!   its punctuator fires once at each multiple of its interval the task's position passes,
//!   interleaved with the records in event time, with the multiple as timestamp; after a
//!   restart the schedule and the punctuator's state go on from the changelog.
//! - **Wall-clock time, live and replayed**: the punctuator runs on the built-in clock's ticks.
//!   A second application replays the same input *and the same ticks*: its stage reads the clock
//!   topic of the first from offset 0 (application `{app}` with stage `p-forward` has the clock
//!   topic `{app}-p-forward-clock`, the topic of application `{app}-p` with stage `forward`),
//!   under its own group and changelog. Its outputs up to the live run's last punctuation are
//!   the live run's, byte for byte: the same firings, at the same tick times, between the same
//!   records, seeing the same state.
//!
//! Tests wait on committed deliveries and committed outputs (end offsets), never on time.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parsley_clock::Channel;
use parsley_runtime::{Running, Runtime, RuntimeConfig, TopicInfo};
use parsley_stage::{
    EventTimeOrder, FoldStates, Handler, HandlerResult, Punctuated, Punctuation, PunctuationType,
    PunctuatorResult, Record, Step, Topology, Utf8, clock_topic,
};
use parsley_testkit::fixtures::{
    DEADLINE, create_topic, raw_producer, read_committed, unique_topic, wait_committed,
};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// The only key the tests write.
const KEY: &str = "k";

/// Counts the records of each key and emits `rec {value}` to its sink.
struct Counter(Arc<str>);

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
            .emit(self.0.clone(), r.key, format!("rec {}", r.value))
            .set_state(n))
    }
}

/// A punctuator emitting `p{n} seen={count of KEY}` to `sink`, `n` kept under key `punct`.
fn report(
    sink: Arc<str>,
) -> impl Fn(Punctuation, &FoldStates<'_, String, u64>) -> PunctuatorResult<String, String, u64>
+ Send
+ Sync
+ 'static {
    move |_, state| {
        let seen = state.get(&KEY.to_string())?.unwrap_or(0);
        let n = state.get(&"punct".to_string())?.unwrap_or(0) + 1;
        Ok(Punctuated::none()
            .emit(
                sink.clone(),
                "punct".to_string(),
                format!("p{n} seen={seen}"),
            )
            .set_state("punct".to_string(), n))
    }
}

fn topology(
    app: &str,
    stage: &str,
    input: &str,
    out: &str,
    order: EventTimeOrder,
    kind: PunctuationType,
    interval_ms: i64,
) -> Topology {
    let sink: Arc<str> = out.into();
    Topology::builder(app)
        .stage(stage, Counter(sink.clone()), |s| {
            s.source(input)
                .sink(out)
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
                .order_by_event_time(order)
                .schedule(interval_ms, kind, report(sink))
        })
        .build()
        .expect("a valid topology")
}

fn start(topology: &Topology) -> Running {
    Runtime::new(
        topology.clone(),
        RuntimeConfig::new(parsley_testkit::fixtures::bootstrap()),
    )
    .start()
    .unwrap()
}

fn send(producer: &BaseProducer, topic: &str, values: &[(&str, i64)]) {
    for (value, t) in values {
        producer
            .send(
                BaseRecord::to(topic)
                    .partition(0)
                    .key(KEY)
                    .payload(*value)
                    .timestamp(*t),
            )
            .map_err(|(e, _)| e)
            .expect("send");
    }
    producer.flush(DEADLINE).expect("flush");
}

/// `(value, timestamp)` of every committed record of `topic`.
fn outputs(topic: &TopicInfo) -> Vec<(String, i64)> {
    read_committed(topic)
        .into_iter()
        .map(|r| {
            (
                String::from_utf8(r.value.expect("a value")).expect("UTF-8"),
                r.timestamp.expect("a timestamp"),
            )
        })
        .collect()
}

/// Waits until `topic` holds at least `n` committed punctuation outputs; returns its outputs.
fn wait_punctuations(topic: &TopicInfo, n: usize) -> Vec<(String, i64)> {
    let started = Instant::now();
    loop {
        let out = outputs(topic);
        if out.iter().filter(|(v, _)| v.starts_with('p')).count() >= n {
            return out;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{n} punctuations not committed to {} within {DEADLINE:?}: {out:?}",
            topic.name
        );
    }
}

fn owned(expected: &[(&str, i64)]) -> Vec<(String, i64)> {
    expected.iter().map(|(v, t)| (v.to_string(), *t)).collect()
}

#[test]
fn stream_time_punctuation_fires_at_each_boundary_between_the_records_and_resumes_after_a_restart()
{
    let input = create_topic("punct-st-in", 1);
    let out = create_topic("punct-st-out", 1);
    let app = unique_topic("punct-st");
    let topology = topology(
        &app,
        "counter",
        &input.name,
        &out.name,
        EventTimeOrder::new(),
        PunctuationType::StreamTime,
        1_000,
    );
    // A multiple of the interval: the boundaries are `b + 1,000 * i`.
    let b = 1_700_000_000_000;
    let producer = raw_producer(None);
    let running = start(&topology);
    send(
        &producer,
        &input.name,
        &[
            ("x0", b + 100),
            ("x1", b + 500),
            ("x2", b + 3_200),
            ("x3", b + 3_300),
            ("x4", b + 5_000),
        ],
    );
    wait_committed(&running, "counter", 5);
    running.stop().unwrap();
    assert_eq!(
        outputs(&out),
        owned(&[
            ("rec x0", b + 100),
            ("rec x1", b + 500),
            ("p1 seen=2", b + 1_000),
            ("p2 seen=2", b + 2_000),
            ("p3 seen=2", b + 3_000),
            ("rec x2", b + 3_200),
            ("rec x3", b + 3_300),
            ("p4 seen=4", b + 4_000),
            ("rec x4", b + 5_000),
            ("p5 seen=5", b + 5_000),
        ])
    );

    // Every output, the punctuations' too, is stamped with the task's node clock: the first
    // punctuation claims at least the two records handled before it (input offsets 0 and 1;
    // the clock observes a record when the gate delivers it, before it is parked, so it may
    // claim more).
    let read = read_committed(&out);
    assert!(read.iter().all(|r| r.stamp.is_some()));
    let p1 = &read[2];
    assert_eq!(p1.value.as_deref(), Some(&b"p1 seen=2"[..]));
    let claimed = p1
        .stamp
        .as_ref()
        .unwrap()
        .clock
        .get(&Channel::new(input.id, 0));
    assert!(claimed >= Some(1), "{:?}", p1.stamp);

    // Restarted: the schedule (next at b + 6,000) and the count come back from the changelog.
    let running = start(&topology);
    send(&producer, &input.name, &[("x5", b + 6_100)]);
    wait_committed(&running, "counter", 1);
    running.stop().unwrap();
    assert_eq!(
        outputs(&out)[10..],
        owned(&[("p6 seen=5", b + 6_000), ("rec x5", b + 6_100)])
    );
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn wall_clock_punctuation_fires_on_the_ticks_and_a_replay_of_input_and_ticks_fires_it_alike() {
    // Far above how late a loaded machine hands a record to the stage: none is late.
    const LAG_MS: i64 = 3_000;
    const INTERVAL_MS: i64 = 300;
    let input = create_topic("punct-wc-in", 1);
    let live_out = create_topic("punct-wc-live", 1);
    let replay_out = create_topic("punct-wc-replay", 1);
    let app = unique_topic("punct-wc");
    let order = || EventTimeOrder::new().clock(LAG_MS).tick_interval_ms(50);
    let live = topology(
        &app,
        "p-forward",
        &input.name,
        &live_out.name,
        order(),
        PunctuationType::WallClockTime,
        INTERVAL_MS,
    );
    let replay = topology(
        &format!("{app}-p"),
        "forward",
        &input.name,
        &replay_out.name,
        order(),
        PunctuationType::WallClockTime,
        INTERVAL_MS,
    );
    assert_eq!(
        clock_topic(&app, "p-forward"),
        clock_topic(&format!("{app}-p"), "forward"),
        "both read one clock topic"
    );

    // Live: three bursts of records with event times a little behind now (below the lag: none
    // late), each followed by punctuations.
    let producer = raw_producer(None);
    let running = start(&live);
    let mut sent = 0;
    let mut fired = 0;
    for burst in 0..3 {
        let now = now_ms();
        let values: Vec<(String, i64)> = (0..4)
            .map(|i| (format!("x{burst}-{i}"), now - 100 + 20 * i))
            .collect();
        let refs: Vec<(&str, i64)> = values.iter().map(|(v, t)| (v.as_str(), *t)).collect();
        send(&producer, &input.name, &refs);
        sent += refs.len() as u64;
        wait_committed(&running, "p-forward", sent);
        fired = wait_punctuations(&live_out, fired + 2)
            .iter()
            .filter(|(v, _)| v.starts_with('p'))
            .count();
    }
    let m = running.stop().unwrap()[0].1;
    assert_eq!(
        m.late, 0,
        "no record reached the stage behind the clock: {m:?}"
    );
    let live_outputs = outputs(&live_out);
    // Up to the last punctuation: what the replay must repeat.
    let last = live_outputs
        .iter()
        .rposition(|(v, _)| v.starts_with('p'))
        .expect("punctuations");
    let live_outputs = &live_outputs[..=last];
    let records = live_outputs
        .iter()
        .filter(|(v, _)| v.starts_with("rec"))
        .count();
    assert!(
        records >= 8,
        "records between the punctuations: {live_outputs:?}"
    );
    // Each punctuation is at a tick's time past a multiple of the interval, in time order.
    let times: Vec<i64> = live_outputs
        .iter()
        .filter(|(v, _)| v.starts_with('p'))
        .map(|(_, t)| *t)
        .collect();
    assert!(times.is_sorted(), "{times:?}");
    assert!(
        times
            .windows(2)
            .all(|w| w[1] / INTERVAL_MS > w[0] / INTERVAL_MS),
        "one firing per multiple passed at most: {times:?}"
    );

    // The replay reads the input and the live run's ticks from offset 0.
    let running = start(&replay);
    wait_committed(&running, "forward", sent);
    wait_punctuations(&replay_out, times.len());
    running.stop().unwrap();
    let replayed = outputs(&replay_out);
    assert!(replayed.len() >= live_outputs.len(), "{replayed:?}");
    assert_eq!(
        &replayed[..live_outputs.len()],
        live_outputs,
        "the replay fires at the live run's points"
    );
}
