//! The launcher's own reader (`parsley_broker::read`, Kafka's wire protocol with no client
//! library: what `cargo kafka read` prints) sees exactly what librdkafka's `read_committed`
//! consumer sees: committed transactions, not aborted ones nor their markers, plain records,
//! keys, tombstones, headers, on every partition, up to the last stable offsets.

use parsley_broker::read::{read_to_end, record_line};
use parsley_testkit::fixtures::{
    bootstrap, create_topic, raw_producer, read_committed, send_stamped,
};
use rdkafka::producer::Producer;

#[test]
fn the_wire_reader_sees_what_a_read_committed_consumer_sees() {
    let topic = create_topic("wire-reader", 2);
    let deadline = std::time::Duration::from_secs(30);
    let stamp = parsley_clock::Stamp::default();
    let txn = raw_producer(Some(&format!("{}-txn", topic.name)));
    for (round, commit) in [(0, true), (1, false), (2, true), (3, false), (4, true)] {
        txn.begin_transaction().unwrap();
        for partition in 0..2 {
            let key = format!("k{round}-{partition}");
            let value = format!("v{round}");
            send_stamped(
                &txn,
                &topic.name,
                partition,
                key.as_bytes(),
                value.as_bytes(),
                Some(&stamp),
            );
        }
        if commit {
            txn.commit_transaction(deadline).unwrap();
        } else {
            txn.abort_transaction(deadline).unwrap();
        }
    }
    // A plain producer's records, without a stamp, between the transactions' markers.
    let plain = raw_producer(None);
    send_stamped(&plain, &topic.name, 1, b"plain", b"p", None);

    // The consumer's records in the order it polled them; the reader's partition by partition.
    let mut expected = read_committed(&topic);
    expected.sort_by_key(|r| (r.partition, r.offset));
    let got = read_to_end(&bootstrap(), &topic.name).unwrap();
    let of = |partition, offset, key: &Option<Vec<u8>>, value: &Option<Vec<u8>>| {
        (partition, offset, key.clone(), value.clone())
    };
    assert_eq!(
        got.iter()
            .map(|r| (
                of(r.partition, r.offset, &r.key, &r.value),
                r.headers.clone()
            ))
            .collect::<Vec<_>>(),
        expected
            .iter()
            .map(|r| (
                of(r.partition, r.offset, &r.key, &r.value),
                r.headers.clone()
            ))
            .collect::<Vec<_>>()
    );
    // Three committed rounds on each partition and the plain record: no aborted value.
    assert_eq!(got.len(), 7);
    assert!(
        got.iter()
            .all(|r| r.value.as_deref() != Some(b"v1") && r.value.as_deref() != Some(b"v3"))
    );
    let stamped = got
        .iter()
        .find(|r| r.key.as_deref() == Some(b"k0-0"))
        .unwrap();
    assert!(
        record_line(stamped).starts_with("k0-0\tv0\tps=<stamp, "),
        "{}",
        record_line(stamped)
    );
    assert_eq!(
        record_line(
            got.iter()
                .find(|r| r.key.as_deref() == Some(b"plain"))
                .unwrap()
        ),
        "plain\tp"
    );
}
