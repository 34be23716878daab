//! Decoding changelog bytes (bincode, standard configuration) with what a corrupt length may
//! allocate bounded by the input's own size: the timer queue's records here, the task snapshot
//! and the event-time record in `parsley-stage`.
//!
//! bincode 2 checks a length against a limit before it allocates: a container of `len`
//! elements of `T` claims `len * size_of::<T>()` bytes, and gives back each element's share as
//! it decodes it, so the claims outstanding at any moment are those of the containers open
//! then. In a valid value every element takes at least one input byte, so what is outstanding
//! is at most the input's length times the sum of the element sizes along the deepest nesting
//! of containers. [`decode`] takes the smallest of a few fixed limits that covers
//! [`CLAIM_PER_BYTE`] times the input's length: a corrupt length in a record of a few hundred
//! bytes is refused before it allocates more than 1 MiB, where one fixed limit for the largest
//! record let it allocate that limit.
//!
//! Invariant: for every type decoded here, an element's claim over the fewest input bytes it
//! can take, summed along any nesting of containers, stays well below [`CLAIM_PER_BYTE`] (the
//! largest: the event-time record's input entry, 64 bytes claimed for at least 19 input bytes,
//! with its look-ahead pairs, 16 bytes for at least 2 — about 12 per byte); the tests decode
//! values of those shapes at the smallest input each element allows. Through serde
//! ([`decode_serde`]) only strings and byte strings claim, a byte per input byte; a sequence is
//! preallocated to at most serde's own cautious bound.

use bincode::error::DecodeError;

/// Memory a valid value may claim per byte of its input, at most (module docs).
pub const CLAIM_PER_BYTE: usize = 256;

/// The limit [`decode`] and [`decode_serde`] apply to `body`: the smallest of 1 MiB, 16 MiB
/// and 256 MiB that is at least [`CLAIM_PER_BYTE`] times its length and below `max`, else
/// `max`.
fn tier(body: &[u8], max: usize) -> usize {
    let need = body.len().saturating_mul(CLAIM_PER_BYTE);
    [MIB, 16 * MIB, 256 * MIB]
        .into_iter()
        .find(|&t| need <= t && t < max)
        .unwrap_or(max)
}

const MIB: usize = 1 << 20;

/// One of bincode's two decoders, run with a limit `L` chosen at run time from a few.
trait Decoder<T> {
    fn at<const L: usize>(body: &[u8]) -> Result<(T, usize), DecodeError>;
}

/// bincode's own encoding ([`decode`]).
struct Native;
/// Through serde ([`decode_serde`]).
struct Serde;

impl<T: bincode::Decode<()>> Decoder<T> for Native {
    fn at<const L: usize>(body: &[u8]) -> Result<(T, usize), DecodeError> {
        bincode::decode_from_slice(body, bincode::config::standard().with_limit::<L>())
    }
}

impl<T: serde::de::DeserializeOwned> Decoder<T> for Serde {
    fn at<const L: usize>(body: &[u8]) -> Result<(T, usize), DecodeError> {
        bincode::serde::decode_from_slice(body, bincode::config::standard().with_limit::<L>())
    }
}

/// Runs `D` on `body` with the limit of [`tier`].
fn tiered<T, D: Decoder<T>, const MAX: usize>(body: &[u8]) -> Result<(T, usize), DecodeError> {
    match tier(body, MAX) {
        MIB => D::at::<MIB>(body),
        t if t == 16 * MIB => D::at::<{ 16 * MIB }>(body),
        t if t == 256 * MIB => D::at::<{ 256 * MIB }>(body),
        _ => D::at::<MAX>(body),
    }
}

/// Decodes a `T` (bincode's own encoding) from the front of `body`; returns it and the bytes
/// it used. The limit is the smallest of 1 MiB, 16 MiB, 256 MiB and `MAX` that is at least
/// [`CLAIM_PER_BYTE`] times `body.len()` (`MAX` when none is).
///
/// # Errors
/// bincode's: bytes that do not decode, a length whose claim passes the limit.
pub fn decode<T: bincode::Decode<()>, const MAX: usize>(
    body: &[u8],
) -> Result<(T, usize), DecodeError> {
    tiered::<T, Native, MAX>(body)
}

