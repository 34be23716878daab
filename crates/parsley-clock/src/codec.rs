//! The `parsley.stamp` header codec: versioned, compact, total on untrusted input.
//!
//! # Format (version 1)
//!
//! ```text
//! stamp     := version:u8 (= 1) flags:u8 [sender] [acked] clock [in_flight]
//! sender    := sender_id:[u8; 16] seq:varint          (iff flags bit 0)
//! acked     := acked_through:varint                   (iff flags bit 2)
//! clock     := groups                                 (values are offsets)
//! in_flight := groups                                 (iff flags bit 1; values are sequences)
//! groups    := count:varint group*                    (topic ids strictly ascending)
//! group     := topic_id:[u8; 16] n:varint (>= 1) entry*n (partitions strictly ascending)
//! entry     := partition_gap:varint value:varint|zigzag
//! ```
//!
//! - `varint` is unsigned LEB128 (at most 10 bytes); `zigzag` maps signed to unsigned.
//! - The first entry of a group writes its partition and its value as plain varints; each
//!   further entry writes `partition - previous - 1` and the zigzag delta of its value from
//!   the previous entry's value, so the partitions of one topic — whose offsets are usually
//!   close — cost a few bytes each and a topic's UUID is written once per section.
//! - Flag bits 3–7 are reserved. A decoder that does not know a bit rejects the header rather
//!   than misread it.
//!
//! The encoding of a stamp is canonical: [`decode`] accepts only what [`encode`] produces, so
//! equal stamps have equal bytes. Decoding also checks the invariants of [`Stamp`] (in-flight
//! claims need a sender, sequences are consistent).
//!
//! # Errors
//! Decoding never panics and never allocates more than the input can describe; every failure is
//! an [`Error::Decode`] naming the byte position and what was wrong (property-tested on
//! arbitrary bytes).

use crate::channel::{Channel, TopicId};
use crate::clock::Clock;
use crate::error::{DecodeErrorKind, Error, Result};
use crate::sender::{SenderId, SenderTag};
use crate::stamp::{InFlight, Stamp};

/// The Kafka record header that carries a [`Stamp`].
pub const STAMP_HEADER: &str = "parsley.stamp";

/// The version this codec writes.
pub const STAMP_VERSION: u8 = 1;

const FLAG_SENDER: u8 = 0b0000_0001;
const FLAG_IN_FLIGHT: u8 = 0b0000_0010;
const FLAG_ACKED: u8 = 0b0000_0100;
const KNOWN_FLAGS: u8 = FLAG_SENDER | FLAG_IN_FLIGHT | FLAG_ACKED;

/// Encodes `stamp` into a fresh buffer.
///
/// # Panics
/// When the stamp breaks its invariants (see [`Stamp::validate`]) or an in-flight sequence
/// exceeds `i64::MAX`; [`try_encode`] returns an error instead.
pub fn encode(stamp: &Stamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len_hint(stamp));
    encode_into(stamp, &mut out);
    out
}

/// Encodes `stamp` into a fresh buffer, checking its invariants first.
///
/// # Errors
/// [`Error::Decode`] naming the broken invariant.
pub fn try_encode(stamp: &Stamp) -> Result<Vec<u8>> {
    stamp.validate()?;
    if stamp.in_flight.iter().any(|c| c.seq > i64::MAX as u64) {
        return Err(Error::Decode {
            at: 0,
            kind: DecodeErrorKind::SequenceOutOfRange,
        });
    }
    Ok(encode(stamp))
}

/// Appends the encoding of `stamp` to `out`.
///
/// # Panics
/// As [`encode`].
pub fn encode_into(stamp: &Stamp, out: &mut Vec<u8>) {
    debug_assert!(stamp.validate().is_ok(), "encoding an invalid stamp");
    encode_parts(
        stamp.sender,
        stamp.acked_through,
        stamp.clock.entries(),
        &stamp.in_flight,
        out,
    );
}

