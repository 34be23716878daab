//! Unit tests of the stream thread's pure parts, without a broker: a task's delivery path
//! (gate, handler, stamped emission, snapshot), its exact restore, the commit-first decision,
//! the backpressure plan and the assignment check; the bad-record policies
//! (`bad_records.rs`); the built-in clock's ticks (`ticks.rs`).

mod bad_records;
mod ticks;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use parsley_clock::{
    Channel, Clock, Coordinate, InFlight, SenderId, SenderTag, Stamp, TopicId, codec,
};
use parsley_gate::{Arrival, Awaiting, Gate};
use parsley_stage::changelog::{META_KEY, Restored, TaskSnapshot};
use parsley_stage::{
    BadRecordPolicy, ImpossiblePolicy, KeyPartitioning, StageSpec, Topology, Utf8,
};
use parsley_testkit::fixtures::CountKeys;

use super::rebalance::check_assignment;
use super::transaction::{OwnWait, OwnWrites};
use parsley_task::GateMode;
use parsley_task::backpressure::{self, Step as Plan};
use parsley_task::context::{DeadLetterTopic, TaskContext};
use parsley_task::error::{Error, Result};
use parsley_task::error::{ProcessingError, RecordError, SetupError};
use parsley_task::metrics::StageMetrics;
use parsley_task::output::{ChangelogWriter, Header, HeldSend, Outgoing, Output};
use parsley_task::record::{Fetched, Payload, Rare};
use parsley_task::task::{FoldState, Task};
use parsley_task::topic::SendTag;
use parsley_task::topic::TopicInfo;

fn topic(n: u8, name: &str) -> TopicInfo {
    TopicInfo {
        name: name.to_string(),
        id: TopicId::from_bytes([n; 16]),
        partitions: 1,
    }
}

fn ch(n: u8) -> Channel {
    Channel::new(TopicId::from_bytes([n; 16]), 0)
}

