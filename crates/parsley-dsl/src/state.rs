//! The state a stage keeps per key: one slot per stateful operator of the stage (a table's
//! materialised value, an aggregate, a join's two sides, a handler's fold state), all kept as
//! the key's one fold state in the stage's changelog.
//!
//! Encoding: a version byte (`2`), then bincode (standard configuration) of the list of
//! `(slot name, slot bytes, written)` triples sorted by name; each slot's bytes are bincode
//! of the operator's value, and `written` ([`Written`]) says whether they carry the timestamp
//! of the record that last set them (an aggregate's, as Kafka Streams' timestamped stores keep
//! a value and its timestamp) or were carried over from version 1. Version `1`, written
//! before, is the same list of `(slot name, slot bytes)` pairs: it is read, each slot marked
//! as of version 1, so that an operator whose value changed shape since reads that slot in its
//! old shape ([`Slots::get_upgraded`]) until it writes it anew. Slots are named after their
//! operators, so an operator keeps its state when others are added to the stage, as long as
//! its name stays (name stateful operators).
//!
//! Invariants: the stored list is sorted by slot name with no duplicates; a key whose slots
//! are all gone is deleted, not stored empty; decoding untrusted bytes never panics.
//!
//! At the bottom of the crate: it imports none of its modules.

use std::borrow::Cow;
use std::sync::Arc;

use parsley_stage::store::ValueReader;
use parsley_stage::{Bincode, Codec, CodecError, StateChange};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The version byte of the encoding.
const VERSION: u8 = 2;

/// The version byte of the encoding without timestamps.
const VERSION_1: u8 = 1;

/// How a slot's bytes were written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Written {
    /// In version 1 of the encoding, in the operator's value shape of then.
    Version1,
    /// Without a timestamp.
    Untimed,
    /// With the timestamp of the record that set them, ms since the epoch.
    At(i64),
}

/// One slot: its name, its value's bytes (borrowed from the stored state until changed), and
/// how they were written. Encoded as bincode encodes `(String, serde_bytes::ByteBuf,
/// Written)`.
#[derive(Serialize, Deserialize)]
struct Slot<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, with = "serde_bytes")]
    bytes: Cow<'a, [u8]>,
    written: Written,
}

