//! Case C20 on the real broker: keys hashed by another partitioner. A plain rdkafka producer
//! with librdkafka's default partitioner (`consistent_random`, CRC32) writes keys `k0..k99` to
//! one topic; a Java-compatible (murmur2) producer writes the same keys to a co-partitioned
//! second topic. A stage reading both stops with a typed error naming the record, its key and
//! the partition murmur2 gives — unless that source opted out of the check.

use parsley_runtime::RecordError;
use parsley_runtime::{Error, Runtime, RuntimeConfig, partition_for};
use parsley_stage::KeyPartitioning;
use parsley_testkit::fixtures::{
    DEADLINE, Forward, bootstrap, create_topic, next_failure, unique_topic, wait_committed,
};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// Writes `k0..k99` to `topic` with librdkafka's partitioner `partitioner`.
fn write_keys(topic: &str, partitioner: &str) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("partitioner", partitioner)
        .create()
        .unwrap();
    for i in 0..100 {
        let key = format!("k{i}");
        producer
            .send(BaseRecord::to(topic).key(&key).payload("v"))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(DEADLINE).unwrap();
}

#[test]
fn c20_keys_hashed_by_another_partitioner_stop_the_stage_naming_the_record() {
    let crc = create_topic("c20-crc", 4);
    let murmur = create_topic("c20-murmur", 4);
    let out = create_topic("c20-out", 4);
    write_keys(&crc.name, "consistent_random");
    write_keys(&murmur.name, "murmur2_random");

    let build = |unchecked: bool| {
        let app = unique_topic("c20");
        let topology = parsley_stage::Topology::builder(&app)
            .stage("forward", Forward(out.name.clone()), |s| {
                let s = s
                    .source(&crc.name)
                    .source(&murmur.name)
                    .sink(&out.name)
                    .key_codec(parsley_stage::Utf8)
                    .value_codec(parsley_stage::Utf8)
                    .output_codec(parsley_stage::Utf8);
                if unchecked {
                    s.key_partitioning(&crc.name, KeyPartitioning::Unchecked)
                } else {
                    s
                }
            })
            .build()
            .unwrap();
        Runtime::new(topology, RuntimeConfig::new(bootstrap()))
    };

    let running = build(false).start().unwrap();
    let failure = next_failure(&running);
    let _ = running.stop();
    match &*failure {
        Error::Record(RecordError::KeyPartitionMismatch {
            topic,
            partition,
            key,
            expected,
            partitions: 4,
            ..
        }) => {
            assert_eq!(
                *topic, crc.name,
                "only the CRC32-partitioned source mismatches"
            );
            let raw: String = serde_json_unquote(key);
            assert_eq!(partition_for(raw.as_bytes(), 4), *expected);
            assert_ne!(partition, expected);
        }
        other => panic!("expected KeyPartitionMismatch, got {other}"),
    }

    // Opted out, the source's records are delivered as they are.
    let running = build(true).start().unwrap();
    wait_committed(&running, "forward", 200);
    running.stop().unwrap();
}

/// The key inside the error's rendering (`"k12"`).
fn serde_json_unquote(key: &str) -> String {
    key.trim_matches('"').to_string()
}
