//! Writes generated lines to a topic with a plain rdkafka producer.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use parsley::runtime::rdkafka::ClientConfig;
use parsley::runtime::rdkafka::client::ClientContext;
use parsley::runtime::rdkafka::error::{KafkaError, RDKafkaErrorCode};
use parsley::runtime::rdkafka::message::DeliveryResult;
use parsley::runtime::rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};

use crate::lines::LineGenerator;

/// How long the final flush may wait for the last acknowledgements.
const FLUSH_DEADLINE: Duration = Duration::from_secs(120);

/// What [`produce_lines`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Produced {
    /// Records acknowledged by the broker.
    pub records: u64,
    /// Words in them.
    pub words: u64,
    /// From the first send to the last acknowledgement.
    pub elapsed: Duration,
}

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

/// Writes `lines` lines of [`LineGenerator::new(seed)`](LineGenerator::new) to `topic` as
/// records without a key, with an idempotent producer (`acks=all`), and returns once the
/// broker has acknowledged every one of them. The topic must exist.
///
/// # Errors
/// A client that cannot be created, a record the broker did not acknowledge (the first
/// failure is named), or acknowledgements still missing after the final flush's deadline.
pub fn produce_lines(bootstrap: &str, topic: &str, lines: u64, seed: u64) -> Result<Produced> {
    let producer: BaseProducer<Acks> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("partitioner", "murmur2_random")
        .create_with_context(Acks::default())
        .context("creating the producer")?;
    let started = Instant::now();
    let mut words = 0u64;
    for line in LineGenerator::new(seed).take(lines as usize) {
        words += line.split_whitespace().count() as u64;
        let mut record: BaseRecord<'_, (), str> = BaseRecord::to(topic).payload(line.as_str());
        loop {
            match producer.send(record) {
                Ok(()) => break,
                // librdkafka's queue is full: serve delivery reports, then try again.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(100));
                }
                Err((e, _)) => return Err(e).context(format!("sending a line to {topic}")),
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer
        .flush(FLUSH_DEADLINE)
        .context("waiting for the last acknowledgements")?;
    let acks = producer.context();
    let (acked, failed) = (
        acks.acked.load(Ordering::Relaxed),
        acks.failed.load(Ordering::Relaxed),
    );
    if failed > 0 {
        let first = acks.first_error.lock().ok().and_then(|e| e.clone());
        bail!(
            "{failed} of {lines} lines were not written to {topic}; the first failure: {first:?}"
        );
    }
    if acked != lines {
        bail!("{acked} of {lines} lines acknowledged after the flush");
    }
    Ok(Produced {
        records: acked,
        words,
        elapsed: started.elapsed(),
    })
}
