//! The bytes of a [`TimerQueue`]'s changelog records: a version byte ([`CODEC_VERSION`]), then
//! bincode 2 (standard configuration). The header is one value; a segment record is its ids,
//! readable alone ([`segment_ids`]), followed by its entries ([`Segments`] packs entries into
//! records of bounded size); a late count is one number.
//!
//! Decoding never panics on corrupt bytes: what it may allocate is bounded by the record's
//! length ([`crate::bounded`]; at most [`DECODE_LIMIT`]),
//! and an unknown version, truncated or trailing bytes, and a segment with no entries or with
//! not as many ids as entries are refused. What the decoded parts must satisfy together is
//! checked by [`TimerQueue::from_parts`].

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::TimerMetrics;
#[cfg(doc)]
use super::TimerQueue;
use super::sort::{Entry, Id};
use crate::error::GateError;

/// Version byte of every changelog record ([`TimerQueue::to_parts`]); 1 wrote one record per
/// parked record.
pub(super) const CODEC_VERSION: u8 = 2;
/// Most a decode may claim (bincode's check before it allocates), bytes; a short record's
/// limit is lower ([`crate::bounded`]).
const DECODE_LIMIT: usize = 1 << 30;

/// The queue-wide part of the changelog form ([`TimerQueue::to_parts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Header {
    pub(super) watermark: Option<i64>,
    pub(super) next_arrival: u64,
    pub(super) next_segment: u64,
    pub(super) metrics: TimerMetrics,
}

/// One entry of a segment record, after its id (module docs: changelogging).
#[derive(Serialize)]
struct EntryOut<'a, K, V> {
    key: &'a K,
    event_time_ms: i64,
    late: bool,
    value: &'a V,
}

#[derive(Deserialize)]
pub(super) struct EntryIn<K, V> {
    pub(super) key: K,
    pub(super) event_time_ms: i64,
    pub(super) late: bool,
    pub(super) value: V,
}

fn codec_error(e: impl std::fmt::Display) -> GateError {
    GateError::TimerQueueCodec {
        message: e.to_string(),
    }
}

pub(super) fn encode_into<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), GateError> {
    bincode::serde::encode_into_std_write(value, out, bincode::config::standard())
        .map(|_| ())
        .map_err(codec_error)
}

pub(super) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, GateError> {
    let mut out = vec![CODEC_VERSION];
    encode_into(value, &mut out)?;
    Ok(out)
}

fn split_version<'a>(what: &str, bytes: &'a [u8]) -> Result<&'a [u8], String> {
    let (&version, body) = bytes
        .split_first()
        .ok_or_else(|| format!("{what}: empty input"))?;
    if version != CODEC_VERSION {
        return Err(format!("{what}: unknown version {version}"));
    }
    Ok(body)
}

/// Decodes one value from the front of `body`; returns it and the rest.
fn decode_front<'a, T: DeserializeOwned>(
    what: &str,
    body: &'a [u8],
) -> Result<(T, &'a [u8]), String> {
    let (value, used): (T, usize) = crate::bounded::decode_serde::<T, DECODE_LIMIT>(body)
        .map_err(|e| format!("{what}: {e}"))?;
    Ok((value, &body[used..]))
}

pub(super) fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, String> {
    let (value, rest) = decode_front(what, split_version(what, bytes)?)?;
    if !rest.is_empty() {
        return Err(format!("{what}: {} trailing bytes", rest.len()));
    }
    Ok(value)
}

/// The ids `(park time, arrival)` of the entries of a segment record, in the record's order,
/// without decoding the entries (for tools and tests that inspect a changelog; an entry is
/// still parked iff its park time is above the watermark of the header committed with it).
///
/// # Errors
/// [`GateError::TimerQueueCodec`] for an unknown version or ids that do not decode.
pub fn segment_ids(bytes: &[u8]) -> Result<Vec<(i64, u64)>, GateError> {
    let body = split_version("segment", bytes).map_err(codec_error)?;
    decode_front("segment ids", body)
        .map(|(ids, _)| ids)
        .map_err(codec_error)
}

/// A decoded segment record: each entry with its id.
type DecodedSegment<K, V> = Vec<(Id, EntryIn<K, V>)>;
/// Encoded segment records: each with the ids it holds.
type EncodedSegments = Vec<(Vec<Id>, Vec<u8>)>;

/// Decodes a segment record: its ids and entries, as many of one as of the other.
pub(super) fn decode_segment<K: DeserializeOwned, V: DeserializeOwned>(
    bytes: &[u8],
) -> Result<DecodedSegment<K, V>, String> {
    let body = split_version("segment", bytes)?;
    let (ids, rest): (Vec<(i64, u64)>, _) = decode_front("segment ids", body)?;
    let (entries, rest): (Vec<EntryIn<K, V>>, _) = decode_front("segment entries", rest)?;
    if !rest.is_empty() {
        return Err(format!("segment: {} trailing bytes", rest.len()));
    }
    if ids.len() != entries.len() {
        return Err(format!(
            "segment: {} ids for {} entries",
            ids.len(),
            entries.len()
        ));
    }
    if ids.is_empty() {
        return Err("segment: no entries".into());
    }
    Ok(ids.into_iter().zip(entries).collect())
}

/// Packs encoded entries into segment records of at most `limit` bytes each (one entry larger
/// than that alone), in the order pushed.
pub(super) struct Segments {
    limit: usize,
    /// The open segment: its ids and its entries' bytes.
    ids: Vec<Id>,
    bodies: Vec<u8>,
    /// One entry's bytes.
    scratch: Vec<u8>,
    done: EncodedSegments,
}

impl Segments {
    pub(super) fn new(limit: usize) -> Self {
        Segments {
            limit,
            ids: Vec::new(),
            bodies: Vec::new(),
            scratch: Vec::new(),
            done: Vec::new(),
        }
    }

    /// Adds an entry; returns the index of the segment that holds it (0 for the first).
    pub(super) fn push<K: Serialize, V: Serialize>(
        &mut self,
        id: Id,
        e: &Entry<K, V>,
    ) -> Result<u64, GateError> {
        self.scratch.clear();
        encode_into(
            &EntryOut {
                key: &e.key,
                event_time_ms: e.event_time_ms,
                late: e.late,
                value: &e.value,
            },
            &mut self.scratch,
        )?;
        // A version byte, two lengths (at most 9 bytes each), an id at most 18 bytes.
        let size = 19 + 18 * (self.ids.len() + 1) + self.bodies.len() + self.scratch.len();
        if !self.ids.is_empty() && size > self.limit {
            self.close()?;
        }
        self.ids.push(id);
        self.bodies.extend_from_slice(&self.scratch);
        Ok(self.done.len() as u64)
    }

    fn close(&mut self) -> Result<(), GateError> {
        let mut record = Vec::with_capacity(19 + 18 * self.ids.len() + self.bodies.len());
        record.push(CODEC_VERSION);
        encode_into(&self.ids, &mut record)?;
        encode_into(&(self.ids.len() as u64), &mut record)?;
        record.extend_from_slice(&self.bodies);
        self.done.push((std::mem::take(&mut self.ids), record));
        self.bodies.clear();
        Ok(())
    }

    pub(super) fn finish(mut self) -> Result<EncodedSegments, GateError> {
        if !self.ids.is_empty() {
            self.close()?;
        }
        Ok(self.done)
    }
}