/// A slot of version 1: no timestamp.
#[derive(Serialize, Deserialize)]
struct SlotV1<'a> {
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
        Ok(self.get_timestamped(name)?.map(|(value, _)| value))
    }

    /// The value in slot `name` and its timestamp (ms since the epoch; `None` when it was put
    /// without one), if it holds one.
    ///
    /// # Errors
    /// When the stored state or the slot does not decode.
    pub(crate) fn get_timestamped<S: Serialize + DeserializeOwned>(
        &mut self,
        name: &str,
    ) -> Result<Option<(S, Option<i64>)>, CodecError> {
        let entries = self.entries()?;
        match entries.binary_search_by(|slot| slot.name.as_ref().cmp(name)) {
            Ok(i) => Ok(Some((
                Bincode.decode(&entries[i].bytes)?,
                match entries[i].written {
                    Written::At(t) => Some(t),
                    Written::Version1 | Written::Untimed => None,
                },
            ))),
            Err(_) => Ok(None),
        }
    }

    /// The value in slot `name` of an operator whose value changed shape since version 1 of
    /// the encoding: decoded as `Old` and converted by `upgrade` when the slot was written in
    /// version 1, else as `S`.
    ///
    /// # Errors
    /// When the stored state or the slot does not decode.
    pub(crate) fn get_upgraded<S, Old>(
        &mut self,
        name: &str,
        upgrade: impl FnOnce(Old) -> S,
    ) -> Result<Option<S>, CodecError>
    where
        S: Serialize + DeserializeOwned,
        Old: Serialize + DeserializeOwned,
    {
        let entries = self.entries()?;
        match entries.binary_search_by(|slot| slot.name.as_ref().cmp(name)) {
            Ok(i) if entries[i].written == Written::Version1 => {
                Ok(Some(upgrade(Bincode.decode(&entries[i].bytes)?)))
            }
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

    /// Puts `value` in slot `name`, without a timestamp; `None` empties it.
    ///
    /// # Errors
    /// When the stored state does not decode or the value does not encode.
    #[cfg(test)]
    pub(crate) fn put<S: Serialize + DeserializeOwned>(
        &mut self,
        name: &str,
        value: Option<&S>,
    ) -> Result<(), CodecError> {
        self.put_timestamped(name, value, None)
    }

    /// Puts `value` in slot `name` with `timestamp` (ms since the epoch); `None` empties it.
    ///
    /// # Errors
    /// When the stored state does not decode or the value does not encode.
    pub(crate) fn put_timestamped<S: Serialize + DeserializeOwned>(
        &mut self,
        name: &str,
        value: Option<&S>,
        timestamp: Option<i64>,
    ) -> Result<(), CodecError> {
        let written = timestamp.map_or(Written::Untimed, Written::At);
        let bytes = value.map(|v| Bincode.encode(v)).transpose()?;
        let entries = self.entries()?;
        match (
            entries.binary_search_by(|slot| slot.name.as_ref().cmp(name)),
            bytes,
        ) {
            (Ok(i), Some(b)) => {
                entries[i].bytes = Cow::Owned(b);
                entries[i].written = written;
            }
            (Ok(i), None) => {
                entries.remove(i);
            }
            (Err(i), Some(b)) => entries.insert(
                i,
                Slot {
                    name: Cow::Owned(name.to_string()),
                    bytes: Cow::Owned(b),
                    written,
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
        .map(|s| s.name.len() + s.bytes.len() + 28)
        .sum();
    let mut out = Vec::with_capacity(1 + 9 + size);
    out.push(VERSION);
    bincode::serde::encode_into_std_write(entries, &mut out, bincode::config::standard())?;
    Ok(out)
}

/// How a key's fold state reads as the value in slot `name`: a queryable store's value
/// (`None` when the key's state has no such slot).
pub(crate) fn slot_reader<S: Serialize + DeserializeOwned + 'static>(
    name: String,
) -> ValueReader<S> {
    Arc::new(move |raw: &[u8]| Slots::new(Some(raw)).get::<S>(&name))
}

/// The slots of `raw` (version 2, or version 1 without timestamps), borrowing their names
/// and bytes from it.
fn decode(raw: &[u8]) -> Result<Entries<'_>, CodecError> {
    fn all<'a, T: Deserialize<'a>>(rest: &'a [u8]) -> Result<Vec<T>, CodecError> {
        let (entries, read): (Vec<T>, usize) =
            bincode::serde::borrow_decode_from_slice(rest, bincode::config::standard())?;
        if read != rest.len() {
            return Err(CodecError::TrailingBytes(rest.len() - read));
        }
        Ok(entries)
    }
    let entries = match raw.split_first() {
        Some((&VERSION, rest)) => all::<Slot<'_>>(rest)?,
        Some((&VERSION_1, rest)) => all::<SlotV1<'_>>(rest)?
            .into_iter()
            .map(|s| Slot {
                name: s.name,
                bytes: s.bytes,
                written: Written::Version1,
            })
            .collect(),
        _ => {
            return Err(CodecError::Malformed(format!(
                "unknown state version {:?}",
                raw.first()
            )));
        }
    };
    if entries.windows(2).any(|w| w[0].name >= w[1].name) {
        return Err(CodecError::Malformed(
            "state slots out of order or repeated".into(),
        ));
    }
    Ok(entries)
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
    fn the_encoding_is_bincode_of_name_bytes_and_written_triples_and_version_1_is_read() {
        // Version 2: bincode of `Vec<(String, ByteBuf, Written)>` after the version byte.
        let triples = |first: Written| {
            vec![
                (
                    "a-table".to_string(),
                    serde_bytes::ByteBuf::from(vec![3]),
                    first,
                ),
                (
                    "count".to_string(),
                    serde_bytes::ByteBuf::from(vec![7]),
                    Written::At(40),
                ),
            ]
        };
        let mut v2 = vec![VERSION];
        v2.extend(Bincode.encode(&triples(Written::Untimed)).unwrap());
        let mut s = Slots::new(Some(&v2));
        assert_eq!(
            s.get_timestamped::<u64>("count").unwrap(),
            Some((7, Some(40)))
        );
        assert_eq!(
            s.get_timestamped::<u64>("a-table").unwrap(),
            Some((3, None))
        );
        // What earlier versions wrote, and changelogs still hold: version 1, bincode of
        // `Vec<(String, ByteBuf)>`, read without timestamps.
        let pairs: Vec<_> = triples(Written::Untimed)
            .into_iter()
            .map(|(n, b, _)| (n, b))
            .collect();
        let mut v1 = vec![VERSION_1];
        v1.extend(Bincode.encode(&pairs).unwrap());
        assert_eq!(read_slot::<u64>(&v1, "count").unwrap(), Some(7));
        let mut s = Slots::new(Some(&v1));
        assert_eq!(s.get_timestamped::<u64>("count").unwrap(), Some((7, None)));
        // An operator whose value changed shape reads a version-1 slot in its old shape, until
        // it writes it: a slot not written again stays marked as of version 1 in version 2.
        let upgrade = |old: u64| (old, "upgraded".to_string());
        let upgraded = s.get_upgraded("a-table", upgrade).unwrap();
        assert_eq!(upgraded, Some((3, "upgraded".to_string())));
        s.put_timestamped("count", Some(&7u64), Some(40)).unwrap();
        let StateChange::Set(new) = s.into_change().unwrap() else {
            panic!("state should be set")
        };
        let mut carried = vec![VERSION];
        carried.extend(Bincode.encode(&triples(Written::Version1)).unwrap());
        assert_eq!(new, carried);
        let mut s = Slots::new(Some(&new));
        assert_eq!(
            s.get_upgraded("a-table", upgrade).unwrap(),
            Some((3, "upgraded".to_string()))
        );
        s.put("a-table", Some(&(3u64, "new".to_string()))).unwrap();
        assert_eq!(
            s.get_upgraded("a-table", upgrade).unwrap(),
            Some((3, "new".to_string()))
        );
        // Trailing bytes are refused, in both versions.
        for old in [v1, v2] {
            let mut long = old.clone();
            long.push(0);
            assert!(read_slot::<u64>(&long, "count").is_err());
        }
    }

    #[test]
    fn bad_state_bytes_are_errors_not_panics() {
        for raw in [
            &[][..],
            &[3, 0][..],
            &[1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],
            &[1, 1, 200][..],
        ] {
            assert!(read_slot::<u64>(raw, "count").is_err(), "{raw:?}");
        }
        // Slots out of order are refused.
        let slot = |name: &'static str| Slot {
            name: Cow::Borrowed(name),
            bytes: Cow::Borrowed(&[1]),
            written: Written::Untimed,
        };
        let bad = encode(&vec![slot("b"), slot("a")]).unwrap();
        assert!(read_slot::<u64>(&bad, "a").is_err());
    }
}
