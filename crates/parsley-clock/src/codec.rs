//! The `parsley.stamp` header codec: versioned, compact, total on untrusted input.
//!
//! # Format (version 1)
//!
//! ```text
//! stamp    := version:u8 (= 1) flags:u8 [sender] topics
//! sender   := sender_id:[u8; 16] seq:varint            (present iff flags bit 0)
//! topics   := count:varint group*                       (topic ids strictly ascending)
//! group    := topic_id:[u8; 16] n:varint (>= 1) entry*n (partitions strictly ascending)
//! entry    := partition_gap:varint offset:varint|zigzag
//! ```
//!
//! - `varint` is unsigned LEB128 (at most 10 bytes); `zigzag` maps signed to unsigned.
//! - The first entry of a group writes its partition and its offset as plain varints; each
//!   further entry writes `partition - previous - 1` and the zigzag delta of its offset from
//!   the previous entry's offset, so the partitions of one topic — whose offsets are usually
//!   close — cost a few bytes each and a topic's UUID is written once.
//! - Flag bits 1–7 are reserved for in-flight claims and the acked-through sequence
//!   (DESIGN.md §3, issue 3). A decoder that does not know a bit rejects the header rather than
//!   misread it.
//!
//! The encoding of a stamp is canonical: [`decode`] accepts only what [`encode`] produces, so
//! equal stamps have equal bytes.
//!
//! # Errors
//! Decoding never panics and never allocates more than the input can describe; every failure is
//! an [`Error::Decode`] naming the byte position and what was wrong (property-tested on
//! arbitrary bytes).

use crate::channel::{Channel, TopicId};
use crate::clock::Clock;
use crate::error::{DecodeErrorKind, Error, Result};
use crate::sender::{SenderId, SenderTag};
use crate::stamp::Stamp;

/// The Kafka record header that carries a [`Stamp`].
pub const STAMP_HEADER: &str = "parsley.stamp";

/// The version this codec writes.
pub const STAMP_VERSION: u8 = 1;

const FLAG_SENDER: u8 = 0b0000_0001;
const KNOWN_FLAGS: u8 = FLAG_SENDER;

/// Encodes `stamp` into a fresh buffer.
pub fn encode(stamp: &Stamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len_hint(stamp));
    encode_into(stamp, &mut out);
    out
}

/// Appends the encoding of `stamp` to `out`.
pub fn encode_into(stamp: &Stamp, out: &mut Vec<u8>) {
    out.push(STAMP_VERSION);
    let flags = if stamp.sender.is_some() {
        FLAG_SENDER
    } else {
        0
    };
    out.push(flags);
    if let Some(tag) = stamp.sender {
        out.extend_from_slice(tag.sender.as_bytes());
        put_varint(out, tag.seq);
    }
    let entries = stamp.clock.entries();
    let topics = count_topics(entries);
    put_varint(out, topics as u64);
    let mut i = 0;
    while i < entries.len() {
        let topic = entries[i].0.topic;
        let end = i + entries[i..]
            .iter()
            .take_while(|(c, _)| c.topic == topic)
            .count();
        out.extend_from_slice(topic.as_bytes());
        put_varint(out, (end - i) as u64);
        let (first, first_offset) = entries[i];
        put_varint(out, first.partition as u64);
        put_varint(out, first_offset as u64);
        let (mut prev_p, mut prev_o) = (first.partition, first_offset);
        for &(c, o) in &entries[i + 1..end] {
            put_varint(out, (c.partition - prev_p - 1) as u64);
            put_varint(out, zigzag(o - prev_o));
            prev_p = c.partition;
            prev_o = o;
        }
        i = end;
    }
}

/// An upper bound of the encoded size, for buffer sizing.
pub fn encoded_len_hint(stamp: &Stamp) -> usize {
    2 + 26 + 10 + stamp.clock.len() * (16 + 10 + 20)
}

