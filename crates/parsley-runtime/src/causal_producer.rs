//! `CausalProducer`: a plain Kafka producer that stamps what it sends with a
//! [`CausalClock`], for services that feed a Parsley topology without being a stage.
//!
//! What it claims (the book's specification, §3): the records it was told it consumed
//! ([`CausalProducer::observe_message`] for a record read with an rdkafka consumer,
//! [`CausalProducer::observe`] for a coordinate), the stamps they carried, and its own sends
//! once they are acknowledged. Sends to one channel need no claim (an idempotent producer
//! appends them in order). Earlier sends to *other* channels that are not acknowledged yet are
//! claimed in flight by a transactional producer (its commit makes them visible together); a
//! non-transactional producer cannot do that, so its `send` first flushes at such a channel
//! switch — batch its sends per channel to keep flushes rare.
//!
//! A transactional producer restores its clock when it aborts: the aborted coordinates are
//! never claimed afterwards.
//!
//! It has no background thread: librdkafka's delivery reports (and its error and log events)
//! are served by the calling thread when it waits for them — a flush, a commit or abort, a
//! send that must flush first or finds librdkafka's queue full.
//!
//! [`CausalProducer`]'s own docs show the loop of a service that consumes with rdkafka:
//! consume, observe, send.

use std::collections::HashMap;
use std::time::Duration;

use parsley_clock::{
    CausalClock, Channel, Clock, Coordinate, SenderId, Stamp, TopicId, codec, is_stamp_header,
};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::Producer;

use crate::admin::Admin;
use crate::authorization::Names;
use crate::clients::{ClientRole, ClientSettings};
use crate::outbox::{Ack, Outbox};
use parsley_task::error::{Error, Result};
use parsley_task::error::{KafkaError, Operation, RecordError};
use parsley_task::outgoing::{Acked, OutgoingRecord};
use parsley_task::topic::TopicInfo;
use parsley_task::topic::{SendTag, partition_for};

/// How to build a [`CausalProducer`].
#[derive(Debug, Clone)]
pub struct CausalProducerConfig {
    /// `host:port[,…]` of the cluster.
    pub bootstrap: String,
    /// `Some(id)` for a transactional producer (EOS); `None` for an idempotent one.
    pub transactional_id: Option<String>,
    /// The user's librdkafka settings: for both clients (the producer and its admin client:
    /// security and the rest), and per role (`linger.ms`, `compression.type`, … for the
    /// producer).
    pub clients: ClientSettings,
    /// Deadline of each blocking call (flush, commit, metadata).
    pub timeout: Duration,
}

impl CausalProducerConfig {
    /// An idempotent, non-transactional producer for `bootstrap`.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        CausalProducerConfig {
            bootstrap: bootstrap.into(),
            transactional_id: None,
            clients: ClientSettings::new(),
            timeout: Duration::from_secs(30),
        }
    }

    /// Makes the producer transactional with `id`.
    pub fn transactional(mut self, id: impl Into<String>) -> Self {
        self.transactional_id = Some(id.into());
        self
    }

    /// Sets a librdkafka property on the producer.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.clients = self.clients.set_for(ClientRole::Producer, key, value);
        self
    }

    /// Sets a librdkafka property on both clients (the producer and its admin client):
    /// security settings go here.
    pub fn client_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.clients = self.clients.set(key, value);
        self
    }

    /// Replaces the user's client settings.
    pub fn client_settings(mut self, clients: ClientSettings) -> Self {
        self.clients = clients;
        self
    }
}

