//! Schema-registry codecs for Parsley: Avro, Protobuf and JSON Schema records in the
//! Confluent wire format, their schemas registered in a registry with a Confluent-compatible
//! REST API (Confluent Schema Registry, Apicurio Registry's `/apis/ccompat/v7`, Karapace, or
//! the checkout's local registry, `cargo kafka registry up`).
//!
//! Each codec is a [`parsley_stage::Codec`] for one topic's key or value, given to the DSL
//! through `Consumed::with` and `Produced::with`:
//!
//! - [`AvroCodec`]: serde values as Avro binary (`apache-avro`), with schema resolution from
//!   the writer's schema to the codec's;
//! - [`ProtobufCodec`]: `prost` messages, with the message indexes of the wire format;
//! - [`JsonSchemaCodec`]: serde values as JSON, under a registered JSON Schema.
//!
//! The wire format ([`wire`]): byte 0 is the magic byte `0`, bytes 1–4 the schema id
//! (big-endian), then the payload (for Protobuf, after the message indexes). A codec writes its
//! own schema's id, registered under the subject its [`SubjectNameStrategy`] names; it reads
//! any id, fetching the writer's schema from the registry ([`RegistryClient`], which caches
//! both directions).
//!
//! Invariants: decoding never panics, whatever the bytes; every failure is a [`SchemaError`]
//! inside [`parsley_stage::CodecError::External`] ([`SchemaError::of`] gives it back), so the
//! stage's bad-record policy sees which byte, id or field was wrong. The crate is pure Rust
//! and blocking (a registry request happens at most once per schema and per id read); it does
//! not depend on a Kafka client.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use parsley_registry::{AvroCodec, Part, RegistryClient};
//! use parsley_stage::Codec;
//!
//! #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
//! struct Order {
//!     id: String,
//!     cents: i64,
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Arc::new(RegistryClient::new("http://127.0.0.1:8081"));
//! let schema = r#"{"type": "record", "name": "Order", "namespace": "shop",
//!     "fields": [{"name": "id", "type": "string"}, {"name": "cents", "type": "long"}]}"#;
//! let codec = AvroCodec::<Order>::new(registry, "orders", Part::Value, schema)?;
//! assert_eq!(codec.subject(), "orders-value");
//! let order = Order { id: "o-1".into(), cents: 1250 };
//! let bytes = codec.encode(&order)?; // registers the schema at the first call
//! assert_eq!(bytes[0], 0);
//! assert_eq!(codec.decode(&bytes)?, order);
//! # Ok(())
//! # }
//! ```
#![doc(test(attr(deny(warnings))))]
#![forbid(unsafe_code)]

mod avro;
mod client;
mod codec;
mod error;
mod json;
mod protobuf;
mod subject;
pub mod wire;

pub use avro::AvroCodec;
pub use client::{RegistryClient, Schema, SchemaKind};
pub use error::SchemaError;
pub use json::JsonSchemaCodec;
pub use protobuf::{ProtobufCodec, message_indexes};
pub use subject::{Part, SubjectNameStrategy};
