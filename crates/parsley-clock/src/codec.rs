//! The stamp header codec: versioned, compact, total on untrusted input.
//!
//! # Format (version 2, written)
//!
//! ```text
//! stamp     := head:u8 [sender] [acked] clock [in_flight]
//! head      := 0x20 | flags                           (the high four bits: version 2)
//! sender    := sender_id seq:varint                   (iff flags bit 0)
//! sender_id := [u8; 8]                                (a short id: its first 8 bytes are 0)
//!            | [u8; 16]                               (iff flags bit 3: any other id)
//! acked     := seq - 1 - acked_through:varint         (iff flags bit 2)
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
//! - Sender ids drawn by [`SenderId::random`] are short (64 random bits): eight bytes on the
//!   wire. Acked-through is written as its distance below the stamp's own sequence, usually
//!   one byte.
//! - Flag bits 4–7 of the head are the version; a decoder that does not know a flag bit (or
//!   bit 3 without bit 0) rejects the header rather than misread it.
//!
//! # Version 1 (read, not written)
//!
//! Version 1 wrote `version:u8 (= 1) flags:u8`, a 16-byte sender id whatever its value, and
//! acked-through as a plain varint; the rest is as version 2, and flag bit 3 is unknown to it.
//! [`decode`] reads both versions, so records written before version 2 stay readable.
//!
//! The encoding of a stamp is canonical: [`decode`] accepts only what [`encode_version`]
//! produces for the version the bytes name, so equal stamps have equal bytes. Decoding also
//! checks the invariants of [`Stamp`] (in-flight claims need a sender, sequences are
//! consistent).
//!
//! # The header
//!
//! The stamp travels in the record header [`STAMP_HEADER`] (`ps`, two bytes: on a small record
//! the header's name is part of the cost of every stamp). Readers also take
//! [`LEGACY_STAMP_HEADER`] (`parsley.stamp`), the name earlier releases wrote; see
//! [`is_stamp_header`].
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
pub const STAMP_HEADER: &str = "ps";

/// The stamp header's name before version 2 of the format: still read, never written.
pub const LEGACY_STAMP_HEADER: &str = "parsley.stamp";

/// Whether a record header of this name carries a stamp: [`STAMP_HEADER`] or
/// [`LEGACY_STAMP_HEADER`]. Both names are reserved for stamps.
#[inline]
pub fn is_stamp_header(name: &str) -> bool {
    name == STAMP_HEADER || name == LEGACY_STAMP_HEADER
}

/// The version this codec writes.
pub const STAMP_VERSION: u8 = 2;

const FLAG_SENDER: u8 = 0b0000_0001;
const FLAG_IN_FLIGHT: u8 = 0b0000_0010;
const FLAG_ACKED: u8 = 0b0000_0100;
/// Version 2: the sender id takes 16 bytes (it has no short form).
const FLAG_LONG_SENDER: u8 = 0b0000_1000;
const KNOWN_FLAGS_V1: u8 = FLAG_SENDER | FLAG_IN_FLIGHT | FLAG_ACKED;
const KNOWN_FLAGS_V2: u8 = KNOWN_FLAGS_V1 | FLAG_LONG_SENDER;
/// The head byte of version 2 without flags.
const HEAD_V2: u8 = 0x20;

/// Encodes `stamp` into a fresh buffer, in the current version ([`STAMP_VERSION`]).
///
/// # Panics
/// When the stamp breaks its invariants (see [`Stamp::validate`]) or an in-flight sequence
/// exceeds `i64::MAX`; [`try_encode`] returns an error instead.
pub fn encode(stamp: &Stamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len_hint(stamp));
    encode_into(stamp, &mut out);
    out
}

/// Encodes `stamp` in format `version` (1 or 2): the canonical bytes a header of that version
/// carries. Writing version 1 serves compatibility tests, which need headers as earlier
/// releases wrote them.
///
/// # Panics
/// As [`encode`], and for a version other than 1 or 2.
pub fn encode_version(stamp: &Stamp, version: u8) -> Vec<u8> {
    let format = match version {
        1 => Format::V1,
        2 => Format::V2,
        v => panic!("stamp format version {v} is not known"),
    };
    debug_assert!(stamp.validate().is_ok(), "encoding an invalid stamp");
    let mut out = Vec::with_capacity(encoded_len_hint(stamp));
    encode_parts(
        format,
        stamp.sender,
        stamp.acked_through,
        Entries::all(stamp.clock.entries()),
        &stamp.in_flight,
        &mut out,
    );
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
        Format::V2,
        stamp.sender,
        stamp.acked_through,
        Entries::all(stamp.clock.entries()),
        &stamp.in_flight,
        out,
    );
}

/// A format version the encoder writes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Format {
    V1,
    V2,
}

/// A clock's entries, sorted by channel, less at most one (the entry of the channel a stamp is
/// sent to: [`crate::CausalClock::stamp_into`]): the entries before it and those after it.
#[derive(Clone, Copy)]
pub(crate) struct Entries<'a> {
    before: &'a [(Channel, i64)],
    after: &'a [(Channel, i64)],
}

impl<'a> Entries<'a> {
    /// Every entry of `clock`.
    pub(crate) fn all(clock: &'a [(Channel, i64)]) -> Self {
        Entries {
            before: clock,
            after: &[],
        }
    }

    /// The entries of `clock` other than `channel`'s.
    pub(crate) fn without(clock: &'a [(Channel, i64)], channel: Channel) -> Self {
        match clock.binary_search_by(|(c, _)| c.cmp(&channel)) {
            Ok(i) => Entries {
                before: &clock[..i],
                after: &clock[i + 1..],
            },
            Err(_) => Self::all(clock),
        }
    }

