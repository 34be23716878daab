//! Sources written with another partitioner than murmur2: declared CRC32 (librdkafka's default),
//! a stateful stage reads them as they are; undeclared, the error names CRC32 and the line that
//! declares it; a CRC32 stream that meets a murmur2 input is repartitioned first, and a CRC32
//! table (never repartitioned) beside a murmur2 stream is refused at build.

use parsley_runtime::crc32_partition_for;
use parsley_runtime::driver::{RawInput, TopologyTestDriver};
use parsley_runtime::{Error, RecordError};
use parsley_stage::{KeyPartitioning, Topology};

use crate::{Consumed, StreamsBuilder};

/// `clicks` counted per key, its partitioning declared as `partitioning`.
fn counts(partitioning: KeyPartitioning) -> Topology {
    let b = StreamsBuilder::new("app");
    b.stream_with::<String, String>("clicks", Consumed::default().key_partitioning(partitioning))
        .group_by_key()
        .named("counts")
        .count()
        .to_stream()
        .to("out");
    b.build().unwrap()
}

/// Pipes `key` to `clicks` on the partition CRC32 gives it among 4, as librdkafka's default
/// partitioner writes it.
fn pipe_crc32(driver: &TopologyTestDriver, key: &str) -> Result<(), parsley_runtime::Error> {
    let partition = crc32_partition_for(key.as_bytes(), 4);
    driver
        .pipe_raw(
            "clicks",
            RawInput::new(Some(key.as_bytes()), Some(b"x")).partition(partition),
        )
        .map(|_| ())
}

#[test]
fn a_source_declared_crc32_is_counted_as_it_is() {
    let t = counts(KeyPartitioning::Crc32);
    assert_eq!(t.stages().len(), 1, "no repartition: {}", t.describe());
    let driver = TopologyTestDriver::builder(t)
        .partitions("clicks", 4)
        .build()
        .unwrap();
    for key in ["ann", "bob", "ann", "cy"] {
        pipe_crc32(&driver, key).unwrap();
    }
    // Piped without a partition, a record goes where the declared partitioner puts it.
    driver
        .pipe_raw("clicks", RawInput::new(Some(b"ann"), Some(b"x")))
        .unwrap();
    let mut out = driver
        .output_topic("out", parsley_stage::Utf8, parsley_stage::Utf8)
        .unwrap();
    let mut last = std::collections::BTreeMap::new();
    for r in out.read_records() {
        last.insert(r.key, r.value);
    }
    assert_eq!(last["ann"], "3");
    assert_eq!(last["bob"], "1");
}

#[test]
fn undeclared_the_error_names_crc32_and_the_line_that_declares_it() {
    let driver = TopologyTestDriver::builder(counts(KeyPartitioning::Murmur2))
        .partitions("clicks", 4)
        .build()
        .unwrap();
    // A key CRC32 and murmur2 put on different partitions.
    let key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| {
            crc32_partition_for(k.as_bytes(), 4) != parsley_runtime::partition_for(k.as_bytes(), 4)
        })
        .unwrap();
    let err = pipe_crc32(&driver, &key).unwrap_err();
    match err.stage_error() {
        Error::Record(RecordError::KeyPartitionMismatch {
            partitioner: KeyPartitioning::Murmur2,
            matches: Some(KeyPartitioning::Crc32),
            ..
        }) => {}
        other => panic!("expected a mismatch that CRC32 explains, got {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("Consumed::default().key_partitioning(KeyPartitioning::Crc32)"),
        "{text}"
    );
    assert!(text.contains(&format!("has key \"{key}\"")), "{text}");
}

#[test]
fn a_crc32_stream_joined_with_a_murmur2_table_is_repartitioned_first() {
    let b = StreamsBuilder::new("app");
    let customers = b.table::<String, String>("customers");
    b.stream_with::<String, String>(
        "clicks",
        Consumed::default().key_partitioning(KeyPartitioning::Crc32),
    )
    .named("named-clicks")
    .join(&customers, |c, name| format!("{name}: {c}"))
    .to("out");
    let t = b.build().unwrap();
    let text = t.describe().to_string();
    assert_eq!(t.stages().len(), 2, "{text}");
    assert!(
        text.contains("app-named-clicks-input-repartition"),
        "{text}"
    );
    let driver = TopologyTestDriver::builder(t)
        .partitions("clicks", 4)
        .partitions("customers", 4)
        .build()
        .unwrap();
    driver
        .pipe_raw("customers", RawInput::new(Some(b"k7"), Some(b"Ann")))
        .unwrap();
    pipe_crc32(&driver, "k7").unwrap();
    let mut out = driver
        .output_topic("out", parsley_stage::Utf8, parsley_stage::Utf8)
        .unwrap();
    let joined: Vec<String> = out.read_records().into_iter().map(|r| r.value).collect();
    assert_eq!(joined, ["Ann: x"]);
}

#[test]
fn a_crc32_table_beside_a_murmur2_stream_is_refused_at_build() {
    // A table is not repartitioned: the stage would mix the two partitioners.
    let b = StreamsBuilder::new("app");
    let customers = b.table_with::<String, String>(
        "customers",
        Consumed::default().key_partitioning(KeyPartitioning::Crc32),
    );
    b.stream::<String, String>("clicks")
        .join(&customers, |c, name| format!("{name}: {c}"))
        .to("out");
    let err = b.build().unwrap_err();
    assert!(
        err.to_string().contains(
            "source \"customers\" is partitioned by CRC32 and source \"clicks\" by murmur2"
        ),
        "{err}"
    );
}