/// A stage reading `in` (topic 1) and `side` (topic 2), counting each key into `out` (topic 3)
/// as `key=n`.
fn context() -> TaskContext {
    let topology = Topology::builder("app")
        .stage("count", CountKeys::new("out"), |s| {
            s.source("in")
                .source("side")
                .sink("out")
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap();
    context_of(topology.stage("count").unwrap(), BadRecordPolicy::Fail)
}

/// The context of a task of `spec` (sources `in` and `side`, sink `out`) under `bad_records`
/// (its dead-letter topic is topic 4, `dlq`, with two partitions).
fn context_of(spec: &StageSpec, bad_records: BadRecordPolicy) -> TaskContext {
    let dead_letter = matches!(bad_records, BadRecordPolicy::DeadLetter { .. }).then(|| {
        let mut dlq = topic(4, "dlq");
        dlq.partitions = 2;
        DeadLetterTopic::new(dlq)
    });
    TaskContext {
        stage: spec.name().into(),
        sources: vec![topic(1, "in"), topic(2, "side")],
        key_partitioning: vec![KeyPartitioning::Murmur2; 2],
        global: vec![false; 2],
        sinks: vec![topic(3, "out")],
        dead_letter: None,
        bad_record_dead_letter: dead_letter,
        processor: spec.processor().clone(),
        keeps_state: spec.processor().keeps_state(),
        policy: ImpossiblePolicy::Fail,
        keep_headers: matches!(bad_records, BadRecordPolicy::DeadLetter { .. }),
        bad_records,
        gate_mode: GateMode::Causal,
        cap: 10_000,
        control: None,
        clock: None,
        fed_by_stages: vec![None, None],
        metrics: Arc::new(StageMetrics::default()),
    }
}

/// Record `offset` of source `source` (0: `in`, 1: `side`), key `key`, value `value`.
fn fetched(source: usize, offset: i64, key: &str, value: &str, stamp: Option<Stamp>) -> Fetched {
    raw_fetched(
        source,
        offset,
        Some(key.as_bytes()),
        value.as_bytes(),
        &[],
        stamp,
    )
}

/// Record `offset` of source `source`, with key and value bytes and headers.
fn raw_fetched(
    source: usize,
    offset: i64,
    key: Option<&[u8]>,
    value: &[u8],
    headers: &[Header],
    stamp: Option<Stamp>,
) -> Fetched {
    let channel = ch(source as u8 + 1);
    Fetched {
        partition: 0,
        channel,
        arrival: Arrival {
            offset,
            epoch: 1,
            timestamp: 1_000 + offset,
            stamp,
            payload: Payload {
                source,
                key: key.map(<[u8]>::to_vec),
                value: Some(value.to_vec()),
                arrived: Instant::now(),
                record_timestamp: Some(1_000 + offset),
                rare: (!headers.is_empty()).then(|| {
                    Box::new(Rare {
                        headers: headers.into(),
                        ..Rare::default()
                    })
                }),
            },
        },
        malformed: None,
    }
}

/// A stamp of another stage's sender claiming `claims`.
fn claiming(claims: &[Coordinate]) -> Stamp {
    Stamp {
        sender: Some(SenderTag {
            sender: SenderId::from_bytes([9; 16]),
            seq: 0,
        }),
        clock: claims.iter().copied().collect::<Clock>(),
        in_flight: Vec::new(),
        acked_through: None,
    }
}

/// A record the task sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    topic: String,
    tag: SendTag,
    key: Option<String>,
    value: String,
    stamp: Vec<u8>,
    headers: Vec<Header>,
    timestamp: Option<i64>,
}

impl Sent {
    /// The value of header `name`, as text.
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

#[derive(Default)]
struct Sends(Vec<Sent>);

impl Output for Sends {
    fn send(&mut self, r: Outgoing<'_>) -> Result<()> {
        self.0.push(Sent {
            topic: r.topic.to_string(),
            tag: r.tag,
            key: r.key.map(|k| String::from_utf8(k).unwrap()),
            value: String::from_utf8(r.value.unwrap_or_default()).unwrap(),
            stamp: r.stamp.to_vec(),
            headers: r.headers.to_vec(),
            timestamp: r.timestamp,
        });
        Ok(())
    }
}

/// Refuses every send.
struct Refusing;

impl Output for Refusing {
    fn send(&mut self, r: Outgoing<'_>) -> Result<()> {
        Err(Error::Setup(SetupError::UnknownTopic {
            topic: r.topic.to_string(),
        }))
    }
}

#[derive(Default)]
struct Written(Vec<(Vec<u8>, Option<Vec<u8>>)>);

impl ChangelogWriter for Written {
    fn write(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        self.0.push((key.to_vec(), value.map(<[u8]>::to_vec)));
        Ok(())
    }
}

/// Acknowledges every send of `sent` at consecutive offsets of its channel from `next`.
fn ack_all(task: &mut Task, sent: &[Sent], next: &mut BTreeMap<Channel, i64>) {
    for s in sent {
        let offset = next.entry(s.tag.channel).or_insert(0);
        task.acked(s.tag, *offset).unwrap();
        *offset += 1;
    }
}

fn fresh_task(ctx: &TaskContext) -> Task {
    Task::fresh(
        0,
        ctx.consumed(0),
        &[(ch(1), 0), (ch(2), 0)],
        FoldState::memory(Default::default()),
    )
    .unwrap()
}

#[test]
fn a_delivery_goes_through_gate_handler_and_stamp_into_the_snapshot() {
    let ctx = context();
    let mut task = fresh_task(&ctx);
    let mut out = Sends::default();
    // side@0 claims in@0: the gate holds it until its cause is delivered.
    task.offer(
        &ctx,
        fetched(1, 0, "a", "effect", Some(claiming(&[ch(1).at(0)]))),
    )
    .unwrap();
    let work = task.deliver(&ctx, &mut out).unwrap();
    assert_eq!((work.deliveries, out.0.len()), (0, 0), "the effect waits");
    assert_eq!(task.gate().blocked_count(), 1);
    task.offer(&ctx, fetched(0, 0, "a", "cause", None)).unwrap();
    let work = task.deliver(&ctx, &mut out).unwrap();
    assert_eq!((work.deliveries, work.emissions, work.parked), (2, 2, 0));

    // Cause first; both emissions carry their record's timestamp and go to `out`'s one
    // partition, sequence 0 then 1 of the task's sender.
    let lines: Vec<&str> = out.0.iter().map(|s| s.value.as_str()).collect();
    assert_eq!(lines, ["a=1", "a=2"]);
    assert_eq!(out.0[0].timestamp, Some(1_000));
    assert_eq!(out.0[1].timestamp, Some(1_000));
    assert_eq!(
        out.0
            .iter()
            .map(|s| (s.tag.channel, s.tag.seq))
            .collect::<Vec<_>>(),
        [(ch(3), 0), (ch(3), 1)]
    );
    // The second stamp claims both deliveries by coordinate: the node clock observed each
    // record before its handler ran. The unacknowledged first send is on the same channel, so
    // append order covers it (no in-flight claim needed).
    let second = codec::decode(&out.0[1].stamp).unwrap();
    assert_eq!(second.clock.get(&ch(1)), Some(0));
    assert_eq!(second.clock.get(&ch(2)), Some(0));
    assert_eq!(second.in_flight, Vec::<InFlight>::new());
    assert_eq!(
        second.sender,
        Some(SenderTag {
            sender: task.clock().sender(),
            seq: 1
        })
    );

    // Acknowledged, the snapshot holds the fold state, the clock and the input offsets.
    ack_all(&mut task, &out.0, &mut BTreeMap::new());
    let mut written = Written::default();
    let offsets = task.write_changelog(&ctx, &mut written).unwrap();
    assert_eq!(offsets, vec![(ch(1), 1), (ch(2), 1)]);
    assert_eq!(
        written.0.len(),
        2,
        "one state record, one snapshot: {:?}",
        written.0
    );
    assert_eq!(written.0[0].0, b"\x00a");
    let (key, value) = &written.0[1];
    assert_eq!(key.as_slice(), META_KEY);
    let snapshot = TaskSnapshot::decode(value.as_deref().unwrap()).unwrap();
    assert_eq!(snapshot.offsets, offsets);
    assert_eq!(snapshot.next_seq, 2);
    assert_eq!(
        snapshot.clock.get(&ch(3)),
        Some(1),
        "own sends, acknowledged"
    );
    // Nothing changed since: a second commit writes nothing.
    let mut again = Written::default();
    task.write_changelog(&ctx, &mut again).unwrap();
    assert!(again.0.is_empty(), "{:?}", again.0);
}

#[test]
fn a_restored_task_makes_the_same_next_deliveries_and_stamps() {
    let ctx = context();
    let mut a = fresh_task(&ctx);
    let mut first = Sends::default();
    a.offer(&ctx, fetched(0, 0, "a", "x", None)).unwrap();
    a.offer(
        &ctx,
        fetched(1, 0, "b", "y", Some(claiming(&[ch(1).at(0)]))),
    )
    .unwrap();
    a.deliver(&ctx, &mut first).unwrap();
    let mut acks = BTreeMap::new();
    ack_all(&mut a, &first.0, &mut acks);
    let mut written = Written::default();
    let committed = a.write_changelog(&ctx, &mut written).unwrap();

    // What a restore reads back from those records.
    let mut restored = Restored::default();
    for (key, value) in &written.0 {
        restored.apply(key, value.as_deref()).unwrap();
    }
    let (mut b, fresh) = Task::restore(
        &ctx,
        0,
        committed.clone(),
        restored.snapshot.unwrap(),
        FoldState::memory(restored.state),
    )
    .unwrap();
    assert!(fresh.is_empty());

    // The same next records, including one held for a cause, give the same sends.
    let next = || {
        vec![
            fetched(1, 1, "a", "z", Some(claiming(&[ch(1).at(1)]))),
            fetched(0, 1, "a", "w", None),
            fetched(0, 2, "b", "v", None),
        ]
    };
    let (mut from_a, mut from_b) = (Sends::default(), Sends::default());
    for f in next() {
        a.offer(&ctx, f).unwrap();
    }
    for f in next() {
        b.offer(&ctx, f).unwrap();
    }
    a.deliver(&ctx, &mut from_a).unwrap();
    b.deliver(&ctx, &mut from_b).unwrap();
    let lines: Vec<&str> = from_b.0.iter().map(|s| s.value.as_str()).collect();
    assert_eq!(lines, ["a=2", "a=3", "b=2"], "the fold state came back");
    assert_eq!(
        from_a.0, from_b.0,
        "same sender, sequences, clocks and stamps"
    );

    // A snapshot committed with other offsets than the group's is refused, named.
    let mut restored = Restored::default();
    for (key, value) in &written.0 {
        restored.apply(key, value.as_deref()).unwrap();
    }
    let err = Task::restore(
        &ctx,
        0,
        vec![(ch(1), 1), (ch(2), 0)],
        restored.snapshot.unwrap(),
        FoldState::memory(restored.state),
    )
    .err()
    .unwrap();
    assert!(
        matches!(&err, Error::Processing(ProcessingError::RestoreMismatch { changelog, group, .. })
            if changelog == &["in/0@1", "side/0@1"] && group == &["in/0@1", "side/0@0"]),
        "{err}"
    );
}

#[test]
fn a_refused_send_releases_its_claim() {
    let ctx = context();
    let mut task = fresh_task(&ctx);
    task.offer(&ctx, fetched(0, 0, "a", "x", None)).unwrap();
    let err = task.deliver(&ctx, &mut Refusing).unwrap_err();
    assert!(
        matches!(err, Error::Setup(SetupError::UnknownTopic { .. })),
        "{err}"
    );
    assert_eq!(
        task.clock().unacked(),
        0,
        "no claim on a send that was not made"
    );
}

#[test]
fn a_held_send_is_sent_unchanged() {
    let stamp = [1, 2, 3];
    let headers: [Header; 2] = [("h".into(), Some(b"v".to_vec())), ("null".into(), None)];
    let tag = SendTag {
        task: 0,
        channel: ch(3),
        seq: 7,
    };
    let held = HeldSend::hold(Outgoing {
        topic: "out".into(),
        tag,
        key: Some(b"k".to_vec()),
        value: Some(b"v".to_vec()),
        stamp: &stamp,
        headers: &headers,
        timestamp: Some(5),
    });
    assert_eq!(held.tag(), tag);
    let mut out = Sends::default();
    held.send_to(&mut out).unwrap();
    assert_eq!(
        out.0,
        [Sent {
            topic: "out".into(),
            tag,
            key: Some("k".into()),
            value: "v".into(),
            stamp: stamp.to_vec(),
            headers: headers.to_vec(),
            timestamp: Some(5),
        }]
    );
}

#[test]
fn commit_first_when_a_gate_waits_on_the_open_transactions_own_write() {
    let ctx = context();
    let mut task = fresh_task(&ctx);
    // `side` is the looped topic: the stage writes it and reads it. in@0 claims side@5.
    task.offer(
        &ctx,
        fetched(0, 0, "a", "x", Some(claiming(&[ch(2).at(5)]))),
    )
    .unwrap();
    task.deliver(&ctx, &mut Sends::default()).unwrap();
    let waits = OwnWait {
        head: ch(1).at(0),
        awaits: ch(2).at(5),
    };
    let looped = || OwnWrites::new(vec![ch(2).topic]);
    let tasks = [task];

    let mut own = looped();
    assert_eq!(own.awaited(&tasks), None, "nothing written yet");
    own.acked(ch(2), 3);
    own.acked(ch(2), 4);
    assert_eq!(
        own.awaited(&tasks),
        Some(waits),
        "side@5 is at or after the lowest write"
    );
    own.clear();
    assert_eq!(
        own.awaited(&tasks),
        None,
        "a new transaction wrote nothing yet"
    );

    let mut own = looped();
    own.acked(ch(2), 6);
    assert_eq!(
        own.awaited(&tasks),
        None,
        "side@5 was written before this transaction"
    );
    let mut own = looped();
    own.acked(ch(2), 5);
    assert_eq!(own.awaited(&tasks), Some(waits));
    let mut own = looped();
    own.acked(ch(3), 0);
    assert_eq!(
        own.awaited(&tasks),
        None,
        "writes to topics the stage does not read"
    );
    assert!(matches!(
        tasks[0].gate().blocked_heads()[0].awaits,
        Awaiting::Frontier(c) if c == ch(2).at(5)
    ));
}

/// A record of `sender`/`seq` claiming `in_flight` in flight.
fn sent_by(offset: i64, sender: u8, seq: u64, in_flight: &[(Channel, u64)]) -> Arrival<i64> {
    Arrival {
        offset,
        timestamp: 0,
        epoch: 1,
        stamp: Some(Stamp {
            sender: Some(SenderTag {
                sender: SenderId::from_bytes([sender; 16]),
                seq,
            }),
            clock: Clock::default(),
            in_flight: in_flight
                .iter()
                .map(|&(channel, seq)| InFlight { channel, seq })
                .collect(),
            acked_through: None,
        }),
        payload: offset,
    }
}

#[test]
fn the_backpressure_plan_keeps_a_channel_a_claim_needs_unpaused() {
    let (a, b, c) = (ch(1), ch(2), ch(3));
    let mut gate: Gate<i64> = Gate::new([a, b, c]);
    for x in [a, b, c] {
        gate.seed(x, 0).unwrap();
    }
    // b@0 of sender 1 claims its own send to `a` (seq 4) in flight: `a` must be read on.
    gate.offer(b, sent_by(0, 1, 5, &[(a, 4)])).unwrap();
    // `a` fills up with three records of other senders; so does `c`, which nobody needs.
    for (o, seq) in [(0, 0), (1, 1), (2, 2)] {
        gate.offer(a, sent_by(o, 3, seq, &[])).unwrap();
        gate.offer(c, sent_by(o, 4, seq, &[])).unwrap();
    }
    assert!(gate.needs_reading(&a) && !gate.needs_reading(&c));
    let cap = 3;

    let steps = backpressure::plan(&gate, &HashSet::new(), cap);
    assert_eq!(steps, [Plan::Spill(a), Plan::Pause(c)]);
    assert!(!steps.contains(&Plan::Pause(a)));

    // Already paused (from an earlier batch): a needed channel is resumed and spills; a
    // channel at half the cap or less resumes.
    let paused: HashSet<Channel> = [a, b, c].into();
    let steps = backpressure::plan(&gate, &paused, cap);
    assert_eq!(steps, [Plan::Spill(a), Plan::Resume(a), Plan::Resume(b)]);

    // The plan is pure: the gate is as it was.
    assert_eq!((gate.held(&a), gate.held(&c)), (3, 3));
    // Mid-batch, a needed channel beyond the cap spills at once.
    gate.offer(a, sent_by(3, 3, 3, &[])).unwrap();
    backpressure::on_offer(&mut gate, a, cap, &StageMetrics::default());
    assert!(gate.held(&a) <= cap, "spilled: {}", gate.held(&a));
}

#[test]
fn at_the_memory_bound_every_channel_is_full_a_needed_one_spills_and_an_event_time_one_reads_on() {
    use parsley_task::memory::AtBound;
    let (a, b, c) = (ch(1), ch(2), ch(3));
    let mut gate: Gate<i64> = Gate::new([a, b, c]);
    for x in [a, b, c] {
        gate.seed(x, 0).unwrap();
    }
    // b@0 claims its sender's record on `a` in flight: `a` must be read on. Each channel holds
    // one record, far below the cap; `c` holds none.
    gate.offer(b, sent_by(0, 1, 5, &[(a, 4)])).unwrap();
    gate.offer(a, sent_by(0, 3, 0, &[])).unwrap();
    let cap = 100;
    let none = HashSet::new();
    assert_eq!(
        backpressure::plan_at_bound(&gate, &none, cap, AtBound::Free, false),
        backpressure::plan(&gate, &none, cap),
        "under the bound the cap alone decides"
    );
    assert!(backpressure::plan_at_bound(&gate, &none, cap, AtBound::Free, false).is_empty());

    // Squeezed: the needed channel spills and reads on; the others pause, empty or not.
    let steps = backpressure::plan_at_bound(&gate, &none, cap, AtBound::Squeeze, false);
    assert_eq!(steps, [Plan::Spill(a), Plan::Pause(b), Plan::Pause(c)]);
    // Paused already: they stay paused, nothing resumes while squeezed.
    let paused: HashSet<Channel> = [b, c].into();
    let steps = backpressure::plan_at_bound(&gate, &paused, cap, AtBound::Squeeze, false);
    assert_eq!(steps, [Plan::Spill(a)]);
    // Back under the resume mark: the cap decides again, and they resume.
    let steps = backpressure::plan_at_bound(&gate, &paused, cap, AtBound::Free, false);
    assert_eq!(steps, [Plan::Resume(b), Plan::Resume(c)]);

    // An event-time task with parked records reads on (only reading moves its watermark):
    // what it holds spills instead of pausing.
    let steps = backpressure::plan_at_bound(&gate, &none, cap, AtBound::Squeeze, true);
    assert_eq!(steps, [Plan::Spill(a), Plan::Spill(b)]);
    assert!(!steps.iter().any(|s| matches!(s, Plan::Pause(_))));
}

#[test]
fn an_assignment_must_cover_every_source_and_sources_must_not_change() {
    let sources = [topic(1, "in"), topic(2, "side")];
    let both: BTreeMap<i32, Vec<(Channel, i64)>> = [(0, vec![(ch(1), 0), (ch(2), 0)])].into();
    assert!(check_assignment("s", &sources, |_| false, &sources, &both).is_ok());

    let one: BTreeMap<i32, Vec<(Channel, i64)>> = [(0, vec![(ch(1), 0)])].into();
    // A global source is not the group's to assign: every task reads it whole.
    assert!(check_assignment("s", &sources, |t| t == "side", &sources, &one).is_ok());
    let err = check_assignment("s", &sources, |_| false, &sources, &one).unwrap_err();
    assert!(
        matches!(&err, Error::Setup(SetupError::NotCoPartitioned { partitions, .. })
            if partitions[1].0 == "side (partition 0 missing)"),
        "{err}"
    );

    let mut grown = sources.clone();
    grown[1].partitions = 2;
    let err = check_assignment("s", &sources, |_| false, &grown, &both).unwrap_err();
    assert!(
        matches!(&err, Error::Record(RecordError::SourceChanged { topic, partitions: (1, 2), recreated: false, .. }) if topic == "side"),
        "{err}"
    );
    let mut recreated = sources.clone();
    recreated[0].id = TopicId::from_bytes([7; 16]);
    let err = check_assignment("s", &sources, |_| false, &recreated, &both).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Record(RecordError::SourceChanged {
                recreated: true,
                ..
            })
        ),
        "{err}"
    );
}

