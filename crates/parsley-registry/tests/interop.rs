//! The codecs against Confluent's own serializers (Python's `confluent-kafka`, with its
//! schema registry client, `AvroSerializer` and `JSONSerializer`), through one registry: each
//! reads what the other wrote. Ignored by `cargo test`: `cargo xtask registry` runs it with
//! `$PARSLEY_PYTHON`, a Python that has `confluent-kafka[avro,json,schemaregistry]`.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use parsley_registry::{AvroCodec, JsonSchemaCodec, Part, RegistryClient};
use parsley_stage::Codec;
use serde::{Deserialize, Serialize};

const ORDER_V1: &str = r#"{"type": "record", "name": "Order", "namespace": "shop",
  "fields": [{"name": "id", "type": "string"}, {"name": "cents", "type": "long"}]}"#;
const ORDER_V2: &str = r#"{"type": "record", "name": "Order", "namespace": "shop",
  "fields": [{"name": "id", "type": "string"}, {"name": "cents", "type": "long"},
             {"name": "currency", "type": "string", "default": "EUR"}]}"#;
const ORDER_JSON: &str = r#"{"$schema": "http://json-schema.org/draft-07/schema#",
  "title": "shop.Order", "type": "object",
  "properties": {"id": {"type": "string"}, "cents": {"type": "integer"}},
  "required": ["id", "cents"]}"#;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct OrderV1 {
    id: String,
    cents: i64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct OrderV2 {
    id: String,
    cents: i64,
    currency: String,
}

#[test]
#[ignore = "needs $PARSLEY_PYTHON with confluent-kafka's serializers: cargo xtask registry"]
fn confluent_serializers_agree_with_the_codecs() {
    let python = std::env::var("PARSLEY_PYTHON").expect("$PARSLEY_PYTHON: cargo xtask registry");
    let local;
    let url = match parsley_broker::registry::url() {
        Some(url) => url,
        None => {
            local = parsley_broker::registry::InProcess::start().unwrap();
            local.url().to_string()
        }
    };
    let registry = Arc::new(RegistryClient::new(&url));
    let topic = format!("interop-{}", std::process::id());
    let dir = std::env::temp_dir().join(&topic);
    std::fs::create_dir_all(&dir).unwrap();

    let avro_v1 =
        AvroCodec::<OrderV1>::new(registry.clone(), &topic, Part::Value, ORDER_V1).unwrap();
    let json =
        JsonSchemaCodec::<OrderV1>::new(registry.clone(), &topic, Part::Key, ORDER_JSON).unwrap();
    let write = |name: &str, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).unwrap();
    write(
        "rust-avro.bin",
        avro_v1
            .encode(&OrderV1 {
                id: "rust-1".into(),
                cents: 1250,
            })
            .unwrap(),
    );
    write(
        "rust-json.bin",
        json.encode(&OrderV1 {
            id: "rust-2".into(),
            cents: -7,
        })
        .unwrap(),
    );

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/confluent_interop.py");
    let status = Command::new(&python)
        .arg(&script)
        .args([url.as_str(), topic.as_str()])
        .arg(&dir)
        .status()
        .expect("running Python");
    assert!(status.success(), "Confluent's side failed: {status}");

    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let avro_v2 =
        AvroCodec::<OrderV2>::new(registry.clone(), &topic, Part::Value, ORDER_V2).unwrap();
    assert_eq!(
        avro_v2.decode(&read("python-avro.bin")).unwrap(),
        OrderV2 {
            id: "python-1".into(),
            cents: 4200,
            currency: "EUR".into()
        }
    );
    assert_eq!(
        json.decode(&read("python-json.bin")).unwrap(),
        OrderV1 {
            id: "python-2".into(),
            cents: 3
        }
    );
    // Both sides registered under the topic's subjects.
    let subjects = registry.subjects().unwrap();
    assert!(subjects.contains(&format!("{topic}-value")), "{subjects:?}");
    assert!(subjects.contains(&format!("{topic}-key")), "{subjects:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
