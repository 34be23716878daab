//! The Confluent wire format: magic byte `0`, the schema id as 4 bytes big-endian, then the
//! payload; a Protobuf payload is preceded by its message indexes.
//!
//! Message indexes name a message in the schema's file: the index of a top-level message, then
//! of a message nested in it, and so on. They are written as a count followed by the indexes,
//! each a zig-zag varint (Kafka's `ByteUtils.writeVarint`); the common `[0]` (the file's first
//! message) is written as the single byte `0` (a count of 0).
//!
//! Parsing never panics: bytes that break the format give a [`SchemaError`] naming the part.

use crate::SchemaError;

/// The first byte of every record in the wire format.
pub const MAGIC_BYTE: u8 = 0;
/// The length of the header: the magic byte and the schema id.
pub const HEADER_LEN: usize = 5;
/// The most message indexes a record may carry (a nesting deeper than any real schema's):
/// a count above it is an error, not an allocation.
pub const MAX_MESSAGE_INDEXES: usize = 128;

/// The header of `id`: magic byte and the id, big-endian.
pub fn header(id: u32) -> [u8; HEADER_LEN] {
    let id = id.to_be_bytes();
    [MAGIC_BYTE, id[0], id[1], id[2], id[3]]
}

/// The schema id of `bytes` and the rest after the header.
///
/// # Errors
/// [`SchemaError::ShortBuffer`] under 5 bytes, [`SchemaError::WrongMagicByte`].
pub fn split(bytes: &[u8]) -> Result<(u32, &[u8]), SchemaError> {
    let Some(&first) = bytes.first() else {
        return Err(SchemaError::ShortBuffer {
            len: 0,
            needed: HEADER_LEN,
            what: "the header",
        });
    };
    if first != MAGIC_BYTE {
        return Err(SchemaError::WrongMagicByte { found: first });
    }
    let Some((id, rest)) = bytes
        .get(1..HEADER_LEN)
        .map(|id| (id, &bytes[HEADER_LEN..]))
    else {
        return Err(SchemaError::ShortBuffer {
            len: bytes.len(),
            needed: HEADER_LEN,
            what: "the header",
        });
    };
    Ok((u32::from_be_bytes([id[0], id[1], id[2], id[3]]), rest))
}

/// Appends `indexes` in the wire format (see the module docs).
pub fn write_message_indexes(indexes: &[i32], out: &mut Vec<u8>) {
    if indexes == [0] {
        out.push(0);
        return;
    }
    write_varint(indexes.len() as i32, out);
    for &i in indexes {
        write_varint(i, out);
    }
}

/// The message indexes at the start of `bytes` (which start at offset `at` of the record) and
/// the rest.
///
/// # Errors
/// [`SchemaError::BadMessageIndexes`] for a varint that ends early or runs over 5 bytes, a
/// negative count or index, or a count over [`MAX_MESSAGE_INDEXES`].
pub fn read_message_indexes(bytes: &[u8], at: usize) -> Result<(Vec<i32>, &[u8]), SchemaError> {
    let (count, mut rest) = read_varint(bytes, at)?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    let bad = |reason: String| SchemaError::BadMessageIndexes { at, reason };
    let count = usize::try_from(count).map_err(|_| bad(format!("negative count {count}")))?;
    if count > MAX_MESSAGE_INDEXES {
        return Err(bad(format!(
            "count {count} over the limit of {MAX_MESSAGE_INDEXES}"
        )));
    }
    let mut indexes = Vec::with_capacity(count);
    for _ in 0..count {
        let offset = at + (bytes.len() - rest.len());
        let (index, after) = read_varint(rest, offset)?;
        if index < 0 {
            return Err(SchemaError::BadMessageIndexes {
                at: offset,
                reason: format!("negative index {index}"),
            });
        }
        indexes.push(index);
        rest = after;
    }
    Ok((indexes, rest))
}

