//! The changelog record of a punctuation schedule ([`PunctuationRecord`], key
//! [`punctuation_key`]): where a task's schedule stands, so that a restore fires it at the same
//! points as the run it continues.

use super::PUNCTUATION_PREFIX;

/// The most firings a record may hold pending (a corrupt count never allocates more).
const MAX_PENDING: u32 = 1 << 20;

/// Where one punctuation schedule of a task stands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PunctuationRecord {
    /// The schedule's type byte (0: stream time, 1: wall-clock time).
    pub kind: u8,
    /// The schedule's interval, ms.
    pub interval_ms: i64,
    /// The time of its next firing, ms since the epoch: the next multiple of the interval it
    /// waits for (`None`: not armed yet, no time seen).
    pub next: Option<i64>,
    /// Firings decided but not made yet, in order: (event-time position at which it fires,
    /// punctuation time), both ms since the epoch (a wall-clock schedule's firings wait for the
    /// event-time position of their tick).
    pub pending: Vec<(i64, i64)>,
}

/// The changelog key of schedule `schedule`: `0x06 ++ schedule (4 bytes, big-endian)`.
pub fn punctuation_key(schedule: u32) -> Vec<u8> {
    let mut key = Vec::with_capacity(5);
    key.push(PUNCTUATION_PREFIX);
    key.extend_from_slice(&schedule.to_be_bytes());
    key
}

/// The schedule a key `0x06 ++ …` names ([`punctuation_key`]'s inverse).
///
/// # Errors
/// A key of another kind or length, named.
pub fn punctuation_of(key: &[u8]) -> Result<u32, String> {
    match key {
        [PUNCTUATION_PREFIX, rest @ ..] => <[u8; 4]>::try_from(rest)
            .map(u32::from_be_bytes)
            .map_err(|_| format!("a punctuation key of {} bytes instead of 5", key.len())),
        _ => Err(format!(
            "a punctuation key that does not start with {PUNCTUATION_PREFIX:#04x}"
        )),
    }
}

impl PunctuationRecord {
    /// The record's bytes: kind (1), interval (8), a flag and the next time (1 + 8), the
    /// pending count (4) and each pending firing (8 + 8); integers big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(22 + 16 * self.pending.len());
        out.push(self.kind);
        out.extend_from_slice(&self.interval_ms.to_be_bytes());
        out.push(u8::from(self.next.is_some()));
        out.extend_from_slice(&self.next.unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&(self.pending.len() as u32).to_be_bytes());
        for (at, time) in &self.pending {
            out.extend_from_slice(&at.to_be_bytes());
            out.extend_from_slice(&time.to_be_bytes());
        }
        out
    }

    /// Decodes [`PunctuationRecord::encode`]'s bytes.
    ///
    /// # Errors
    /// Bytes too short or too long for what they announce, a flag other than 0 or 1, a
    /// pending count above the limit: named.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let i64_at = |at: usize| -> Result<i64, String> {
            bytes
                .get(at..at + 8)
                .map(|b| i64::from_be_bytes(b.try_into().expect("8 bytes")))
                .ok_or_else(|| format!("a punctuation record of {} bytes, cut short", bytes.len()))
        };
        let kind = *bytes
            .first()
            .ok_or("an empty punctuation record".to_string())?;
        let interval_ms = i64_at(1)?;
        let next = match bytes.get(9) {
            Some(0) => None,
            Some(1) => Some(i64_at(10)?),
            Some(f) => return Err(format!("a punctuation record's next-time flag {f}")),
            None => return Err("a punctuation record cut short".into()),
        };
        let count = bytes
            .get(18..22)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
            .ok_or("a punctuation record cut short".to_string())?;
        if count > MAX_PENDING {
            return Err(format!(
                "a punctuation record announcing {count} pending firings (at most {MAX_PENDING})"
            ));
        }
        let expected = 22 + 16 * count as usize;
        if bytes.len() != expected {
            return Err(format!(
                "a punctuation record of {} bytes instead of {expected}",
                bytes.len()
            ));
        }
        let pending = (0..count as usize)
            .map(|i| Ok((i64_at(22 + 16 * i)?, i64_at(30 + 16 * i)?)))
            .collect::<Result<_, String>>()?;
        Ok(PunctuationRecord {
            kind,
            interval_ms,
            next,
            pending,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_keys_round_trip_and_bad_bytes_are_named() {
        let r = PunctuationRecord {
            kind: 1,
            interval_ms: 1_000,
            next: Some(-5_000),
            pending: vec![(1, 2), (i64::MIN, i64::MAX)],
        };
        assert_eq!(PunctuationRecord::decode(&r.encode()), Ok(r.clone()));
        let unarmed = PunctuationRecord::default();
        assert_eq!(PunctuationRecord::decode(&unarmed.encode()), Ok(unarmed));
        let bytes = r.encode();
        for cut in 0..bytes.len() {
            assert!(
                PunctuationRecord::decode(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut flag = bytes.clone();
        flag[9] = 2;
        assert!(
            PunctuationRecord::decode(&flag)
                .unwrap_err()
                .contains("flag 2")
        );
        let mut huge = bytes.clone();
        huge[18..22].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(
            PunctuationRecord::decode(&huge)
                .unwrap_err()
                .contains("at most")
        );
        let mut long = bytes;
        long.push(0);
        assert!(
            PunctuationRecord::decode(&long)
                .unwrap_err()
                .contains("instead of")
        );
        assert_eq!(punctuation_of(&punctuation_key(7)), Ok(7));
        assert!(
            punctuation_of(&[PUNCTUATION_PREFIX, 1])
                .unwrap_err()
                .contains("2 bytes")
        );
        assert!(punctuation_of(&[0, 0, 0, 0, 1]).is_err());
    }
}
