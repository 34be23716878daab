//! The gate on the real broker: an effect that arrives long before its cause is held until the
//! cause is delivered. The same input through a stage with the gate switched off (the negative
//! control) delivers the effect first — so this test can fail, and would if the gate did
//! nothing.
//!
//! The race is made deterministic by the data, not by timing: the cause is the last of many
//! heavy records on one partition while the effect is the only, small record on another, and
//! the consumer fetches at most 64 KiB per partition per request. The effect arrives with the
//! first fetch response; the cause dozens of responses later.

use parsley_runtime::{
    CausalProducer, CausalProducerConfig, Channel, GateMode, OutgoingRecord, Runtime,
    RuntimeConfig, Stamp,
};
use parsley_stage::{Handler, HandlerError, Record, Step, Topology, Utf8};
use parsley_testkit::fixtures::{
    DEADLINE, admin, bootstrap, committed_values, create_topic, raw_producer, read_committed,
    send_stamped, unique_topic, utf8_stage, wait_committed, wait_metrics,
};

const CAUSES: usize = 300;

struct Log(String);

impl Handler for Log {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> Result<Step<String, String, ()>, HandlerError> {
        // Record the delivery order: the first bytes of the value name the record.
        Ok(Step::none().emit(self.0.as_str(), r.key, r.value[..12].to_string()))
    }
}

