//! The errors of the registry client and of the codecs.

use parsley_stage::CodecError;

/// What went wrong reading or writing a record through a schema registry. A codec returns it
/// inside [`CodecError::External`]; [`SchemaError::of`] gives it back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The first byte is not the wire format's magic byte 0.
    #[error("wrong magic byte {found:#04x}: the Confluent wire format starts with 0x00")]
    WrongMagicByte {
        /// The byte found.
        found: u8,
    },
    /// The bytes end before a part of the wire format does.
    #[error("short buffer: {len} byte(s), {what} needs {needed}")]
    ShortBuffer {
        /// How many bytes there are.
        len: usize,
        /// How many the part needed.
        needed: usize,
        /// The part (the header, a message index).
        what: &'static str,
    },
    /// Protobuf message indexes that are not a valid list of varints.
    #[error("bad message indexes at byte {at}: {reason}")]
    BadMessageIndexes {
        /// The offset of the bad varint in the record's bytes.
        at: usize,
        /// What is wrong.
        reason: String,
    },
    /// The registry has no schema with this id.
    #[error("unknown schema id {0}: the registry has no such schema")]
    UnknownSchemaId(u32),
    /// The schema of this id is of another type than the codec reads.
    #[error("schema id {id} is a {found} schema, the codec reads {expected}")]
    WrongSchemaType {
        /// The schema id.
        id: u32,
        /// The codec's type.
        expected: &'static str,
        /// The registry's type.
        found: String,
    },
    /// A schema (the codec's or one fetched by id) that its format's parser rejects.
    #[error("invalid schema{}: {reason}", id.map(|i| format!(" (id {i})")).unwrap_or_default())]
    InvalidSchema {
        /// The id, when the schema came from the registry.
        id: Option<u32>,
        /// What the parser said.
        reason: String,
    },
    /// The schema has no record name, which the subject name strategy needs.
    #[error("the subject name strategy needs a record name and the schema has none")]
    NoRecordName,
    /// The payload does not decode with the writer's schema (or into the codec's type).
    #[error("payload of schema id {id} does not match: {reason}")]
    Payload {
        /// The writer's schema id.
        id: u32,
        /// What the decoder said.
        reason: String,
    },
    /// The value cannot be written with the codec's schema.
    #[error("the value does not match the schema: {0}")]
    Encode(String),
    /// The registry answered with an error.
    #[error("registry {url}: HTTP {status}{}: {message}", code.map(|c| format!(", error code {c}")).unwrap_or_default())]
    Registry {
        /// The request's URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The registry's `error_code`, when it gave one.
        code: Option<u32>,
        /// Its message (or the body).
        message: String,
    },
    /// The registry could not be reached, or its answer is not what the API gives.
    #[error("registry {url}: {reason}")]
    Transport {
        /// The request's URL.
        url: String,
        /// What failed.
        reason: String,
    },
}

impl SchemaError {
    /// The [`SchemaError`] inside a codec's error, if it is one.
    pub fn of(error: &CodecError) -> Option<&SchemaError> {
        match error {
            CodecError::External(e) => e.downcast_ref(),
            _ => None,
        }
    }
}

impl From<SchemaError> for CodecError {
    fn from(e: SchemaError) -> CodecError {
        CodecError::External(Box::new(e))
    }
}