/// Decodes a stamp header value.
///
/// # Errors
/// [`Error::Decode`] with the byte position and the [`DecodeErrorKind`] when the bytes are not
/// the canonical encoding of a stamp of a version this codec knows.
pub fn decode(bytes: &[u8]) -> Result<Stamp> {
    let mut r = Reader { bytes, at: 0 };
    let version = r.byte()?;
    if version != STAMP_VERSION {
        return Err(r.fail_at(0, DecodeErrorKind::UnknownVersion(version)));
    }
    let flags = r.byte()?;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(r.fail_at(1, DecodeErrorKind::UnknownFlags(flags)));
    }
    let sender = if flags & FLAG_SENDER != 0 {
        let id = SenderId::from_bytes(r.array16()?);
        let seq = r.varint()?;
        Some(SenderTag { sender: id, seq })
    } else {
        None
    };
    let topics = r.varint()?;
    // Each group needs at least 16 + 1 + 2 bytes: never trust the count for allocation.
    if topics > (r.remaining() / 19) as u64 {
        return Err(r.fail(DecodeErrorKind::Truncated));
    }
    let mut entries: Vec<(Channel, i64)> = Vec::with_capacity(topics as usize);
    let mut prev_topic: Option<TopicId> = None;
    for _ in 0..topics {
        let topic_at = r.at;
        let topic = TopicId::from_bytes(r.array16()?);
        if prev_topic.is_some_and(|p| p >= topic) {
            return Err(r.fail_at(topic_at, DecodeErrorKind::UnsortedTopics));
        }
        prev_topic = Some(topic);
        let n_at = r.at;
        let n = r.varint()?;
        if n == 0 {
            return Err(r.fail_at(n_at, DecodeErrorKind::EmptyTopicGroup));
        }
        if n > (r.remaining() / 2) as u64 {
            return Err(r.fail(DecodeErrorKind::Truncated));
        }
        entries.reserve(n as usize);
        let mut prev: Option<(i32, i64)> = None;
        for _ in 0..n {
            let p_at = r.at;
            let raw_p = r.varint()?;
            let partition = match prev {
                None => i32::try_from(raw_p).ok(),
                Some((pp, _)) => i64::from(pp)
                    .checked_add(1)
                    .and_then(|x| x.checked_add(i64::try_from(raw_p).ok()?))
                    .and_then(|x| i32::try_from(x).ok()),
            }
            .ok_or_else(|| r.fail_at(p_at, DecodeErrorKind::PartitionOutOfRange))?;
            let o_at = r.at;
            let raw_o = r.varint()?;
            let offset = match prev {
                None => i64::try_from(raw_o).ok(),
                Some((_, po)) => po.checked_add(unzigzag(raw_o)).filter(|o| *o >= 0),
            }
            .ok_or_else(|| r.fail_at(o_at, DecodeErrorKind::OffsetOutOfRange))?;
            prev = Some((partition, offset));
            entries.push((Channel::new(topic, partition), offset));
        }
    }
    if r.remaining() != 0 {
        return Err(r.fail(DecodeErrorKind::TrailingBytes));
    }
    // Sorted by construction: topics ascend, partitions ascend within a topic.
    let clock = Clock::try_from_sorted(entries).map_err(|_| Error::Decode {
        at: bytes.len(),
        kind: DecodeErrorKind::UnsortedTopics,
    })?;
    Ok(Stamp { sender, clock })
}