/// A producer whose every record carries a stamp header.
///
/// What it claims: the records it was told it consumed, the stamps they carried, and its own
/// acknowledged sends. A non-transactional producer flushes before a send to another channel
/// while earlier sends are not acknowledged (batch sends per channel); a transactional one
/// claims them in flight, and restores its clock when it aborts. It has no background thread:
/// delivery reports are served by the calling thread when it waits for them.
///
/// On a cluster with an authorizer it needs Write on each topic it sends to and, when
/// transactional, Write on its transactional id; a call refused for want of one fails with
/// [`KafkaError::Authorization`] naming the topic or the transactional id (from
/// [`CausalProducer::new`] for the transactional id, from the send's delivery report for a
/// topic).
///
/// # Consume, observe, send
///
/// A service that reads records with an rdkafka consumer hands each one to
/// [`CausalProducer::observe_message`] before it sends what the record caused: the producer
/// resolves the topic's id, claims the record's coordinate and what its stamp header
/// claimed, and every later send carries those claims. [`OutgoingRecord`] adds a record
/// timestamp and headers of the service's own. The consumer should read `read_committed`, so
/// that nothing of an aborted transaction is claimed. (rdkafka is re-exported as
/// [`parsley_runtime::rdkafka`](crate::rdkafka): its message types are the ones this producer
/// takes.)
///
/// ```no_run
/// use std::time::Duration;
/// use parsley_runtime::rdkafka::consumer::{BaseConsumer, Consumer};
/// use parsley_runtime::rdkafka::{ClientConfig, Message};
/// use parsley_runtime::{CausalProducer, CausalProducerConfig, OutgoingRecord};
///
/// let consumer: BaseConsumer = ClientConfig::new()
///     .set("bootstrap.servers", "127.0.0.1:9092")
///     .set("group.id", "invoicing")
///     .set("isolation.level", "read_committed")
///     .create()?;
/// consumer.subscribe(&["orders"])?;
/// let mut producer = CausalProducer::new(CausalProducerConfig::new("127.0.0.1:9092"))?;
/// while let Some(message) = consumer.poll(Duration::from_secs(1)) {
///     let order = message?;
///     // The invoice depends on the order, and on everything the order's stamp claims.
///     producer.observe_message(&order)?;
///     let invoice = format!("{} bytes invoiced", order.payload().map_or(0, <[u8]>::len));
///     let key = order.key().unwrap_or_default();
///     let mut record = OutgoingRecord::new("invoices", key, invoice.as_bytes())
///         .header("issued-by", b"invoicing");
///     if let Some(ms) = order.timestamp().to_millis() {
///         record = record.timestamp(ms); // the invoice carries the order's time
///     }
///     producer.send_record(record)?;
/// }
/// producer.flush()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CausalProducer {
    outbox: Outbox,
    /// What a refusal for want of an ACL names.
    names: Names,
    clock: CausalClock,
    admin: Admin,
    topics: HashMap<String, TopicInfo>,
    transactional: bool,
    /// The clock when the open transaction began.
    snapshot: Option<CausalClock>,
    acked: Vec<Acked>,
    /// Delivery reports being applied, kept across drains for its capacity.
    acks: Vec<Ack>,
    timeout: Duration,
}

impl std::fmt::Debug for CausalProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalProducer")
            .field("sender", &self.clock.sender())
            .field("transactional", &self.transactional)
            .finish_non_exhaustive()
    }
}

impl CausalProducer {
    /// Creates the producer (and, when transactional, initialises its transactions).
    ///
    /// # Errors
    /// [`KafkaError::Client`] when the client cannot be created or transactions cannot be
    /// initialised; [`KafkaError::Authorization`] when no ACL allows Write on the transactional
    /// id.
    pub fn new(config: CausalProducerConfig) -> Result<Self> {
        let mut own = vec![("linger.ms", "5"), ("partitioner", "murmur2_random")];
        if let Some(id) = &config.transactional_id {
            own.push(("transactional.id", id));
        }
        let id = config
            .transactional_id
            .as_deref()
            .unwrap_or("parsley-causal-producer");
        let cc = config
            .clients
            .config(&config.bootstrap, ClientRole::Producer, id, &own);
        let outbox = Outbox::new(&cc, None)?;
        // A refusal for want of an ACL names the transactional id or the topic
        // (module `authorization`).
        let names = Names {
            group: None,
            transactional_id: config.transactional_id.clone(),
            client: Some(ClientRole::Producer),
        };
        if config.transactional_id.is_some() {
            outbox
                .init_transactions(config.timeout)
                .map_err(|e| names.typed(e))?;
        }
        Ok(CausalProducer {
            names,
            outbox,
            clock: if config.transactional_id.is_some() {
                CausalClock::transactional(SenderId::random())
            } else {
                CausalClock::new(SenderId::random())
            },
            admin: Admin::connect(&config.bootstrap, &config.clients, config.timeout)?,
            topics: HashMap::new(),
            transactional: config.transactional_id.is_some(),
            snapshot: None,
            acked: Vec::new(),
            acks: Vec::new(),
            timeout: config.timeout,
        })
    }

