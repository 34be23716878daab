//! [`AvroCodec`]: serde values as Avro binary in the Confluent wire format.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use parsley_stage::{Codec, CodecError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::Target;
use crate::{Part, RegistryClient, Schema, SchemaError, SchemaKind, SubjectNameStrategy, wire};

/// A `T` (serde) as an Avro datum of the codec's schema, framed in the wire format.
///
/// - **Encode** registers the codec's schema (its writer schema) under the subject of the
///   strategy once (or only looks it up, [`AvroCodec::lookup_only`]), then writes the header
///   and the datum.
/// - **Decode** reads the schema id, fetches that writer schema once per id, and resolves it
///   against the codec's schema as the reader's (Avro schema resolution): a record written
///   with an older schema reads into a newer one that added a field with a default, and a
///   field the reader dropped is skipped.
///
/// Errors are [`SchemaError`]s in [`CodecError::External`]. Decoding never panics on any
/// bytes.
pub struct AvroCodec<T> {
    schema: apache_avro::Schema,
    target: Target,
    writers: Mutex<HashMap<u32, Arc<apache_avro::Schema>>>,
    _type: PhantomData<fn(T) -> T>,
}

impl<T> std::fmt::Debug for AvroCodec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AvroCodec")
            .field("subject", &self.target.subject)
            .finish_non_exhaustive()
    }
}

impl<T> AvroCodec<T> {
    /// A codec of `topic`'s `part` with the Avro `schema` (JSON text), registering it under
    /// [`SubjectNameStrategy::TopicName`]'s subject unless [`AvroCodec::with_strategy`] says
    /// otherwise. Asks the registry nothing yet.
    ///
    /// # Errors
    /// [`SchemaError::InvalidSchema`] when `schema` does not parse.
    pub fn new(
        registry: Arc<RegistryClient>,
        topic: &str,
        part: Part,
        schema: &str,
    ) -> Result<AvroCodec<T>, SchemaError> {
        let parsed =
            apache_avro::Schema::parse_str(schema).map_err(|e| SchemaError::InvalidSchema {
                id: None,
                reason: e.to_string(),
            })?;
        let record = parsed.name().map(|n| n.fullname(None));
        let target = Target::new(
            registry,
            topic,
            part,
            record,
            Schema {
                kind: SchemaKind::Avro,
                text: schema.to_string(),
            },
        )?;
        Ok(AvroCodec {
            schema: parsed,
            target,
            writers: Mutex::default(),
            _type: PhantomData,
        })
    }

    /// The same, naming the subject by `strategy` (with the schema's full name as the record
    /// name).
    ///
    /// # Errors
    /// [`SchemaError::NoRecordName`] when `strategy` needs a record name and the schema is
    /// not a named type.
    pub fn with_strategy(mut self, strategy: SubjectNameStrategy) -> Result<Self, SchemaError> {
        self.target.set_strategy(strategy)?;
        Ok(self)
    }

    /// The same, never registering: encode finds the schema's id with a lookup under the
    /// subject, and fails when the subject does not hold it (Confluent's
    /// `auto.register.schemas=false`).
    pub fn lookup_only(mut self) -> Self {
        self.target.register = false;
        self
    }

    /// The subject the codec registers its schema under.
    pub fn subject(&self) -> &str {
        &self.target.subject
    }

    /// The parsed writer schema of `id`, fetched once.
    fn writer(&self, id: u32) -> Result<Arc<apache_avro::Schema>, SchemaError> {
        if let Some(s) = crate::codec::lock(&self.writers).get(&id) {
            return Ok(Arc::clone(s));
        }
        let schema = self.target.registry.schema(id)?;
        if schema.kind != SchemaKind::Avro {
            return Err(SchemaError::WrongSchemaType {
                id,
                expected: "AVRO",
                found: schema.kind.to_string(),
            });
        }
        let parsed = apache_avro::Schema::parse_str(&schema.text).map_err(|e| {
            SchemaError::InvalidSchema {
                id: Some(id),
                reason: e.to_string(),
            }
        })?;
        let parsed = Arc::new(parsed);
        crate::codec::lock(&self.writers).insert(id, Arc::clone(&parsed));
        Ok(parsed)
    }
}

impl<T: Serialize + DeserializeOwned> Codec<T> for AvroCodec<T> {
    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        let id = self.target.id()?;
        let writer = GenericDatumWriter::builder(&self.schema)
            .build()
            .map_err(|e| SchemaError::Encode(e.to_string()))?;
        let datum = writer
            .write_ser_to_vec(value)
            .map_err(|e| SchemaError::Encode(e.to_string()))?;
        let mut out = Vec::with_capacity(wire::HEADER_LEN + datum.len());
        out.extend_from_slice(&wire::header(id));
        out.extend_from_slice(&datum);
        Ok(out)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, CodecError> {
        let (id, mut payload) = wire::split(bytes)?;
        let writer = self.writer(id)?;
        let bad = |reason: String| SchemaError::Payload { id, reason };
        // The decoder is not ours: a panic on hostile bytes is turned into an error here, so
        // that decoding never panics whatever the library does.
        let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            GenericDatumReader::builder(&writer)
                .reader_schema(&self.schema)
                .build()
                .and_then(|reader| reader.read_value(&mut payload))
        }))
        .map_err(|_| bad("the Avro decoder panicked".into()))?
        .map_err(|e| bad(e.to_string()))?;
        if !payload.is_empty() {
            return Err(bad(format!("{} byte(s) after the datum", payload.len())).into());
        }
        Ok(apache_avro::from_value::<T>(&value).map_err(|e| bad(e.to_string()))?)
    }
}
