//! One memory bound (`RuntimeConfig::state_memory_bytes`) on the real broker: a count over
//! more unique keys than the bound holds, state on disk, commits far apart. Under a small
//! bound the stage pauses, its use never passes the bound by more than one poll batch of
//! held records, and its output is exactly an unbounded run's: every key counted once. The
//! negative control (a bound too large to reach) shows the same run holding more than the
//! small bound.

use std::time::Duration;

use parsley_runtime::{Holder, MemoryUse, Runtime, RuntimeConfig, partition_for};
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, count_topology, create_topic, raw_producer, read_committed, unique_topic,
    wait_committed,
};
use rdkafka::producer::{BaseRecord, Producer};

/// Unique keys sent.
const KEYS: u64 = 80_000;
/// The small bound: 8 MiB.
const BOUND: u64 = 8 << 20;
/// What use may pass the bound by: one poll batch (2,000 records) of held records per stage
/// at their estimated cost (160 bytes of overhead and the mean key and value), rounded up.
const SLACK: u64 = 512 << 10;

/// Sends `KEYS` records, key `k{i}` and value `x`, to `topic`, spread by murmur2.
fn send_keys(topic: &str) {
    let producer = raw_producer(None);
    for i in 0..KEYS {
        let key = format!("k{i}");
        loop {
            let record = BaseRecord::to(topic)
                .partition(partition_for(key.as_bytes(), 2))
                .key(&key)
                .payload("x");
            match producer.send(record) {
                Ok(()) => break,
                Err((e, _)) => {
                    assert!(
                        matches!(
                            e,
                            rdkafka::error::KafkaError::MessageProduction(
                                rdkafka::types::RDKafkaErrorCode::QueueFull
                            )
                        ),
                        "{e}"
                    );
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    }
    producer.flush(DEADLINE).expect("flush");
}

/// Counts the `KEYS` keys of a new input under `bound`, state on disk and commits 2 s apart,
/// until every record is committed; returns the process's memory figures and the stage's
/// pauses and spills at the bound, after checking the output: every key counted once.
fn count_under(bound: u64) -> (MemoryUse, u64, u64) {
    let input = create_topic("mem-in", 2);
    let output = create_topic("mem-out", 2);
    let app = unique_topic("mem");
    let topology = count_topology(&app, &input.name, &output.name);
    send_keys(&input.name);
    let dir = std::env::temp_dir().join(unique_topic("parsley-mem"));
    let config = RuntimeConfig::new(bootstrap())
        .state_dir(&dir)
        .commit_interval(Duration::from_secs(2))
        .state_memory_bytes(bound);
    let running = Runtime::new(topology, config).start().unwrap();
    let metrics = wait_committed(&running, "count", KEYS);
    let memory = running.state_memory().expect("a bound is set");
    running.stop().unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for r in read_committed(&output) {
        let line = String::from_utf8(r.value.unwrap()).unwrap();
        let (k, n) = line.split_once('=').unwrap();
        assert_eq!(n, "1", "{k} counted {n} times");
        *counts.entry(k.to_string()).or_insert(0u64) += 1;
    }
    assert_eq!(counts.len() as u64, KEYS, "every key counted");
    assert!(counts.values().all(|&n| n == 1), "each once");
    let _ = std::fs::remove_dir_all(&dir);
    (memory, metrics.memory_pauses, metrics.memory_spilled)
}

#[test]
fn a_count_over_more_keys_than_the_bound_holds_pauses_and_never_passes_it() {
    let (memory, pauses, spilled) = count_under(BOUND);
    eprintln!("bounded: {memory:?}, pauses {pauses}, spilled {spilled}");
    assert!(
        memory.peak <= BOUND + SLACK,
        "peak {} over the bound {BOUND} + {SLACK}",
        memory.peak
    );
    assert!(
        pauses + spilled > 0 && memory.pauses == pauses,
        "the bound was reached: {memory:?}"
    );
    assert!(
        memory.of(Holder::Store) > 0,
        "the store's cache and memtables count"
    );

    // Negative control: the same run under a bound it never reaches holds more than BOUND
    // besides its store.
    let (control, pauses, _) = count_under(1 << 40);
    eprintln!("control: {control:?}");
    assert_eq!(pauses, 0, "never reached");
    let store = control.of(Holder::Store);
    assert!(
        control.peak - store > BOUND,
        "the unbounded run holds more than {BOUND} besides its store: {control:?}"
    );
}
