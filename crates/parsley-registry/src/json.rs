//! [`JsonSchemaCodec`]: serde values as JSON under a registered JSON Schema.

use std::marker::PhantomData;
use std::sync::Arc;

use parsley_stage::{Codec, CodecError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::Target;
use crate::{Part, RegistryClient, Schema, SchemaError, SchemaKind, SubjectNameStrategy, wire};

/// A `T` (serde) as JSON text after the wire format's header, its JSON Schema registered.
///
/// - **Encode** registers the codec's schema under the strategy's subject once (the record
///   name of [`SubjectNameStrategy::RecordName`] is the schema's `title`), then writes the
///   header and `serde_json`'s bytes of the value.
/// - **Decode** reads the schema id, checks that the registry has a JSON Schema of that id
///   (fetched once per id), and parses the JSON into `T`.
///
/// The payload is not validated against the schema, neither on encode nor on decode: `T`'s
/// serde shape is the contract (a payload that does not fit `T` is an error).
pub struct JsonSchemaCodec<T> {
    target: Target,
    _type: PhantomData<fn(T) -> T>,
}

impl<T> std::fmt::Debug for JsonSchemaCodec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonSchemaCodec")
            .field("subject", &self.target.subject)
            .finish_non_exhaustive()
    }
}

impl<T> JsonSchemaCodec<T> {
    /// A codec of `topic`'s `part` with the JSON Schema `schema` (its text), under
    /// [`SubjectNameStrategy::TopicName`]'s subject. Asks the registry nothing yet.
    ///
    /// # Errors
    /// [`SchemaError::InvalidSchema`] when `schema` is not a JSON object or boolean.
    pub fn new(
        registry: Arc<RegistryClient>,
        topic: &str,
        part: Part,
        schema: &str,
    ) -> Result<JsonSchemaCodec<T>, SchemaError> {
        let parsed: serde_json::Value =
            serde_json::from_str(schema).map_err(|e| SchemaError::InvalidSchema {
                id: None,
                reason: e.to_string(),
            })?;
        if !(parsed.is_object() || parsed.is_boolean()) {
            return Err(SchemaError::InvalidSchema {
                id: None,
                reason: "a JSON Schema is an object or a boolean".into(),
            });
        }
        let record = parsed
            .get("title")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        let target = Target::new(
            registry,
            topic,
            part,
            record,
            Schema {
                kind: SchemaKind::Json,
                text: schema.to_string(),
            },
        )?;
        Ok(JsonSchemaCodec {
            target,
            _type: PhantomData,
        })
    }

    /// The same, naming the subject by `strategy`.
    ///
    /// # Errors
    /// [`SchemaError::NoRecordName`] when `strategy` needs a record name and the schema has
    /// no `title`.
    pub fn with_strategy(mut self, strategy: SubjectNameStrategy) -> Result<Self, SchemaError> {
        self.target.set_strategy(strategy)?;
        Ok(self)
    }

    /// The same, never registering (see [`crate::AvroCodec::lookup_only`]).
    pub fn lookup_only(mut self) -> Self {
        self.target.register = false;
        self
    }

    /// The subject the codec registers its schema under.
    pub fn subject(&self) -> &str {
        &self.target.subject
    }
}

impl<T: Serialize + DeserializeOwned> Codec<T> for JsonSchemaCodec<T> {
    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        let id = self.target.id()?;
        let mut out = wire::header(id).to_vec();
        serde_json::to_writer(&mut out, value).map_err(|e| SchemaError::Encode(e.to_string()))?;
        Ok(out)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, CodecError> {
        let (id, payload) = wire::split(bytes)?;
        self.target.check_writer(id, SchemaKind::Json)?;
        Ok(
            serde_json::from_slice(payload).map_err(|e| SchemaError::Payload {
                id,
                reason: e.to_string(),
            })?,
        )
    }
}
