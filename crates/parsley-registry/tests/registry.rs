//! The codecs against a registry over HTTP: `$PARSLEY_REGISTRY_URL` (any Confluent-compatible
//! registry), else the one `cargo kafka registry up` recorded, else a local registry in this
//! process. Each test uses topics of its own, so they share one registry.

use std::sync::{Arc, OnceLock};

use parsley_registry::{
    AvroCodec, JsonSchemaCodec, Part, ProtobufCodec, RegistryClient, SchemaError,
    SubjectNameStrategy,
};
use parsley_stage::{Codec, CodecError, Utf8};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

fn registry_url() -> String {
    static LOCAL: OnceLock<parsley_broker::registry::InProcess> = OnceLock::new();
    parsley_broker::registry::url().unwrap_or_else(|| {
        LOCAL
            .get_or_init(|| parsley_broker::registry::InProcess::start().unwrap())
            .url()
            .to_string()
    })
}

fn client() -> Arc<RegistryClient> {
    Arc::new(RegistryClient::new(&registry_url()))
}

/// A topic name of this test run: a shared registry keeps the subjects of earlier runs.
fn topic(name: &str) -> String {
    static RUN: OnceLock<String> = OnceLock::new();
    let run = RUN.get_or_init(|| format!("{:x}", std::process::id() ^ now_nanos()));
    format!("{name}-{run}")
}

fn now_nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}

const ORDER_V1: &str = r#"{"type": "record", "name": "Order", "namespace": "shop",
  "fields": [{"name": "id", "type": "string"}, {"name": "cents", "type": "long"}]}"#;

/// V1 with a field added with a default: a backward-compatible evolution.
const ORDER_V2: &str = r#"{"type": "record", "name": "Order", "namespace": "shop",
  "fields": [{"name": "id", "type": "string"}, {"name": "cents", "type": "long"},
             {"name": "currency", "type": "string", "default": "EUR"}]}"#;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct OrderV1 {
    id: String,
    cents: i64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct OrderV2 {
    id: String,
    cents: i64,
    currency: String,
}

fn schema_error(e: CodecError) -> SchemaError {
    match e {
        CodecError::External(e) => *e.downcast::<SchemaError>().expect("a SchemaError"),
        other => panic!("not a registry codec's error: {other}"),
    }
}

#[test]
fn avro_round_trips_in_the_wire_format_under_the_topic_subject() {
    let registry = client();
    let topic = topic("orders");
    let codec = AvroCodec::<OrderV1>::new(registry.clone(), &topic, Part::Value, ORDER_V1).unwrap();
    assert_eq!(codec.subject(), format!("{topic}-value"));
    let order = OrderV1 {
        id: "o-1".into(),
        cents: 1250,
    };
    let bytes = codec.encode(&order).unwrap();
    let id = registry
        .register(&format!("{topic}-value"), &avro(ORDER_V1))
        .unwrap();
    assert_eq!(bytes[0], 0, "magic byte");
    assert_eq!(bytes[1..5], id.to_be_bytes(), "schema id, big-endian");
    // Avro binary: the string as zig-zag length 3 and its bytes, the long zig-zag varint.
    assert_eq!(bytes[5..], [6, b'o', b'-', b'1', 0xc4, 0x13]);
    assert_eq!(codec.decode(&bytes).unwrap(), order);
    assert_eq!(registry.versions(&format!("{topic}-value")).unwrap(), [1]);
    // A second codec (another process, say) reads it with the id alone.
    let reader = AvroCodec::<OrderV1>::new(client(), &topic, Part::Value, ORDER_V1).unwrap();
    assert_eq!(reader.decode(&bytes).unwrap(), order);
}

fn avro(text: &str) -> parsley_registry::Schema {
    parsley_registry::Schema {
        kind: parsley_registry::SchemaKind::Avro,
        text: text.to_string(),
    }
}

