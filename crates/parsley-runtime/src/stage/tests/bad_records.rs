//! The bad-record policies on a task, without a broker: skip, dead-letter and fail for values
//! that do not decode, handler errors and records without a key (case C19).

use parsley_clock::codec;
use parsley_stage::{BadRecordPolicy, Handler, HandlerResult, Json, Record, Step, Topology, Utf8};
use parsley_task::error::{ProcessingError, RecordError};
use parsley_testkit::fixtures::{CopyRecords, SumValues};

use super::*;
use crate::{
    DLQ_KIND_HEADER, DLQ_OFFSET_HEADER, DLQ_PARTITION_HEADER, DLQ_REASON_HEADER, DLQ_SOURCE_HEADER,
    DLQ_STAGE_HEADER, DLQ_STAMP_HEADER, DLQ_TOPIC_HEADER,
};
use parsley_task::topic::partition_for;

fn sum(policy: BadRecordPolicy) -> TaskContext {
    let topology = Topology::builder("app")
        .stage("sum", SumValues("out".into()), |s| {
            s.source("in")
                .source("side")
                .sink("out")
                .key_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap();
    context_of(topology.stage("sum").unwrap(), policy)
}

fn dead_letter() -> BadRecordPolicy {
    BadRecordPolicy::DeadLetter {
        topic: "dlq".into(),
    }
}

fn task(ctx: &TaskContext) -> Task {
    Task::fresh(
        0,
        ctx.consumed(0),
        &[(ch(1), 0), (ch(2), 0)],
        FoldState::memory(Default::default()),
    )
    .unwrap()
}

#[test]
fn a_value_that_does_not_decode_is_skipped_counted_and_consumed() {
    let ctx = sum(BadRecordPolicy::Skip);
    let mut t = task(&ctx);
    let mut out = Sends::default();
    t.offer(&ctx, fetched(0, 0, "a", "not a number", None))
        .unwrap();
    t.offer(&ctx, fetched(0, 1, "a", "5", None)).unwrap();
    let work = t.deliver(&ctx, &mut out).unwrap();
    assert_eq!(
        out.0.iter().map(|s| s.value.as_str()).collect::<Vec<_>>(),
        ["a=5"]
    );
    assert_eq!((work.deliveries, work.emissions), (2, 1));
    let m = ctx.metrics.snapshot();
    assert_eq!((m.bad_records.value_decode, m.bad_records.total()), (1, 1));
    assert_eq!((m.skipped, m.dead_lettered, m.delivered), (1, 0, 2));
    assert_eq!(
        t.input_offsets()[0],
        (ch(1), 2),
        "the skipped record's offset commits with the next one"
    );
}

#[test]
fn a_handler_error_is_dead_lettered_with_the_original_record_and_its_cause() {
    let ctx = sum(dead_letter());
    let mut t = task(&ctx);
    let mut out = Sends::default();
    let original_stamp = codec::encode(&claiming(&[]));
    let headers: [Header; 3] = [
        ("trace".into(), Some(b"t1".to_vec())),
        ("empty".into(), None),
        (
            parsley_clock::STAMP_HEADER.into(),
            Some(original_stamp.clone()),
        ),
    ];
    t.offer(
        &ctx,
        raw_fetched(0, 0, Some(b"a"), b"13", &headers, Some(claiming(&[]))),
    )
    .unwrap();
    t.offer(&ctx, fetched(0, 1, "a", "5", None)).unwrap();
    let work = t.deliver(&ctx, &mut out).unwrap();
    // The dead letter is a delivery, not an emission: `emissions` (and the `emitted` and
    // `committed_emissions` metrics) count what the handler sent.
    assert_eq!((work.deliveries, work.emissions), (2, 1));
    let [dlq, next] = &out.0[..] else {
        panic!("{:?}", out.0)
    };
    assert_eq!(next.value, "a=5", "the bad record changed no state");

    assert_eq!(dlq.topic, "dlq");
    assert_eq!((dlq.key.as_deref(), dlq.value.as_str()), (Some("a"), "13"));
    assert_eq!(
        dlq.tag.channel,
        Channel::new(TopicId::from_bytes([4; 16]), partition_for(b"a", 2))
    );
    assert_eq!(dlq.timestamp, Some(1_000));
    assert_eq!(dlq.header("trace").as_deref(), Some("t1"));
    assert!(
        dlq.headers.iter().any(|(n, v)| n == "empty" && v.is_none()),
        "a null header stays null"
    );
    assert_eq!(
        dlq.headers
            .iter()
            .find(|(n, _)| n == DLQ_STAMP_HEADER)
            .and_then(|(_, v)| v.clone()),
        Some(original_stamp),
        "the original stamp is kept under its own name"
    );
    assert!(
        !dlq.headers
            .iter()
            .any(|(n, _)| parsley_clock::is_stamp_header(n))
    );
    for (name, value) in [
        (DLQ_SOURCE_HEADER, "in/0@0"),
        (DLQ_STAGE_HEADER, "sum"),
        (DLQ_TOPIC_HEADER, "in"),
        (DLQ_PARTITION_HEADER, "0"),
        (DLQ_OFFSET_HEADER, "0"),
        (DLQ_KIND_HEADER, "handler"),
    ] {
        assert_eq!(dlq.header(name).as_deref(), Some(value), "{name}");
    }
    assert!(dlq.header(DLQ_REASON_HEADER).unwrap().contains("unlucky"));
    // Stamped by the task: it claims the record it carries.
    let stamp = codec::decode(&dlq.stamp).unwrap();
    assert_eq!(stamp.clock.get(&ch(1)), Some(0));
    assert_eq!(stamp.sender.map(|s| s.sender), Some(t.clock().sender()));

    let m = ctx.metrics.snapshot();
    assert_eq!(
        (m.bad_records.handler, m.dead_lettered, m.skipped, m.emitted),
        (1, 1, 0, 1)
    );
}

#[test]
fn under_fail_a_bad_record_stops_the_task_with_the_typed_error() {
    let ctx = sum(BadRecordPolicy::Fail);
    let mut t = task(&ctx);
    t.offer(&ctx, fetched(0, 0, "a", "13", None)).unwrap();
    let err = t.deliver(&ctx, &mut Sends::default()).unwrap_err();
    assert!(
        matches!(&err, Error::Processing(ProcessingError::Stage(parsley_stage::Error::Handler { topic, offset: 0, .. })) if topic == "in"),
        "{err}"
    );
    assert_eq!(
        ctx.metrics.snapshot().bad_records.handler,
        1,
        "counted under every policy"
    );
}

#[test]
fn c19_a_keyless_record_in_a_stateful_stage_goes_to_the_policy_naming_the_missing_key() {
    // Fail: a typed error naming the record.
    let ctx = sum(BadRecordPolicy::Fail);
    let mut t = task(&ctx);
    t.offer(&ctx, raw_fetched(0, 0, None, b"1", &[], None))
        .unwrap();
    let err = t.deliver(&ctx, &mut Sends::default()).unwrap_err();
    assert!(
        matches!(&err, Error::Record(RecordError::KeylessRecord { stage, topic, partition: 0, offset: 0 }) if stage == "sum" && topic == "in"),
        "{err}"
    );
    assert!(err.to_string().contains("has no key"), "{err}");

    // Dead letter: the record without a key, on the task's partition of the topic.
    let ctx = sum(dead_letter());
    let mut t = task(&ctx);
    let mut out = Sends::default();
    for o in 0..3 {
        t.offer(&ctx, raw_fetched(0, o, None, b"1", &[], None))
            .unwrap();
    }
    t.deliver(&ctx, &mut out).unwrap();
    assert_eq!(out.0.len(), 3);
    for (o, dlq) in out.0.iter().enumerate() {
        assert_eq!(dlq.key, None);
        assert_eq!(dlq.tag.channel.partition, 0);
        assert_eq!(dlq.header(DLQ_KIND_HEADER).as_deref(), Some("missing-key"));
        assert_eq!(dlq.header(DLQ_OFFSET_HEADER), Some(o.to_string()));
        assert!(
            dlq.header(DLQ_REASON_HEADER)
                .unwrap()
                .contains("keeps fold state")
        );
    }
    assert_eq!(ctx.metrics.snapshot().bad_records.missing_key, 3);
}

#[test]
fn c19_a_stage_that_keeps_no_state_takes_keyless_records() {
    let topology = Topology::builder("app")
        .stage("copy", CopyRecords("out".into()), |s| {
            s.source("in")
                .source("side")
                .sink("out")
                .key_codec(Json)
                .value_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap();
    let ctx = context_of(topology.stage("copy").unwrap(), BadRecordPolicy::Fail);
    assert!(!ctx.keeps_state);
    let mut t = task(&ctx);
    let mut out = Sends::default();
    for (o, v) in ["x1", "x2", "x3"].into_iter().enumerate() {
        t.offer(
            &ctx,
            raw_fetched(0, o as i64, None, v.as_bytes(), &[], None),
        )
        .unwrap();
    }
    t.offer(&ctx, raw_fetched(0, 3, Some(b"\"k\""), b"x4", &[], None))
        .unwrap();
    t.deliver(&ctx, &mut out).unwrap();
    let got: Vec<(Option<&str>, &str, i32)> = out
        .0
        .iter()
        .map(|s| (s.key.as_deref(), s.value.as_str(), s.tag.channel.partition))
        .collect();
    // Keyless in, keyless out (on the task's partition); a keyed record keeps its key.
    assert_eq!(
        got,
        [
            (None, "x1", 0),
            (None, "x2", 0),
            (None, "x3", 0),
            (Some("\"k\""), "x4", 0)
        ]
    );
    assert_eq!(ctx.metrics.snapshot().bad_records.total(), 0);
    let mut written = Written::default();
    t.write_changelog(&ctx, &mut written).unwrap();
    assert!(
        written.0.iter().all(|(k, _)| k.as_slice() == META_KEY),
        "no fold state written: {:?}",
        written.0
    );
}

#[test]
fn a_stateless_stage_whose_key_type_cannot_be_absent_counts_a_missing_key() {
    struct Upper;
    impl Handler for Upper {
        type Key = String;
        type Value = String;
        type Output = String;
        type State = ();
        fn handle(
            &self,
            r: Record<'_, String, String>,
            _: Option<()>,
        ) -> HandlerResult<String, String, ()> {
            Ok(Step::none().emit("out", r.key, r.value.to_uppercase()))
        }
    }
    let topology = Topology::builder("app")
        .stage("upper", Upper, |s| {
            s.source("in")
                .source("side")
                .sink("out")
                .key_codec(Utf8)
                .value_codec(Utf8)
                .output_codec(Utf8)
        })
        .build()
        .unwrap();
    let ctx = context_of(topology.stage("upper").unwrap(), BadRecordPolicy::Skip);
    let mut t = task(&ctx);
    let mut out = Sends::default();
    t.offer(&ctx, raw_fetched(0, 0, None, b"x", &[], None))
        .unwrap();
    t.offer(&ctx, fetched(0, 1, "k", "y", None)).unwrap();
    t.deliver(&ctx, &mut out).unwrap();
    assert_eq!(
        out.0.iter().map(|s| s.value.as_str()).collect::<Vec<_>>(),
        ["Y"]
    );
    let m = ctx.metrics.snapshot();
    assert_eq!((m.bad_records.missing_key, m.skipped), (1, 1));
}

/// Takes every send but those whose value starts with `refused`, which it refuses as the
/// producer refuses a record too large for it (an [`RecordError::OutputRefused`] not named yet).
struct RefusingSome {
    sent: Sends,
    refused: &'static str,
    reason: crate::Refusal,
}

impl Output for RefusingSome {
    fn send(&mut self, r: Outgoing<'_>) -> Result<()> {
        let value = String::from_utf8(r.value.clone().unwrap_or_default()).unwrap();
        if value.starts_with(self.refused) {
            return Err(Error::Record(RecordError::OutputRefused {
                stage: String::new(),
                input: None,
                dead_letter: false,
                topic: r.topic.to_string(),
                partition: r.tag.channel.partition,
                reason: Box::new(self.reason.clone()),
            }));
        }
        self.sent.send(r)
    }
}

fn too_large() -> crate::Refusal {
    crate::Refusal::TooLarge {
        size: 100_022,
        limit: Some(100_000),
        setting: crate::PRODUCER_SIZE_LIMIT,
    }
}

/// Case C16 on a task: an output refused for good names the stage and its input record; the
/// redo of a task that refuses that input record dead-letters it (kind `output-refused`, the
/// error as the reason) instead of handling it, and handles the others.
#[test]
fn c16_an_input_whose_output_is_refused_goes_to_the_policy_on_its_redo() {
    let ctx = sum(dead_letter());
    let mut t = task(&ctx);
    let mut out = RefusingSome {
        sent: Sends::default(),
        refused: "b=",
        reason: too_large(),
    };
    for (offset, key) in [(0, "a"), (1, "b"), (2, "c")] {
        t.offer(&ctx, fetched(0, offset, key, "5", None)).unwrap();
    }
    let err = t.deliver(&ctx, &mut out).unwrap_err();
    let expected_input = crate::InputRecord {
        topic: "in".into(),
        partition: 0,
        offset: 1,
    };
    assert!(
        matches!(&err, Error::Record(RecordError::OutputRefused { stage, input: Some(i), dead_letter: false, topic, .. })
            if stage == "sum" && **i == expected_input && topic == "out"),
        "{err:?}"
    );
    assert_eq!(
        t.clock().unacked(),
        1,
        "the refused send's claim is released"
    );

    // The recovery: a task back at the last commit, told which input was refused.
    let refused = parsley_task::task::RefusedInput::of(&err, 0).expect("an input to take");
    let mut t = task(&ctx);
    t.refuse([refused]);
    assert!(t.is_refused(0, 1));
    let mut out = Sends::default();
    for (offset, key) in [(0, "a"), (1, "b"), (2, "c")] {
        t.offer(&ctx, fetched(0, offset, key, "5", None)).unwrap();
    }
    let work = t.deliver(&ctx, &mut out).unwrap();
    let sent: Vec<(&str, &str)> = out
        .0
        .iter()
        .map(|s| (s.topic.as_str(), s.value.as_str()))
        .collect();
    assert_eq!(sent, [("out", "a=5"), ("dlq", "5"), ("out", "c=5")]);
    let dlq = &out.0[1];
    assert_eq!(
        dlq.header(DLQ_KIND_HEADER).as_deref(),
        Some("output-refused")
    );
    assert_eq!(dlq.header(DLQ_SOURCE_HEADER).as_deref(), Some("in/0@1"));
    assert_eq!(dlq.header(DLQ_REASON_HEADER), Some(err.to_string()));
    assert_eq!(
        dlq.timestamp,
        Some(1_001),
        "a size refusal keeps the timestamp"
    );
    // Two emissions of the handler; the dead letter is a delivery, not an emission.
    assert_eq!((work.deliveries, work.emissions), (3, 2));
    let m = ctx.metrics.snapshot();
    assert_eq!((m.bad_records.output_refused, m.dead_lettered), (1, 1));
    assert_eq!(t.input_offsets()[0], (ch(1), 3), "b commits as processed");

    // Sends name their input until every send is acknowledged and the changelog written.
    let seq = |i: usize| out.0[i].tag.seq;
    let cause = |t: &Task, i| t.cause_of(seq(i)).map(|c| (c.offset, c.dead_letter));
    assert_eq!(
        [cause(&t, 0), cause(&t, 1), cause(&t, 2)],
        [Some((0, false)), Some((1, true)), Some((2, false))]
    );
    let mut next = BTreeMap::new();
    ack_all(&mut t, &out.0, &mut next);
    t.write_changelog(&ctx, &mut Written::default()).unwrap();
    assert_eq!(cause(&t, 0), None);
    assert!(!t.is_refused(0, 1), "taken, and committed: forgotten");
}

/// Case C17 on a task: the dead letter of an input whose output's timestamp was refused gets
/// the producer's clock (its own timestamp would be refused too); the refused timestamp is in
/// the reason.
#[test]
fn c17_the_dead_letter_of_a_refused_timestamp_gets_the_producers_clock() {
    let ctx = sum(dead_letter());
    let reason = crate::Refusal::Timestamp {
        timestamp: 1_000,
        skew_ms: 7_200_000,
        setting: crate::TIMESTAMP_AFTER_LIMIT,
        max_ms: Some(3_600_000),
    };
    let mut t = task(&ctx);
    let mut out = RefusingSome {
        sent: Sends::default(),
        refused: "a=",
        reason,
    };
    t.offer(&ctx, fetched(0, 0, "a", "5", None)).unwrap();
    let err = t.deliver(&ctx, &mut out).unwrap_err();
    let mut t = task(&ctx);
    t.refuse(parsley_task::task::RefusedInput::of(&err, 0));
    let mut out = Sends::default();
    t.offer(&ctx, fetched(0, 0, "a", "5", None)).unwrap();
    t.deliver(&ctx, &mut out).unwrap();
    assert_eq!(out.0.len(), 1);
    assert_eq!(out.0[0].topic, "dlq");
    assert_eq!(out.0[0].timestamp, None);
    assert!(
        out.0[0]
            .header(DLQ_REASON_HEADER)
            .unwrap()
            .contains("7200000 ms ahead of this host's clock"),
        "{:?}",
        out.0[0].header(DLQ_REASON_HEADER)
    );
}

/// A refused dead letter names the record it carries, and the policy cannot take it.
#[test]
fn a_refused_dead_letter_is_named_as_one() {
    let ctx = sum(dead_letter());
    let mut t = task(&ctx);
    let mut out = RefusingSome {
        sent: Sends::default(),
        refused: "not a number",
        reason: too_large(),
    };
    t.offer(&ctx, fetched(0, 0, "a", "not a number", None))
        .unwrap();
    let err = t.deliver(&ctx, &mut out).unwrap_err();
    assert!(
        matches!(&err, Error::Record(RecordError::OutputRefused { stage, input: Some(i), dead_letter: true, topic, .. })
            if stage == "sum" && i.offset == 0 && topic == "dlq"),
        "{err:?}"
    );
    assert!(parsley_task::task::RefusedInput::of(&err, 0).is_none());
}