    fn len(&self) -> usize {
        self.before.len() + self.after.len()
    }

    /// The entries, copied.
    pub(crate) fn to_vec(self) -> Vec<(Channel, i64)> {
        [self.before, self.after].concat()
    }

    /// The first topic group: its first entry, its further entries (in two runs, the second
    /// non-empty only when the group straddles the left-out entry), and the entries after it.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn next_group(self) -> Option<((Channel, i64), [&'a [(Channel, i64)]; 2], Entries<'a>)> {
        let (&first, before, after) = match self.before.split_first() {
            Some((first, rest)) => (first, rest, self.after),
            None => {
                let (first, rest) = self.after.split_first()?;
                (first, &[][..], rest)
            }
        };
        let topic = first.0.topic;
        let k = before.iter().take_while(|e| e.0.topic == topic).count();
        if k < before.len() || after.is_empty() {
            let (run, before) = before.split_at(k);
            return Some((first, [run, &[]], Entries { before, after }));
        }
        let m = after.iter().take_while(|e| e.0.topic == topic).count();
        let (run, after) = after.split_at(m);
        Some((first, [before, run], Entries { before: &[], after }))
    }
}

/// Appends the encoding of the stamp made of these parts to `out`, without building a
/// [`Stamp`] (a node's clock is not copied per send: [`crate::CausalClock::stamp_into`]).
/// The parts must satisfy [`Stamp`]'s invariants; `clock` sorted by channel.
///
/// # Panics
/// As [`encode`].
pub(crate) fn encode_parts(
    format: Format,
    sender: Option<SenderTag>,
    acked_through: Option<u64>,
    clock: Entries<'_>,
    in_flight: &[InFlight],
    out: &mut Vec<u8>,
) {
    let start = out.len();
    out.resize(start + len_hint(clock.len() + in_flight.len()), 0);
    // The buffer leaves room for a whole ten-byte varint window at every write (see
    // `len_hint`): each write checks its window once and writes inside it without further
    // checks.
    let buf = &mut out[start..];
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
    let mut at = match format {
        Format::V1 => {
            buf[0] = 1;
            buf[1] = flags;
            2
        }
        Format::V2 => 1,
    };
    if let Some(tag) = sender {
        match (format, tag.sender.short()) {
            (Format::V2, Some(short)) => {
                *window::<8>(buf, at) = short;
                at += 8;
            }
            (format, _) => {
                if format == Format::V2 {
                    flags |= FLAG_LONG_SENDER;
                }
                *window::<16>(buf, at) = *tag.sender.as_bytes();
                at += 16;
            }
        }
        at = put_varint(buf, at, tag.seq);
        if let Some(a) = acked_through {
            let written = match format {
                Format::V1 => a,
                Format::V2 => tag.seq - 1 - a,
            };
            at = put_varint(buf, at, written);
        }
    } else if let Some(a) = acked_through {
        // Invalid (acked-through needs a sender); written as version 1 did, for a decoder to
        // reject.
        at = put_varint(buf, at, a);
    }
    if format == Format::V2 {
        buf[0] = HEAD_V2 | flags;
    }
    at = put_groups(buf, at, clock);
    if !in_flight.is_empty() {
        let claims: Vec<(Channel, i64)> = in_flight
            .iter()
            .map(|c| {
                let seq = i64::try_from(c.seq).expect("in-flight sequence beyond i64::MAX");
                (c.channel, seq)
            })
            .collect();
        at = put_groups(buf, at, Entries::all(&claims));
    }
    out.truncate(start + at);
}

/// The `N` bytes of `buf` from `at` on: one bounds check for all of them.
///
/// # Panics
/// When `buf` is shorter, which `len_hint` rules out.
#[inline(always)]
fn window<const N: usize>(buf: &mut [u8], at: usize) -> &mut [u8; N] {
    buf.get_mut(at..)
        .and_then(|rest| rest.first_chunk_mut::<N>())
        .expect("the buffer is sized by len_hint")
}

/// Writes `v` as a varint at `at`; returns the position after it.
#[inline(always)]
fn put_varint(buf: &mut [u8], at: usize, v: u64) -> usize {
    at + varint_into(window(buf, at), v)
}