#[test]
fn avro_evolution_a_new_reader_reads_old_records_and_an_old_reader_new_ones() {
    let topic = topic("evolving");
    let old = AvroCodec::<OrderV1>::new(client(), &topic, Part::Value, ORDER_V1).unwrap();
    let new = AvroCodec::<OrderV2>::new(client(), &topic, Part::Value, ORDER_V2).unwrap();
    let old_bytes = old
        .encode(&OrderV1 {
            id: "a".into(),
            cents: 1,
        })
        .unwrap();
    let new_bytes = new
        .encode(&OrderV2 {
            id: "b".into(),
            cents: 2,
            currency: "USD".into(),
        })
        .unwrap();
    assert_ne!(old_bytes[1..5], new_bytes[1..5], "two schemas, two ids");
    assert_eq!(
        new.decode(&old_bytes).unwrap(),
        OrderV2 {
            id: "a".into(),
            cents: 1,
            currency: "EUR".into(),
        },
        "the added field takes its default"
    );
    assert_eq!(
        old.decode(&new_bytes).unwrap(),
        OrderV1 {
            id: "b".into(),
            cents: 2
        },
        "the field the old reader does not know is skipped"
    );
    assert_eq!(
        client().versions(&format!("{topic}-value")).unwrap(),
        [1, 2]
    );
}

#[test]
fn each_strategy_registers_under_its_subject() {
    let registry = client();
    let topic = topic("strategies");
    let order = OrderV1 {
        id: "x".into(),
        cents: 7,
    };
    // Avro under a record name of its own, so that the subjects of this run are new.
    let schema = ORDER_V1.replace("\"shop\"", &format!("\"shop{}\"", topic.replace('-', "_")));
    let record = format!("shop{}.Order", topic.replace('-', "_"));
    let by_record = AvroCodec::<OrderV1>::new(registry.clone(), &topic, Part::Value, &schema)
        .unwrap()
        .with_strategy(SubjectNameStrategy::RecordName)
        .unwrap();
    assert_eq!(by_record.subject(), record);
    by_record.encode(&order).unwrap();
    let by_topic_record = AvroCodec::<OrderV1>::new(registry.clone(), &topic, Part::Key, &schema)
        .unwrap()
        .with_strategy(SubjectNameStrategy::TopicRecordName)
        .unwrap();
    assert_eq!(by_topic_record.subject(), format!("{topic}-{record}"));
    by_topic_record.encode(&order).unwrap();
    let by_topic =
        JsonSchemaCodec::<OrderV1>::new(registry.clone(), &topic, Part::Key, JSON).unwrap();
    assert_eq!(by_topic.subject(), format!("{topic}-key"));
    by_topic.encode(&order).unwrap();
    let proto = ProtobufCodec::<Line>::new(
        registry.clone(),
        &topic,
        Part::Value,
        PROTO,
        "shop.Order.Line",
    )
    .unwrap()
    .with_strategy(SubjectNameStrategy::TopicRecordName)
    .unwrap();
    assert_eq!(proto.subject(), format!("{topic}-shop.Order.Line"));
    proto.encode(&Line::default()).unwrap();

    let subjects = registry.subjects().unwrap();
    for subject in [
        record.clone(),
        format!("{topic}-{record}"),
        format!("{topic}-key"),
        format!("{topic}-shop.Order.Line"),
    ] {
        assert!(subjects.contains(&subject), "{subject} in {subjects:?}");
    }
    // The same schema under two subjects has one id.
    let a = by_record.encode(&order).unwrap();
    let b = by_topic_record.encode(&order).unwrap();
    assert_eq!(a[1..5], b[1..5]);
    // A JSON Schema without a title has no record name.
    let untitled =
        JsonSchemaCodec::<OrderV1>::new(registry, &topic, Part::Value, r#"{"type": "object"}"#)
            .unwrap()
            .with_strategy(SubjectNameStrategy::RecordName);
    assert!(matches!(untitled, Err(SchemaError::NoRecordName)));
}

const JSON: &str = r#"{"$schema": "http://json-schema.org/draft-07/schema#", "title": "shop.Order",
  "type": "object", "properties": {"id": {"type": "string"}, "cents": {"type": "integer"}},
  "required": ["id", "cents"]}"#;