/// Runs a one-stage topology over `sources` with `gate` and returns the delivery order, the
/// stage's counters and its one task's counters.
fn delivery_order(
    gate: GateMode,
    sources: [&str; 2],
    total: u64,
) -> (
    Vec<String>,
    parsley_runtime::MetricsSnapshot,
    parsley_runtime::TaskMetrics,
) {
    let out = create_topic("gate-log", 1);
    let topology = Topology::builder(unique_topic("gate"))
        .stage("log", Log(out.name.clone()), |s| {
            s.source(sources[0])
                .source(sources[1])
                .sink(&out.name)
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap();
    let config = RuntimeConfig::new(bootstrap())
        .gate(gate)
        .consumer_property("max.partition.fetch.bytes", "65536")
        .consumer_property("fetch.max.bytes", "131072")
        .consumer_property("message.max.bytes", "131072");
    let running = Runtime::new(topology, config).start().unwrap();
    wait_committed(&running, "log", total);
    let task = running.task_metrics()[0].1[0];
    let metrics = running.stop().unwrap()[0].1;
    let order = read_committed(&out)
        .into_iter()
        .map(|r| String::from_utf8(r.value.unwrap()).unwrap())
        .collect();
    (order, metrics, task)
}

#[test]
fn an_effect_fetched_before_its_cause_is_held_and_without_the_gate_it_is_not() {
    let causes = create_topic("gate-causes", 1);
    let effects = create_topic("gate-effects", 1);
    let mut producer = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    let padding = "x".repeat(16 * 1024);
    for i in 0..CAUSES {
        let value = format!("cause-{i:06}{padding}");
        producer.send(&causes.name, b"k", value.as_bytes()).unwrap();
    }
    // The effect is sent after every cause was acknowledged: it claims causes@CAUSES-1.
    producer
        .send(
            &effects.name,
            b"k",
            format!("effect-00000{padding}").as_bytes(),
        )
        .unwrap();
    let acked = producer.flush().unwrap();
    let last_cause = acked
        .iter()
        .filter(|a| a.coordinate.channel.topic == causes.id)
        .map(|a| a.coordinate.offset)
        .max()
        .unwrap();
    assert_eq!(last_cause, CAUSES as i64 - 1);
    let total = CAUSES as u64 + 1;
    let sources = [causes.name.as_str(), effects.name.as_str()];

    let (order, metrics, task) = delivery_order(GateMode::Causal, sources, total);
    assert_eq!(order.len(), CAUSES + 1);
    assert_eq!(
        order.iter().position(|v| v.starts_with("effect")),
        Some(CAUSES),
        "with the gate, the effect comes after its last cause"
    );
    assert!(metrics.held >= 1, "the gate held the effect: {metrics:?}");
    // The task's own counters say the same: the effect waited in the gate while the causes'
    // fetch responses came in, and nothing waits at the end.
    assert_eq!(task.delivered, total, "{task:?}");
    assert_eq!(task.held, metrics.held, "{task:?}");
    assert!(task.gate_wait_us > 0, "{task:?}");
    assert!(
        task.max_gate_wait_us > 0 && task.max_gate_wait_us <= task.gate_wait_us,
        "{task:?}"
    );
    assert_eq!(task.blocked_heads, 0, "{task:?}");
    assert_eq!(task.impossible_stamps, 0, "{task:?}");

    let (order, metrics, task) = delivery_order(GateMode::Off, sources, total);
    let effect_at = order.iter().position(|v| v.starts_with("effect")).unwrap();
    assert!(
        effect_at < CAUSES,
        "negative control: without the gate the effect overtakes its cause (delivered at {effect_at})"
    );
    assert_eq!(metrics.held, 0);
    assert_eq!((task.held, task.gate_wait_us), (0, 0), "{task:?}");
}

/// A record stamped as releases before stamp format 2 wrote it — a version-1 stamp under the
/// header `parsley.stamp` — is gated by it as by a current one.
#[test]
fn a_stamp_in_the_earlier_format_and_header_name_is_still_honoured() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, Producer};

    let causes = create_topic("gate-v1-causes", 1);
    let effects = create_topic("gate-v1-effects", 1);
    let padding = "x".repeat(16 * 1024);
    let p = raw_producer(None);
    for i in 0..CAUSES {
        let value = format!("cause-{i:06}{padding}");
        send_stamped(&p, &causes.name, 0, b"k", value.as_bytes(), None);
    }
    // A 16-byte sender id, as every id was before short ids.
    let stamp = Stamp::new(
        Some(parsley_runtime::SenderTag {
            sender: parsley_runtime::SenderId::from_bytes([7; 16]),
            seq: 0,
        }),
        [Channel::new(causes.id, 0).at(CAUSES as i64 - 1)]
            .into_iter()
            .collect(),
    );
    let v1 = parsley_clock::codec::encode_version(&stamp, 1);
    assert_eq!(v1[0], 1, "a version-1 encoding");
    assert_eq!(parsley_clock::codec::decode(&v1).unwrap(), stamp);
    let value = format!("effect-00000{padding}");
    let record = BaseRecord::to(&effects.name)
        .partition(0)
        .key(&b"k"[..])
        .payload(value.as_bytes())
        .headers(OwnedHeaders::new().insert(Header {
            key: parsley_clock::LEGACY_STAMP_HEADER,
            value: Some(v1.as_slice()),
        }));
    p.send(record).map_err(|(e, _)| e).unwrap();
    p.flush(DEADLINE).unwrap();

    let sources = [causes.name.as_str(), effects.name.as_str()];
    let (order, metrics, task) = delivery_order(GateMode::Causal, sources, CAUSES as u64 + 1);
    assert_eq!(
        order.iter().position(|v| v.starts_with("effect")),
        Some(CAUSES),
        "the effect comes after its last cause"
    );
    assert!(metrics.held >= 1, "the gate held the effect: {metrics:?}");
    assert_eq!(task.impossible_stamps, 0, "{task:?}");
}

/// Emits the record timestamp the handler sees.
struct Timestamps(String);

impl Handler for Timestamps {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> Result<Step<String, String, ()>, HandlerError> {
        Ok(Step::none().emit(self.0.as_str(), r.key, r.timestamp.to_string()))
    }
}