/// [`decode`] for a `T` read through serde.
///
/// # Errors
/// As [`decode`].
pub fn decode_serde<T: serde::de::DeserializeOwned, const MAX: usize>(
    body: &[u8],
) -> Result<(T, usize), DecodeError> {
    tiered::<T, Serde, MAX>(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The event-time record's input entry: channel, prefix maximum, look-ahead pairs.
    type Input = (([u8; 16], i32), Option<i64>, Vec<(i64, i64)>);

    #[test]
    fn a_short_input_with_a_huge_length_is_refused_at_the_smallest_limit() {
        // A vector claiming 500 MiB of bytes in a 6-byte input.
        let mut body = Vec::new();
        bincode::encode_into_std_write(500u64 << 20, &mut body, bincode::config::standard())
            .unwrap();
        let err = decode::<Vec<u8>, { 1 << 30 }>(&body).unwrap_err();
        assert!(
            matches!(err, DecodeError::LimitExceeded),
            "refused by the limit, not by running out of input: {err:?}"
        );
        // With the one fixed limit the claim passes and the vector is allocated before the
        // missing bytes are found.
        let fixed = bincode::decode_from_slice::<Vec<u8>, _>(
            &body,
            bincode::config::standard().with_limit::<{ 1 << 30 }>(),
        )
        .unwrap_err();
        assert!(
            matches!(fixed, DecodeError::UnexpectedEnd { .. }),
            "{fixed:?}"
        );
    }

    #[test]
    fn through_serde_a_string_with_a_huge_length_is_refused_at_the_smallest_limit() {
        let mut body = Vec::new();
        bincode::encode_into_std_write(500u64 << 20, &mut body, bincode::config::standard())
            .unwrap();
        let err = decode_serde::<String, { 1 << 30 }>(&body).unwrap_err();
        assert!(matches!(err, DecodeError::LimitExceeded), "{err:?}");
        let text = "parsley".repeat(1_000);
        let body = bincode::serde::encode_to_vec(&text, bincode::config::standard()).unwrap();
        assert_eq!(
            decode_serde::<String, { 1 << 30 }>(&body).unwrap(),
            (text, body.len())
        );
    }

    #[test]
    fn the_limit_is_the_smallest_tier_that_covers_the_input_and_never_above_the_maximum() {
        assert_eq!(tier(&[0; 100], 1 << 30), MIB);
        assert_eq!(tier(&[0; 4096], 1 << 30), MIB);
        assert_eq!(tier(&[0; 4097], 1 << 30), 16 * MIB);
        assert_eq!(tier(&vec![0; 2 << 20], 1 << 30), 1 << 30);
        assert_eq!(tier(&vec![0; 100_000], 64 * MIB), 64 * MIB);
        assert_eq!(tier(&[0; 10], MIB), MIB);
    }

    #[test]
    fn valid_values_decode_at_the_smallest_input_each_element_allows() {
        // Each element as short as it gets: one byte per element, where the claim per element
        // is largest relative to its input.
        let pairs: Vec<(i64, i64)> = vec![(0, 0); 100_000];
        let body = bincode::encode_to_vec(&pairs, bincode::config::standard()).unwrap();
        let (back, used) = decode::<Vec<(i64, i64)>, { 1 << 30 }>(&body).unwrap();
        assert_eq!((back, used), (pairs, body.len()));
        let nested: Vec<Input> = vec![(([0; 16], 0), None, Vec::new()); 50_000];
        let body = bincode::encode_to_vec(&nested, bincode::config::standard()).unwrap();
        let (back, _) = decode::<Vec<Input>, { 1 << 30 }>(&body).unwrap();
        assert_eq!(back, nested);
    }
}