    /// This producer's sender identity.
    pub fn sender(&self) -> SenderId {
        self.clock.sender()
    }

    /// What the producer claims now.
    pub fn clock(&self) -> &Clock {
        self.clock.clock()
    }

    /// Records that the application consumed the record at `coordinate` (with its stamp):
    /// later sends claim it.
    ///
    /// # Panics
    /// When `coordinate.offset` is negative (a Kafka record's offset never is).
    pub fn observe(&mut self, coordinate: Coordinate, stamp: Option<&Stamp>) {
        self.clock.observe(coordinate, stamp);
    }

    /// Records that the application consumed `message` (read with an rdkafka consumer:
    /// a `BorrowedMessage`, or an `OwnedMessage` detached from one): later sends claim its
    /// coordinate and what its stamp header claims, as [`CausalProducer::observe`]
    /// does. The topic's id is resolved as [`CausalProducer::topic`] resolves it (described
    /// once, then cached). Returns the record's coordinate.
    ///
    /// A record without a stamp header is claimed by its coordinate alone. The stamp's
    /// in-flight claims are not taken (the claim on the record covers them: a gate delivers the
    /// record only once they are resolved).
    ///
    /// # Errors
    /// Nothing is observed when one of these is returned:
    /// - [`SetupError::UnknownTopic`](parsley_task::error::SetupError::UnknownTopic) when the
    ///   message's topic does not exist (any more);
    /// - [`RecordError::MalformedStamp`] naming the record's topic, partition and offset and the
    ///   decoder's finding when its stamp header does not decode;
    /// - [`ProcessingError::Clock`](parsley_task::error::ProcessingError::Clock)
    ///   ([`NegativeOffset`](parsley_clock::Error::NegativeOffset)) for a message with a negative
    ///   offset (one made by hand, never read from a log).
    pub fn observe_message<M: Message>(&mut self, message: &M) -> Result<Coordinate> {
        let topic = self.topic(message.topic())?.id;
        let (coordinate, stamp) = consumed(topic, message)?;
        self.clock.observe(coordinate, stamp.as_ref());
        Ok(coordinate)
    }