/// With the gate on and off, the handler sees each record's Kafka timestamp (ms since the
/// epoch; with the gate off it once saw an arrival counter) and each output carries the
/// timestamp of the record that caused it (timestamp propagation, as in Kafka Streams).
#[test]
fn the_handler_sees_the_record_timestamp_and_outputs_carry_it() {
    let input = create_topic("ts-in", 1);
    let mut producer = CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap();
    // Out of order and in the past, but within retention (time-based retention never deletes
    // them).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let times = [now - 3_600_000, now - 7_200_000, now - 1_234];
    for t in times {
        producer
            .send_record(OutgoingRecord::new(&input.name, b"k", b"v").timestamp(t))
            .unwrap();
    }
    producer.flush().unwrap();
    for gate in [GateMode::Causal, GateMode::Off] {
        let out = create_topic("ts-out", 1);
        let topology = Topology::builder(unique_topic("ts"))
            .stage("ts", Timestamps(out.name.clone()), |s| {
                s.source(&input.name)
                    .sink(&out.name)
                    .key_codec(Utf8)
                    .value_codec(Utf8)
                    .output_codec(Utf8)
            })
            .build()
            .unwrap();
        let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()).gate(gate))
            .start()
            .unwrap();
        wait_committed(&running, "ts", times.len() as u64);
        running.stop().unwrap();
        let records = read_committed(&out);
        let seen: Vec<String> = records
            .iter()
            .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
            .collect();
        let expected: Vec<String> = times.iter().map(i64::to_string).collect();
        assert_eq!(seen, expected, "{gate:?}");
        let carried: Vec<Option<i64>> = records.iter().map(|r| r.timestamp).collect();
        assert_eq!(carried, times.map(Some), "{gate:?}");
    }
}

/// A stage that writes a topic it also reads: `go` on the input is echoed into the loop topic;
/// every record is logged to `out` as `topic-kind:value`.
struct Echo {
    input: String,
    looped: String,
    out: String,
}

impl Handler for Echo {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> Result<Step<String, String, ()>, HandlerError> {
        let from = if r.topic == self.input { "in" } else { "loop" };
        let step = Step::none().emit(
            self.out.as_str(),
            r.key.clone(),
            format!("{from}:{}", r.value),
        );
        Ok(if r.topic == self.input && r.value == "go" {
            step.emit(self.looped.as_str(), r.key, "echo".to_string())
        } else {
            step
        })
    }
}

#[test]
fn a_gate_waiting_on_its_own_open_transaction_commits_first() {
    // The book's specification, §7: a task never waits on its own open transaction. The stage
    // echoes `go` into `loop`, which it also reads, in a transaction that the commit interval (10
    // minutes) would keep open far beyond this test's deadline. A record then claims the echo's
    // coordinate (as a second stage's coarse claim on a channel it does not consume would: the high
    // watermark below an open transaction's write). The gate blocks on `loop`@0, a record of the
    // task's own open transaction that `read_committed` shows only after the commit: the stage
    // commits first, then delivers the echo and the claiming record in causal order.
    let input = create_topic("own-in", 1);
    let looped = create_topic("own-loop", 1);
    let out = create_topic("own-out", 1);
    let topology = Topology::builder(unique_topic("own"))
        .stage(
            "echo",
            Echo {
                input: input.name.clone(),
                looped: looped.name.clone(),
                out: out.name.clone(),
            },
            |s| utf8_stage(s, &[&input.name, &looped.name], &[&looped.name, &out.name]),
        )
        .build()
        .unwrap();
    let config =
        RuntimeConfig::new(bootstrap()).commit_interval(std::time::Duration::from_secs(600));
    let running = Runtime::new(topology, config).start().unwrap();
    let p = raw_producer(None);
    send_stamped(&p, &input.name, 0, b"k", b"go", None);
    // Evidence that the echo is in the log, uncommitted: the high watermark passed it.
    let started = std::time::Instant::now();
    while admin().high_watermarks(&[(&looped.name, 0)]).unwrap()[0] < 1 {
        assert!(started.elapsed() < DEADLINE, "the echo was never appended");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let m = running.metrics()[0].1;
    assert_eq!((m.delivered, m.transactions), (1, 0), "{m:?}");
    let claims_echo = Stamp::new(
        None,
        [Channel::new(looped.id, 0).at(0)].into_iter().collect(),
    );
    send_stamped(&p, &input.name, 0, b"k", b"after", Some(&claims_echo));
    let m = wait_metrics(&running, "echo", "three deliveries", |m| m.delivered >= 3);
    assert_eq!(m.own_write_commits, 1, "{m:?}");
    assert_eq!(m.transactions, 1, "only the commit-first commit: {m:?}");
    // The claiming record waited in the gate (the echo may have too, for evidence on `out`,
    // where its sibling send was in flight); the output order below shows for what.
    assert!(
        m.held >= 1,
        "the claiming record waited for the echo: {m:?}"
    );
    running.stop().unwrap();
    assert_eq!(committed_values(&out), ["in:go", "loop:echo", "in:after"]);
}