/// Appends the encoding of the stamp made of these parts to `out`, without building a
/// [`Stamp`] (a node's clock is not copied per send: [`crate::CausalClock::stamp_into`]).
/// The parts must satisfy [`Stamp`]'s invariants; `clock` sorted by channel.
///
/// # Panics
/// As [`encode`].
pub(crate) fn encode_parts(
    sender: Option<SenderTag>,
    acked_through: Option<u64>,
    clock: &[(Channel, i64)],
    in_flight: &[InFlight],
    out: &mut Vec<u8>,
) {
    let start = out.len();
    out.resize(start + len_hint(clock.len() + in_flight.len()), 0);
    let mut w = Writer {
        buf: &mut out[start..],
        at: 0,
    };
    let mut flags = 0;
    if sender.is_some() {
        flags |= FLAG_SENDER;
    }
    if !in_flight.is_empty() {
        flags |= FLAG_IN_FLIGHT;
    }
    if acked_through.is_some() {
        flags |= FLAG_ACKED;
    }
    w.byte(STAMP_VERSION);
    w.byte(flags);
    if let Some(tag) = sender {
        w.bytes16(tag.sender.as_bytes());
        w.varint(tag.seq);
    }
    if let Some(a) = acked_through {
        w.varint(a);
    }
    w.groups(clock);
    if !in_flight.is_empty() {
        let claims: Vec<(Channel, i64)> = in_flight
            .iter()
            .map(|c| {
                let seq = i64::try_from(c.seq).expect("in-flight sequence beyond i64::MAX");
                (c.channel, seq)
            })
            .collect();
        w.groups(&claims);
    }
    let written = w.at;
    out.truncate(start + written);
}

/// Writes into a buffer sized by [`encoded_len_hint`], which leaves room for a whole
/// ten-byte varint window at every write: each write checks its window once and the bytes
/// inside it are written without further checks.
struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    #[inline]
    fn byte(&mut self, b: u8) {
        self.buf[self.at] = b;
        self.at += 1;
    }

    #[inline]
    fn bytes16(&mut self, b: &[u8; 16]) {
        self.buf[self.at..self.at + 16].copy_from_slice(b);
        self.at += 16;
    }

    #[inline(always)]
    fn varint(&mut self, v: u64) {
        let window: &mut [u8; 10] = (&mut self.buf[self.at..self.at + 10])
            .try_into()
            .expect("a ten-byte window");
        self.at += put_varint(window, v);
    }

    /// Writes `(channel, value)` entries, sorted by channel, as topic groups, in one pass:
    /// the topic count and each group's entry count get one byte up front, patched once known
    /// (and widened in place in the rare case they need more).
    fn groups(&mut self, entries: &[(Channel, i64)]) {
        let topics_at = self.at;
        self.at += 1;
        let mut topics = 0u64;
        let mut group_at = 0;
        let mut group_len = 0u64;
        let mut prev: Option<(Channel, i64)> = None;
        for &(c, v) in entries {
            match prev {
                Some((p, pv)) if p.topic == c.topic => {
                    // One window check for both varints of the entry.
                    let window: &mut [u8; 20] = (&mut self.buf[self.at..self.at + 20])
                        .try_into()
                        .expect("a twenty-byte window");
                    let gap = (c.partition - p.partition - 1) as u64;
                    let delta = zigzag(v - pv);
                    if gap < 0x80 && delta < 0x4000 {
                        // The common case without a branch on the delta's length: a one-byte
                        // gap, a one- or two-byte delta (a third byte written past a one-byte
                        // delta is overwritten or truncated).
                        let two = u8::from(delta >= 0x80);
                        window[0] = gap as u8;
                        window[1] = (delta as u8 & 0x7f) | (two << 7);
                        window[2] = (delta >> 7) as u8;
                        self.at += 2 + usize::from(two);
                    } else {
                        let first = window.first_chunk_mut::<10>().expect("ten bytes");
                        let n = put_varint(first, gap);
                        let value = window[n..].first_chunk_mut::<10>().expect("ten bytes");
                        self.at += n + put_varint(value, delta);
                    }
                    group_len += 1;
                }
                _ => {
                    if topics > 0 {
                        self.patch_count(group_at, group_len);
                    }
                    topics += 1;
                    self.bytes16(&c.topic.to_bytes());
                    group_at = self.at;
                    self.at += 1;
                    group_len = 1;
                    self.varint(c.partition as u64);
                    self.varint(v as u64);
                }
            }
            prev = Some((c, v));
        }
        if topics > 0 {
            self.patch_count(group_at, group_len);
        }
        self.patch_count(topics_at, topics);
    }

    /// Writes `n` as a varint into the one byte reserved at `at`, moving what was written
    /// after it when `n` needs more bytes.
    #[inline(always)]
    fn patch_count(&mut self, at: usize, n: u64) {
        if n < 0x80 {
            self.buf[at] = n as u8;
        } else {
            self.widen_count(at, n);
        }
    }

    #[cold]
    #[inline(never)]
    fn widen_count(&mut self, at: usize, n: u64) {
        let mut window = [0u8; 10];
        let len = put_varint(&mut window, n);
        self.buf.copy_within(at + 1..self.at, at + len);
        self.buf[at..at + len].copy_from_slice(&window[..len]);
        self.at += len - 1;
    }
}