/// Writes `(channel, value)` entries, sorted by channel, as topic groups at `at`; returns the
/// position after them. The topic count gets one byte up front, patched at the end (and
/// widened in place in the rare case it needs more).
fn put_groups(buf: &mut [u8], at: usize, entries: Entries<'_>) -> usize {
    let mut pos = at + 1;
    let mut topics = 0u64;
    let mut rest = entries;
    while let Some((first, runs, more)) = rest.next_group() {
        topics += 1;
        rest = more;
        let n = 1 + runs[0].len() + runs[1].len();
        let partition = first.0.partition as u64;
        let value = first.1 as u64;
        if partition < 0x80 && value < 1 << 56 && n < 0x80 {
            // The common head in one window: topic id, a one-byte count, a one-byte
            // partition, and a value of up to eight bytes written as one word.
            let w = window::<26>(buf, pos);
            let (word, value_len) = word_varint_bytes(value);
            w[..16].copy_from_slice(&first.0.topic.to_bytes());
            w[16] = n as u8;
            w[17] = partition as u8;
            w[18..].copy_from_slice(&word.to_le_bytes());
            pos += 18 + value_len;
        } else {
            *window::<16>(buf, pos) = first.0.topic.to_bytes();
            pos = put_varint(buf, pos + 16, n as u64);
            pos = put_varint(buf, pos, partition);
            pos = put_varint(buf, pos, value);
        }
        let (mut p, mut pv) = (first.0.partition, first.1);
        for run in runs {
            for &(c, v) in run {
                // Partitions ascend within a group: `c.partition > p >= 0`.
                let gap = (c.partition - p - 1) as u32 as u64;
                let delta = zigzag(v - pv);
                if (gap | delta >> 7) < 0x80 {
                    // The common case, one store and no branch on the delta's length: a
                    // one-byte gap, a one- or two-byte delta (the bytes written past a
                    // one-byte delta are overwritten or truncated).
                    // `delta + (delta & 0x3f80)` spreads its two 7-bit groups a byte apart;
                    // bit 14 of `delta + 0x3f80` is set when it needs the second byte (its
                    // continuation bit).
                    let more = (delta + 0x3f80) & 0x4000;
                    let word = gap | (delta + (delta & 0x3f80)) << 8 | more << 1;
                    *window::<4>(buf, pos) = (word as u32).to_le_bytes();
                    pos += 2 + (more >> 14) as usize;
                } else {
                    pos = put_entry(buf, pos, gap, delta);
                }
                (p, pv) = (c.partition, v);
            }
        }
    }
    if topics < 0x80 {
        buf[at] = topics as u8;
        pos
    } else {
        widen_count(buf, at, pos, topics)
    }
}

/// Writes an entry of a group whose gap or delta takes more than the common one and two
/// bytes; returns the position after it.
#[inline(never)]
fn put_entry(buf: &mut [u8], at: usize, gap: u64, delta: u64) -> usize {
    let w = window::<20>(buf, at);
    let n = varint_into(w.first_chunk_mut::<10>().expect("ten bytes"), gap);
    let value = w[n..].first_chunk_mut::<10>().expect("ten bytes");
    at + n + varint_into(value, delta)
}

/// The LEB128 bytes of `v < 2^56` as a little-endian word, and their number (1..=8).
#[inline(always)]
fn word_varint_bytes(v: u64) -> (u64, usize) {
    debug_assert!(v < 1 << 56);
    // Spread the 7-bit groups a byte apart: halves of 28 bits, then of 14, then of 7.
    let mut w = (v & 0x0fff_ffff) | ((v & 0x00ff_ffff_f000_0000) << 4);
    w = (w & 0x0000_3fff_0000_3fff) | ((w & 0x0fff_c000_0fff_c000) << 2);
    w = (w & 0x007f_007f_007f_007f) | ((w & 0x3f80_3f80_3f80_3f80) << 1);
    let len = (63 - (v | 1).leading_zeros()) as usize / 7 + 1;
    // A continuation bit on every byte but the last.
    let more = 0x8080_8080_8080_8080 & ((1u64 << (8 * (len - 1))) - 1);
    (w | more, len)
}

/// Writes `n` as a varint into the one byte reserved at `count_at`, moving what was written
/// after it, up to `end`; returns the new end.
#[cold]
#[inline(never)]
fn widen_count(buf: &mut [u8], count_at: usize, end: usize, n: u64) -> usize {
    let mut varint = [0u8; 10];
    let len = varint_into(&mut varint, n);
    buf.copy_within(count_at + 1..end, count_at + len);
    buf[count_at..count_at + len].copy_from_slice(&varint[..len]);
    end + len - 1
}

/// Writes `v` as LEB128 into `window`; returns the number of bytes written (1..=10).
#[inline(always)]
fn varint_into(window: &mut [u8; 10], mut v: u64) -> usize {
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
    len_hint(stamp.clock.len() + stamp.in_flight.len())
}

/// Version and flags (2), sender (16 + 10), acked-through (10) and two group counts (10
/// each); per entry at most a topic id (16), a group count (10), a partition (5) and a value
/// (9) — a further entry of a group takes at most 15 —; and twenty bytes of slack for the
/// writer's checked windows, which reach at most 18 bytes past what they write.
fn len_hint(entries: usize) -> usize {
    2 + 26 + 10 + 20 + entries * 40 + 20
}

