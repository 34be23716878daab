//! The stamp test vectors of the repository (`spec/stamp-vectors.json`), checked against this
//! codec both ways: every `encode` case encodes to its bytes and decodes back, every `decode`
//! case decodes to its stamp (and encodes back in the version its bytes name), and every
//! `malformed` case fails with its error kind at its byte position.
//!
//! The file is the source of truth: when the codec's bytes change, this test fails, and the
//! change is a new stamp format version, not an edit of the vectors. Its format is described
//! in the book's specification ("Test vectors for the stamp").

use std::collections::BTreeSet;

use parsley_clock::codec::{STAMP_VERSION, decode, encode, encode_version, try_encode};
use parsley_clock::{
    Channel, Clock, DecodeErrorKind, Error, InFlight, LEGACY_STAMP_HEADER, STAMP_HEADER, SenderId,
    SenderTag, Stamp, TopicId,
};
use serde_json::Value;

const VECTORS: &str = include_str!("../../../spec/stamp-vectors.json");

/// Every decode error kind, by the name the vectors use.
const KINDS: [&str; 14] = [
    "truncated",
    "unknown_version",
    "unknown_flags",
    "varint_overflow",
    "non_canonical_varint",
    "unsorted_topics",
    "empty_topic_group",
    "partition_out_of_range",
    "offset_out_of_range",
    "trailing_bytes",
    "claims_without_sender",
    "inconsistent_sequences",
    "sequence_out_of_range",
    "non_canonical_sender_id",
];

/// The vectors' name of a decode error kind, and the value it carries (the version or the
/// flags).
fn kind_name(kind: DecodeErrorKind) -> (&'static str, Option<u64>) {
    match kind {
        DecodeErrorKind::Truncated => ("truncated", None),
        DecodeErrorKind::UnknownVersion(v) => ("unknown_version", Some(v.into())),
        DecodeErrorKind::UnknownFlags(f) => ("unknown_flags", Some(f.into())),
        DecodeErrorKind::VarintOverflow => ("varint_overflow", None),
        DecodeErrorKind::NonCanonicalVarint => ("non_canonical_varint", None),
        DecodeErrorKind::UnsortedTopics => ("unsorted_topics", None),
        DecodeErrorKind::EmptyTopicGroup => ("empty_topic_group", None),
        DecodeErrorKind::PartitionOutOfRange => ("partition_out_of_range", None),
        DecodeErrorKind::OffsetOutOfRange => ("offset_out_of_range", None),
        DecodeErrorKind::TrailingBytes => ("trailing_bytes", None),
        DecodeErrorKind::ClaimsWithoutSender => ("claims_without_sender", None),
        DecodeErrorKind::InconsistentSequences => ("inconsistent_sequences", None),
        DecodeErrorKind::SequenceOutOfRange => ("sequence_out_of_range", None),
        DecodeErrorKind::NonCanonicalSenderId => ("non_canonical_sender_id", None),
        other => panic!("decode error kind {other:?} has no name in the vectors: add it"),
    }
}

fn vectors() -> Value {
    serde_json::from_str(VECTORS).expect("spec/stamp-vectors.json is JSON")
}

fn field<'a>(v: &'a Value, name: &str, ctx: &str) -> &'a Value {
    v.get(name)
        .unwrap_or_else(|| panic!("{ctx}: field `{name}` missing"))
}

fn str_field<'a>(v: &'a Value, name: &str, ctx: &str) -> &'a str {
    field(v, name, ctx)
        .as_str()
        .unwrap_or_else(|| panic!("{ctx}: `{name}` is not a string"))
}

fn array<'a>(v: &'a Value, name: &str, ctx: &str) -> &'a [Value] {
    field(v, name, ctx)
        .as_array()
        .unwrap_or_else(|| panic!("{ctx}: `{name}` is not an array"))
}

/// A 64-bit value, written as a decimal string (JSON numbers lose precision beyond 2^53 in
/// many languages).
fn u64_field(v: &Value, name: &str, ctx: &str) -> u64 {
    str_field(v, name, ctx)
        .parse()
        .unwrap_or_else(|e| panic!("{ctx}: `{name}` is not a decimal u64: {e}"))
}

fn i64_field(v: &Value, name: &str, ctx: &str) -> i64 {
    str_field(v, name, ctx)
        .parse()
        .unwrap_or_else(|e| panic!("{ctx}: `{name}` is not a decimal i64: {e}"))
}

fn uuid_field(v: &Value, name: &str, ctx: &str) -> uuid::Uuid {
    let s = str_field(v, name, ctx);
    let id = uuid::Uuid::parse_str(s).unwrap_or_else(|e| panic!("{ctx}: `{name}`: {e}"));
    // One spelling only: lower-case, hyphenated.
    assert_eq!(
        id.hyphenated().to_string(),
        s,
        "{ctx}: `{name}` not in canonical form"
    );
    id
}

fn channel(v: &Value, ctx: &str) -> Channel {
    let topic = TopicId::from_uuid(uuid_field(v, "topic", ctx));
    let partition = field(v, "partition", ctx)
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .unwrap_or_else(|| panic!("{ctx}: `partition` is not an i32"));
    Channel::new(topic, partition)
}

fn hex(v: &Value, name: &str, ctx: &str) -> Vec<u8> {
    let s = str_field(v, name, ctx);
    assert!(
        s.len().is_multiple_of(2),
        "{ctx}: `{name}` has an odd number of hex digits"
    );
    (0..s.len())
        .step_by(2)
        .map(|i| {
            let pair = &s[i..i + 2];
            assert_eq!(pair, pair.to_lowercase(), "{ctx}: hex is lower-case");
            u8::from_str_radix(pair, 16).unwrap_or_else(|e| panic!("{ctx}: `{name}`: {e}"))
        })
        .collect()
}