/// Writes `v` as LEB128 into `window`; returns the number of bytes written (1..=10).
#[inline(always)]
fn put_varint(window: &mut [u8; 10], mut v: u64) -> usize {
    // Fast paths: partition gaps and offset deltas mostly take one or two bytes.
    if v < 0x80 {
        window[0] = v as u8;
        return 1;
    }
    if v < 0x4000 {
        window[0] = (v as u8) | 0x80;
        window[1] = (v >> 7) as u8;
        return 2;
    }
    for (i, slot) in window.iter_mut().enumerate() {
        if v < 0x80 {
            *slot = v as u8;
            return i + 1;
        }
        *slot = (v as u8) | 0x80;
        v >>= 7;
    }
    unreachable!("a u64 takes at most ten LEB128 bytes")
}

/// An upper bound of the encoded size, for buffer sizing.
pub fn encoded_len_hint(stamp: &Stamp) -> usize {
    // version, flags, sender (16 + 10), acked (10), two group counts (10 each), and per entry
    // at most a topic id (16), a group count (10), a partition (10) and a value (10); plus one
    // twenty-byte window of slack for the writer's checked windows.
    len_hint(stamp.clock.len() + stamp.in_flight.len())
}

fn len_hint(entries: usize) -> usize {
    2 + 26 + 10 + 20 + entries * 46 + 20
}

