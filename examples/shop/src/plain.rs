//! A plain rdkafka producer: idempotent, `acks=all`, keys placed by `murmur2_random` (Kafka's
//! Java partitioner, which Kafka Streams and Parsley place keys by), waiting for every
//! acknowledgement before it reports success.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use parsley::runtime::rdkafka::ClientConfig;
use parsley::runtime::rdkafka::client::ClientContext;
use parsley::runtime::rdkafka::error::{KafkaError, RDKafkaErrorCode};
use parsley::runtime::rdkafka::message::DeliveryResult;
use parsley::runtime::rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};

/// How long [`PlainProducer::finish`] may wait for the last acknowledgements.
const FLUSH_DEADLINE: Duration = Duration::from_secs(120);

/// Counts delivery reports.
#[derive(Default)]
struct Acks {
    acked: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<KafkaError>>,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.acked.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| e.clone());
                }
            }
        }
    }
}

/// An idempotent producer that counts what the broker acknowledged.
pub struct PlainProducer {
    producer: BaseProducer<Acks>,
    sent: u64,
}

impl std::fmt::Debug for PlainProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlainProducer")
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

impl PlainProducer {
    /// A producer for the cluster at `bootstrap`.
    ///
    /// # Errors
    /// When the client cannot be created.
    pub fn new(bootstrap: &str) -> Result<Self> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("partitioner", "murmur2_random")
            .create_with_context(Acks::default())
            .context("creating the producer")?;
        Ok(PlainProducer { producer, sent: 0 })
    }

    /// Queues one record (timestamp: now); waits only while librdkafka's queue is full.
    ///
    /// # Errors
    /// A record librdkafka refuses.
    pub fn send(&mut self, topic: &str, key: &[u8], value: &[u8]) -> Result<()> {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).key(key).payload(value);
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                // The queue is full: serve delivery reports, then try again.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.producer.poll(Duration::from_millis(100));
                }
                Err((e, _)) => return Err(e).context(format!("sending a record to {topic}")),
            }
        }
        self.sent += 1;
        self.producer.poll(Duration::ZERO);
        Ok(())
    }

    /// Waits until every record sent is acknowledged; returns how many were.
    ///
    /// # Errors
    /// A record the broker did not acknowledge (the first failure is named), or
    /// acknowledgements still missing after the deadline.
    pub fn finish(self) -> Result<u64> {
        self.producer
            .flush(FLUSH_DEADLINE)
            .context("waiting for the last acknowledgements")?;
        let acks = self.producer.context();
        let acked = acks.acked.load(Ordering::Relaxed);
        let failed = acks.failed.load(Ordering::Relaxed);
        if failed > 0 {
            let first = acks.first_error.lock().ok().and_then(|e| e.clone());
            bail!(
                "{failed} of {} records were not written; the first failure: {first:?}",
                self.sent
            );
        }
        if acked != self.sent {
            bail!(
                "{acked} of {} records acknowledged after the flush",
                self.sent
            );
        }
        Ok(acked)
    }
}
