//! The driver's causal producer: a plain producer in memory that stamps what it sends with a
//! [`CausalClock`], as `CausalProducer` does on a broker.
//!
//! Invariants: a send is appended and acknowledged at once, so the clock claims every earlier
//! send by its coordinate (no in-flight claim is ever needed); a send inside an open
//! transaction is in its partition — counted by the high watermark — but invisible to readers
//! (it holds the last stable offset) until the transaction commits.

use parsley_clock::{
    CausalClock, Channel, Clock, Coordinate, STAMP_HEADER, SenderId, Stamp, codec,
};

use super::TopologyTestDriver;
use super::log::{Append, name_uuid};
use super::topics::TestRecord;
use crate::error::Result;
use crate::outgoing::{Acked, OutgoingRecord};

/// The state of one named producer.
pub(super) struct ProducerState {
    pub clock: CausalClock,
    /// A transaction is open.
    pub open: bool,
}

impl ProducerState {
    /// A new producer `name`: its sender id is derived from the name, so a test's stamps are
    /// the same from run to run.
    pub(super) fn new(name: &str) -> Self {
        ProducerState {
            clock: CausalClock::new(SenderId::from_bytes(name_uuid("producer", name))),
            open: false,
        }
    }
}

/// A causal producer of a [`TopologyTestDriver`] ([`TopologyTestDriver::causal_producer`]):
/// what a service that feeds the topology sends, stamped with what it observed before.
///
/// ```
/// use parsley_task::driver::TopologyTestDriver;
/// use parsley_stage::{Topology, Utf8};
/// # use parsley_stage::{Handler, HandlerResult, Record, Step};
/// # struct Forward;
/// # impl Handler for Forward {
/// #     type Key = String; type Value = String; type Output = String; type State = ();
/// #     fn handle(&self, r: Record<'_, String, String>, _: Option<()>)
/// #         -> HandlerResult<String, String, ()> {
/// #         Ok(Step::none().emit("out", r.key, r.value))
/// #     }
/// # }
///
/// let topology = Topology::builder("shop")
///     .stage("pay", Forward, |s| {
///         s.source("orders").source("payments").sink("out")
///             .key_codec(Utf8).value_codec(Utf8).output_codec(Utf8)
///     })
///     .build()?;
/// let driver = TopologyTestDriver::builder(topology).build()?;
/// let mut out = driver.output_topic("out", Utf8, Utf8)?;
///
/// // The order's transaction is open: it is in its partition, but no stage sees it.
/// let shop = driver.causal_producer("shop");
/// shop.begin();
/// let order = shop.send("orders", b"o-1", b"order")?;
/// // The payment service was told of the order and claims it.
/// let payments = driver.causal_producer("payments");
/// payments.observe(order.coordinate, None);
/// payments.send("payments", b"o-1", b"paid")?;
/// assert!(out.is_empty(), "the gate holds the payment until its cause is delivered");
/// shop.commit()?;
/// assert_eq!(out.read_values(), ["order", "paid"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TestProducer<'d> {
    pub(super) driver: &'d TopologyTestDriver,
    pub(super) name: String,
}

impl TestProducer<'_> {
    /// The producer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its sender id (derived from its name).
    pub fn sender(&self) -> SenderId {
        self.driver.with(|d| d.producer(&self.name).clock.sender())
    }

    /// What it claims by coordinate now.
    pub fn clock(&self) -> Clock {
        self.driver
            .with(|d| d.producer(&self.name).clock.clock().clone())
    }

    /// Records that the producer consumed the record at `coordinate`, which carried `stamp`:
    /// its later sends claim both (`CausalProducer::observe`).
    pub fn observe(&self, coordinate: Coordinate, stamp: Option<&Stamp>) {
        self.driver
            .with(|d| d.producer(&self.name).clock.observe(coordinate, stamp));
    }

    /// Records that the producer consumed `record`, read from any topic: its coordinate and
    /// stamp (`CausalProducer::observe_message`).
    /// Returns the coordinate.
    pub fn observe_record<K, V>(&self, record: &TestRecord<K, V>) -> Coordinate {
        self.observe(record.coordinate, record.stamp.as_ref());
        record.coordinate
    }

    /// Opens a transaction: what the producer sends until [`TestProducer::commit`] is in its
    /// partitions (counted by their high watermarks) but no reader sees it.
    ///
    /// # Panics
    /// When a transaction is open already.
    pub fn begin(&self) {
        self.driver.with(|d| {
            let p = d.producer(&self.name);
            assert!(!p.open, "producer {}: a transaction is open", self.name);
            p.open = true;
        });
    }

    /// Commits the open transaction: what it sent becomes visible, and the driver runs the
    /// topology (unless auto-run is off).
    ///
    /// # Errors
    /// As [`TopologyTestDriver::run`].
    ///
    /// # Panics
    /// When no transaction is open.
    pub fn commit(&self) -> Result<()> {
        self.driver.with(|d| {
            let p = d.producer(&self.name);
            assert!(p.open, "producer {}: no transaction is open", self.name);
            p.open = false;
            d.logs.commit(&self.name);
            d.after_write()
        })
    }

    /// Stamps and sends one record with `key` and `value` to `topic` at the driver's time
    /// ([`TestProducer::send_record`] with [`OutgoingRecord::new`]).
    ///
    /// # Errors
    /// As [`TestProducer::send_record`].
    pub fn send(&self, topic: &str, key: &[u8], value: &[u8]) -> Result<Acked> {
        self.send_record(OutgoingRecord::new(topic, key, value))
    }

    /// Stamps and sends `record` to the partition murmur2 gives its key, its headers after the
    /// stamp header (timestamp: the record's, else the driver's time); returns its sequence
    /// and coordinate. Outside a transaction the record is visible at once and the driver runs
    /// the topology (unless auto-run is off).
    ///
    /// # Errors
    /// [`crate::error::RecordError::InvalidRecord`] before anything is sent or claimed, as
    /// `CausalProducer::send_record`;
    /// [`crate::error::SetupError::UnknownTopic`]; then as [`TopologyTestDriver::run`].
    pub fn send_record(&self, record: OutgoingRecord<'_>) -> Result<Acked> {
        record.check()?;
        self.driver.with(|d| {
            let partition = d.logs.partition_for(record.topic, Some(record.key))?;
            let id = d.logs.topic(record.topic)?.info.id;
            let channel = Channel::new(id, partition);
            let time = d.time_ms;
            let p = d.producer(&self.name);
            let stamp = p.clock.stamp(channel)?;
            let seq = stamp.sender.expect("CausalClock stamps carry a sender").seq;
            let mut headers = vec![(STAMP_HEADER.to_string(), Some(codec::encode(&stamp)))];
            headers.extend(
                record
                    .headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), Some(v.to_vec()))),
            );
            let open = p.open.then(|| self.name.clone());
            let visible = open.is_none();
            let appended = d.logs.append(
                record.topic,
                partition,
                Append {
                    key: Some(record.key.to_vec()),
                    value: Some(record.value.to_vec()),
                    timestamp: record.timestamp.unwrap_or(time),
                    headers,
                    open,
                },
            );
            let p = d.producer(&self.name);
            let offset = match appended {
                Ok(offset) => offset,
                Err(e) => {
                    p.clock.failed(seq, channel)?;
                    return Err(e);
                }
            };
            let coordinate = channel.at(offset);
            p.clock.acked(seq, coordinate)?;
            if visible {
                d.after_write()?;
            }
            Ok(Acked { seq, coordinate })
        })
    }
}
