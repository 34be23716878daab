//! `CausalProducer` as a service that consumes with rdkafka uses it, on the real broker: a
//! consumed record handed to `observe_message` is claimed by the next send (with what its
//! stamp claimed); a record without a stamp is claimed by its coordinate; a malformed stamp is
//! a typed error that leaves the clock as it was; a send with a timestamp and headers arrives
//! with exactly those and the stamp.
//!
//! Everything is used through `parsley_runtime` alone (its re-exports of the clock's types and
//! of rdkafka), as a service without a dependency on `parsley-clock` would.

use std::time::{Duration, Instant};

use parsley_runtime::rdkafka::consumer::{BaseConsumer, Consumer};
use parsley_runtime::rdkafka::message::{Headers, Message, OwnedMessage};
use parsley_runtime::rdkafka::{Offset, Timestamp, TopicPartitionList};
use parsley_runtime::{
    CausalProducer, CausalProducerConfig, Channel, ClockError, DecodeErrorKind, Error,
    OutgoingRecord, RecordProblem, STAMP_HEADER, Stamp, TopicInfo,
};
use parsley_runtime::{RecordError, SetupError};
use parsley_testkit::fixtures::{
    DEADLINE, bootstrap, committed_consumer, create_topic, raw_producer, read_committed,
    send_stamped,
};

fn producer() -> CausalProducer {
    CausalProducer::new(CausalProducerConfig::new(bootstrap())).unwrap()
}

/// The first `n` records of partition 0 of `topic`, read `read_committed` by a plain rdkafka
/// consumer (no group), detached from it.
fn consume(topic: &TopicInfo, n: usize) -> Vec<OwnedMessage> {
    let consumer: BaseConsumer = committed_consumer();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic.name, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let started = Instant::now();
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            started.elapsed() < DEADLINE,
            "{}: {} of {n} records consumed",
            topic.name,
            out.len()
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            out.push(m.unwrap().detach());
        }
    }
    out
}

/// The stamp of the one record in `topic` (which must hold exactly one).
fn only_stamp(topic: &TopicInfo) -> Stamp {
    let records = read_committed(topic);
    assert_eq!(records.len(), 1, "{}: {records:?}", topic.name);
    records[0].stamp.clone().expect("a stamped record")
}

#[test]
fn a_consumed_stamped_record_is_claimed_by_the_next_send_with_its_stamps_claims() {
    let cause = create_topic("observe-cause", 1);
    let orders = create_topic("observe-orders", 1);
    let invoices = create_topic("observe-invoices", 1);
    // Upstream: the order claims its cause.
    let mut upstream = producer();
    upstream.send(&cause.name, b"k", b"cause").unwrap();
    let acked = upstream.flush().unwrap();
    let cause_at = Channel::new(cause.id, 0).at(0);
    assert_eq!(acked[0].coordinate, cause_at);
    upstream.send(&orders.name, b"k", b"order").unwrap();
    upstream.flush().unwrap();

    // The service: consume the order with a plain consumer, observe it, send the invoice.
    let order = consume(&orders, 1).remove(0);
    let mut service = producer();
    let order_at = service.observe_message(&order).unwrap();
    assert_eq!(order_at, Channel::new(orders.id, 0).at(0));
    assert!(service.clock().covers(order_at) && service.clock().covers(cause_at));
    service.send(&invoices.name, b"k", b"invoice").unwrap();
    service.flush().unwrap();

    let stamp = only_stamp(&invoices);
    assert_eq!(stamp.sender.map(|t| t.sender), Some(service.sender()));
    assert_eq!(
        stamp.clock.get(&order_at.channel),
        Some(0),
        "the invoice claims the consumed coordinate"
    );
    assert!(
        stamp.clock.covers(cause_at),
        "and what the order's stamp claimed"
    );
}

#[test]
fn a_consumed_record_without_a_stamp_is_claimed_by_its_coordinate_alone() {
    let orders = create_topic("observe-plain", 1);
    let invoices = create_topic("observe-plain-out", 1);
    let plain = raw_producer(None);
    send_stamped(&plain, &orders.name, 0, b"k", b"first", None);
    send_stamped(&plain, &orders.name, 0, b"k", b"second", None);
    let consumed = consume(&orders, 2);
    assert!(consumed[1].headers().is_none(), "no header at all");

    let mut service = producer();
    let at = service.observe_message(&consumed[1]).unwrap();
    assert_eq!(at, Channel::new(orders.id, 0).at(1));
    assert_eq!(service.clock().iter().collect::<Vec<_>>(), [at]);
    service.send(&invoices.name, b"k", b"invoice").unwrap();
    service.flush().unwrap();
    let stamp = only_stamp(&invoices);
    assert_eq!(stamp.clock.iter().collect::<Vec<_>>(), [at]);
}