#[test]
fn c20_a_key_on_another_partition_than_murmur2_gives_stops_the_task_unless_unchecked() {
    let mut ctx = context();
    ctx.sources[0].partitions = 4;
    // Keys whose murmur2 partition among 4 is 0, and one whose is not.
    let on = |p: i32| {
        (0..)
            .map(|i| format!("k{i}"))
            .find(|k| parsley_task::topic::partition_for(k.as_bytes(), 4) == p)
            .unwrap()
    };
    let (here, elsewhere) = (on(0), on(3));
    let mut task = fresh_task(&ctx);
    task.offer(&ctx, fetched(0, 0, &here, "x", None)).unwrap();
    task.offer(&ctx, fetched(0, 1, &elsewhere, "y", None))
        .unwrap();
    let mut out = Sends::default();
    let err = task.deliver(&ctx, &mut out).unwrap_err();
    assert_eq!(out.0.len(), 1, "the record before it was handled");
    assert!(
        matches!(&err, Error::Record(RecordError::KeyPartitionMismatch { topic, partition: 0, offset: 1, key, expected: 3, partitions: 4, .. })
            if topic == "in" && *key == format!("{elsewhere:?}")),
        "{err}"
    );
    assert!(
        err.to_string().contains("murmur2 puts on partition 3 of 4"),
        "names the partitioner checked: {err}"
    );

    // Opted out: the same records are handled.
    ctx.key_partitioning[0] = KeyPartitioning::Unchecked;
    let mut task = fresh_task(&ctx);
    task.offer(&ctx, fetched(0, 0, &here, "x", None)).unwrap();
    task.offer(&ctx, fetched(0, 1, &elsewhere, "y", None))
        .unwrap();
    let mut out = Sends::default();
    task.deliver(&ctx, &mut out).unwrap();
    assert_eq!(out.0.len(), 2);
}

#[test]
fn keys_in_errors_are_text_when_they_are_else_hex() {
    assert_eq!(parsley_task::error::render_key(b"sku-1"), "\"sku-1\"");
    // A JSON string key as it is, not escaped again; control characters escaped.
    assert_eq!(
        parsley_task::error::render_key(br#""order-1""#),
        r#"""order-1"""#
    );
    assert_eq!(parsley_task::error::render_key(b"a\nb"), r#""a\nb""#);
    assert_eq!(parsley_task::error::render_key(&[0xff, 0x00]), "0xff00");
    assert!(parsley_task::error::render_key(&[b'a'; 100]).ends_with('…'));
}