fn write_varint(value: i32, out: &mut Vec<u8>) {
    let mut v = ((value << 1) ^ (value >> 31)) as u32;
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A zig-zag varint of at most 5 bytes.
fn read_varint(bytes: &[u8], at: usize) -> Result<(i32, &[u8]), SchemaError> {
    let mut v: u32 = 0;
    for (i, &b) in bytes.iter().enumerate().take(5) {
        if i == 4 && b > 0x0f {
            return Err(SchemaError::BadMessageIndexes {
                at: at + i,
                reason: "a varint over 32 bits".into(),
            });
        }
        v |= u32::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let value = ((v >> 1) as i32) ^ -((v & 1) as i32);
            return Ok((value, &bytes[i + 1..]));
        }
    }
    Err(SchemaError::ShortBuffer {
        len: bytes.len(),
        needed: bytes.len() + 1,
        what: "a message index varint",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_header_is_magic_byte_and_big_endian_id() {
        assert_eq!(header(0x0102_0304), [0, 1, 2, 3, 4]);
        assert_eq!(split(&[0, 0, 0, 1, 0, 9, 8]).unwrap(), (256, &[9u8, 8][..]));
        assert!(matches!(
            split(&[1, 0, 0, 0, 1]),
            Err(SchemaError::WrongMagicByte { found: 1 })
        ));
        assert!(matches!(
            split(&[0, 0, 1]),
            Err(SchemaError::ShortBuffer {
                len: 3,
                needed: 5,
                ..
            })
        ));
        assert!(matches!(
            split(&[]),
            Err(SchemaError::ShortBuffer { len: 0, .. })
        ));
    }

    #[test]
    fn message_indexes_match_confluents_bytes() {
        let mut out = Vec::new();
        write_message_indexes(&[0], &mut out);
        assert_eq!(out, [0]);
        out.clear();
        // Count 2, indexes 1 and 0: zig-zag 2 → 4, 1 → 2, 0 → 0.
        write_message_indexes(&[1, 0], &mut out);
        assert_eq!(out, [4, 2, 0]);
        out.clear();
        write_message_indexes(&[64], &mut out);
        assert_eq!(out, [2, 0x80, 0x01]);
        assert_eq!(
            read_message_indexes(&[4, 2, 0, 7], 5).unwrap(),
            (vec![1, 0], &[7u8][..])
        );
        assert_eq!(
            read_message_indexes(&[0, 7], 5).unwrap(),
            (vec![0], &[7u8][..])
        );
    }

    #[test]
    fn bad_message_indexes_name_the_byte() {
        // A negative count (zig-zag 1 → -1).
        assert!(matches!(
            read_message_indexes(&[1], 5),
            Err(SchemaError::BadMessageIndexes { at: 5, .. })
        ));
        // A count of 2 and one index.
        assert!(matches!(
            read_message_indexes(&[4, 2], 5),
            Err(SchemaError::ShortBuffer { .. })
        ));
        // An index that is negative, at byte 6.
        assert!(matches!(
            read_message_indexes(&[2, 3], 5),
            Err(SchemaError::BadMessageIndexes { at: 6, .. })
        ));
        // A varint of six bytes.
        assert!(matches!(
            read_message_indexes(&[0x80, 0x80, 0x80, 0x80, 0x80, 0], 5),
            Err(SchemaError::BadMessageIndexes { at: 9, .. })
        ));
        // A count over the limit.
        assert!(matches!(
            read_message_indexes(&[0x82, 0x02], 5),
            Err(SchemaError::BadMessageIndexes { at: 5, .. })
        ));
    }

    proptest! {
        #[test]
        fn message_indexes_round_trip(indexes in proptest::collection::vec(0i32..i32::MAX, 1..8)) {
            let mut out = Vec::new();
            write_message_indexes(&indexes, &mut out);
            out.push(42);
            let (read, rest) = read_message_indexes(&out, 0).unwrap();
            prop_assert_eq!(read, indexes);
            prop_assert_eq!(rest, &[42u8][..]);
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok((_, rest)) = split(&bytes) {
                let _ = read_message_indexes(rest, HEADER_LEN);
            }
            let _ = read_message_indexes(&bytes, 0);
        }
    }
}
