//! The decoder as it was before the rewrite for speed, kept as a test oracle: the
//! current decoder must accept the same bytes and reject the rest with the same error, at the
//! same position.

use super::{
    FLAG_ACKED, FLAG_IN_FLIGHT, FLAG_LONG_SENDER, FLAG_SENDER, HEAD_V2, KNOWN_FLAGS_V1,
    KNOWN_FLAGS_V2,
};
use crate::channel::{Channel, TopicId};
use crate::clock::Clock;
use crate::error::{DecodeErrorKind, Error, Result};
use crate::sender::{SenderId, SenderTag};
use crate::stamp::{InFlight, Stamp};

/// Decodes a stamp header value, of version 2 or 1.
///
/// # Errors
/// [`Error::Decode`] with the byte position and the [`DecodeErrorKind`] when the bytes are not
/// the canonical encoding of a valid stamp of a version this codec knows.
pub(super) fn decode(bytes: &[u8]) -> Result<Stamp> {
    let mut r = Reader { bytes, at: 0 };
    let head = r.byte()?;
    let v2 = head & 0xf0 == HEAD_V2;
    let flags = if head == 1 {
        let flags = r.byte()?;
        if flags & !KNOWN_FLAGS_V1 != 0 {
            return Err(r.fail_at(1, DecodeErrorKind::UnknownFlags(flags)).into());
        }
        flags
    } else if v2 {
        let flags = head & 0x0f;
        let long_alone = flags & FLAG_LONG_SENDER != 0 && flags & FLAG_SENDER == 0;
        if flags & !KNOWN_FLAGS_V2 != 0 || long_alone {
            return Err(r.fail_at(0, DecodeErrorKind::UnknownFlags(flags)).into());
        }
        flags
    } else {
        let version = if head < 0x10 { head } else { head >> 4 };
        return Err(r
            .fail_at(0, DecodeErrorKind::UnknownVersion(version))
            .into());
    };
    let sender_at = r.at;
    let sender = if flags & FLAG_SENDER != 0 {
        let id = if v2 && flags & FLAG_LONG_SENDER == 0 {
            let a = r.array16_or8(8)?;
            SenderId::from_bytes(a)
        } else {
            let id = SenderId::from_bytes(r.array16_or8(16)?);
            if v2 && id.as_bytes()[..8] == [0; 8] {
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
    let acked_at = r.at;
    let acked_through = if flags & FLAG_ACKED != 0 {
        let v = r.varint()?;
        if !v2 {
            Some(v)
        } else {
            let Some(tag) = sender else {
                return Err(r
                    .fail_at(acked_at, DecodeErrorKind::ClaimsWithoutSender)
                    .into());
            };
            if v >= tag.seq {
                return Err(r
                    .fail_at(acked_at, DecodeErrorKind::InconsistentSequences)
                    .into());
            }
            Some(tag.seq - 1 - v)
        }
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

    /// Reads `n` (8 or 16) bytes of a sender id: 8 are its last eight, the first eight zero.
    #[inline]
    fn array16_or8(&mut self, n: usize) -> Parse<[u8; 16]> {
        let slice = self
            .bytes
            .get(self.at..self.at + n)
            .ok_or_else(|| self.fail(DecodeErrorKind::Truncated))?;
        self.at += n;
        let mut a = [0u8; 16];
        a[16 - n..].copy_from_slice(slice);
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
