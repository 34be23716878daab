//! Serde codecs for keys, values and fold state.
//!
//! At the bottom of the crate: it imports none of its modules.
//!
//! A [`Codec<T>`] turns a typed value into the bytes of a Kafka key or value (or of a state
//! entry) and back. [`Json`] is readable on the wire and the default; [`Bincode`] is compact;
//! [`Utf8`] writes a `String` as its bytes, the common choice for keys shared with other
//! clients; [`Bytes`] passes `Vec<u8>` through unchanged; [`Auto`] picks per type as Kafka
//! clients do (text, bytes, else JSON) and is the DSL's default. Keys of co-partitioned topics must be
//! encoded the same way by every writer: the partition is a hash of the key's bytes.
//!
//! # Absent keys and values
//! A Kafka record may have no key, and a tombstone has no value. A codec says whether its type
//! can stand for such an absent part ([`Codec::decode_absent`], [`Codec::encode_part`]):
//! [`Json`] maps an absent part to JSON `null`, so an `Option<T>` key or value (or `()`) takes
//! it and gives it back; [`Nullable`] does the same for any other codec. With a type that
//! cannot stand for it (a `String` through [`Utf8`], a struct through [`Json`]), an absent part
//! is an error ([`CodecError::Absent`]) that the stage's bad-record policy handles.
//!
//! Decoding untrusted bytes never panics: it returns [`CodecError`].

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why bytes could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// JSON encoding or decoding failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// Bincode encoding failed.
    #[error("bincode encode: {0}")]
    BincodeEncode(#[from] bincode::error::EncodeError),
    /// Bincode decoding failed.
    #[error("bincode decode: {0}")]
    BincodeDecode(#[from] bincode::error::DecodeError),
    /// Bytes left over after a complete bincode value.
    #[error("{0} trailing byte(s) after the value")]
    TrailingBytes(usize),
    /// Bytes that are not UTF-8 where a string was expected.
    #[error("not UTF-8: {0}")]
    Utf8(#[from] std::string::FromUtf8Error),
    /// The bytes decode but break a rule of their format (a version byte, an order).
    #[error("malformed: {0}")]
    Malformed(String),
    /// The part is absent (a record without a key, a tombstone) and the type cannot stand for
    /// an absent part (see the module docs: use an `Option` with [`Json`] or [`Nullable`]).
    #[error("the part is absent and its type cannot stand for an absent part")]
    Absent,
    /// An error of a codec defined outside this crate, typed by that codec (a schema
    /// registry's codec says which byte, schema id or field was wrong): `downcast_ref` on the
    /// boxed error gives it back.
    #[error("{0}")]
    External(Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// Encodes and decodes values of type `T`.
pub trait Codec<T>: Send + Sync {
    /// The bytes of `value`.
    ///
    /// # Errors
    /// When the value cannot be represented in this format.
    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError>;

    /// The value in `bytes`.
    ///
    /// # Errors
    /// When the bytes are not a valid encoding of a `T`.
    fn decode(&self, bytes: &[u8]) -> Result<T, CodecError>;

    /// The bytes of `value`, consuming it. A codec whose values own their encoding (a
    /// `String`'s UTF-8, a `Vec<u8>`'s bytes) returns it without a copy; the default encodes
    /// by reference. The runtime encodes emissions with this method.
    ///
    /// # Errors
    /// As [`Codec::encode`].
    fn encode_owned(&self, value: T) -> Result<Vec<u8>, CodecError> {
        self.encode(&value)
    }

    /// The value in `bytes`, which the codec may keep. A codec whose values own their encoding
    /// takes the buffer without a copy; the default decodes by reference. The runtime decodes
    /// delivered values with this method (the bytes were copied out of the consumer once
    /// already).
    ///
    /// # Errors
    /// As [`Codec::decode`].
    fn decode_owned(&self, bytes: Vec<u8>) -> Result<T, CodecError> {
        self.decode(&bytes)
    }

    /// The value an absent part decodes to: a record without a key, a tombstone's value. The
    /// default: none ([`CodecError::Absent`]).
    ///
    /// # Errors
    /// [`CodecError::Absent`] when the type cannot stand for an absent part.
    fn decode_absent(&self) -> Result<T, CodecError> {
        Err(CodecError::Absent)
    }

    /// `value` as a record part, consuming it: `None` when it stands for an absent part (a key
    /// to leave out, a tombstone's value). The default: always present
    /// ([`Codec::encode_owned`]). The runtime encodes emissions with this method.
    ///
    /// # Errors
    /// As [`Codec::encode`].
    fn encode_part(&self, value: T) -> Result<Option<Vec<u8>>, CodecError> {
        self.encode_owned(value).map(Some)
    }
}

/// JSON via `serde_json`. An absent part is JSON `null` both ways (module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl<T: Serialize + DeserializeOwned> Codec<T> for Json {
    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        Ok(serde_json::to_vec(value)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, CodecError> {
        Ok(serde_json::from_slice(bytes)?)
    }

    fn decode_absent(&self) -> Result<T, CodecError> {
        serde_json::from_slice(b"null").map_err(|_| CodecError::Absent)
    }

    fn encode_part(&self, value: T) -> Result<Option<Vec<u8>>, CodecError> {
        let bytes = serde_json::to_vec(&value)?;
        Ok((bytes != b"null").then_some(bytes))
    }
}

/// The usual choice per type, as Kafka clients make it: a `String` as its UTF-8 bytes (Kafka's
/// `StringSerializer`), a `Vec<u8>` as it is (`ByteArraySerializer`), an `Option` of either
/// with `None` as an absent part, and every other type as JSON ([`Json`], which maps an absent
/// part to `null`). The DSL's default codec: a `String` key written by any Kafka client
/// decodes, and the key bytes Parsley writes hash to the partition other clients expect.
#[derive(Debug, Clone, Copy, Default)]
pub struct Auto;

/// What [`Auto`] does with a type.
enum AutoKind {
    Text,
    Raw,
    OptionalText,
    OptionalRaw,
    Json,
}

fn auto_kind<T: 'static>() -> AutoKind {
    use std::any::TypeId;
    let t = TypeId::of::<T>();
    if t == TypeId::of::<String>() {
        AutoKind::Text
    } else if t == TypeId::of::<Vec<u8>>() {
        AutoKind::Raw
    } else if t == TypeId::of::<Option<String>>() {
        AutoKind::OptionalText
    } else if t == TypeId::of::<Option<Vec<u8>>>() {
        AutoKind::OptionalRaw
    } else {
        AutoKind::Json
    }
}

/// `value` as a `T`, when `T` is its type (checked by [`auto_kind`] before the call).
fn cast<T: 'static, U: 'static>(value: U) -> Result<T, CodecError> {
    let boxed: Box<dyn std::any::Any> = Box::new(value);
    boxed
        .downcast::<T>()
        .map(|b| *b)
        .map_err(|_| CodecError::Absent)
}

impl<T: Serialize + DeserializeOwned + 'static> Codec<T> for Auto {
    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        let any = value as &dyn std::any::Any;
        if let Some(s) = any.downcast_ref::<String>() {
            Ok(s.as_bytes().to_vec())
        } else if let Some(b) = any.downcast_ref::<Vec<u8>>() {
            Ok(b.clone())
        } else if let Some(s) = any.downcast_ref::<Option<String>>() {
            s.as_ref()
                .map(|s| s.as_bytes().to_vec())
                .ok_or(CodecError::Absent)
        } else if let Some(b) = any.downcast_ref::<Option<Vec<u8>>>() {
            b.clone().ok_or(CodecError::Absent)
        } else {
            Json.encode(value)
        }
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, CodecError> {
        match auto_kind::<T>() {
            AutoKind::Text => cast(Utf8.decode(bytes)?),
            AutoKind::Raw => cast(bytes.to_vec()),
            AutoKind::OptionalText => cast(Some(Utf8.decode(bytes)?)),
            AutoKind::OptionalRaw => cast(Some(bytes.to_vec())),
            AutoKind::Json => Json.decode(bytes),
        }
    }

    fn encode_owned(&self, value: T) -> Result<Vec<u8>, CodecError> {
        match auto_kind::<T>() {
            AutoKind::Text => Ok(cast::<String, T>(value)?.into_bytes()),
            AutoKind::Raw => cast::<Vec<u8>, T>(value),
            _ => self.encode(&value),
        }
    }

    fn decode_owned(&self, bytes: Vec<u8>) -> Result<T, CodecError> {
        match auto_kind::<T>() {
            AutoKind::Text => cast(Utf8.decode_owned(bytes)?),
            AutoKind::Raw => cast(bytes),
            AutoKind::OptionalText => cast(Some(Utf8.decode_owned(bytes)?)),
            AutoKind::OptionalRaw => cast(Some(bytes)),
            AutoKind::Json => Json.decode(&bytes),
        }
    }

    fn decode_absent(&self) -> Result<T, CodecError> {
        match auto_kind::<T>() {
            AutoKind::Text | AutoKind::Raw => Err(CodecError::Absent),
            AutoKind::OptionalText => cast(None::<String>),
            AutoKind::OptionalRaw => cast(None::<Vec<u8>>),
            AutoKind::Json => Json.decode_absent(),
        }
    }

    fn encode_part(&self, value: T) -> Result<Option<Vec<u8>>, CodecError> {
        match auto_kind::<T>() {
            AutoKind::Text | AutoKind::Raw => self.encode_owned(value).map(Some),
            AutoKind::OptionalText => Ok(cast::<Option<String>, T>(value)?.map(String::into_bytes)),
            AutoKind::OptionalRaw => cast::<Option<Vec<u8>>, T>(value),
            AutoKind::Json => Json.encode_part(value),
        }
    }
}

/// Any codec, with `None` standing for an absent part (module docs): `Some(v)` is `v` through
/// the inner codec, `None` is a record without a key or a tombstone's value.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nullable<C>(pub C);

impl<T, C: Codec<T>> Codec<Option<T>> for Nullable<C> {
    /// # Errors
    /// [`CodecError::Absent`] for `None`, which has no bytes (an emission's `None` is written
    /// as an absent part by [`Codec::encode_part`]).
    fn encode(&self, value: &Option<T>) -> Result<Vec<u8>, CodecError> {
        match value {
            Some(v) => self.0.encode(v),
            None => Err(CodecError::Absent),
        }
    }

    fn decode(&self, bytes: &[u8]) -> Result<Option<T>, CodecError> {
        self.0.decode(bytes).map(Some)
    }

    fn encode_owned(&self, value: Option<T>) -> Result<Vec<u8>, CodecError> {
        match value {
            Some(v) => self.0.encode_owned(v),
            None => Err(CodecError::Absent),
        }
    }

    fn decode_owned(&self, bytes: Vec<u8>) -> Result<Option<T>, CodecError> {
        self.0.decode_owned(bytes).map(Some)
    }

    fn decode_absent(&self) -> Result<Option<T>, CodecError> {
        Ok(None)
    }

    fn encode_part(&self, value: Option<T>) -> Result<Option<Vec<u8>>, CodecError> {
        match value {
            Some(v) => self.0.encode_part(v),
            None => Ok(None),
        }
    }
}

/// Bincode 2 (standard configuration: varint integers, little endian) via serde.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bincode;

impl<T: Serialize + DeserializeOwned> Codec<T> for Bincode {
    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        Ok(bincode::serde::encode_to_vec(
            value,
            bincode::config::standard(),
        )?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, CodecError> {
        let (value, read) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())?;
        if read != bytes.len() {
            return Err(CodecError::TrailingBytes(bytes.len() - read));
        }
        Ok(value)
    }
}

/// A `String` as its UTF-8 bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Utf8;

impl Codec<String> for Utf8 {
    fn encode(&self, value: &String) -> Result<Vec<u8>, CodecError> {
        Ok(value.as_bytes().to_vec())
    }

    fn decode(&self, bytes: &[u8]) -> Result<String, CodecError> {
        Ok(String::from_utf8(bytes.to_vec())?)
    }

    fn encode_owned(&self, value: String) -> Result<Vec<u8>, CodecError> {
        Ok(value.into_bytes())
    }

    fn decode_owned(&self, bytes: Vec<u8>) -> Result<String, CodecError> {
        Ok(String::from_utf8(bytes)?)
    }
}

/// Bytes as they are (`Vec<u8>`): the identity codec, for stages that route or copy records
/// without reading them. With [`Codec::encode_owned`] and [`Codec::decode_owned`] a delivered
/// value reaches the emission without a copy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bytes;

impl Codec<Vec<u8>> for Bytes {
    fn encode(&self, value: &Vec<u8>) -> Result<Vec<u8>, CodecError> {
        Ok(value.clone())
    }

    fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, CodecError> {
        Ok(bytes.to_vec())
    }

    fn encode_owned(&self, value: Vec<u8>) -> Result<Vec<u8>, CodecError> {
        Ok(value)
    }

    fn decode_owned(&self, bytes: Vec<u8>) -> Result<Vec<u8>, CodecError> {
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    enum Event {
        InStock { qty: u32 },
        Sold { qty: u32 },
    }

    #[test]
    fn every_codec_round_trips() {
        let e = Event::Sold { qty: 3 };
        let j: Event = Json.decode(&Json.encode(&e).unwrap()).unwrap();
        assert_eq!(j, e);
        let b: Event = Bincode.decode(&Bincode.encode(&e).unwrap()).unwrap();
        assert_eq!(b, e);
        let s = "sku-1".to_string();
        assert_eq!(Utf8.encode(&s).unwrap(), b"sku-1");
        assert_eq!(Utf8.decode(b"sku-1").unwrap(), s);
        assert_eq!(Utf8.encode_owned(s.clone()).unwrap(), b"sku-1");
        assert_eq!(Utf8.decode_owned(b"sku-1".to_vec()).unwrap(), s);
        let raw = vec![0, 159, 146, 150];
        assert_eq!(Bytes.decode(&Bytes.encode(&raw).unwrap()).unwrap(), raw);
        assert_eq!(Bytes.decode_owned(raw.clone()).unwrap(), raw);
        assert_eq!(Bytes.encode_owned(raw.clone()).unwrap(), raw);
        // The defaults go through the borrowing methods.
        let owned: Event = Json.decode_owned(Json.encode_owned(e).unwrap()).unwrap();
        assert_eq!(owned, Event::Sold { qty: 3 });
    }

    #[test]
    fn absent_parts_are_json_null_or_a_nullable_none() {
        // Json: an Option (or unit) stands for an absent part both ways; a struct does not.
        let none: Option<String> = Json.decode_absent().unwrap();
        assert_eq!(none, None);
        assert_eq!(Json.encode_part(None::<String>).unwrap(), None);
        assert_eq!(
            Json.encode_part(Some("k".to_string())).unwrap(),
            Some(b"\"k\"".to_vec())
        );
        assert_eq!(
            Json.encode_part("null".to_string()).unwrap(),
            Some(b"\"null\"".to_vec())
        );
        assert!(matches!(
            <Json as Codec<Event>>::decode_absent(&Json),
            Err(CodecError::Absent)
        ));
        // Other codecs: only through Nullable.
        assert!(matches!(Utf8.decode_absent(), Err(CodecError::Absent)));
        let n = Nullable(Utf8);
        assert_eq!(n.decode_absent().unwrap(), None);
        assert_eq!(n.decode(b"k").unwrap(), Some("k".to_string()));
        assert_eq!(n.encode_part(None).unwrap(), None);
        assert_eq!(
            n.encode_part(Some("k".into())).unwrap(),
            Some(b"k".to_vec())
        );
        assert!(matches!(n.encode(&None), Err(CodecError::Absent)));
        assert_eq!(Utf8.encode_part("k".into()).unwrap(), Some(b"k".to_vec()));
    }

    #[test]
    fn auto_writes_strings_and_bytes_as_they_are_and_the_rest_as_json() {
        assert_eq!(Auto.encode(&"o-1".to_string()).unwrap(), b"o-1");
        let s: String = Auto.decode(b"o-1").unwrap();
        assert_eq!(s, "o-1");
        let s: String = Auto.decode_owned(b"o-2".to_vec()).unwrap();
        assert_eq!(s, "o-2");
        assert_eq!(Auto.encode_owned("o-3".to_string()).unwrap(), b"o-3");
        assert!(matches!(
            <Auto as Codec<String>>::decode_absent(&Auto),
            Err(CodecError::Absent)
        ));
        assert!(<Auto as Codec<String>>::decode(&Auto, &[0xff]).is_err());
        assert_eq!(Auto.encode(&vec![0u8, 255]).unwrap(), [0, 255]);
        let b: Vec<u8> = Auto.decode_owned(vec![1, 2]).unwrap();
        assert_eq!(b, [1, 2]);
        let none: Option<String> = Auto.decode_absent().unwrap();
        assert_eq!(none, None);
        let some: Option<String> = Auto.decode(b"k").unwrap();
        assert_eq!(some.as_deref(), Some("k"));
        assert_eq!(Auto.encode_part(None::<String>).unwrap(), None);
        assert_eq!(
            Auto.encode_part(Some("k".to_string())).unwrap(),
            Some(b"k".to_vec())
        );
        let raw: Option<Vec<u8>> = Auto.decode(b"\x01").unwrap();
        assert_eq!(raw, Some(vec![1]));
        assert_eq!(Auto.encode_part(None::<Vec<u8>>).unwrap(), None);
        // Anything else is JSON, absent parts included.
        let e = Event::Sold { qty: 3 };
        assert_eq!(Auto.encode(&e).unwrap(), Json.encode(&e).unwrap());
        let back: Event = Auto.decode_owned(Auto.encode_owned(e).unwrap()).unwrap();
        assert_eq!(back, Event::Sold { qty: 3 });
        assert_eq!(Auto.encode_part(7i64).unwrap(), Some(b"7".to_vec()));
        let unit: () = Auto.decode_absent().unwrap();
        assert_eq!(unit, ());
        assert!(<Auto as Codec<Event>>::decode(&Auto, b"{nope").is_err());
    }

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        assert!(<Json as Codec<Event>>::decode(&Json, b"{nope").is_err());
        assert!(<Bincode as Codec<Event>>::decode(&Bincode, &[9, 9, 9]).is_err());
        let one = Bincode.encode(&Event::InStock { qty: 1 }).unwrap();
        let two = [one.clone(), vec![0]].concat();
        assert!(matches!(
            <Bincode as Codec<Event>>::decode(&Bincode, &two),
            Err(CodecError::TrailingBytes(1))
        ));
        assert!(Utf8.decode(&[0xff]).is_err());
        assert!(Utf8.decode_owned(vec![0xff]).is_err());
    }
}
