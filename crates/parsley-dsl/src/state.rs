//! The state a stage keeps per key: one slot per stateful operator of the stage (a table's
//! materialised value, an aggregate, a join's two sides, a handler's fold state), all kept as
//! the key's one fold state in the stage's changelog.
//!
//! Encoding: a version byte (`1`), then bincode (standard configuration) of the list of
//! `(slot name, slot bytes)` pairs sorted by name; each slot's bytes are bincode of the
//! operator's value. Slots are named after their operators, so an operator keeps its state
//! when others are added to the stage, as long as its name stays (name stateful operators).
//!
//! Invariants: the stored list is sorted by slot name with no duplicates; a key whose slots
//! are all gone is deleted, not stored empty; decoding untrusted bytes never panics.

use std::borrow::Cow;

use parsley_stage::{Bincode, Codec, CodecError, StateChange};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The version byte of the encoding.
const VERSION: u8 = 1;

/// One slot: its name and its value's bytes, borrowed from the stored state until changed.
/// Encoded as bincode encodes `(String, serde_bytes::ByteBuf)`.
#[derive(Serialize, Deserialize)]
struct Slot<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, with = "serde_bytes")]
    bytes: Cow<'a, [u8]>,
}

type Entries<'a> = Vec<Slot<'a>>;

/// The slots of one key's state, decoded on first use.
pub(crate) struct Slots<'a> {
    raw: Option<&'a [u8]>,
    entries: Option<Entries<'a>>,
    changed: bool,
}

impl<'a> Slots<'a> {
    /// The slots stored as `raw` (`None`: the key has no state yet).
    pub(crate) fn new(raw: Option<&'a [u8]>) -> Self {
        Slots {
            raw,
            entries: None,
            changed: false,
        }
    }