/// Decodes a stamp header value, of version 2 or 1.
///
/// # Errors
/// [`Error::Decode`] with the byte position and the [`DecodeErrorKind`] when the bytes are not
/// the canonical encoding of a valid stamp of a version this codec knows.
pub fn decode(bytes: &[u8]) -> Result<Stamp> {
    let mut r = Reader::new(bytes);
    let head = r.byte()?;
    let (format, flags) = match head {
        1 => {
            let flags = r.byte()?;
            if flags & !KNOWN_FLAGS_V1 != 0 {
                return Err(r.fail_at(1, DecodeErrorKind::UnknownFlags(flags)).into());
            }
            (Format::V1, flags)
        }
        _ if head & 0xf0 == HEAD_V2 => {
            let flags = head & 0x0f;
            if flags & !KNOWN_FLAGS_V2 != 0
                || (flags & FLAG_LONG_SENDER != 0 && flags & FLAG_SENDER == 0)
            {
                return Err(r.fail_at(0, DecodeErrorKind::UnknownFlags(flags)).into());
            }
            (Format::V2, flags)
        }
        _ => {
            // From version 2 on the version is the high four bits; version 1 wrote a byte.
            let version = if head < 0x10 { head } else { head >> 4 };
            return Err(r
                .fail_at(0, DecodeErrorKind::UnknownVersion(version))
                .into());
        }
    };
    let sender_at = r.at();
    let sender = if flags & FLAG_SENDER != 0 {
        let id = if format == Format::V2 && flags & FLAG_LONG_SENDER == 0 {
            SenderId::from_short(*r.array8()?)
        } else {
            let id = SenderId::from_bytes(*r.array16()?);
            if format == Format::V2 && id.short().is_some() {
                return Err(r
                    .fail_at(sender_at, DecodeErrorKind::NonCanonicalSenderId)
                    .into());
            }
            id
        };
        let seq = r.varint()?;
        Some(SenderTag { sender: id, seq })
    } else {
        None
    };
    let acked_at = r.at();
    let acked_through = if flags & FLAG_ACKED != 0 {
        let v = r.varint()?;
        match (format, sender) {
            (Format::V1, _) => Some(v),
            (Format::V2, None) => {
                return Err(r
                    .fail_at(acked_at, DecodeErrorKind::ClaimsWithoutSender)
                    .into());
            }
            (Format::V2, Some(tag)) => {
                match tag.seq.checked_sub(1).and_then(|s| s.checked_sub(v)) {
                    Some(a) => Some(a),
                    None => {
                        return Err(r
                            .fail_at(acked_at, DecodeErrorKind::InconsistentSequences)
                            .into());
                    }
                }
            }
        }
    } else {
        None
    };
    // Sorted by construction: topics ascend, partitions ascend within a topic, offsets >= 0.
    let clock = Clock::from_sorted_unchecked(r.groups(false)?);
    let in_flight_at = r.at();
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
    // Without in-flight claims and acked-through there is nothing to contradict.
    if flags & (FLAG_IN_FLIGHT | FLAG_ACKED) == 0 {
        return Ok(stamp);
    }
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

/// Reads from the front of `rest`; positions (for errors) count from the start of the input,
/// `len` bytes long, and are computed only when something fails.
#[derive(Clone, Copy)]
struct Reader<'a> {
    rest: &'a [u8],
    len: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader {
            rest: bytes,
            len: bytes.len(),
        }
    }

    /// The position of the next byte.
    #[inline(always)]
    fn at(&self) -> usize {
        self.len - self.rest.len()
    }

    fn remaining(&self) -> usize {
        self.rest.len()
    }

    fn fail(&self, kind: DecodeErrorKind) -> Fault {
        Fault {
            at: self.at(),
            kind,
        }
    }

    fn fail_at(&self, at: usize, kind: DecodeErrorKind) -> Fault {
        Fault { at, kind }
    }

    fn byte(&mut self) -> Parse<u8> {
        let (&b, rest) = self
            .rest
            .split_first()
            .ok_or_else(|| self.fail(DecodeErrorKind::Truncated))?;
        self.rest = rest;
        Ok(b)
    }

    #[inline(always)]
    fn array8(&mut self) -> Parse<&'a [u8; 8]> {
        let (a, rest) = self
            .rest
            .split_first_chunk::<8>()
            .ok_or_else(|| self.fail(DecodeErrorKind::Truncated))?;
        self.rest = rest;
        Ok(a)
    }

    #[inline(always)]
    fn array16(&mut self) -> Parse<&'a [u8; 16]> {
        let (a, rest) = self
            .rest
            .split_first_chunk::<16>()
            .ok_or_else(|| self.fail(DecodeErrorKind::Truncated))?;
        self.rest = rest;
        Ok(a)
    }

    /// Reads a topic id as two big-endian words straight from the input (going through a
    /// 16-byte array costs a store-forwarding stall per topic).
    #[inline(always)]
    fn topic(&mut self) -> Parse<TopicId> {
        let a = self.array16()?;
        let (hi, lo) = a.split_at(8);
        Ok(TopicId::from_halves(
            i64::from_be_bytes(hi.try_into().expect("eight bytes")),
            i64::from_be_bytes(lo.try_into().expect("eight bytes")),
        ))
    }

    /// Reads a varint: a one-byte value inline, up to eight bytes from one word (offsets near
    /// 10^9 take five), anything else out of line.
    #[inline(always)]
    fn varint(&mut self) -> Parse<u64> {
        if let Some((&b0, rest)) = self.rest.split_first()
            && b0 < 0x80
        {
            self.rest = rest;
            return Ok(u64::from(b0));
        }
        if let Some(word) = self.rest.first_chunk::<8>()
            && let Some((v, len)) = word_varint(u64::from_le_bytes(*word))
        {
            self.rest = &self.rest[len..];
            return Ok(v);
        }
        self.varint_slow()
    }

    /// A varint near the end of the input, of nine or ten bytes, or malformed. The reader is
    /// passed by value to a function out of line, so that it stays in registers elsewhere.
    #[inline(always)]
    fn varint_slow(&mut self) -> Parse<u64> {
        let (v, rest) = varint_slow(*self)?;
        self.rest = rest;
        Ok(v)
    }

    /// Reads a `groups` section; values are offsets, or sequences when `sequences`.
    fn groups(&mut self, sequences: bool) -> Parse<Vec<(Channel, i64)>> {
        // A copy in registers: the caller's reader lives in memory.
        let mut r = *self;
        let entries = r.groups_here(sequences)?;
        *self = r;
        Ok(entries)
    }

    #[inline(always)]
    fn groups_here(&mut self, sequences: bool) -> Parse<Vec<(Channel, i64)>> {
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
            let topic_at = self.at();
            let (topic, n, mut partition, mut value) = match group_head_fast(self.rest) {
                Some((head, len)) => {
                    // What the general path checks after reading the topic and the count.
                    if prev_topic.is_some_and(|p| p >= head.0) {
                        return Err(self.fail_at(topic_at, DecodeErrorKind::UnsortedTopics));
                    }
                    if head.1 > (self.remaining() - 17) / 2 {
                        return Err(self.fail_at(topic_at + 17, DecodeErrorKind::Truncated));
                    }
                    self.rest = &self.rest[len..];
                    head
                }
                None => {
                    let (head, rest) = group_head(*self, prev_topic, out_of_range)?;
                    self.rest = rest;
                    head
                }
            };
            prev_topic = Some(topic);
            // The group's slots, its topic written once for all: the loop below fills in the
            // partitions and values, with no capacity check per entry (the slots are dropped
            // with the vector when an entry turns out malformed).
            let first = entries.len();
            entries.extend(std::iter::repeat_n((Channel::new(topic, 0), 0), n));
            let (head, others) = entries[first..]
                .split_first_mut()
                .expect("a group has an entry");
            // The first entry: plain partition and value.
            head.0.partition = partition as i32;
            head.1 = value;
            // Further entries: partition gaps and zigzag value deltas, read from a local
            // slice (kept in registers; the reader is written back after the group).
            let mut rest = self.rest;
            for slot in others {
                // (gap, zigzag delta, length of the gap's varint, the rest after the entry)
                let (gap, zig, gap_len, after) = match *rest {
                    // Fast paths: a one-byte gap and a one- or two-byte delta (canonical: a
                    // final byte of a longer varint is non-zero).
                    [g, d0, ref more @ ..] if g | d0 < 0x80 => {
                        (u32::from(g), u64::from(d0), 1, more)
                    }
                    [g, d0, d1, ref more @ ..] if g < 0x80 && d1.wrapping_sub(1) < 0x7f => {
                        let zig = u64::from(d0 & 0x7f) | (u64::from(d1) << 7);
                        (u32::from(g), zig, 1, more)
                    }
                    _ => {
                        let (gap, zig, gap_len, len) = entry_slow(Reader {
                            rest,
                            len: self.len,
                        })?;
                        (gap, zig, gap_len, &rest[len..])
                    }
                };
                // At most `i32::MAX + 1 + i32::MAX`: no overflow.
                partition += 1 + gap;
                // `value >= 0`, so the sum leaves the range of offsets exactly when the
                // wrapping sum is negative.
                value = value.wrapping_add(unzigzag(zig));
                if partition > i32::MAX as u32 || value < 0 {
                    let p_at = self.len - rest.len();
                    return Err(if partition > i32::MAX as u32 {
                        self.fail_at(p_at, DecodeErrorKind::PartitionOutOfRange)
                    } else {
                        self.fail_at(p_at + gap_len, out_of_range)
                    });
                }
                rest = after;
                slot.0.partition = partition as i32;
                slot.1 = value;
            }
            self.rest = rest;
        }
        if entries.capacity() > 2 * entries.len() + 4 {
            entries.shrink_to_fit();
        }
        Ok(entries)
    }
}