fn count_topics(entries: &[(Channel, i64)]) -> usize {
    let mut n = 0;
    let mut prev: Option<TopicId> = None;
    for (c, _) in entries {
        if prev != Some(c.topic) {
            n += 1;
            prev = Some(c.topic);
        }
    }
    n
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn fail(&self, kind: DecodeErrorKind) -> Error {
        Error::Decode { at: self.at, kind }
    }

    fn fail_at(&self, at: usize, kind: DecodeErrorKind) -> Error {
        Error::Decode { at, kind }
    }

    fn byte(&mut self) -> Result<u8> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| self.fail(DecodeErrorKind::Truncated))?;
        self.at += 1;
        Ok(b)
    }

    fn array16(&mut self) -> Result<[u8; 16]> {
        let slice = self
            .bytes
            .get(self.at..self.at + 16)
            .ok_or_else(|| self.fail(DecodeErrorKind::Truncated))?;
        self.at += 16;
        let mut a = [0u8; 16];
        a.copy_from_slice(slice);
        Ok(a)
    }

    fn varint(&mut self) -> Result<u64> {
        let start = self.at;
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.byte()?;
            if i == 9 && b > 1 {
                return Err(self.fail_at(start, DecodeErrorKind::VarintOverflow));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                // Canonical: no redundant trailing zero groups.
                if i > 0 && b == 0 {
                    return Err(self.fail_at(start, DecodeErrorKind::NonCanonicalVarint));
                }
                return Ok(v);
            }
        }
        Err(self.fail_at(start, DecodeErrorKind::VarintOverflow))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::channel::Coordinate;

    fn topic(t: u8) -> TopicId {
        TopicId::from_bytes([t; 16])
    }

    fn sample() -> Stamp {
        let clock: Clock = [
            Channel::new(topic(1), 0).at(1_000_000),
            Channel::new(topic(1), 1).at(1_000_200),
            Channel::new(topic(1), 5).at(999_000),
            Channel::new(topic(2), 0).at(0),
        ]
        .into_iter()
        .collect();
        Stamp::new(
            Some(SenderTag {
                sender: SenderId::from_bytes([9; 16]),
                seq: 300,
            }),
            clock,
        )
    }

    #[test]
    fn round_trip_of_a_sample_stamp() {
        let s = sample();
        let bytes = encode(&s);
        assert_eq!(decode(&bytes).unwrap(), s);
        // version, flags, sender 16 + seq 2, topic count 1,
        // topic 1: 16 + n 1 + (1 + 3) + (1 + 2) + (1 + 2), topic 2: 16 + 1 + 1 + 1
        assert_eq!(
            bytes.len(),
            2 + 18 + 1 + (16 + 1 + 4 + 3 + 3) + (16 + 1 + 2)
        );
    }

    #[test]
    fn empty_stamp_is_three_bytes() {
        let bytes = encode(&Stamp::default());
        assert_eq!(bytes, vec![STAMP_VERSION, 0, 0]);
        assert_eq!(decode(&bytes).unwrap(), Stamp::default());
    }

    #[test]
    fn rejections_name_what_and_where() {
        let good = encode(&sample());
        let cases: Vec<(Vec<u8>, usize, DecodeErrorKind)> = vec![
            (vec![], 0, DecodeErrorKind::Truncated),
            (vec![2, 0, 0], 0, DecodeErrorKind::UnknownVersion(2)),
            (vec![1, 0b10, 0], 1, DecodeErrorKind::UnknownFlags(0b10)),
            // The last group claims one entry but only its partition byte is left.
            (
                good[..good.len() - 1].to_vec(),
                good.len() - 2,
                DecodeErrorKind::Truncated,
            ),
            (
                [good.clone(), vec![0]].concat(),
                good.len(),
                DecodeErrorKind::TrailingBytes,
            ),
            (
                vec![1, 0, 0x80, 0x00],
                2,
                DecodeErrorKind::NonCanonicalVarint,
            ),
            (
                vec![
                    1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
                ],
                2,
                DecodeErrorKind::VarintOverflow,
            ),
        ];
        for (bytes, at, kind) in cases {
            match decode(&bytes) {
                Err(Error::Decode { at: a, kind: k }) => {
                    assert_eq!((a, k), (at, kind), "for {bytes:?}")
                }
                other => panic!("{bytes:?} decoded to {other:?}"),
            }
        }
    }

    #[test]
    fn unsorted_topics_and_empty_groups_are_rejected() {
        let mut bytes = vec![1, 0, 2];
        bytes.extend_from_slice(&[2; 16]);
        bytes.extend_from_slice(&[1, 0, 0]);
        bytes.extend_from_slice(&[1; 16]);
        bytes.extend_from_slice(&[1, 0, 0]);
        assert!(matches!(
            decode(&bytes),
            Err(Error::Decode {
                at: 22,
                kind: DecodeErrorKind::UnsortedTopics
            })
        ));
        let mut empty = vec![1, 0, 1];
        empty.extend_from_slice(&[1; 16]);
        empty.extend_from_slice(&[0, 0, 0]);
        assert!(matches!(
            decode(&empty),
            Err(Error::Decode {
                kind: DecodeErrorKind::EmptyTopicGroup,
                ..
            })
        ));
    }

    #[test]
    fn a_negative_offset_delta_below_zero_is_rejected() {
        // topic 1: partition 0 @ 1, partition 1 @ 1 + (-2) = -1
        let mut bytes = vec![1, 0, 1];
        bytes.extend_from_slice(&[1; 16]);
        bytes.extend_from_slice(&[2, 0, 1, 0, zigzag(-2) as u8]);
        assert!(matches!(
            decode(&bytes),
            Err(Error::Decode {
                at: 23,
                kind: DecodeErrorKind::OffsetOutOfRange
            })
        ));
    }

    fn arb_stamp() -> impl Strategy<Value = Stamp> {
        let entries = proptest::collection::vec((0u8..6, 0i32..i32::MAX, 0i64..i64::MAX), 0..40);
        (
            proptest::option::of((any::<[u8; 16]>(), any::<u64>())),
            entries,
        )
            .prop_map(|(sender, entries)| {
                let clock: Clock = entries
                    .into_iter()
                    .map(|(t, p, o)| Coordinate {
                        channel: Channel::new(topic(t), p),
                        offset: o,
                    })
                    .collect();
                Stamp::new(
                    sender.map(|(id, seq)| SenderTag {
                        sender: SenderId::from_bytes(id),
                        seq,
                    }),
                    clock,
                )
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn decode_inverts_encode(s in arb_stamp()) {
            let bytes = encode(&s);
            prop_assert!(bytes.len() <= encoded_len_hint(&s));
            prop_assert_eq!(decode(&bytes).unwrap(), s);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_accepted_bytes_are_canonical(
            bytes in proptest::collection::vec(any::<u8>(), 0..200)
        ) {
            if let Ok(s) = decode(&bytes) {
                prop_assert_eq!(encode(&s), bytes);
            }
        }

        #[test]
        fn mutated_encodings_never_panic(s in arb_stamp(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
            let mut bytes = encode(&s);
            for (i, b) in flips {
                let n = bytes.len();
                bytes[i % n] ^= b;
            }
            if let Ok(d) = decode(&bytes) {
                prop_assert_eq!(encode(&d), bytes);
            }
        }
    }
}