#[test]
fn json_schema_round_trips_with_its_schema_registered_as_json() {
    let registry = client();
    let topic = topic("json");
    let codec =
        JsonSchemaCodec::<OrderV1>::new(registry.clone(), &topic, Part::Value, JSON).unwrap();
    let order = OrderV1 {
        id: "j".into(),
        cents: -3,
    };
    let bytes = codec.encode(&order).unwrap();
    assert_eq!(&bytes[5..], br#"{"id":"j","cents":-3}"#);
    let id = u32::from_be_bytes(bytes[1..5].try_into().unwrap());
    let stored = registry.schema(id).unwrap();
    assert_eq!(stored.kind, parsley_registry::SchemaKind::Json);
    assert_eq!(stored.text, JSON);
    assert_eq!(codec.decode(&bytes).unwrap(), order);
    // Valid JSON of another shape is a payload error naming the id.
    let mut other = bytes[..5].to_vec();
    other.extend_from_slice(br#"{"id": 5}"#);
    assert!(matches!(
        schema_error(codec.decode(&other).unwrap_err()),
        SchemaError::Payload { id: i, .. } if i == id
    ));
}

const PROTO: &str = r#"
syntax = "proto3";
package shop;

message Order {
  string id = 1;
  int64 cents = 2;
  message Line { string sku = 1; int32 quantity = 2; }
  repeated Line lines = 3;
}
"#;

#[derive(Clone, PartialEq, prost::Message)]
struct Order {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(int64, tag = "2")]
    cents: i64,
    #[prost(message, repeated, tag = "3")]
    lines: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Line {
    #[prost(string, tag = "1")]
    sku: String,
    #[prost(int32, tag = "2")]
    quantity: i32,
}

#[test]
fn protobuf_round_trips_with_message_indexes() {
    let topic = topic("proto");
    let orders =
        ProtobufCodec::<Order>::new(client(), &topic, Part::Value, PROTO, "shop.Order").unwrap();
    assert_eq!(orders.message_indexes(), [0]);
    let order = Order {
        id: "p".into(),
        cents: 99,
        lines: vec![Line {
            sku: "apple".into(),
            quantity: 3,
        }],
    };
    let bytes = orders.encode(&order).unwrap();
    assert_eq!(bytes[5], 0, "[0] is the single byte 0");
    assert_eq!(&bytes[6..], prost::Message::encode_to_vec(&order));
    assert_eq!(orders.decode(&bytes).unwrap(), order);

    let lines =
        ProtobufCodec::<Line>::new(client(), &topic, Part::Key, PROTO, "shop.Order.Line").unwrap();
    assert_eq!(lines.message_indexes(), [0, 0]);
    let line = Line {
        sku: "pear".into(),
        quantity: 1,
    };
    let line_bytes = lines.encode(&line).unwrap();
    assert_eq!(line_bytes[5..8], [4, 0, 0], "count 2, indexes 0 and 0");
    assert_eq!(lines.decode(&line_bytes).unwrap(), line);
    // A record of another message of the same file is refused, not misread.
    let e = schema_error(lines.decode(&bytes).unwrap_err());
    assert!(
        matches!(&e, SchemaError::Payload { reason, .. } if reason.contains("shop.Order,")),
        "{e}"
    );
}

#[test]
fn bad_input_is_a_typed_error_naming_what_was_wrong() {
    let registry = client();
    let topic = topic("bad");
    let avro = AvroCodec::<OrderV1>::new(registry.clone(), &topic, Part::Value, ORDER_V1).unwrap();
    let json = JsonSchemaCodec::<OrderV1>::new(registry.clone(), &topic, Part::Key, JSON).unwrap();
    let good = avro
        .encode(&OrderV1 {
            id: "g".into(),
            cents: 1,
        })
        .unwrap();

    let e = schema_error(avro.decode(&[1, 0, 0, 0, 1, 2]).unwrap_err());
    assert!(matches!(e, SchemaError::WrongMagicByte { found: 1 }), "{e}");
    let e = schema_error(avro.decode(&[0, 0, 0]).unwrap_err());
    assert!(
        matches!(
            e,
            SchemaError::ShortBuffer {
                len: 3,
                needed: 5,
                ..
            }
        ),
        "{e}"
    );
    let e = schema_error(avro.decode(&[0, 0x7f, 0xff, 0xff, 0xf0, 2]).unwrap_err());
    assert!(
        matches!(e, SchemaError::UnknownSchemaId(0x7fff_fff0)),
        "{e}"
    );
    // The datum cut short, and a datum with a byte too many.
    let e = schema_error(avro.decode(&good[..good.len() - 1]).unwrap_err());
    assert!(matches!(e, SchemaError::Payload { .. }), "{e}");
    let mut long = good.clone();
    long.push(0);
    let e = schema_error(avro.decode(&long).unwrap_err());
    assert!(
        matches!(&e, SchemaError::Payload { reason, .. } if reason.contains("1 byte(s) after")),
        "{e}"
    );
    // An Avro record read by the JSON Schema codec: the id is an Avro schema's.
    let e = schema_error(json.decode(&good).unwrap_err());
    assert!(
        matches!(&e, SchemaError::WrongSchemaType { expected: "JSON", found, .. } if found == "AVRO"),
        "{e}"
    );
    // A value the schema cannot hold (a struct of another shape).
    let wrong =
        AvroCodec::<(i32, i32)>::new(registry.clone(), &topic, Part::Value, ORDER_V1).unwrap();
    let e = schema_error(wrong.encode(&(1, 2)).unwrap_err());
    assert!(matches!(e, SchemaError::Encode(_)), "{e}");
    // A schema that does not parse, and a lookup-only codec whose schema was never registered.
    assert!(matches!(
        AvroCodec::<OrderV1>::new(
            registry.clone(),
            &topic,
            Part::Value,
            "{\"type\": \"nope\"}"
        ),
        Err(SchemaError::InvalidSchema { id: None, .. })
    ));
    let lookup = AvroCodec::<OrderV1>::new(registry, &topic, Part::Key, ORDER_V2)
        .unwrap()
        .lookup_only();
    let e = schema_error(
        lookup
            .encode(&OrderV1 {
                id: "l".into(),
                cents: 0,
            })
            .unwrap_err(),
    );
    assert!(
        matches!(
            e,
            SchemaError::Registry {
                code: Some(40403),
                ..
            }
        ),
        "{e}"
    );
}

/// The header of a schema the registry has, then random bytes: each codec returns a value
/// or an error, never panics.
fn known_headers() -> &'static (Vec<u8>, Vec<u8>, Vec<u8>) {
    static HEADERS: OnceLock<(Vec<u8>, Vec<u8>, Vec<u8>)> = OnceLock::new();
    HEADERS.get_or_init(|| {
        let topic = topic("fuzz");
        let a = AvroCodec::<OrderV2>::new(client(), &topic, Part::Value, ORDER_V2).unwrap();
        let j = JsonSchemaCodec::<OrderV1>::new(client(), &topic, Part::Key, JSON).unwrap();
        let p = ProtobufCodec::<Order>::new(client(), &topic, Part::Value, PROTO, "shop.Order")
            .unwrap();
        let order = OrderV1 {
            id: "f".into(),
            cents: 1,
        };
        (
            a.encode(&OrderV2 {
                id: "f".into(),
                cents: 1,
                currency: "X".into(),
            })
            .unwrap()[..5]
                .to_vec(),
            j.encode(&order).unwrap()[..5].to_vec(),
            p.encode(&Order::default()).unwrap()[..5].to_vec(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic_a_decoder(
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        which in 0usize..4,
    ) {
        let (avro_header, json_header, proto_header) = known_headers();
        let topic = topic("fuzz");
        let avro = AvroCodec::<OrderV2>::new(client(), &topic, Part::Value, ORDER_V2).unwrap();
        let json = JsonSchemaCodec::<OrderV1>::new(client(), &topic, Part::Key, JSON).unwrap();
        let proto = ProtobufCodec::<Order>::new(client(), &topic, Part::Value, PROTO, "shop.Order").unwrap();
        let header: &[u8] = match which {
            0 => avro_header,
            1 => json_header,
            2 => proto_header,
            _ => &[],
        };
        let bytes = [header, &payload].concat();
        // Every result is fine but a panic; errors must be the codecs' own.
        for result in [
            avro.decode(&bytes).map(|_| ()),
            json.decode(&bytes).map(|_| ()),
            proto.decode(&bytes).map(|_| ()),
        ] {
            if let Err(e) = result {
                prop_assert!(SchemaError::of(&e).is_some(), "{e}");
            }
        }
    }
}

/// A DSL pipeline in the test driver reading Avro orders and writing Avro: the big orders,
/// with the added field, under the output topic's subject.
#[test]
fn a_dsl_pipeline_reads_avro_and_writes_avro() {
    use parsley_dsl::{Consumed, Produced, StreamsBuilder};
    use parsley_task::driver::TopologyTestDriver;

    let input = topic("dsl-orders");
    let output = topic("dsl-big");
    let builder = StreamsBuilder::new("avro-pipeline");
    builder
        .stream_with::<String, OrderV1>(
            input.clone(),
            Consumed::with(
                Utf8,
                AvroCodec::new(client(), &input, Part::Value, ORDER_V1).unwrap(),
            ),
        )
        .filter(|_, o| o.cents >= 1000)
        .map_values(|o| OrderV2 {
            id: o.id.clone(),
            cents: o.cents,
            currency: "EUR".into(),
        })
        .to_with(
            output.clone(),
            Produced::with(
                Utf8,
                AvroCodec::new(client(), &output, Part::Value, ORDER_V2).unwrap(),
            ),
        );
    let topology = builder.build().unwrap();
    let driver = TopologyTestDriver::builder(topology).build().unwrap();
    let orders = driver
        .input_topic(
            &input,
            Utf8,
            AvroCodec::<OrderV1>::new(client(), &input, Part::Value, ORDER_V1).unwrap(),
        )
        .unwrap();
    // Read back with the old schema: the output's records resolve to it as well.
    let mut big = driver
        .output_topic(
            &output,
            Utf8,
            AvroCodec::<OrderV1>::new(client(), &output, Part::Value, ORDER_V1).unwrap(),
        )
        .unwrap();
    for (id, cents) in [("a", 500), ("b", 1500), ("c", 2500)] {
        orders
            .pipe(
                id.to_string(),
                OrderV1 {
                    id: id.into(),
                    cents,
                },
            )
            .unwrap();
    }
    assert_eq!(
        big.read_key_values(),
        [
            (
                "b".to_string(),
                OrderV1 {
                    id: "b".into(),
                    cents: 1500
                }
            ),
            (
                "c".to_string(),
                OrderV1 {
                    id: "c".into(),
                    cents: 2500
                }
            ),
        ]
    );
    let registry = client();
    assert_eq!(registry.versions(&format!("{output}-value")).unwrap(), [1]);
    let latest = registry.schema(
        registry
            .lookup(&format!("{output}-value"), &avro(ORDER_V2))
            .unwrap()
            .unwrap(),
    );
    assert_eq!(latest.unwrap().text, ORDER_V2);
}