/// Decodes a stamp header value.
///
/// # Errors
/// [`Error::Decode`] with the byte position and the [`DecodeErrorKind`] when the bytes are not
/// the canonical encoding of a valid stamp of a version this codec knows.
pub fn decode(bytes: &[u8]) -> Result<Stamp> {
    let mut r = Reader { bytes, at: 0 };
    let version = r.byte()?;
    if version != STAMP_VERSION {
        return Err(r
            .fail_at(0, DecodeErrorKind::UnknownVersion(version))
            .into());
    }
    let flags = r.byte()?;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(r.fail_at(1, DecodeErrorKind::UnknownFlags(flags)).into());
    }
    let sender = if flags & FLAG_SENDER != 0 {
        let id = SenderId::from_bytes(r.array16()?);
        let seq = r.varint()?;
        Some(SenderTag { sender: id, seq })
    } else {
        None
    };
    let acked_at = r.at;
    let acked_through = if flags & FLAG_ACKED != 0 {
        Some(r.varint()?)
    } else {
        None
    };
    // Sorted by construction: topics ascend, partitions ascend within a topic, offsets >= 0.
    let clock = Clock::from_sorted_unchecked(r.groups(false)?);
    let in_flight_at = r.at;
    let in_flight = if flags & FLAG_IN_FLIGHT != 0 {
        let claims = r.groups(true)?;
        if claims.is_empty() {
            // A set flag with an empty section is not canonical.
            return Err(r
                .fail_at(in_flight_at, DecodeErrorKind::EmptyTopicGroup)
                .into());
        }
        claims
            .into_iter()
            .map(|(channel, seq)| InFlight {
                channel,
                seq: seq as u64,
            })
            .collect()
    } else {
        Vec::new()
    };
    if r.remaining() != 0 {
        return Err(r.fail(DecodeErrorKind::TrailingBytes).into());
    }
    let stamp = Stamp {
        sender,
        clock,
        in_flight,
        acked_through,
    };
    stamp.validate().map_err(|e| match e {
        Error::Decode { kind, .. } => Error::Decode {
            at: if kind == DecodeErrorKind::ClaimsWithoutSender || flags & FLAG_IN_FLIGHT == 0 {
                acked_at
            } else {
                in_flight_at
            },
            kind,
        },
        other => other,
    })?;
    Ok(stamp)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A decoding failure inside the reader: small enough to travel in registers, turned into an
/// [`Error::Decode`] at the codec's boundary.
#[derive(Clone, Copy, Debug)]
struct Fault {
    at: usize,
    kind: DecodeErrorKind,
}

impl From<Fault> for Error {
    fn from(f: Fault) -> Self {
        Error::Decode {
            at: f.at,
            kind: f.kind,
        }
    }
}