#[test]
fn a_malformed_stamp_is_a_typed_error_naming_the_record_and_the_clock_is_unchanged() {
    use parsley_runtime::rdkafka::message::{Header, OwnedHeaders};
    use parsley_runtime::rdkafka::producer::{BaseRecord, Producer};
    let orders = create_topic("observe-malformed", 1);
    let plain = raw_producer(None);
    send_stamped(&plain, &orders.name, 0, b"k", b"fine", None);
    // A stamp of a version no build knows.
    plain
        .send(
            BaseRecord::to(&orders.name)
                .partition(0)
                .key("k")
                .payload("bad")
                .headers(OwnedHeaders::new().insert(Header {
                    key: STAMP_HEADER,
                    value: Some(&[9u8, 0][..]),
                })),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    plain.flush(DEADLINE).unwrap();
    let consumed = consume(&orders, 2);

    let mut service = producer();
    service.observe_message(&consumed[0]).unwrap();
    let before = service.clock().clone();
    let e = service.observe_message(&consumed[1]).unwrap_err();
    match &e {
        Error::Record(RecordError::MalformedStamp {
            topic,
            partition,
            offset,
            record,
            source,
        }) => {
            assert_eq!(
                (topic.as_str(), *partition, *offset),
                (orders.name.as_str(), 0, 1)
            );
            assert_eq!(*record, Channel::new(orders.id, 0).at(1));
            assert!(
                matches!(
                    **source,
                    ClockError::Decode {
                        kind: DecodeErrorKind::UnknownVersion(9),
                        ..
                    }
                ),
                "{source}"
            );
        }
        other => panic!("not a malformed stamp: {other}"),
    }
    assert!(e.is_fatal(), "{e}");
    assert_eq!(service.clock(), &before, "nothing half-applied");
}

#[test]
fn a_record_of_a_topic_that_does_not_exist_is_an_unknown_topic() {
    let name = parsley_testkit::fixtures::unique_topic("observe-missing");
    let message = OwnedMessage::new(
        Some(b"v".to_vec()),
        None,
        name.clone(),
        Timestamp::NotAvailable,
        0,
        0,
        None,
    );
    let mut service = producer();
    assert!(matches!(
        service.observe_message(&message),
        Err(Error::Setup(SetupError::UnknownTopic { topic })) if topic == name
    ));
    assert!(service.clock().is_empty());
}

#[test]
fn a_send_with_a_timestamp_and_headers_arrives_with_exactly_those_and_the_stamp() {
    let topic = create_topic("send-record", 1);
    let mut p = producer();
    // An hour ago, to the millisecond: not the producer's clock, and within retention.
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 3_600_001;
    let (seq, channel) = p
        .send_record(
            OutgoingRecord::new(&topic.name, b"k", b"v")
                .timestamp(at)
                .header("trace-id", b"abc")
                .header("empty", b"")
                .header("trace-id", b"def"),
        )
        .unwrap();
    assert_eq!(channel, Channel::new(topic.id, 0));
    // Refused records change nothing: the next sequence is the next one.
    let refused = p
        .send_record(OutgoingRecord::new(&topic.name, b"k", b"v").header(STAMP_HEADER, b"mine"))
        .unwrap_err();
    assert!(
        matches!(&refused, Error::Record(RecordError::InvalidRecord { problem: RecordProblem::ReservedHeader(h), .. }) if h == STAMP_HEADER),
        "{refused}"
    );
    let acked = p.flush().unwrap();
    assert_eq!(acked.len(), 1);
    assert_eq!((acked[0].seq, acked[0].coordinate), (seq, channel.at(0)));

    let record = consume(&topic, 1).remove(0);
    assert_eq!(record.timestamp(), Timestamp::CreateTime(at));
    let headers = record.headers().expect("headers");
    let got: Vec<(&str, Option<&[u8]>)> = headers.iter().map(|h| (h.key, h.value)).collect();
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0].0, STAMP_HEADER, "the stamp comes first");
    assert_eq!(
        &got[1..],
        [
            ("trace-id", Some(&b"abc"[..])),
            ("empty", Some(&b""[..])),
            ("trace-id", Some(&b"def"[..])),
        ]
    );
    let stamp = only_stamp(&topic);
    assert_eq!(
        stamp.sender.map(|t| (t.sender, t.seq)),
        Some((p.sender(), seq))
    );
}