    /// The topic's id and partition count (described once, then cached).
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`](parsley_task::error::SetupError::UnknownTopic) when the topic
    /// does not exist.
    pub fn topic(&mut self, topic: &str) -> Result<&TopicInfo> {
        if !self.topics.contains_key(topic) {
            let info = self.admin.describe_topics(&[topic])?.remove(0);
            self.topics.insert(topic.to_string(), info);
        }
        Ok(&self.topics[topic])
    }

    /// The channel a record with `key` goes to on `topic`.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`](parsley_task::error::SetupError::UnknownTopic) when the topic
    /// does not exist.
    pub fn channel_for(&mut self, topic: &str, key: &[u8]) -> Result<Channel> {
        let info = self.topic(topic)?;
        Ok(Channel::new(info.id, partition_for(key, info.partitions)))
    }

    /// Stamps and sends one record with `key` and `value` to `topic` (timestamp: the producer's
    /// clock; no header but the stamp): [`CausalProducer::send_record`] with
    /// [`OutgoingRecord::new`]. Returns its send sequence and channel.
    ///
    /// # Errors
    /// As [`CausalProducer::send_record`].
    pub fn send(&mut self, topic: &str, key: &[u8], value: &[u8]) -> Result<(u64, Channel)> {
        self.send_record(OutgoingRecord::new(topic, key, value))
    }

    /// Stamps and sends `record`, with its timestamp and headers after the stamp header;
    /// returns its send sequence and channel. Flushes first when earlier sends to another
    /// channel are not acknowledged yet (see the module docs).
    ///
    /// # Errors
    /// - [`RecordError::InvalidRecord`] before anything is sent or claimed: a header named like the
    ///   stamp header
    ///   ([`RecordProblem::ReservedHeader`](parsley_task::error::RecordProblem::ReservedHeader)), a
    ///   header name with a NUL byte, a timestamp that is not positive;
    /// - [`SetupError::UnknownTopic`](parsley_task::error::SetupError::UnknownTopic), a send or
    ///   flush failure, or a timeout.
    pub fn send_record(&mut self, record: OutgoingRecord<'_>) -> Result<(u64, Channel)> {
        record.check()?;
        let (topic, key, value, timestamp) = (
            record.topic(),
            record.key(),
            record.value(),
            record.record_timestamp(),
        );
        let headers = record.headers().to_vec();
        let channel = self.channel_for(topic, key)?;
        let stamp = match self.clock.stamp(channel) {
            Ok(s) => s,
            Err(parsley_clock::Error::UnackedSends { .. }) => {
                self.settle_all()?;
                self.clock.stamp(channel)?
            }
            Err(e) => return Err(e.into()),
        };
        let seq = stamp.sender.expect("CausalClock stamps carry a sender").seq;
        let bytes = codec::encode(&stamp);
        let tag = SendTag {
            task: -1,
            channel,
            seq,
        };
        if let Err(e) = self.outbox.send(
            topic,
            tag,
            Some(key),
            Some(value.to_vec()),
            &bytes,
            &headers
                .iter()
                .map(|(k, v)| (*k, Some(*v)))
                .collect::<Vec<_>>(),
            timestamp,
            self.timeout,
        ) {
            self.clock.failed(seq, channel)?;
            return Err(self.names.typed(e));
        }
        Ok((seq, channel))
    }

    /// Waits for every send's acknowledgement and claims the acknowledged coordinates.
    /// Returns the sends acknowledged since the last call that returned them.
    ///
    /// # Errors
    /// The first failed send ([`KafkaError::Send`]), or a timeout.
    pub fn flush(&mut self) -> Result<Vec<Acked>> {
        self.settle_all()?;
        Ok(std::mem::take(&mut self.acked))
    }

    /// Waits for every acknowledgement and applies it to the clock; the acknowledged sends
    /// stay queued for the caller.
    fn settle_all(&mut self) -> Result<()> {
        self.outbox.wait_acked(self.timeout)?;
        self.apply_acks()
    }

    fn apply_acks(&mut self) -> Result<()> {
        let mut acks = std::mem::take(&mut self.acks);
        self.outbox.drain_into(&mut acks);
        let applied = self.apply(&mut acks);
        self.acks = acks;
        applied
    }

    /// Applies drained delivery reports to the clock (see [`CausalProducer::apply_acks`]),
    /// emptying `acks`.
    fn apply(&mut self, acks: &mut Vec<Ack>) -> Result<()> {
        let mut first_error = None;
        for ack in acks.drain(..) {
            // A CausalProducer sends stamped records only.
            let Some(tag) = ack.tag else { continue };
            match ack.result {
                Ok(offset) => {
                    let coordinate = tag.channel.at(offset);
                    self.clock.acked(tag.seq, coordinate)?;
                    self.acked.push(Acked {
                        seq: tag.seq,
                        coordinate,
                    });
                }
                Err(failed) => {
                    self.clock.failed(tag.seq, tag.channel)?;
                    let topic = self
                        .topics
                        .values()
                        .find(|t| t.id == tag.channel.topic)
                        .map_or_else(String::new, |t| t.name.clone());
                    first_error.get_or_insert(self.names.typed(Error::Kafka(KafkaError::Send {
                        topic,
                        channel: Box::new(tag.channel),
                        source: Box::new(crate::client_error::client_error(failed.error)),
                    })));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Begins a transaction; the clock is snapshotted so an abort can restore it.
    ///
    /// # Errors
    /// [`KafkaError::Client`] from the client (also when the producer is not transactional).
    pub fn begin(&mut self) -> Result<()> {
        self.outbox.producer().begin_transaction().map_err(|e| {
            self.names
                .typed(crate::client_error::kafka(Operation::BeginTransaction, e))
        })?;
        self.snapshot = Some(self.clock.clone());
        Ok(())
    }

    /// Commits the open transaction; returns the sends acknowledged since the last call that
    /// returned them.
    ///
    /// # Errors
    /// [`KafkaError::Client`] from the client; the transaction must then be aborted.
    pub fn commit(&mut self) -> Result<Vec<Acked>> {
        self.outbox
            .commit_transaction(self.timeout)
            .map_err(|e| self.names.typed(e))?;
        let acked = self.flush()?;
        self.snapshot = None;
        Ok(acked)
    }

    /// Aborts the open transaction and restores the clock of its beginning: nothing it sent
    /// is claimed afterwards.
    ///
    /// # Errors
    /// [`KafkaError::Client`] from the client.
    pub fn abort(&mut self) -> Result<()> {
        self.outbox.abort_transaction(self.timeout).map_err(|e| {
            self.names
                .typed(crate::client_error::kafka(Operation::AbortTransaction, e))
        })?;
        self.outbox.wait_acked(self.timeout)?;
        self.outbox.discard();
        self.acked.clear();
        if let Some(s) = self.snapshot.take() {
            self.clock = s;
        }
        Ok(())
    }

    /// `true` for a transactional producer.
    pub fn is_transactional(&self) -> bool {
        self.transactional
    }
}

/// The coordinate of `message`, a record of the topic with id `topic`, and the stamp its
/// stamp header holds (`None` without one).
///
/// # Errors
/// [`RecordError::MalformedStamp`] when the header does not decode;
/// [`ProcessingError::Clock`](parsley_task::error::ProcessingError::Clock) for a negative offset.
fn consumed<M: Message>(topic: TopicId, message: &M) -> Result<(Coordinate, Option<Stamp>)> {
    let channel = Channel::new(topic, message.partition());
    let offset = message.offset();
    if offset < 0 {
        return Err(parsley_clock::Error::NegativeOffset { channel, offset }.into());
    }
    let coordinate = channel.at(offset);
    let Some(value) = message.headers().and_then(|headers| {
        headers
            .iter()
            .find(|h| is_stamp_header(h.key))
            .map(|h| h.value.unwrap_or_default())
    }) else {
        return Ok((coordinate, None));
    };
    let stamp = codec::decode(value).map_err(|source| {
        Error::Record(RecordError::MalformedStamp {
            topic: message.topic().to_string(),
            partition: message.partition(),
            offset,
            record: coordinate,
            source: Box::new(source),
        })
    })?;
    Ok((coordinate, Some(stamp)))
}

impl Drop for CausalProducer {
    fn drop(&mut self) {
        if !self.transactional {
            let _ = self.outbox.wait_acked(self.timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use parsley_clock::{
        CausalClock, Channel, DecodeErrorKind, STAMP_HEADER, SenderId, TopicId, codec,
    };
    use rdkafka::Timestamp;
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};

    use super::{CausalProducer, CausalProducerConfig, OutgoingRecord};
    use parsley_task::error::{Error, RecordProblem};
    use parsley_task::error::{ProcessingError, RecordError};
    use parsley_task::topic::TopicInfo;

    const ORDERS: TopicId = TopicId::from_halves(1, 2);
    const OTHER: TopicId = TopicId::from_halves(3, 4);

    /// A producer for a cluster that is never reached (clients connect lazily), which knows
    /// topic `orders` already: what needs no broker can be tested.
    fn offline() -> CausalProducer {
        let mut config = CausalProducerConfig::new("127.0.0.1:1").client_property("log_level", "0");
        config.timeout = Duration::from_secs(1);
        let mut p = CausalProducer::new(config).unwrap();
        p.topics.insert(
            "orders".into(),
            TopicInfo {
                name: "orders".into(),
                id: ORDERS,
                partitions: 4,
            },
        );
        p
    }

    fn message(offset: i64, stamp: Option<&[u8]>) -> OwnedMessage {
        let headers = OwnedHeaders::new().insert(Header {
            key: "trace-id",
            value: Some(&b"abc"[..]),
        });
        let headers = match stamp {
            Some(s) => headers.insert(Header {
                key: STAMP_HEADER,
                value: Some(s),
            }),
            None => headers,
        };
        OwnedMessage::new(
            Some(b"v".to_vec()),
            Some(b"k".to_vec()),
            "orders".into(),
            Timestamp::CreateTime(1),
            3,
            offset,
            Some(headers),
        )
    }

    #[test]
    fn a_consumed_message_is_claimed_with_what_its_stamp_claims() {
        let mut p = offline();
        let mut upstream = CausalClock::new(SenderId::random());
        upstream.observe(Channel::new(OTHER, 0).at(9), None);
        let stamp = upstream.stamp(Channel::new(ORDERS, 3)).unwrap();
        let consumed = p
            .observe_message(&message(41, Some(&codec::encode(&stamp))))
            .unwrap();
        assert_eq!(consumed, Channel::new(ORDERS, 3).at(41));
        assert!(p.clock().covers(consumed));
        assert!(
            p.clock().covers(Channel::new(OTHER, 0).at(9)),
            "the stamp's claim"
        );
        assert_eq!(p.clock().len(), 2);
    }

    #[test]
    fn a_message_without_a_stamp_is_claimed_by_its_coordinate() {
        let mut p = offline();
        let consumed = p.observe_message(&message(7, None)).unwrap();
        let claims: Vec<_> = p.clock().iter().collect();
        assert_eq!(claims, [Channel::new(ORDERS, 3).at(7)]);
        assert_eq!(consumed, claims[0]);
    }

    #[test]
    fn a_malformed_stamp_is_a_typed_error_and_nothing_is_observed() {
        let mut p = offline();
        p.observe_message(&message(1, None)).unwrap();
        let before = p.clock().clone();
        let e = p.observe_message(&message(2, Some(&[9, 0]))).unwrap_err();
        match &e {
            Error::Record(RecordError::MalformedStamp {
                topic,
                partition,
                offset,
                record,
                source,
            }) => {
                assert_eq!((topic.as_str(), *partition, *offset), ("orders", 3, 2));
                assert_eq!(*record, Channel::new(ORDERS, 3).at(2));
                assert!(
                    matches!(
                        **source,
                        parsley_clock::Error::Decode {
                            at: 0,
                            kind: DecodeErrorKind::UnknownVersion(9)
                        }
                    ),
                    "{source}"
                );
            }
            other => panic!("not a malformed stamp: {other}"),
        }
        let text = e.to_string();
        assert!(
            text.contains("orders/3@2") && text.contains("unknown stamp version 9"),
            "{text}"
        );
        assert_eq!(p.clock(), &before, "nothing half-applied");
        // An empty (or null) stamp header is malformed too, not a missing one.
        assert!(matches!(
            p.observe_message(&message(3, Some(&[]))),
            Err(Error::Record(RecordError::MalformedStamp { offset: 3, .. }))
        ));
        assert_eq!(p.clock(), &before);
    }

    #[test]
    fn a_message_with_a_negative_offset_is_refused() {
        let mut p = offline();
        assert!(matches!(
            p.observe_message(&message(-1, None)),
            Err(Error::Processing(ProcessingError::Clock(e))) if matches!(*e, parsley_clock::Error::NegativeOffset { offset: -1, .. })
        ));
        assert!(p.clock().is_empty());
    }

    #[test]
    fn a_record_that_cannot_be_sent_as_asked_is_refused_before_anything_is_sent() {
        let mut p = offline();
        let refused = |p: &mut CausalProducer, r: OutgoingRecord<'_>| match p.send_record(r) {
            Err(Error::Record(RecordError::InvalidRecord { topic, problem })) => {
                assert_eq!(topic, "orders");
                problem
            }
            other => panic!("not refused: {other:?}"),
        };
        let record = OutgoingRecord::new("orders", b"k", b"v");
        assert_eq!(
            refused(
                &mut p,
                record.clone().header("a", b"1").header(STAMP_HEADER, b"x")
            ),
            RecordProblem::ReservedHeader(STAMP_HEADER.into())
        );
        assert_eq!(
            refused(&mut p, record.clone().header("parsley.stamp", b"x")),
            RecordProblem::ReservedHeader("parsley.stamp".into())
        );
        assert_eq!(
            refused(&mut p, record.clone().header("a\0b", b"1")),
            RecordProblem::NulInHeaderName("a\0b".into())
        );
        assert_eq!(
            refused(&mut p, record.clone().timestamp(0)),
            RecordProblem::Timestamp(0)
        );
        assert_eq!(
            refused(&mut p, record.timestamp(-5)),
            RecordProblem::Timestamp(-5)
        );
        assert_eq!(p.clock.next_seq(), 0, "no sequence was allocated");
        assert_eq!(p.flush().unwrap(), [], "nothing was sent");
    }

    #[test]
    fn an_outgoing_record_keeps_its_headers_in_order() {
        let r = OutgoingRecord::new("t", b"k", b"v")
            .header("b", b"2")
            .header("a", b"1")
            .header("b", b"3")
            .timestamp(1_700_000_000_000);
        assert_eq!(r.topic(), "t");
        assert_eq!(
            r.headers(),
            [("b", &b"2"[..]), ("a", &b"1"[..]), ("b", &b"3"[..])]
        );
        assert_eq!(r.record_timestamp(), Some(1_700_000_000_000));
    }
}
