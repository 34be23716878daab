//! The reference for the history drain target: a plain consumer group member reading the same
//! history, doing nothing with it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parsley_runtime::Admin;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;

use crate::error::{Error, Result};

/// How long a plain drain may take before it is reported as stuck.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(600);

/// What the plain consumer read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainDrain {
    /// Records read.
    pub records: u64,
    /// From creating the consumer (it joins a fresh group, as the runtime's stage does) until
    /// it had read every partition up to the end offset read before it started.
    pub elapsed: Duration,
}

/// Reads every partition of `topics` (each with `partitions` partitions) from the beginning up
/// to its high watermark read before starting, as a `read_committed` member of a fresh group
/// (subscribed, like the runtime), and times it.
///
/// # Errors
/// [`Error::Runtime`] for the end offsets, [`Error::Kafka`] for the consumer,
/// [`Error::Deadline`] after [`DRAIN_DEADLINE`].
pub fn drain(
    bootstrap: &str,
    admin: &Admin,
    topics: &[String],
    partitions: i32,
    group: &str,
) -> Result<PlainDrain> {
    let channels: Vec<(&str, i32)> = topics
        .iter()
        .flat_map(|t| (0..partitions).map(move |p| (t.as_str(), p)))
        .collect();
    let ends = admin
        .high_watermarks(&channels)
        .map_err(|e| Error::runtime("reading end offsets", e))?;
    let mut waiting: HashMap<(String, i32), i64> = channels
        .iter()
        .zip(&ends)
        .filter(|(_, end)| **end > 0)
        .map(|((t, p), end)| ((t.to_string(), *p), *end))
        .collect();
    let started = Instant::now();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| Error::kafka("creating the plain consumer", e))?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&names)
        .map_err(|e| Error::kafka("subscribing the plain consumer", e))?;
    let mut records = 0u64;
    while !waiting.is_empty() {
        if started.elapsed() > DRAIN_DEADLINE {
            return Err(Error::Deadline {
                what: format!(
                    "the plain consumer's end offsets ({} partitions left)",
                    waiting.len()
                ),
                deadline: DRAIN_DEADLINE,
            });
        }
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.map_err(|e| Error::kafka("polling the plain consumer", e))?;
        records += 1;
        let key = (m.topic().to_string(), m.partition());
        if waiting.get(&key).is_some_and(|end| m.offset() + 1 >= *end) {
            waiting.remove(&key);
        }
    }
    Ok(PlainDrain {
        records,
        elapsed: started.elapsed(),
    })
}
