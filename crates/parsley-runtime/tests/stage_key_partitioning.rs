//! Case C20 on the real broker: keys hashed by another partitioner. A plain rdkafka producer
//! with librdkafka's default partitioner (`consistent_random`, CRC32) writes keys `k0..k99` to
//! one topic; a Java-compatible (murmur2) producer writes the same keys to a co-partitioned
//! second topic. A stage reading both stops with a typed error naming the record, its key, the
//! partition murmur2 gives and CRC32 as the partitioner that put it there — unless that source
//! opted out of the check. Declared `Crc32`, a stateful stage reads the first topic as it is:
//! every key's records in one task, counted once.

use parsley_runtime::RecordError;
use parsley_runtime::{Error, Runtime, RuntimeConfig, partition_for};
use parsley_stage::KeyPartitioning;
use parsley_testkit::fixtures::{CountKeys, read_committed};
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
            partitioner: KeyPartitioning::Murmur2,
            matches: Some(KeyPartitioning::Crc32),
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

    assert!(
        failure.to_string().contains(&format!(
            ".key_partitioning(\"{}\", KeyPartitioning::Crc32)",
            crc.name
        )),
        "the line that declares it: {failure}"
    );

    // Opted out, the source's records are delivered as they are.
    let running = build(true).start().unwrap();
    wait_committed(&running, "forward", 200);
    running.stop().unwrap();

    // Declared CRC32 (librdkafka's partitioner, checked on every record), a stateful stage
    // reads it as it is: each key once, in the task of its partition.
    let counts = create_topic("c20-counts", 4);
    let topology = parsley_stage::Topology::builder(unique_topic("c20-crc32"))
        .stage("count", CountKeys::new(&counts.name), |s| {
            s.source(&crc.name)
                .sink(&counts.name)
                .key_codec(parsley_stage::Utf8)
                .value_codec(parsley_stage::Utf8)
                .output_codec(parsley_stage::Utf8)
                .key_partitioning(&crc.name, KeyPartitioning::Crc32)
        })
        .build()
        .unwrap();
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "count", 100);
    running.stop().unwrap();
    let mut counted: Vec<String> = read_committed(&counts)
        .into_iter()
        .map(|r| String::from_utf8(r.value.unwrap()).unwrap())
        .collect();
    counted.sort();
    let mut expected: Vec<String> = (0..100).map(|i| format!("k{i}=1")).collect();
    expected.sort();
    assert_eq!(counted, expected, "every key counted once");
}

/// The key inside the error's rendering (`"k12"`).
fn serde_json_unquote(key: &str) -> String {
    key.trim_matches('"').to_string()
}
