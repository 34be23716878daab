//! Transactions on the real broker: open transactions are invisible to `read_committed`
//! consumers, and aborted records never reach a stage.

use std::time::{Duration, Instant};

use parsley_runtime::{CausalProducer, CausalProducerConfig, Runtime, RuntimeConfig};
use parsley_stage::ImpossiblePolicy;
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, committed_consumer, create_topic, forward_topology, read_committed,
    unique_topic, wait_committed,
};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

#[test]
fn records_of_an_open_transaction_are_invisible_until_it_commits() {
    let topic = create_topic("open-txn", 2);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", unique_topic("open-txn-producer"))
        .create()
        .unwrap();
    producer.init_transactions(DEADLINE).unwrap();
    producer.begin_transaction().unwrap();
    producer
        .send(
            BaseRecord::to(&topic.name)
                .partition(0)
                .key("k")
                .payload("x"),
        )
        .unwrap();
    producer.flush(DEADLINE).unwrap(); // x is in the log (acked), its transaction open

    // A record on partition 1, written after x was acknowledged, outside any transaction.
    let plain: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    plain
        .send(
            BaseRecord::to(&topic.name)
                .partition(1)
                .key("k")
                .payload("m"),
        )
        .unwrap();
    plain.flush(DEADLINE).unwrap();

    // Evidence 1: the end a read_committed consumer sees (the LSO) stops before x, while the
    // high watermark includes it.
    let committed = committed_consumer();
    let uncommitted: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("isolation.level", "read_uncommitted")
        .create()
        .unwrap();
    assert_eq!(
        committed
            .fetch_watermarks(&topic.name, 0, DEADLINE)
            .unwrap()
            .1,
        0
    );
    assert_eq!(
        uncommitted
            .fetch_watermarks(&topic.name, 0, DEADLINE)
            .unwrap()
            .1,
        1
    );

    // Evidence 2: a read_committed consumer of both partitions returns m (written after x)
    // and nothing of partition 0.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic.name, 0, Offset::Beginning)
        .unwrap();
    tpl.add_partition_offset(&topic.name, 1, Offset::Beginning)
        .unwrap();
    committed.assign(&tpl).unwrap();
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < DEADLINE, "m never arrived");
        if let Some(msg) = committed.poll(Duration::from_millis(100)) {
            let msg = msg.unwrap();
            assert_eq!(
                msg.partition(),
                1,
                "nothing of the open transaction is returned"
            );
            assert_eq!(msg.payload(), Some(&b"m"[..]));
            break;
        }
    }

    producer.commit_transaction(DEADLINE).unwrap();
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < DEADLINE,
            "x never arrived after the commit"
        );
        if let Some(msg) = committed.poll(Duration::from_millis(100)) {
            let msg = msg.unwrap();
            assert_eq!((msg.partition(), msg.offset()), (0, 0));
            assert_eq!(msg.payload(), Some(&b"x"[..]));
            break;
        }
    }
}

#[test]
fn records_of_an_aborted_transaction_are_never_delivered_to_a_stage() {
    // C03's layout: T(a,b)+C, T(c,d)+A, T(e,f)+C -> records 0,1 marker 2, 3,4 marker 5,
    // 6,7 marker 8; end offset 9.
    let input = create_topic("aborted-in", 1);
    let output = create_topic("aborted-out", 1);
    let mut producer = CausalProducer::new(
        CausalProducerConfig::new(bootstrap()).transactional(unique_topic("aborted-producer")),
    )
    .unwrap();
    for (values, commit) in [(["a", "b"], true), (["c", "d"], false), (["e", "f"], true)] {
        producer.begin().unwrap();
        for v in values {
            producer.send(&input.name, b"k", v.as_bytes()).unwrap();
        }
        if commit {
            producer.commit().unwrap();
        } else {
            producer.flush().unwrap(); // written to the log, then aborted
            producer.abort().unwrap();
        }
    }

    let topology = forward_topology(
        &unique_topic("aborted"),
        &[&input.name],
        &output.name,
        ImpossiblePolicy::Fail,
    );
    let running = Runtime::new(topology, RuntimeConfig::new(bootstrap()))
        .start()
        .unwrap();
    // Evidence: the stage delivered 4 records and the last one was at offset 7 (f), the last
    // record of the partition; everything before it was delivered or skipped.
    wait_committed(&running, "forward", 4);
    let stats = running.stop().unwrap();
    assert_eq!(stats[0].1.delivered, 4, "{stats:?}");

    let out: Vec<String> = read_committed(&output)
        .into_iter()
        .map(|r| String::from_utf8(r.value.unwrap()).unwrap())
        .collect();
    assert_eq!(out, ["a", "b", "e", "f"]);
}