/// The head of a topic group: topic id, entry count (`>= 1`), and the first entry's partition
/// (`<= i32::MAX`) and value (`>= 0`).
type GroupHead = (TopicId, usize, u32, i64);

/// The head of a group in one bounds check, when its count and partition take a byte each
/// and its value at most eight: the head and its length. `None` for anything else, which
/// [`group_head`] reads.
#[inline(always)]
fn group_head_fast(rest: &[u8]) -> Option<(GroupHead, usize)> {
    let (topic, rest) = rest.split_first_chunk::<16>()?;
    let &[n, partition, ref value @ ..] = rest.first_chunk::<10>()?;
    if n | partition >= 0x80 || n == 0 {
        return None;
    }
    let (value, len) = word_varint(u64::from_le_bytes(*value.first_chunk::<8>()?))?;
    let (hi, lo) = topic.split_at(8);
    let topic = TopicId::from_halves(
        i64::from_be_bytes(hi.try_into().expect("eight bytes")),
        i64::from_be_bytes(lo.try_into().expect("eight bytes")),
    );
    let head = (topic, usize::from(n), u32::from(partition), value as i64);
    Some((head, 18 + len))
}

/// Reads the head of a group, checking it in order: the topic follows `prev_topic`, the
/// count is not zero and fits the input, the partition and the value are in range.
#[inline(never)]
fn group_head(
    mut r: Reader<'_>,
    prev_topic: Option<TopicId>,
    out_of_range: DecodeErrorKind,
) -> Parse<(GroupHead, &[u8])> {
    let topic_at = r.at();
    let topic = r.topic()?;
    if prev_topic.is_some_and(|p| p >= topic) {
        return Err(r.fail_at(topic_at, DecodeErrorKind::UnsortedTopics));
    }
    let n_at = r.at();
    let n = r.varint()?;
    if n == 0 {
        return Err(r.fail_at(n_at, DecodeErrorKind::EmptyTopicGroup));
    }
    if n > (r.remaining() / 2) as u64 {
        return Err(r.fail(DecodeErrorKind::Truncated));
    }
    let p_at = r.at();
    let partition = u32::try_from(r.varint()?)
        .ok()
        .filter(|p| *p <= i32::MAX as u32)
        .ok_or_else(|| r.fail_at(p_at, DecodeErrorKind::PartitionOutOfRange))?;
    let v_at = r.at();
    let value = i64::try_from(r.varint()?).map_err(|_| r.fail_at(v_at, out_of_range))?;
    Ok(((topic, n as usize, partition, value), r.rest))
}