type Parse<T> = std::result::Result<T, Fault>;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn fail(&self, kind: DecodeErrorKind) -> Fault {
        Fault { at: self.at, kind }
    }

    fn fail_at(&self, at: usize, kind: DecodeErrorKind) -> Fault {
        Fault { at, kind }
    }

    fn byte(&mut self) -> Parse<u8> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| self.fail(DecodeErrorKind::Truncated))?;
        self.at += 1;
        Ok(b)
    }

    /// Reads a topic id as two big-endian words straight from the input (going through a
    /// 16-byte array costs a store-forwarding stall per topic).
    #[inline]
    fn topic(&mut self) -> Parse<TopicId> {
        let (hi, lo) = self
            .bytes
            .get(self.at..)
            .and_then(|rest| rest.first_chunk::<16>())
            .map(|b| {
                let (hi, lo) = b.split_at(8);
                (
                    u64::from_be_bytes(hi.try_into().expect("eight bytes")),
                    u64::from_be_bytes(lo.try_into().expect("eight bytes")),
                )
            })
            .ok_or_else(|| self.fail(DecodeErrorKind::Truncated))?;
        self.at += 16;
        Ok(TopicId::from_halves(hi as i64, lo as i64))
    }

    #[inline]
    fn array16(&mut self) -> Parse<[u8; 16]> {
        let slice = self
            .bytes
            .get(self.at..self.at + 16)
            .ok_or_else(|| self.fail(DecodeErrorKind::Truncated))?;
        self.at += 16;
        let mut a = [0u8; 16];
        a.copy_from_slice(slice);
        Ok(a)
    }

    /// Reads a varint; one- and two-byte values (most partition gaps and offset deltas) take
    /// the inlined fast path.
    #[inline(always)]
    fn varint(&mut self) -> Parse<u64> {
        match self.bytes.get(self.at..) {
            Some([b0, ..]) if *b0 < 0x80 => {
                self.at += 1;
                Ok(u64::from(*b0))
            }
            // A canonical second byte is non-zero.
            Some([b0, b1, ..]) if *b1 < 0x80 && *b1 != 0 => {
                self.at += 2;
                Ok(u64::from(b0 & 0x7f) | (u64::from(*b1) << 7))
            }
            _ => self.varint_long(),
        }
    }

    #[inline(never)]
    fn varint_long(&mut self) -> Parse<u64> {
        let start = self.at;
        let rest = &self.bytes[start..];
        let mut v: u64 = 0;
        if let Some(window) = rest.first_chunk::<10>() {
            // Ten bytes at hand: no bounds checks inside the loop.
            for (i, &b) in window.iter().enumerate() {
                v |= u64::from(b & 0x7f) << (7 * i);
                if b < 0x80 {
                    return self.varint_end(start, i, b, v);
                }
            }
            return Err(self.fail_at(start, DecodeErrorKind::VarintOverflow));
        }
        for (i, &b) in rest.iter().enumerate() {
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return self.varint_end(start, i, b, v);
            }
        }
        self.at = self.bytes.len();
        Err(self.fail(DecodeErrorKind::Truncated))
    }

    /// Finishes a varint whose last byte `b` is at `start + i`: canonical (no redundant zero
    /// group), at most 64 bits.
    #[inline(always)]
    fn varint_end(&mut self, start: usize, i: usize, b: u8, v: u64) -> Parse<u64> {
        if b == 0 && i > 0 {
            return Err(self.fail_at(start, DecodeErrorKind::NonCanonicalVarint));
        }
        if i == 9 && b > 1 {
            return Err(self.fail_at(start, DecodeErrorKind::VarintOverflow));
        }
        self.at = start + i + 1;
        Ok(v)
    }

    /// Reads a `groups` section; values are offsets, or sequences when `sequences`.
    fn groups(&mut self, sequences: bool) -> Parse<Vec<(Channel, i64)>> {
        let out_of_range = if sequences {
            DecodeErrorKind::SequenceOutOfRange
        } else {
            DecodeErrorKind::OffsetOutOfRange
        };
        let topics = self.varint()?;
        // Each group needs at least 16 + 1 + 2 bytes: never trust the count for allocation.
        if topics > (self.remaining() / 19) as u64 {
            return Err(self.fail(DecodeErrorKind::Truncated));
        }
        // Every entry takes at least 2 bytes: one allocation, trimmed below if it was far too
        // generous (a decoded stamp may wait in a queue for a while).
        let bound = (self.remaining() - 17 * topics as usize) / 2;
        let mut entries: Vec<(Channel, i64)> = Vec::with_capacity(bound);
        let mut prev_topic: Option<TopicId> = None;
        for _ in 0..topics {
            let topic_at = self.at;
            let topic = self.topic()?;
            if prev_topic.is_some_and(|p| p >= topic) {
                return Err(self.fail_at(topic_at, DecodeErrorKind::UnsortedTopics));
            }
            prev_topic = Some(topic);
            let n_at = self.at;
            let n = self.varint()?;
            if n == 0 {
                return Err(self.fail_at(n_at, DecodeErrorKind::EmptyTopicGroup));
            }
            if n > (self.remaining() / 2) as u64 {
                return Err(self.fail(DecodeErrorKind::Truncated));
            }
            // The first entry: plain partition and value.
            let p_at = self.at;
            let mut partition = i32::try_from(self.varint()?)
                .map_err(|_| self.fail_at(p_at, DecodeErrorKind::PartitionOutOfRange))?;
            let v_at = self.at;
            let mut value =
                i64::try_from(self.varint()?).map_err(|_| self.fail_at(v_at, out_of_range))?;
            entries.push((Channel::new(topic, partition), value));
            // Further entries: partition gaps and zigzag value deltas.
            for _ in 1..n {
                let p_at = self.at;
                let (gap, v_at, zig) = match self.bytes.get(p_at..) {
                    // Fast path: a one-byte gap and a one- or two-byte delta (canonical: a
                    // final byte of a longer varint is non-zero).
                    Some(&[g, d0, ..]) if g < 0x80 && d0 < 0x80 => {
                        self.at += 2;
                        (u64::from(g), p_at + 1, u64::from(d0))
                    }
                    Some(&[g, d0, d1, ..]) if g < 0x80 && d1 < 0x80 && d1 != 0 => {
                        self.at += 3;
                        (
                            u64::from(g),
                            p_at + 1,
                            u64::from(d0 & 0x7f) | (u64::from(d1) << 7),
                        )
                    }
                    _ => {
                        let gap = self.varint()?;
                        let v_at = self.at;
                        (gap, v_at, self.varint()?)
                    }
                };
                let next = i64::from(partition) + 1 + gap.min(u64::from(u32::MAX)) as i64;
                partition = i32::try_from(next)
                    .map_err(|_| self.fail_at(p_at, DecodeErrorKind::PartitionOutOfRange))?;
                value = value
                    .checked_add(unzigzag(zig))
                    .filter(|v| *v >= 0)
                    .ok_or_else(|| self.fail_at(v_at, out_of_range))?;
                entries.push((Channel::new(topic, partition), value));
            }
        }
        if entries.capacity() > 2 * entries.len() + 4 {
            entries.shrink_to_fit();
        }
        Ok(entries)
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
    fn counts_of_128_and_more_widen_in_place() {
        // 300 partitions of one topic (the group count takes two bytes) and 130 topics (the
        // topic count takes two bytes), each followed by more data that must move with it.
        let wide_group: Clock = (0..300)
            .map(|p| Channel::new(topic(1), p).at(5 + i64::from(p)))
            .collect();
        let many_topics: Clock = (0..130u128)
            .map(|t| Channel::new(TopicId::from_halves(0, t as i64 + 1), 0).at(7))
            .chain([Channel::new(TopicId::from_halves(1, 0), 3).at(1 << 40)])
            .collect();
        for clock in [wide_group, many_topics] {
            let mut s = Stamp::new(
                Some(SenderTag {
                    sender: SenderId::from_bytes([3; 16]),
                    seq: 1_000,
                }),
                clock,
            );
            s.acked_through = Some(10);
            s.in_flight = vec![InFlight {
                channel: Channel::new(topic(9), 0),
                seq: 999,
            }];
            let bytes = encode(&s);
            assert!(bytes.len() <= encoded_len_hint(&s));
            assert_eq!(decode(&bytes).unwrap(), s);
        }
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
            (vec![1, 0b1000, 0], 1, DecodeErrorKind::UnknownFlags(0b1000)),
            // acked-through without a sender
            (
                vec![1, 0b100, 3, 0],
                2,
                DecodeErrorKind::ClaimsWithoutSender,
            ),
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

    #[test]
    fn in_flight_claims_and_acked_through_round_trip_and_are_checked() {
        let mut s = sample();
        s.acked_through = Some(200);
        s.in_flight = vec![
            InFlight {
                channel: Channel::new(topic(1), 2),
                seq: 250,
            },
            InFlight {
                channel: Channel::new(topic(3), 0),
                seq: 299,
            },
        ];
        let bytes = encode(&s);
        assert_eq!(decode(&bytes).unwrap(), s);
        assert_eq!(try_encode(&s).unwrap(), bytes);

        // An in-flight claim at or below acked-through, or at or beyond the own sequence,
        // contradicts the stamp.
        for seq in [200, 300, 301] {
            let mut bad = s.clone();
            bad.in_flight[0].seq = seq;
            assert!(matches!(
                try_encode(&bad),
                Err(Error::Decode {
                    kind: DecodeErrorKind::InconsistentSequences,
                    ..
                })
            ));
        }
        // Unsorted claims are rejected too.
        let mut bad = s.clone();
        bad.in_flight.swap(0, 1);
        assert!(try_encode(&bad).is_err());
        // Claims need a sender.
        let mut bad = s.clone();
        bad.sender = None;
        bad.acked_through = None;
        assert!(matches!(
            try_encode(&bad),
            Err(Error::Decode {
                kind: DecodeErrorKind::ClaimsWithoutSender,
                ..
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
