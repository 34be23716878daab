"""Confluent's own serializers (confluent-kafka's schema registry client, AvroSerializer and
JSONSerializer) against the registry and the bytes of Parsley's codecs.

Run by the test `confluent_serializers_agree_with_the_codecs` (tests/interop.rs):

    python confluent_interop.py URL TOPIC DIR

reads DIR/rust-avro.bin and DIR/rust-json.bin (written by Parsley's codecs for TOPIC's value
and key) and checks the values Confluent's deserializers give, the Avro one with a newer
reader schema (an added field with a default); then writes DIR/python-avro.bin and
DIR/python-json.bin with Confluent's serializers, for the Rust test to read. Exits 1 with a
message on any difference.
"""

import json
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "string"}, {"name": "cents", "type": "long"}],
}
ORDER_V2 = dict(
    ORDER_V1,
    fields=ORDER_V1["fields"] + [{"name": "currency", "type": "string", "default": "EUR"}],
)
ORDER_JSON = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "shop.Order",
    "type": "object",
    "properties": {"id": {"type": "string"}, "cents": {"type": "integer"}},
    "required": ["id", "cents"],
}


def check(what, got, expected):
    if got != expected:
        print(f"confluent_interop: {what}: got {got!r}, expected {expected!r}")
        sys.exit(1)
    print(f"confluent_interop: {what}: {got!r}")


def main():
    url, topic, folder = sys.argv[1:4]
    registry = SchemaRegistryClient({"url": url})
    value = SerializationContext(topic, MessageField.VALUE)
    key = SerializationContext(topic, MessageField.KEY)

    # Parsley's bytes, read by Confluent's deserializers.
    with open(f"{folder}/rust-avro.bin", "rb") as f:
        avro = f.read()
    reader = AvroDeserializer(registry, json.dumps(ORDER_V2))
    check(
        "Parsley's Avro record read with the newer schema",
        reader(avro, value),
        {"id": "rust-1", "cents": 1250, "currency": "EUR"},
    )
    with open(f"{folder}/rust-json.bin", "rb") as f:
        data = f.read()
    check(
        "Parsley's JSON Schema record",
        JSONDeserializer(json.dumps(ORDER_JSON), schema_registry_client=registry)(data, key),
        {"id": "rust-2", "cents": -7},
    )

    # Confluent's bytes, for Parsley's codecs to read.
    writer = AvroSerializer(registry, json.dumps(ORDER_V1))
    with open(f"{folder}/python-avro.bin", "wb") as f:
        f.write(writer({"id": "python-1", "cents": 4200}, value))
    writer = JSONSerializer(json.dumps(ORDER_JSON), registry)
    with open(f"{folder}/python-json.bin", "wb") as f:
        f.write(writer({"id": "python-2", "cents": 3}, key))
    print("confluent_interop: wrote python-avro.bin and python-json.bin")


if __name__ == "__main__":
    main()