/// The stamp a vector describes.
fn stamp(v: &Value, ctx: &str) -> Stamp {
    let sender = match field(v, "sender", ctx) {
        Value::Null => None,
        s => Some(SenderTag {
            sender: SenderId::from_uuid(uuid_field(s, "id", ctx)),
            seq: u64_field(s, "seq", ctx),
        }),
    };
    let acked_through = match field(v, "acked_through", ctx) {
        Value::Null => None,
        _ => Some(u64_field(v, "acked_through", ctx)),
    };
    let entries = array(v, "clock", ctx)
        .iter()
        .map(|e| (channel(e, ctx), i64_field(e, "offset", ctx)))
        .collect();
    // The file lists entries in the order of the wire: by topic id (its bytes), then
    // partition.
    let clock = Clock::try_from_sorted(entries)
        .unwrap_or_else(|e| panic!("{ctx}: clock entries not sorted: {e}"));
    let in_flight = array(v, "in_flight", ctx)
        .iter()
        .map(|c| InFlight {
            channel: channel(c, ctx),
            seq: u64_field(c, "seq", ctx),
        })
        .collect();
    Stamp {
        sender,
        clock,
        in_flight,
        acked_through,
    }
}

#[test]
fn the_vectors_name_this_codecs_version_and_headers() {
    let v = vectors();
    assert_eq!(field(&v, "vectors_version", "top").as_u64(), Some(1));
    assert_eq!(
        field(&v, "stamp_format_version", "top").as_u64(),
        Some(u64::from(STAMP_VERSION))
    );
    assert_eq!(str_field(&v, "header", "top"), STAMP_HEADER);
    let legacy: Vec<&str> = array(&v, "legacy_headers", "top")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(legacy, [LEGACY_STAMP_HEADER]);
}

#[test]
fn encode_cases_encode_to_their_bytes_and_decode_back() {
    let v = vectors();
    let cases = array(&v, "encode", "top");
    let mut names = BTreeSet::new();
    for case in cases {
        let name = str_field(case, "name", "encode case");
        assert!(names.insert(name), "encode case {name} twice");
        let ctx = &format!("encode case {name}");
        assert_eq!(str_field(case, "header", ctx), STAMP_HEADER, "{ctx}");
        let s = stamp(field(case, "stamp", ctx), ctx);
        let bytes = hex(case, "bytes", ctx);
        assert_eq!(
            to_hex(&encode(&s)),
            to_hex(&bytes),
            "{ctx}: the encoder's bytes"
        );
        assert_eq!(try_encode(&s).as_deref(), Ok(&bytes[..]), "{ctx}");
        assert_eq!(decode(&bytes), Ok(s), "{ctx}: decoding the bytes");
    }
    assert!(cases.len() >= 15, "{} encode cases", cases.len());
}

#[test]
fn decode_cases_decode_to_their_stamps() {
    let v = vectors();
    let cases = array(&v, "decode", "top");
    for case in cases {
        let name = str_field(case, "name", "decode case");
        let ctx = &format!("decode case {name}");
        let version = field(case, "format_version", ctx)
            .as_u64()
            .and_then(|v| u8::try_from(v).ok())
            .unwrap_or_else(|| panic!("{ctx}: `format_version` is not a byte"));
        let s = stamp(field(case, "stamp", ctx), ctx);
        let bytes = hex(case, "bytes", ctx);
        assert_eq!(decode(&bytes), Ok(s.clone()), "{ctx}");
        // Canonical: the stamp encodes back to the same bytes in the version they name.
        assert_eq!(
            to_hex(&encode_version(&s, version)),
            to_hex(&bytes),
            "{ctx}"
        );
    }
    assert!(!cases.is_empty());
}

#[test]
fn malformed_cases_fail_with_their_error() {
    let v = vectors();
    let cases = array(&v, "malformed", "top");
    let mut seen = BTreeSet::new();
    let mut wrong = Vec::new();
    for case in cases {
        let name = str_field(case, "name", "malformed case");
        let ctx = &format!("malformed case {name}");
        let bytes = hex(case, "bytes", ctx);
        let want = field(case, "error", ctx);
        let want_kind = str_field(want, "kind", ctx);
        assert!(
            KINDS.contains(&want_kind),
            "{ctx}: unknown kind {want_kind}"
        );
        let want_at = field(want, "at", ctx)
            .as_u64()
            .unwrap_or_else(|| panic!("{ctx}: `at` is not a number"));
        let want_value = want.get("value").map(|x| {
            x.as_u64()
                .unwrap_or_else(|| panic!("{ctx}: `value` is not a number"))
        });
        match decode(&bytes) {
            Err(Error::Decode { at, kind }) => {
                let (got_kind, got_value) = kind_name(kind);
                if (got_kind, got_value, at as u64) != (want_kind, want_value, want_at) {
                    wrong.push(format!(
                        "{ctx}: got {got_kind} ({got_value:?}) at {at}, \
                         want {want_kind} ({want_value:?}) at {want_at}"
                    ));
                }
            }
            other => wrong.push(format!("{ctx}: decoded to {other:?}")),
        }
        seen.insert(want_kind);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let missing: Vec<&str> = KINDS
        .iter()
        .filter(|k| !seen.contains(*k))
        .copied()
        .collect();
    assert!(missing.is_empty(), "no malformed case for {missing:?}");
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