/// Decodes a varint of at most eight bytes from the little-endian word `w` of the input's next
/// bytes: its value and length, or `None` when it is longer or not canonical.
#[inline(always)]
fn word_varint(w: u64) -> Option<(u64, usize)> {
    let stops = !w & 0x8080_8080_8080_8080;
    if stops == 0 {
        return None;
    }
    // The last byte is the first without its continuation bit; canonical when it is not zero
    // or the only byte.
    let end = stops.trailing_zeros(); // 8 * (length - 1) + 7
    if end > 7 && (w >> (end - 7)) as u8 == 0 {
        return None;
    }
    let mut v = w & (u64::MAX >> (63 - end)) & 0x7f7f_7f7f_7f7f_7f7f;
    // Gather the 7-bit groups: pairs of bytes, then pairs of 14 bits, then of 28.
    v = (v & 0x007f_007f_007f_007f) | ((v & 0x7f00_7f00_7f00_7f00) >> 1);
    v = (v & 0x0000_3fff_0000_3fff) | ((v & 0x3fff_0000_3fff_0000) >> 2);
    v = (v & 0x0000_0000_0fff_ffff) | ((v & 0x0fff_ffff_0000_0000) >> 4);
    Some((v, (end / 8 + 1) as usize))
}

/// A further entry of a group that the fast paths do not take: its partition gap (clamped to
/// `i32::MAX`, which is out of range anyway), its zigzag delta, the length of the gap's varint
/// and of the entry.
#[inline(never)]
fn entry_slow(mut r: Reader<'_>) -> Parse<(u32, u64, usize, usize)> {
    let start = r.rest.len();
    let (gap, rest) = varint_slow(r)?;
    r.rest = rest;
    let (zig, rest) = varint_slow(r)?;
    let gap = gap.min(i32::MAX as u64) as u32;
    Ok((gap, zig, start - r.rest.len(), start - rest.len()))
}

#[inline(never)]
fn varint_slow(r: Reader<'_>) -> Parse<(u64, &[u8])> {
    match varint_bytes(r.rest) {
        Ok((v, len)) => Ok((v, &r.rest[len..])),
        Err(DecodeErrorKind::Truncated) => Err(r.fail_at(r.len, DecodeErrorKind::Truncated)),
        Err(kind) => Err(r.fail(kind)),
    }
}

/// Decodes the varint at the start of `bytes`: its value and length, or what is wrong
/// (truncated: the input ends inside it).
fn varint_bytes(bytes: &[u8]) -> std::result::Result<(u64, usize), DecodeErrorKind> {
    let mut v: u64 = 0;
    for (i, &b) in bytes.iter().take(10).enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return if b == 0 && i > 0 {
                Err(DecodeErrorKind::NonCanonicalVarint)
            } else if i == 9 && b > 1 {
                Err(DecodeErrorKind::VarintOverflow)
            } else {
                Ok((v, i + 1))
            };
        }
    }
    if bytes.len() >= 10 {
        Err(DecodeErrorKind::VarintOverflow)
    } else {
        Err(DecodeErrorKind::Truncated)
    }
}

