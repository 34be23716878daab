//! Case C27 on the real broker: aborts in a loop, and an abort the producer's state refuses.
//!
//! - The runtime's transactional producer ([`CausalProducer`]) begins, sends 5 records and
//!   aborts, 1,000 times in a row (every other time once the records are acknowledged, so the
//!   abort writes its marker after them): no call fails or waits past its timeout, nothing is visible
//!   to `read_committed`, and the next transaction commits exactly its own records.
//! - A stage whose producer meets the broker's `INVALID_TXN_STATE` as a fatal error at a commit
//!   (injected through librdkafka's own test hook: `ProducerFault::InvalidTxnStateAtCommit`,
//!   cargo feature `fault-injection`) — its offsets, its commit and the abort that follows all
//!   fail with it — replaces its producer (a new epoch for its transactional id) and redoes the
//!   work exactly once, instead of stopping.

use parsley_runtime::{
    CausalProducer, CausalProducerConfig, ProducerFault, Runtime, RuntimeConfig, TopicInfo,
};
use parsley_testkit::fixtures::{
    bootstrap, committed_end_offsets, committed_values, count_topology, create_topic, group_offset,
    raw_producer, read_committed, send_stamped, unique_topic, wait_committed, wait_metrics,
};

/// Transactions begun and aborted in a row.
const ABORTS: usize = 1_000;
/// Records sent in each.
const PER_TRANSACTION: usize = 5;

#[test]
fn c27_a_thousand_aborted_transactions_leave_nothing_visible_and_the_producer_usable() {
    let topic: TopicInfo = create_topic("c27-loop", 1);
    let mut producer = CausalProducer::new(
        CausalProducerConfig::new(bootstrap()).transactional(unique_topic("c27-loop-p")),
    )
    .unwrap();
    let started = std::time::Instant::now();
    for round in 0..ABORTS {
        producer
            .begin()
            .unwrap_or_else(|e| panic!("begin {round}: {e}"));
        for i in 0..PER_TRANSACTION {
            producer
                .send(&topic.name, b"k", format!("a{round}-{i}").as_bytes())
                .unwrap_or_else(|e| panic!("send {round}/{i}: {e}"));
        }
        if round % 2 == 1 {
            // Every other transaction waits for its records to be in the log (the abort then
            // needs its EndTxn and leaves an abort marker); the others abort at once, with
            // their records possibly still queued (librdkafka purges them).
            producer
                .flush()
                .unwrap_or_else(|e| panic!("flush {round}: {e}"));
        }
        producer
            .abort()
            .unwrap_or_else(|e| panic!("abort {round}: {e}"));
    }
    let looped = started.elapsed();
    producer.begin().unwrap();
    for i in 0..PER_TRANSACTION {
        producer
            .send(&topic.name, b"k", format!("c{i}").as_bytes())
            .unwrap();
    }
    producer.commit().unwrap();
    let ends = committed_end_offsets(&topic);
    eprintln!(
        "C27: {ABORTS} transactions of {PER_TRANSACTION} aborted in {looped:?}; end offset {}",
        ends[&0]
    );
    let values: Vec<String> = read_committed(&topic)
        .into_iter()
        .map(|r| String::from_utf8(r.value.unwrap()).unwrap())
        .collect();
    assert_eq!(
        values,
        (0..PER_TRANSACTION)
            .map(|i| format!("c{i}"))
            .collect::<Vec<_>>(),
        "only the committed transaction is visible"
    );
}

#[test]
fn c27_an_invalid_txn_state_at_the_commit_and_the_abort_replaces_the_producer() {
    let input = create_topic("c27-in", 1);
    let output = create_topic("c27-out", 1);
    let plain = raw_producer(None);
    for k in ["k1", "k2", "k3"] {
        send_stamped(&plain, &input.name, 0, k.as_bytes(), b"x", None);
    }
    let app = unique_topic("c27");
    let topology = count_topology(&app, &input.name, &output.name);
    let config = RuntimeConfig::new(bootstrap()).inject(ProducerFault::InvalidTxnStateAtCommit);
    let running = Runtime::new(topology.clone(), config).start().unwrap();
    let m = wait_metrics(
        &running,
        "count",
        "an abort and 3 committed deliveries",
        |m| m.aborts >= 1 && m.committed_deliveries >= 3,
    );
    running.stop().unwrap();
    eprintln!(
        "C27: after the injected INVALID_TXN_STATE: {} aborts, {} transactions, {} committed \
         deliveries",
        m.aborts, m.transactions, m.committed_deliveries
    );
    assert_eq!(
        committed_values(&output),
        ["k1=1", "k2=1", "k3=1"],
        "the work is redone exactly once"
    );
    assert_eq!(
        group_offset(&format!("{app}.count"), &input.name, 0),
        Some(3)
    );
    // The stage goes on with its new producer.
    send_stamped(&plain, &input.name, 0, b"k1", b"x", None);
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    wait_committed(&running, "count", 1);
    running.stop().unwrap();
    assert_eq!(committed_values(&output), ["k1=1", "k2=1", "k3=1", "k1=2"]);
}