    fn entries(&mut self) -> Result<&mut Entries<'a>, CodecError> {
        if self.entries.is_none() {
            self.entries = Some(match self.raw {
                None => Vec::new(),
                Some(raw) => decode(raw)?,
            });
        }
        Ok(self.entries.get_or_insert_with(Vec::new))
    }

    /// The value in slot `name`, if it holds one.
    ///
    /// # Errors
    /// When the stored state or the slot does not decode.
    pub(crate) fn get<S: Serialize + DeserializeOwned>(
        &mut self,
        name: &str,
    ) -> Result<Option<S>, CodecError> {
        let entries = self.entries()?;
        match entries.binary_search_by(|slot| slot.name.as_ref().cmp(name)) {
            Ok(i) => Bincode.decode(&entries[i].bytes).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Decodes the stored state, if not done yet.
    ///
    /// # Errors
    /// When it does not decode.
    pub(crate) fn decoded(&mut self) -> Result<(), CodecError> {
        self.entries().map(|_| ())
    }

    /// Puts `value` in slot `name`; `None` empties it.
    ///
    /// # Errors
    /// When the stored state does not decode or the value does not encode.
    pub(crate) fn put<S: Serialize + DeserializeOwned>(
        &mut self,
        name: &str,
        value: Option<&S>,
    ) -> Result<(), CodecError> {
        let bytes = value.map(|v| Bincode.encode(v)).transpose()?;
        let entries = self.entries()?;
        match (
            entries.binary_search_by(|slot| slot.name.as_ref().cmp(name)),
            bytes,
        ) {
            (Ok(i), Some(b)) => entries[i].bytes = Cow::Owned(b),
            (Ok(i), None) => {
                entries.remove(i);
            }
            (Err(i), Some(b)) => entries.insert(
                i,
                Slot {
                    name: Cow::Owned(name.to_string()),
                    bytes: Cow::Owned(b),
                },
            ),
            (Err(_), None) => return Ok(()),
        }
        self.changed = true;
        Ok(())
    }

    /// What becomes of the key's state: kept when no slot changed, deleted when none is left.
    ///
    /// # Errors
    /// When the slots do not encode.
    pub(crate) fn into_change(self) -> Result<StateChange<Vec<u8>>, CodecError> {
        match self.entries {
            Some(entries) if self.changed => {
                if entries.is_empty() {
                    Ok(StateChange::Delete)
                } else {
                    Ok(StateChange::Set(encode(&entries)?))
                }
            }
            _ => Ok(StateChange::Keep),
        }
    }
}

/// The version byte and the slots, in one buffer.
fn encode(entries: &Entries<'_>) -> Result<Vec<u8>, CodecError> {
    let size: usize = entries
        .iter()
        .map(|s| s.name.len() + s.bytes.len() + 18)
        .sum();
    let mut out = Vec::with_capacity(1 + 9 + size);
    out.push(VERSION);
    bincode::serde::encode_into_std_write(entries, &mut out, bincode::config::standard())?;
    Ok(out)
}

/// The slots of `raw`, borrowing their names and bytes from it.
fn decode(raw: &[u8]) -> Result<Entries<'_>, CodecError> {
    match raw.split_first() {
        Some((&VERSION, rest)) => {
            let (entries, read): (Entries<'_>, usize) =
                bincode::serde::borrow_decode_from_slice(rest, bincode::config::standard())?;
            if read != rest.len() {
                return Err(CodecError::TrailingBytes(rest.len() - read));
            }
            if entries.windows(2).any(|w| w[0].name >= w[1].name) {
                return Err(CodecError::Malformed(
                    "state slots out of order or repeated".into(),
                ));
            }
            Ok(entries)
        }
        _ => Err(CodecError::Malformed(format!(
            "unknown state version {:?}",
            raw.first()
        ))),
    }
}

/// The value of slot `name` in a key's stored state, for tests and tools that read a stage's
/// state (a table's value, an aggregate).
///
/// # Errors
/// When the stored state or the slot does not decode.
pub fn read_slot<S: Serialize + DeserializeOwned>(
    raw: &[u8],
    name: &str,
) -> Result<Option<S>, CodecError> {
    Slots::new(Some(raw)).get(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip_and_an_empty_state_is_deleted() {
        let mut s = Slots::new(None);
        assert_eq!(s.get::<u64>("count").unwrap(), None);
        s.put("count", Some(&3u64)).unwrap();
        s.put("a-table", Some(&"x".to_string())).unwrap();
        let StateChange::Set(raw) = s.into_change().unwrap() else {
            panic!("state should be set")
        };
        assert_eq!(read_slot::<u64>(&raw, "count").unwrap(), Some(3));
        assert_eq!(
            read_slot::<String>(&raw, "a-table").unwrap().as_deref(),
            Some("x")
        );
        let mut s = Slots::new(Some(&raw));
        assert_eq!(s.get::<u64>("count").unwrap(), Some(3));
        s.put::<u64>("count", None).unwrap();
        s.put::<String>("a-table", None).unwrap();
        assert_eq!(s.into_change().unwrap(), StateChange::Delete);
        // Reading alone changes nothing.
        let mut s = Slots::new(Some(&raw));
        let _ = s.get::<u64>("count").unwrap();
        assert_eq!(s.into_change().unwrap(), StateChange::Keep);
        // Emptying an empty slot changes nothing either.
        let mut s = Slots::new(None);
        s.put::<u64>("count", None).unwrap();
        assert_eq!(s.into_change().unwrap(), StateChange::Keep);
    }

    #[test]
    fn the_encoding_is_bincode_of_name_and_byte_buffer_pairs() {
        // What earlier versions wrote, and changelogs still hold: bincode of
        // `Vec<(String, ByteBuf)>` after the version byte.
        let pairs = vec![
            (
                "a-table".to_string(),
                serde_bytes::ByteBuf::from(vec![1, 2, 3]),
            ),
            ("count".to_string(), serde_bytes::ByteBuf::from(vec![7])),
        ];
        let mut old = vec![VERSION];
        old.extend(Bincode.encode(&pairs).unwrap());
        assert_eq!(read_slot::<u64>(&old, "count").unwrap(), Some(7));
        let mut s = Slots::new(Some(&old));
        s.put("count", Some(&7u64)).unwrap();
        let StateChange::Set(new) = s.into_change().unwrap() else {
            panic!("state should be set")
        };
        assert_eq!(new, old);
        // Trailing bytes are refused.
        let mut long = old.clone();
        long.push(0);
        assert!(read_slot::<u64>(&long, "count").is_err());
    }

    #[test]
    fn bad_state_bytes_are_errors_not_panics() {
        for raw in [
            &[][..],
            &[2, 0][..],
            &[1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],
            &[1, 1, 200][..],
        ] {
            assert!(read_slot::<u64>(raw, "count").is_err(), "{raw:?}");
        }
        // Slots out of order are refused.
        let slot = |name: &'static str| Slot {
            name: Cow::Borrowed(name),
            bytes: Cow::Borrowed(&[1]),
        };
        let bad = encode(&vec![slot("b"), slot("a")]).unwrap();
        assert!(read_slot::<u64>(&bad, "a").is_err());
    }
}
