//! Cases of single records on the real broker: C15 (a full fetch of
//! aborted records only, librdkafka #2993: read as a stage's source and as a changelog being
//! restored), C16 (a record that cannot fit, with its stamp: librdkafka #993, #488; refused in
//! `produce()` by the producer's `message.max.bytes`, and by the broker for the topic's
//! `max.message.bytes`) and C17 (timestamps the broker refuses, KIP-937 and KIP-1030; one it
//! takes; a `LogAppendTime` source under an event-time stage).
//!
//! Before the fix, C16 (a), C16 (b) and C17 (a timestamp two hours ahead) each made the stage
//! redo the same transaction five times (`aborts: 6`, in about 1.5 s) and stop with an untyped
//! `KafkaError::Send` (`MessageSizeTooLarge` twice; `InvalidRecord` or `InvalidTimestamp` for the
//! timestamp — Kafka 4.4 answered both in these runs). Checked by hand: with the refusal
//! classification switched off, the six tests of refused outputs fail; without the producer
//! replaced after a refused batch, the C16 (b) dead-letter test sees a second abort
//! (`OUT_OF_ORDER_SEQUENCE_NUMBER`); with `isolation.level=read_uncommitted` forced on the
//! stage's consumer and on the restore consumer, both C15 tests fail (3001 records delivered;
//! `x1` restored with an aborted state). C15 and C17's other two tests passed before the
//! change: librdkafka 2.12 reads a fetch of aborted records only without an error (fixed in
//! librdkafka 1.9, PR #3639), and the runtime took those timestamps as they are.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parsley_runtime::RecordError;
use parsley_runtime::{
    ClientRole, ClientSettings, Error, InputRecord, MetricsSnapshot, PRODUCER_SIZE_LIMIT, Refusal,
    Runtime, RuntimeConfig, TIMESTAMP_AFTER_LIMIT, TOPIC_SIZE_LIMIT, TopicInfo, TopicSpec,
    changelog_topic,
};
use parsley_stage::{
    BadRecordPolicy, EventTimeOrder, Handler, HandlerResult, ImpossiblePolicy, Record, Step,
    Topology, Utf8,
};
use parsley_testkit::fixtures::{
    DEADLINE, ReadRecord, admin, bootstrap, committed_values, create_topic, forward_topology,
    forward_topology_with, group_offset, next_failure, raw_producer, read_committed, unique_topic,
    utf8_stage, wait_committed, wait_tasks,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const HOUR: i64 = 3_600_000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A new one-partition topic `prefix-…` with the topic configuration `config`.
fn topic_with(prefix: &str, config: &[(&str, &str)]) -> TopicInfo {
    let spec = config
        .iter()
        .fold(TopicSpec::new(unique_topic(prefix), 1), |spec, (k, v)| {
            spec.config(*k, *v)
        });
    admin().create_topics(&[spec]).unwrap().remove(0)
}

/// Queues `value` under `key` for partition 0 of `topic`, with record timestamp `timestamp`
/// when given; the caller flushes.
fn enqueue(p: &BaseProducer, topic: &str, key: &[u8], value: &[u8], timestamp: Option<i64>) {
    let mut record = BaseRecord::to(topic).partition(0).key(key).payload(value);
    if let Some(t) = timestamp {
        record = record.timestamp(t);
    }
    p.send(record).map_err(|(e, _)| e).expect("send");
}

/// Writes `records` (key, value, timestamp) to partition 0 of `topic`, acknowledged, outside
/// any transaction.
fn write(topic: &TopicInfo, records: &[(&[u8], &[u8], Option<i64>)]) {
    let p = raw_producer(None);
    for (k, v, t) in records {
        enqueue(&p, &topic.name, k, v, *t);
    }
    p.flush(DEADLINE).unwrap();
    assert_eq!(
        admin().high_watermarks(&[(&topic.name, 0)]).unwrap()[0],
        records.len() as i64,
        "every record of {} was appended",
        topic.name
    );
}

/// Starts `topology` with `config`, waits for its stage to fail, and returns the error and
/// the stage's counters then.
fn failure(topology: Topology, config: RuntimeConfig) -> (Arc<Error>, MetricsSnapshot) {
    let running = Runtime::new(topology, config).start().unwrap();
    let error = next_failure(&running);
    let metrics = running.metrics()[0].1;
    let _ = running.stop();
    (error, metrics)
}

/// Record `offset` of partition 0 of `topic`, as an error names it.
fn record_at(topic: &TopicInfo, offset: i64) -> InputRecord {
    InputRecord {
        topic: topic.name.clone(),
        partition: 0,
        offset,
    }
}

// ---------------------------------------------------------------------------------------
// C15: a full fetch of aborted records only.
// ---------------------------------------------------------------------------------------

/// One KiB.
const KIB: usize = 1024;
/// The fetch size of the case: a fetch of aborted records only fills it many times over.
const FETCH: &str = "65536";

/// C15's history on partition 0 of `topic`: `T(x1..x3000)+A` with 1 KiB values (offsets
/// 0..2999, the abort marker at 3000), then `T(b)+C` (`b` at 3001, the commit marker at 3002):
/// end offset 3003. `record` makes the key and value of `x{i}` and of `b`.
fn aborted_then_b(topic: &str, record: impl Fn(&str) -> (Vec<u8>, Vec<u8>)) {
    let p = raw_producer(Some(&unique_topic("c15-writer")));
    p.begin_transaction().unwrap();
    for i in 1..=3000 {
        let (k, v) = record(&format!("x{i}"));
        enqueue(&p, topic, &k, &v, None);
    }
    p.flush(DEADLINE).unwrap(); // about 3 MB in the log, then aborted
    p.abort_transaction(DEADLINE).unwrap();
    p.begin_transaction().unwrap();
    let (k, v) = record("b");
    enqueue(&p, topic, &k, &v, None);
    p.commit_transaction(DEADLINE).unwrap();
    // The commit marker is written after the producer's call returns (markers go partition by
    // partition): end offset and LSO are 3003 once it is, read until then.
    let a = admin();
    let started = std::time::Instant::now();
    loop {
        let ends = (
            a.high_watermarks(&[(topic, 0)]).unwrap()[0],
            a.last_stable_offsets(&[(topic, 0)]).unwrap()[0],
        );
        if ends == (3003, 3003) {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "end offset and LSO {ends:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A plain `read_committed` reader with the case's fetch sizes reads `topic` from the start:
/// every record and every error it polls until its position reaches `end`.
fn read_with_small_fetches(topic: &str, end: i64) -> (Vec<(i64, Vec<u8>)>, Vec<String>) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique_topic("c15-reader"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("fetch.message.max.bytes", FETCH)
        .set("max.partition.fetch.bytes", FETCH)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let (mut records, mut errors) = (Vec::new(), Vec::new());
    let started = Instant::now();
    loop {
        let position = consumer.position().unwrap().elements()[0].offset();
        if matches!(position, Offset::Offset(p) if p >= end) {
            return (records, errors);
        }
        assert!(
            started.elapsed() < DEADLINE,
            "position {position:?}, not {end}; errors {errors:?}"
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => records.push((m.offset(), m.payload().unwrap_or_default().to_vec())),
            Some(Err(e)) => errors.push(e.to_string()),
            None => {}
        }
    }
}

#[test]
fn c15_a_full_fetch_of_aborted_records_only_is_skipped_by_a_stage_source() {
    let input = create_topic("c15-in", 1);
    let output = create_topic("c15-out", 1);
    let value = vec![b'v'; KIB];
    aborted_then_b(&input.name, |name| {
        (
            b"k".to_vec(),
            if name == "b" {
                b"b".to_vec()
            } else {
                value.clone()
            },
        )
    });

    // The client alone: no error, `b` only, the position at the end.
    let (records, errors) = read_with_small_fetches(&input.name, 3003);
    assert_eq!(errors, Vec::<String>::new(), "no error event");
    assert_eq!(records, [(3001, b"b".to_vec())]);

    // A stage whose consumer fetches as little.
    let app = unique_topic("c15");
    let topology = forward_topology(&app, &[&input.name], &output.name, ImpossiblePolicy::Fail);
    let config = RuntimeConfig::new(bootstrap())
        .consumer_property("fetch.message.max.bytes", FETCH)
        .consumer_property("max.partition.fetch.bytes", FETCH);
    let running = Runtime::new(topology, config).start().unwrap();
    let m = wait_committed(&running, "forward", 1);
    // Caught up: the first undelivered offset is the end offset (the commit marker passed).
    let tasks = wait_tasks(&running, "forward", "caught up at the end offset", |t| {
        t.len() == 1 && t[0].frontier_lag == Some(0)
    });
    let stats = running.stop().expect("no error");
    assert_eq!((m.fetched, stats[0].1.delivered), (1, 1), "{m:?} {tasks:?}");
    assert_eq!(committed_values(&output), ["b"]);
    assert_eq!(
        group_offset(&format!("{app}.forward"), &input.name, 0),
        Some(3003),
        "the committed position is the end offset"
    );
}

/// Remembers the last value of each key (its fold state, UTF-8) and emits
/// `key:previous->value` (`previous` empty for a key without state).
struct Last(String);

impl Handler for Last {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = String;

    fn handle(
        &self,
        r: Record<'_, String, String>,
        previous: Option<String>,
    ) -> HandlerResult<String, String, String> {
        let line = format!("{}:{}->{}", r.key, previous.unwrap_or_default(), r.value);
        Ok(Step::none()
            .set_state(r.value.clone())
            .emit(self.0.as_str(), r.key, line))
    }
}

#[test]
fn c15_a_full_fetch_of_aborted_records_only_is_skipped_by_a_changelog_restore() {
    let input = create_topic("c15r-in", 1);
    let output = create_topic("c15r-out", 1);
    let app = unique_topic("c15r");
    let topology = Topology::builder(&app)
        .stage("last", Last(output.name.clone()), |s| {
            utf8_stage(s, &[&input.name], &[&output.name]).state_codec(Utf8)
        })
        .build()
        .unwrap();
    // The stage's changelog, written before it first runs: 3000 aborted states of keys
    // `x1..x3000`, then the committed state `restored` of key `b` (key layout: `0x00 ++ k`).
    let changelog = changelog_topic(&topology.stage("last").unwrap().group_id(&app));
    admin()
        .create_topics(&[TopicSpec::new(&changelog, 1).config("cleanup.policy", "compact")])
        .unwrap();
    let value = vec![b'v'; KIB];
    aborted_then_b(&changelog, |name| {
        let key = [&[0u8][..], name.as_bytes()].concat();
        (
            key,
            if name == "b" {
                b"restored".to_vec()
            } else {
                value.clone()
            },
        )
    });
    let (records, errors) = read_with_small_fetches(&changelog, 3003);
    assert_eq!(errors, Vec::<String>::new(), "no error event");
    assert_eq!(records, [(3001, b"restored".to_vec())]);

    write(&input, &[(b"b", b"next", None), (b"x1", b"y", None)]);
    let config = RuntimeConfig::new(bootstrap()).client_settings(
        ClientSettings::new()
            .set_for(ClientRole::Restore, "fetch.message.max.bytes", FETCH)
            .set_for(ClientRole::Restore, "max.partition.fetch.bytes", FETCH),
    );
    let running = Runtime::new(topology, config).start().unwrap();
    wait_committed(&running, "last", 2);
    let tasks = running.task_metrics()[0].1.clone();
    running.stop().expect("no error");
    assert_eq!(
        (tasks[0].restore_position, tasks[0].restore_end),
        (3003, 3003),
        "the restore read up to the end offset: {tasks:?}"
    );
    assert_eq!(
        committed_values(&output),
        ["b:restored->next", "x1:->y"],
        "b's committed state, nothing of the aborted states"
    );
}

// ---------------------------------------------------------------------------------------
// C16: a record that cannot fit, with its stamp.
// ---------------------------------------------------------------------------------------

/// For an input value `go`, emits `small1`, a value of `big` bytes, then `small2`; any other
/// value is forwarded. Keys are kept.
struct EmitBig {
    out: String,
    big: usize,
}

impl Handler for EmitBig {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> HandlerResult<String, String, ()> {
        let out = self.out.as_str();
        if r.value != "go" {
            return Ok(Step::none().emit(out, r.key, r.value));
        }
        Ok(Step::none()
            .emit(out, r.key.clone(), "small1".into())
            .emit(out, r.key.clone(), "x".repeat(self.big))
            .emit(out, r.key, "small2".into()))
    }
}

fn emit_big(
    app: &str,
    input: &TopicInfo,
    output: &TopicInfo,
    big: usize,
    policy: BadRecordPolicy,
) -> Topology {
    let handler = EmitBig {
        out: output.name.clone(),
        big,
    };
    Topology::builder(app)
        .stage("emit", handler, |s| {
            utf8_stage(s, &[&input.name], &[&output.name]).on_bad_record(policy)
        })
        .build()
        .unwrap()
}

/// The key of case C16 (a): 32 bytes. With it, the 99,900-byte value fits the producer's
/// `message.max.bytes` of 100,000 (librdkafka counts key, value and headers plus 36 B:
/// 99,968 B) until the stamp header is added (54 B with its name: 100,022 B).
const KEY32: &[u8; 32] = b"key-of-thirty-two-bytes-c16-case";
// The record fits without its stamp header.
const _: () = assert!(36 + KEY32.len() + 99_900 <= 100_000);

fn dead_letter(dlq: &TopicInfo) -> BadRecordPolicy {
    BadRecordPolicy::DeadLetter {
        topic: dlq.name.clone(),
    }
}

fn outputs_of_go(values: &[String]) -> Vec<&String> {
    values
        .iter()
        .filter(|v| v.starts_with("small") || v.starts_with("xxx"))
        .collect()
}

#[test]
fn c16a_a_record_over_the_producers_limit_with_its_stamp_aborts_and_names_it() {
    let input = create_topic("c16a-in", 1);
    let output = create_topic("c16a-out", 1);
    write(&input, &[(KEY32, b"go", None)]);
    let app = unique_topic("c16a");
    let topology = emit_big(&app, &input, &output, 99_900, BadRecordPolicy::Fail);
    let config = RuntimeConfig::new(bootstrap()).producer_property("message.max.bytes", "100000");
    let (error, m) = failure(topology, config);
    let Error::Record(RecordError::OutputRefused {
        stage,
        input: Some(refused_input),
        dead_letter: false,
        topic,
        partition: 0,
        reason,
    }) = &*error
    else {
        panic!("expected OutputRefused naming its input, got {error:?}");
    };
    eprintln!("C16 (a): {error}");
    assert_eq!((stage.as_str(), topic), ("emit", &output.name));
    assert_eq!(**refused_input, record_at(&input, 0));
    let Refusal::TooLarge {
        size,
        limit: Some(100_000),
        setting: PRODUCER_SIZE_LIMIT,
    } = **reason
    else {
        panic!("{reason:?}");
    };
    assert!(size > 100_000 && size < 100_000 + 100, "{size}");
    assert!(error.is_fatal(), "not retried");
    assert_eq!(m.aborts, 1, "aborted once, not redone: {m:?}");
    assert_eq!(m.bad_records.output_refused, 1, "{m:?}");
    assert_eq!(
        committed_values(&output),
        Vec::<String>::new(),
        "none of small1, the large record, small2"
    );
    assert_eq!(group_offset(&format!("{app}.emit"), &input.name, 0), None);
}

/// Under `DeadLetter`, C16's input record is dead-lettered on the redo (its reason the typed
/// error), and the records around it commit: `a` before, `b` after. Returns the dead letter.
fn c16_dead_letter(
    prefix: &str,
    output: &TopicInfo,
    big: usize,
    config: RuntimeConfig,
) -> (ReadRecord, MetricsSnapshot) {
    let input = create_topic(&format!("{prefix}-in"), 1);
    let dlq = create_topic(&format!("{prefix}-dlq"), 1);
    write(
        &input,
        &[
            (KEY32, b"a", None),
            (KEY32, b"go", None),
            (KEY32, b"b", None),
        ],
    );
    let app = unique_topic(prefix);
    let topology = emit_big(&app, &input, output, big, dead_letter(&dlq));
    let running = Runtime::new(topology, config).start().unwrap();
    let m = wait_committed(&running, "emit", 3);
    let m = running.stop().map(|s| s[0].1).unwrap_or(m);
    assert_eq!(committed_values(output), ["a", "b"], "{m:?}");
    assert_eq!(
        m.aborts, 1,
        "the transaction that lost an output was aborted, and the next one committed: {m:?}"
    );
    assert_eq!(
        (
            m.bad_records.output_refused,
            m.dead_lettered,
            m.committed_deliveries
        ),
        (1, 1, 3),
        "{m:?}"
    );
    assert_eq!(
        group_offset(&format!("{app}.emit"), &input.name, 0),
        Some(3)
    );
    let letters = read_committed(&dlq);
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = letters[0].clone();
    assert_eq!(letter.value.as_deref(), Some(&b"go"[..]));
    assert_eq!(
        letter.header(parsley_runtime::DLQ_SOURCE_HEADER),
        Some(format!("{}/0@1", input.name))
    );
    assert_eq!(
        letter.header(parsley_runtime::DLQ_KIND_HEADER).as_deref(),
        Some("output-refused")
    );
    (letter, m)
}

#[test]
fn c16a_under_dead_letter_the_input_record_is_dead_lettered_and_nothing_of_it_commits() {
    let output = create_topic("c16ad-out", 1);
    let config = RuntimeConfig::new(bootstrap()).producer_property("message.max.bytes", "100000");
    let (letter, _) = c16_dead_letter("c16ad", &output, 99_900, config);
    let reason = letter.header(parsley_runtime::DLQ_REASON_HEADER).unwrap();
    eprintln!("C16 (a) dead letter: {reason}");
    assert!(
        reason.contains("over the limit of 100000 B (message.max.bytes of the stage's producer)"),
        "{reason}"
    );
}

#[test]
fn c16b_a_batch_the_broker_refuses_for_the_topics_limit_aborts_and_names_the_record() {
    let input = create_topic("c16b-in", 1);
    let output = topic_with("c16b-out", &[("max.message.bytes", "2000")]);
    write(
        &input,
        &[
            (KEY32, b"a", None),
            (KEY32, b"go", None),
            (KEY32, b"b", None),
        ],
    );
    let app = unique_topic("c16b");
    let topology = emit_big(&app, &input, &output, 3000, BadRecordPolicy::Fail);
    let (error, m) = failure(topology, RuntimeConfig::new(bootstrap()));
    eprintln!("C16 (b): {error}");
    let Error::Record(RecordError::OutputRefused {
        input: Some(refused_input),
        dead_letter: false,
        topic,
        reason,
        ..
    }) = &*error
    else {
        panic!("expected OutputRefused naming its input, got {error:?}");
    };
    assert_eq!((**refused_input).clone(), record_at(&input, 1));
    assert_eq!(topic, &output.name);
    let Refusal::TooLarge {
        size,
        limit: Some(2000),
        setting: TOPIC_SIZE_LIMIT,
    } = **reason
    else {
        panic!("{reason:?}");
    };
    // A batch of its own: 61 B of header, the framed record (key, value, stamp header).
    assert!(
        size > 61 + 32 + 3000 && size < 61 + 32 + 3000 + 100,
        "{size}"
    );
    assert_eq!(m.aborts, 1, "aborted once, not redone: {m:?}");
    let committed = committed_values(&output);
    assert!(outputs_of_go(&committed).is_empty(), "{committed:?}");
    let offset = group_offset(&format!("{app}.emit"), &input.name, 0);
    assert!(
        offset.is_none_or(|o| o <= 1),
        "go is not committed: {offset:?}"
    );
}

#[test]
fn c16b_under_dead_letter_the_producer_goes_on_and_the_next_transaction_commits() {
    let output = topic_with("c16bd-out", &[("max.message.bytes", "2000")]);
    let (letter, m) = c16_dead_letter("c16bd", &output, 3000, RuntimeConfig::new(bootstrap()));
    let reason = letter.header(parsley_runtime::DLQ_REASON_HEADER).unwrap();
    eprintln!(
        "C16 (b) dead letter: {reason} ({} transactions)",
        m.transactions
    );
    assert!(
        reason.contains("over the limit of 2000 B (max.message.bytes of the topic)"),
        "{reason}"
    );
}

// ---------------------------------------------------------------------------------------
// C17: timestamps the broker refuses.
// ---------------------------------------------------------------------------------------

/// A source topic that takes timestamps up to a day ahead (the default would refuse the
/// case's input record itself).
fn lenient_input(prefix: &str) -> TopicInfo {
    topic_with(
        prefix,
        &[("message.timestamp.after.max.ms", &(24 * HOUR).to_string())],
    )
}

#[test]
fn c17_an_output_stamped_two_hours_ahead_is_refused_and_named_with_the_setting() {
    let input = lenient_input("c17-in");
    let output = create_topic("c17-out", 1);
    let config = admin().topic_config(&output.name).unwrap();
    assert!(
        config.contains(&("message.timestamp.after.max.ms".into(), HOUR.to_string())),
        "Kafka 4's default: one hour ahead at most"
    );
    let ahead = now_ms() + 2 * HOUR;
    write(&input, &[(b"k", b"future", Some(ahead))]);
    let app = unique_topic("c17");
    let topology = forward_topology(&app, &[&input.name], &output.name, ImpossiblePolicy::Fail);
    let (error, m) = failure(topology, RuntimeConfig::new(bootstrap()));
    eprintln!("C17: {error}");
    let Error::Record(RecordError::OutputRefused {
        input: Some(refused_input),
        topic,
        reason,
        ..
    }) = &*error
    else {
        panic!("expected OutputRefused naming its input, got {error:?}");
    };
    assert_eq!((**refused_input).clone(), record_at(&input, 0));
    assert_eq!(topic, &output.name);
    let Refusal::Timestamp {
        timestamp,
        skew_ms,
        setting: TIMESTAMP_AFTER_LIMIT,
        max_ms: Some(HOUR),
    } = **reason
    else {
        panic!("{reason:?}");
    };
    assert_eq!(timestamp, ahead, "the input's timestamp, propagated");
    assert!((HOUR..2 * HOUR).contains(&skew_ms), "{skew_ms}");
    assert_eq!(m.aborts, 1, "aborted once, not redone: {m:?}");
    assert!(committed_values(&output).is_empty());
    assert_eq!(
        group_offset(&format!("{app}.forward"), &input.name, 0),
        None
    );
}

#[test]
fn c17_under_dead_letter_a_refused_timestamp_is_dead_lettered_at_the_producers_clock() {
    let input = lenient_input("c17d-in");
    let output = create_topic("c17d-out", 1);
    let dlq = create_topic("c17d-dlq", 1);
    let now = now_ms();
    let ahead = now + 2 * HOUR;
    write(
        &input,
        &[
            (b"k", b"a", Some(now)),
            (b"k", b"future", Some(ahead)),
            (b"k", b"b", Some(now)),
        ],
    );
    let topology =
        forward_topology_with(&unique_topic("c17d"), &[&input.name], &output.name, |s| {
            s.on_bad_record(dead_letter(&dlq))
        });
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    let m = wait_committed(&running, "forward", 3);
    running.stop().unwrap();
    let out = read_committed(&output);
    let values: Vec<_> = out.iter().map(|r| r.value.clone().unwrap()).collect();
    assert_eq!(values, [b"a".to_vec(), b"b".to_vec()], "{m:?}");
    assert!(
        out.iter().all(|r| r.timestamp == Some(now)),
        "propagated: {out:?}"
    );
    let letters = read_committed(&dlq);
    assert_eq!(letters.len(), 1);
    let reason = letters[0]
        .header(parsley_runtime::DLQ_REASON_HEADER)
        .unwrap();
    assert!(
        reason.contains(&format!("record timestamp {ahead} ms"))
            && reason.contains("message.timestamp.after.max.ms of the topic = 3600000 ms"),
        "{reason}"
    );
    let stamped = letters[0].timestamp.unwrap();
    assert!(
        stamped < ahead - HOUR,
        "the dead letter has the producer's clock: {stamped}"
    );
}

#[test]
fn c17_an_output_stamped_thirty_days_back_passes_with_its_timestamp() {
    // No time-based retention: a record thirty days old would be due for deletion.
    let keep = [("retention.ms", "-1")];
    let input = topic_with("c17p-in", &keep);
    let output = topic_with("c17p-out", &keep);
    let past = now_ms() - 30 * 24 * HOUR;
    write(&input, &[(b"k", b"old", Some(past))]);
    let topology = forward_topology(
        &unique_topic("c17p"),
        &[&input.name],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "forward", 1);
    running.stop().expect("no error");
    let out = read_committed(&output);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].value.as_deref(), out[0].timestamp),
        (Some(&b"old"[..]), Some(past))
    );
}

/// A source with `message.timestamp.type=LogAppendTime`: the broker stamps every record with
/// its append time, so an event-time stage orders by append time, whatever the producer
/// wrote. The same writes to a `CreateTime` source come out in `CreateTime` order.
#[test]
fn c17_over_a_log_append_time_source_event_time_is_the_append_time() {
    let run = |source: &TopicInfo, tag: &str| -> (Vec<ReadRecord>, Vec<ReadRecord>) {
        let output = create_topic(&format!("c17l-{tag}-out"), 1);
        // Producer timestamps in the opposite order of the writes.
        let base = now_ms() - HOUR;
        write(
            source,
            &[(b"k", b"A", Some(base + 60_000)), (b"k", b"B", Some(base))],
        );
        let topology = forward_topology_with(
            &unique_topic(&format!("c17l-{tag}")),
            &[&source.name],
            &output.name,
            |s| s.order_by_event_time(EventTimeOrder::new()),
        );
        let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
            .start()
            .unwrap();
        wait_committed(&running, "forward", 2);
        wait_tasks(&running, "forward", "nothing parked", |t| {
            t.len() == 1 && t[0].parked == 0 && t[0].delivered == 2
        });
        running.stop().unwrap();
        (read_committed(source), read_committed(&output))
    };
    let values = |rs: &[ReadRecord]| -> Vec<String> {
        rs.iter()
            .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
            .collect()
    };
    let timestamps =
        |rs: &[ReadRecord]| -> Vec<i64> { rs.iter().map(|r| r.timestamp.unwrap()).collect() };

    let written = now_ms();
    let appended = topic_with(
        "c17l-append",
        &[("message.timestamp.type", "LogAppendTime")],
    );
    let (source, out) = run(&appended, "append");
    let append_times = timestamps(&source);
    assert!(
        append_times[0] >= written - 1_000 && append_times[0] <= append_times[1],
        "the broker's append times: {append_times:?} (written at {written})"
    );
    assert_eq!(values(&out), ["A", "B"], "append order");
    assert_eq!(
        timestamps(&out),
        append_times,
        "event time is the append time"
    );

    let created = create_topic("c17l-create", 1);
    let (source, out) = run(&created, "create");
    assert_eq!(values(&out), ["B", "A"], "CreateTime order");
    let create_times = timestamps(&source);
    assert_eq!(timestamps(&out), [create_times[1], create_times[0]]);
}
