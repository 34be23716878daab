//! `CausalProducer`: a plain Kafka producer that stamps what it sends with a
//! [`CausalClock`], for services that feed a Parsley topology without being a stage.
//!
//! What it claims (DESIGN.md §3): the records it was told it consumed
//! ([`CausalProducer::observe`]), the stamps they carried, and its own sends once they are
//! acknowledged. Sends to one channel need no claim (an idempotent producer appends them in
//! order). Earlier sends to *other* channels that are not acknowledged yet are claimed in
//! flight by a transactional producer (its commit makes them visible together); a
//! non-transactional producer cannot do that, so its `send` first flushes at such a channel
//! switch — batch its sends per channel to keep flushes rare.
//!
//! A transactional producer restores its clock when it aborts: the aborted coordinates are
//! never claimed afterwards.
//!
//! It has no background thread: librdkafka's delivery reports (and its error and log events)
//! are served by the calling thread when it waits for them — a flush, a commit or abort, a
//! send that must flush first or finds librdkafka's queue full.

use std::collections::HashMap;
use std::time::Duration;

use parsley_clock::{CausalClock, Channel, Clock, Coordinate, SenderId, Stamp, codec};
use rdkafka::producer::Producer;

use crate::admin::{Admin, TopicInfo};
use crate::clients::{ClientRole, ClientSettings};
use crate::error::{Error, Result};
use crate::outbox::{Outbox, SendTag, partition_for};

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

/// A send the broker acknowledged: its sequence and coordinate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// The send sequence [`CausalProducer::send`] returned.
    pub seq: u64,
    /// Where the record was appended.
    pub coordinate: Coordinate,
}

/// A producer whose every record carries a `parsley.stamp` header.
pub struct CausalProducer {
    outbox: Outbox,
    clock: CausalClock,
    admin: Admin,
    topics: HashMap<String, TopicInfo>,
    transactional: bool,
    /// The clock when the open transaction began.
    snapshot: Option<CausalClock>,
    acked: Vec<Acked>,
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
    /// [`Error::Kafka`] when the client cannot be created or transactions cannot be
    /// initialised.
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
        if config.transactional_id.is_some() {
            outbox.init_transactions(config.timeout)?;
        }
        Ok(CausalProducer {
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
    pub fn observe(&mut self, coordinate: Coordinate, stamp: Option<&Stamp>) {
        self.clock.observe(coordinate, stamp);
    }

    /// The topic's id and partition count (described once, then cached).
    ///
    /// # Errors
    /// [`Error::UnknownTopic`] when the topic does not exist.
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
    /// [`Error::UnknownTopic`] when the topic does not exist.
    pub fn channel_for(&mut self, topic: &str, key: &[u8]) -> Result<Channel> {
        let info = self.topic(topic)?;
        Ok(Channel::new(info.id, partition_for(key, info.partitions)))
    }

    /// Stamps and sends one record; returns its send sequence and channel. Flushes first when
    /// earlier sends to another channel are not acknowledged yet (see the module docs).
    ///
    /// # Errors
    /// [`Error::UnknownTopic`], a send or flush failure, or a timeout.
    pub fn send(&mut self, topic: &str, key: &[u8], value: &[u8]) -> Result<(u64, Channel)> {
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
            &[],
            None,
            self.timeout,
        ) {
            self.clock.failed(seq, channel)?;
            return Err(e);
        }
        Ok((seq, channel))
    }

    /// Waits for every send's acknowledgement and claims the acknowledged coordinates.
    /// Returns the sends acknowledged since the last call that returned them.
    ///
    /// # Errors
    /// The first failed send ([`Error::Send`]), or a timeout.
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
        let mut first_error = None;
        for ack in self.outbox.drain() {
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
                Err(source) => {
                    self.clock.failed(tag.seq, tag.channel)?;
                    let topic = self
                        .topics
                        .values()
                        .find(|t| t.id == tag.channel.topic)
                        .map_or_else(String::new, |t| t.name.clone());
                    first_error.get_or_insert(Error::Send {
                        topic,
                        channel: Box::new(tag.channel),
                        source,
                    });
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Begins a transaction; the clock is snapshotted so an abort can restore it.
    ///
    /// # Errors
    /// [`Error::Kafka`] from the client (also when the producer is not transactional).
    pub fn begin(&mut self) -> Result<()> {
        self.outbox
            .producer()
            .begin_transaction()
            .map_err(|e| Error::kafka("beginning a transaction", e))?;
        self.snapshot = Some(self.clock.clone());
        Ok(())
    }

    /// Commits the open transaction; returns the sends acknowledged since the last call that
    /// returned them.
    ///
    /// # Errors
    /// [`Error::Kafka`] from the client; the transaction must then be aborted.
    pub fn commit(&mut self) -> Result<Vec<Acked>> {
        self.outbox.commit_transaction(self.timeout)?;
        let acked = self.flush()?;
        self.snapshot = None;
        Ok(acked)
    }

    /// Aborts the open transaction and restores the clock of its beginning: nothing it sent
    /// is claimed afterwards.
    ///
    /// # Errors
    /// [`Error::Kafka`] from the client.
    pub fn abort(&mut self) -> Result<()> {
        self.outbox
            .abort_transaction(self.timeout)
            .map_err(|e| Error::kafka("aborting a transaction", e))?;
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

impl Drop for CausalProducer {
    fn drop(&mut self) {
        if !self.transactional {
            let _ = self.outbox.wait_acked(self.timeout);
        }
    }
}