#[cfg(test)]
#[path = "codec_reference.rs"]
mod reference;

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

    /// The version `bytes` name (1 or 2), for encoding a decoded stamp back.
    fn version_of(bytes: &[u8]) -> u8 {
        if bytes.first() == Some(&1) { 1 } else { 2 }
    }

    #[test]
    fn round_trip_of_a_sample_stamp() {
        let s = sample();
        let bytes = encode(&s);
        assert_eq!(decode(&bytes).unwrap(), s);
        // head, a long sender id 16 + seq 2, topic count 1,
        // topic 1: 16 + n 1 + (1 + 3) + (1 + 2) + (1 + 2), topic 2: 16 + 1 + 1 + 1
        assert_eq!(
            bytes.len(),
            1 + 18 + 1 + (16 + 1 + 4 + 3 + 3) + (16 + 1 + 2)
        );
        // Version 1 spends a byte more on the head.
        let v1 = encode_version(&s, 1);
        assert_eq!(v1.len(), bytes.len() + 1);
        assert_eq!(decode(&v1).unwrap(), s);
    }

    #[test]
    fn a_pass_through_stamp_fits_in_forty_bytes_with_its_header_name() {
        // A stage task that copies partition 3 of one topic to partition 3 of another: its
        // clock holds the input's delivered offset and its own acknowledged output offset; the
        // stamp of a send to the output leaves the output's entry out. Offsets near 10^9 and
        // a sequence near 10^7 take the most bytes they take in practice.
        let (input, output) = (Channel::new(topic(1), 3), Channel::new(topic(2), 3));
        let mut c = crate::CausalClock::resume(
            SenderId::random(),
            12_345_678,
            [input.at(1_000_000_000), output.at(999_999_000)]
                .into_iter()
                .collect(),
            true,
        );
        let mut bytes = Vec::new();
        c.stamp_into(output, &mut bytes).unwrap();
        // head 1, sender 8 + seq 4, acked-through 1, count 1, group 16 + 1 + 1 + 5
        assert_eq!(bytes.len(), 38);
        assert!(STAMP_HEADER.len() + bytes.len() <= 40);
        let s = decode(&bytes).unwrap();
        assert_eq!(s.clock.entries(), &[(input, 1_000_000_000)]);
        assert_eq!(s.acked_through, Some(12_345_677));
    }

    #[test]
    fn further_entries_of_a_topic_take_at_most_three_bytes() {
        // Offsets near 10^9 that differ by up to 5,000 between partitions (deltas of ±5,000,
        // the largest such).
        let clock: Clock = (0..16)
            .map(|p| Channel::new(topic(1), p).at(1_000_000_000 + i64::from(p % 2) * 5_000))
            .collect();
        let one: Clock = [Channel::new(topic(1), 0).at(1_000_000_000)]
            .into_iter()
            .collect();
        let len = |clock: Clock| encode(&Stamp::new(None, clock)).len();
        assert_eq!(len(clock) - len(one), 3 * 15);
    }

    #[test]
    fn short_and_long_sender_ids() {
        let short = SenderId::from_short([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(short.short(), Some([1, 2, 3, 4, 5, 6, 7, 8]));
        assert!(SenderId::random().short().is_some());
        let long = SenderId::from_bytes([9; 16]);
        assert_eq!(long.short(), None);
        for (id, len) in [(short, 8), (long, 16)] {
            let mut s = sample();
            s.sender = Some(SenderTag {
                sender: id,
                seq: 300,
            });
            s.acked_through = Some(290);
            let bytes = encode(&s);
            assert_eq!(
                bytes[0],
                HEAD_V2 | FLAG_SENDER | FLAG_ACKED | if len == 16 { FLAG_LONG_SENDER } else { 0 }
            );
            // seq 300 takes two bytes; acked-through 290 is written as 300 - 1 - 290 = 9.
            assert_eq!(&bytes[1 + len + 2..1 + len + 3], &[9]);
            assert_eq!(decode(&bytes).unwrap(), s);
            assert_eq!(decode(&encode_version(&s, 1)).unwrap(), s);
        }
        // A short id written long is not canonical.
        let mut s = sample();
        s.sender = Some(SenderTag {
            sender: short,
            seq: 1,
        });
        let mut bytes = encode(&s);
        bytes[0] |= FLAG_LONG_SENDER;
        bytes.splice(1..1, [0; 8]);
        assert_eq!(
            decode(&bytes),
            Err(Error::Decode {
                at: 1,
                kind: DecodeErrorKind::NonCanonicalSenderId
            })
        );
        assert_eq!(reference::decode(&bytes), decode(&bytes));
    }

    #[test]
    fn the_stamp_header_and_its_legacy_name() {
        assert_eq!(STAMP_HEADER, "ps");
        assert!(is_stamp_header("ps"));
        assert!(is_stamp_header("parsley.stamp"));
        assert!(!is_stamp_header("parsley.dlq.stamp"));
        assert!(!is_stamp_header("p"));
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
    fn empty_stamp_is_two_bytes() {
        let bytes = encode(&Stamp::default());
        assert_eq!(bytes, vec![HEAD_V2, 0]);
        assert_eq!(decode(&bytes).unwrap(), Stamp::default());
        assert_eq!(encode_version(&Stamp::default(), 1), vec![1, 0, 0]);
    }

    #[test]
    fn rejections_name_what_and_where() {
        let good = encode(&sample());
        let cases: Vec<(Vec<u8>, usize, DecodeErrorKind)> = vec![
            (vec![], 0, DecodeErrorKind::Truncated),
            (vec![2, 0, 0], 0, DecodeErrorKind::UnknownVersion(2)),
            (vec![0x30, 0], 0, DecodeErrorKind::UnknownVersion(3)),
            (vec![1, 0b1000, 0], 1, DecodeErrorKind::UnknownFlags(0b1000)),
            // The long-sender flag without a sender.
            (vec![0x28, 0], 0, DecodeErrorKind::UnknownFlags(0b1000)),
            // Version 2: acked-through without a sender, and at a distance beyond the sequence.
            (vec![0x24, 3, 0], 1, DecodeErrorKind::ClaimsWithoutSender),
            (
                [vec![0x25], vec![7; 8], vec![5, 5, 0]].concat(),
                10,
                DecodeErrorKind::InconsistentSequences,
            ),
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
    fn long_varints_at_the_end_of_the_input() {
        // (bytes, expected): the topic count is the varint at byte 2.
        let ff = |n: usize| [vec![1, 0], vec![0xff; n]].concat();
        let cases: Vec<(Vec<u8>, Result<Stamp>)> = vec![
            // Ten bytes, all with a continuation bit: too long, though the input ends there.
            (
                ff(10),
                Err(Error::Decode {
                    at: 2,
                    kind: DecodeErrorKind::VarintOverflow,
                }),
            ),
            (
                ff(9),
                Err(Error::Decode {
                    at: 11,
                    kind: DecodeErrorKind::Truncated,
                }),
            ),
            // A nine-byte count of 2^56: read out of line, then too large for the input.
            (
                [vec![1, 0], vec![0x80; 8], vec![1]].concat(),
                Err(Error::Decode {
                    at: 11,
                    kind: DecodeErrorKind::Truncated,
                }),
            ),
            // A zero count in two bytes: not canonical, near the end and with room to spare.
            (
                vec![1, 0, 0x80, 0],
                Err(Error::Decode {
                    at: 2,
                    kind: DecodeErrorKind::NonCanonicalVarint,
                }),
            ),
            (
                [vec![1, 0, 0x80, 0], vec![0; 8]].concat(),
                Err(Error::Decode {
                    at: 2,
                    kind: DecodeErrorKind::NonCanonicalVarint,
                }),
            ),
        ];
        for (bytes, expected) in cases {
            assert_eq!(decode(&bytes), expected, "for {bytes:?}");
            assert_eq!(
                reference::decode(&bytes),
                expected,
                "reference, for {bytes:?}"
            );
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
        (proptest::option::of((arb_sender(), any::<u64>())), entries).prop_map(
            |(sender, entries)| {
                let clock: Clock = entries
                    .into_iter()
                    .map(|(t, p, o)| Coordinate {
                        channel: Channel::new(topic(t), p),
                        offset: o,
                    })
                    .collect();
                Stamp::new(sender.map(|(sender, seq)| SenderTag { sender, seq }), clock)
            },
        )
    }

    /// Short and long sender ids, and long ids that differ from a short one in one byte.
    fn arb_sender() -> impl Strategy<Value = SenderId> {
        (any::<[u8; 16]>(), 0u8..3).prop_map(|(mut id, form)| {
            match form {
                0 => id[..8].fill(0),
                1 => {
                    id[..8].fill(0);
                    id[7] |= 1;
                }
                _ => {}
            }
            SenderId::from_bytes(id)
        })
    }

    /// Stamps with every section: sender, acked-through, in-flight claims, and offsets and
    /// sequences of every varint length (deltas of both signs and of every size).
    fn arb_stamp_with_claims() -> impl Strategy<Value = Stamp> {
        let value = prop_oneof![
            0i64..200,
            0i64..20_000,
            0i64..i64::MAX,
            (0u32..63).prop_map(|b| (1i64 << b) - 1)
        ];
        let entries = proptest::collection::vec((0u8..4, 0i32..300, value.clone()), 0..30);
        let claims = proptest::collection::btree_map((0u8..4, 0i32..4), 0u64..1_000, 0..4);
        (
            arb_sender(),
            2_001u64..u64::MAX,
            proptest::option::of(Just(1_000u64)),
            entries,
            claims,
        )
            .prop_map(|(id, seq, acked, entries, claims)| {
                let clock: Clock = entries
                    .into_iter()
                    .map(|(t, p, o)| Channel::new(topic(t), p).at(o))
                    .collect();
                let mut s = Stamp::new(Some(SenderTag { sender: id, seq }), clock);
                s.acked_through = acked;
                let base = acked.map_or(0, |a| a + 1);
                s.in_flight = claims
                    .into_iter()
                    .map(|((t, p), q)| InFlight {
                        channel: Channel::new(topic(t), p),
                        seq: base + q,
                    })
                    .collect();
                s
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn stamps_with_claims_round_trip(s in arb_stamp_with_claims()) {
            let bytes = encode(&s);
            prop_assert!(bytes.len() <= encoded_len_hint(&s));
            prop_assert_eq!(reference::decode(&bytes).unwrap(), s.clone());
            prop_assert_eq!(decode(&bytes).unwrap(), s);
        }

        /// Leaving one entry out while encoding (a group may straddle it) writes the encoding
        /// of the clock without it.
        #[test]
        fn an_entry_left_out_encodes_as_the_clock_without_it(
            s in arb_stamp_with_claims(),
            pick in any::<prop::sample::Index>(),
            absent in any::<bool>(),
        ) {
            let entries = s.clock.entries();
            let left_out = if entries.is_empty() || absent {
                Channel::new(topic(2), 7)
            } else {
                entries[pick.index(entries.len())].0
            };
            let mut bytes = vec![0xAA];
            encode_parts(
                Format::V2,
                s.sender,
                s.acked_through,
                Entries::without(entries, left_out),
                &s.in_flight,
                &mut bytes,
            );
            let mut without = s.clone();
            without.clock.retain(|c| c.channel != left_out);
            prop_assert_eq!(bytes[0], 0xAA);
            prop_assert_eq!(&bytes[1..], &encode(&without)[..]);
            prop_assert_eq!(decode(&bytes[1..]).unwrap(), without);
        }

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
                prop_assert_eq!(encode_version(&s, version_of(&bytes)), bytes);
            }
        }

        #[test]
        fn version_1_encodings_still_decode(s in arb_stamp_with_claims()) {
            let bytes = encode_version(&s, 1);
            prop_assert_eq!(reference::decode(&bytes).unwrap(), s.clone());
            prop_assert_eq!(decode(&bytes).unwrap(), s);
        }

        #[test]
        fn arbitrary_bytes_decode_as_the_reference_decoder_does(
            bytes in proptest::collection::vec(any::<u8>(), 0..200)
        ) {
            prop_assert_eq!(decode(&bytes), reference::decode(&bytes));
        }

        #[test]
        fn mutated_encodings_decode_as_the_reference_decoder_does(
            s in arb_stamp_with_claims(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
            cut in any::<usize>(),
        ) {
            let mut bytes = encode(&s);
            for (i, b) in flips {
                let n = bytes.len();
                bytes[i % n] ^= b;
            }
            prop_assert_eq!(decode(&bytes), reference::decode(&bytes));
            // Truncated anywhere, and with every varint near the end of the input.
            let cut = &bytes[..cut % (bytes.len() + 1)];
            prop_assert_eq!(decode(cut), reference::decode(cut));
        }

        #[test]
        fn mutated_encodings_never_panic(s in arb_stamp(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
            let mut bytes = encode(&s);
            for (i, b) in flips {
                let n = bytes.len();
                bytes[i % n] ^= b;
            }
            if let Ok(d) = decode(&bytes) {
                prop_assert_eq!(encode_version(&d, version_of(&bytes)), bytes);
            }
        }
    }
}
