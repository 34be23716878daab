//! A `read_committed` consumer that notes when each record of some topics became visible to
//! it: the built-in clock's ticks (when a tick's transaction committed) and windowed results
//! (when a final result was committed).
//!
//! It reads every partition from the beginning on a thread of its own and keeps, per record
//! its parse function accepts, the topic, partition, record timestamp and the instant the
//! record was polled. It asks the broker every 10 ms at most (`fetch.wait.max.ms`), so a
//! record is seen within that of its commit, plus the fetch's round trip.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::debug;

use crate::error::{Error, Result};

/// One record as the observer saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen<T> {
    /// Index of its topic in the list the observer was started with.
    pub topic: usize,
    /// Its partition.
    pub partition: i32,
    /// Its record timestamp, ms since the epoch (`-1`: none).
    pub timestamp: i64,
    /// When the observer polled it.
    pub at: Instant,
    /// What the parse function made of its key and value.
    pub item: T,
}

/// Parses a record's key and value (absent ones as empty); `None` skips the record.
pub type Parse<T> = Box<dyn Fn(&[u8], &[u8]) -> Option<T> + Send>;

/// The running observer.
pub struct Observer<T> {
    stop: Arc<AtomicBool>,
    seen: Arc<AtomicU64>,
    handle: JoinHandle<Result<Vec<Seen<T>>>>,
}

impl<T: Send + 'static> Observer<T> {
    /// Starts reading `topics` (name, partitions), each partition from the beginning, as a
    /// `read_committed` consumer with no group offsets.
    ///
    /// # Errors
    /// [`Error::Kafka`] for the consumer, [`Error::Worker`] when the thread cannot start.
    pub fn start(bootstrap: &str, topics: &[(String, i32)], parse: Parse<T>) -> Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set(
                "group.id",
                format!("observer-{:x}", crate::produce::now_ms()),
            )
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "10")
            .set("fetch.queue.backoff.ms", "10")
            .create()
            .map_err(|e| Error::kafka("creating the observer", e))?;
        let mut tpl = TopicPartitionList::new();
        for (topic, partitions) in topics {
            for p in 0..*partitions {
                tpl.add_partition_offset(topic, p, Offset::Beginning)
                    .map_err(|e| Error::kafka("building the observer's assignment", e))?;
            }
        }
        consumer
            .assign(&tpl)
            .map_err(|e| Error::kafka("assigning the observer", e))?;
        let names: Vec<String> = topics.iter().map(|(t, _)| t.clone()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), seen.clone());
        let handle = std::thread::Builder::new()
            .name("observer".into())
            .spawn(move || observe(&consumer, &names, &parse, &s, &n))
            .map_err(|e| Error::Worker(format!("observer: {e}")))?;
        Ok(Observer { stop, seen, handle })
    }

    /// Records seen (and accepted) so far.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::Acquire)
    }

    /// Stops and returns what it saw, in the order it saw it.
    ///
    /// # Errors
    /// The consumer's error, or [`Error::Worker`] if the thread panicked.
    pub fn stop(self) -> Result<Vec<Seen<T>>> {
        self.stop.store(true, Ordering::Release);
        self.handle
            .join()
            .map_err(|_| Error::Worker("observer".into()))?
    }
}

fn observe<T>(
    consumer: &BaseConsumer,
    topics: &[String],
    parse: &Parse<T>,
    stop: &AtomicBool,
    count: &AtomicU64,
) -> Result<Vec<Seen<T>>> {
    let mut seen = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let Some(m) = consumer.poll(Duration::from_millis(20)) else {
            continue;
        };
        let at = Instant::now();
        let m = match m {
            Ok(m) => m,
            // A topic the runtime is still creating.
            Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownPartition,
            )) => {
                debug!("observer: a topic is not there yet");
                continue;
            }
            Err(e) => return Err(Error::kafka("polling the observer", e)),
        };
        let Some(topic) = topics.iter().position(|t| t == m.topic()) else {
            continue;
        };
        let Some(item) = parse(m.key().unwrap_or_default(), m.payload().unwrap_or_default()) else {
            continue;
        };
        seen.push(Seen {
            topic,
            partition: m.partition(),
            timestamp: m.timestamp().to_millis().unwrap_or(-1),
            at,
            item,
        });
        count.fetch_add(1, Ordering::Release);
    }
    Ok(seen)
}
