//! The load side, in the parent process: the preloaded backlog of the throughput phase, and
//! the paced producer and the `read_committed` output reader of the latency phase.
//!
//! Records carry an 8-byte decimal key (`partition_for(key)` picks their input partition, so
//! the raw loop's same-partition copy and the Parsley stage's keyed emission land alike) and
//! a value of exactly the payload size. In the latency phase the value starts with the send
//! time, µs since the Unix epoch (big-endian); a value starting with eight zero bytes is a
//! warm-up record.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use parsley_runtime::partition_for;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Deadline of a flush or of reading the expected records back.
const TIMEOUT: Duration = Duration::from_secs(300);

/// The key of record `i`.
fn key(i: u64) -> Vec<u8> {
    format!("{:08}", i % 100_000_000).into_bytes()
}

/// A value of `size` bytes (at least 8): the send time (µs since the epoch, 0 for none) then
/// filler.
fn value(size: usize, sent_us: u64) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size).map(|j| b'a' + (j % 26) as u8).collect();
    v[..8].copy_from_slice(&sent_us.to_be_bytes());
    v
}

/// µs since the Unix epoch.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A plain idempotent producer.
///
/// # Errors
/// When it cannot be created.
pub fn producer(bootstrap: &str, linger_ms: u32) -> Result<BaseProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", linger_ms.to_string())
        .create()
        .context("creating the load producer")
}

/// Sends `value` under `key` to `partition` of `topic`, serving delivery reports while the
/// queue is full.
fn send(
    producer: &BaseProducer,
    topic: &str,
    partition: i32,
    key: &[u8],
    value: &[u8],
) -> Result<()> {
    let mut record = BaseRecord::to(topic)
        .partition(partition)
        .key(key)
        .payload(value);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => return Err(e).with_context(|| format!("sending to {topic}")),
        }
    }
}

/// Writes `records` records of `payload` bytes to `topic` and waits until all are
/// acknowledged.
///
/// # Errors
/// When a send or the flush fails.
pub fn preload(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    records: u64,
    payload: usize,
) -> Result<()> {
    let producer = producer(bootstrap, 20)?;
    let value = value(payload, 0);
    for i in 0..records {
        let key = key(i);
        send(
            &producer,
            topic,
            partition_for(&key, partitions),
            &key,
            &value,
        )?;
        producer.poll(Duration::ZERO);
    }
    producer
        .flush(TIMEOUT)
        .with_context(|| format!("flushing the preload of {topic}"))
}

/// A `read_committed` reader of every partition of `topic` from its start.
///
/// # Errors
/// When the consumer cannot be created or assigned.
pub fn output_reader(bootstrap: &str, topic: &str, partitions: i32) -> Result<BaseConsumer> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-reader"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        // A fetch returns as soon as the last stable offset moves; this only bounds how long
        // an empty fetch waits, so it adds at most 10 ms to a measured latency.
        .set("fetch.wait.max.ms", "10")
        .create()
        .context("creating the output reader")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .context("building the reader's assignment")?;
    }
    consumer.assign(&tpl).context("assigning the output")?;
    Ok(consumer)
}

/// Sends one warm-up record to each input partition and waits until all of them are read
/// back from the output: the loop under test has joined its group and committed once, and
/// `producer` is connected with its producer id (so the paced load that follows on the same
/// producer does not measure client start-up).
///
/// # Errors
/// When they do not come back within the timeout.
pub fn warm_up(
    producer: &BaseProducer,
    input: &str,
    reader: &BaseConsumer,
    partitions: i32,
    payload: usize,
) -> Result<()> {
    for p in 0..partitions {
        send(
            producer,
            input,
            p,
            &key(u64::from(p.unsigned_abs())),
            &value(payload, 0),
        )?;
    }
    producer.flush(TIMEOUT).context("flushing the warm-up")?;
    let started = Instant::now();
    let mut seen = 0;
    while seen < partitions {
        if let Some(m) = reader.poll(Duration::from_millis(100)) {
            let m = m.context("reading the output")?;
            if sent_us(m.payload()) == Some(0) {
                seen += 1;
            }
        }
        if started.elapsed() > TIMEOUT {
            bail!("the warm-up records did not reach the output in {TIMEOUT:?}");
        }
    }
    Ok(())
}

/// The send time a value carries (`Some(0)` for a warm-up record).
fn sent_us(value: Option<&[u8]>) -> Option<u64> {
    let head: [u8; 8] = value?.get(..8)?.try_into().ok()?;
    Some(u64::from_be_bytes(head))
}

/// Writes `records` records at `rate` per second (each stamped with its send time) with
/// `producer` on a thread, and reads them back from the output with `reader`: the latency of
/// each, µs, in arrival order.
///
/// # Errors
/// When sending fails or the records do not all come back within the timeout.
pub fn measure_latency(
    producer: BaseProducer,
    input: &str,
    reader: &BaseConsumer,
    partitions: i32,
    payload: usize,
    records: u64,
    rate: u32,
) -> Result<Vec<u64>> {
    let input = input.to_string();
    let writer = std::thread::spawn(move || -> Result<()> {
        let started = Instant::now();
        for i in 0..records {
            let due = started + Duration::from_secs_f64(i as f64 / f64::from(rate));
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let key = key(i);
            let value = value(payload, now_us());
            send(
                &producer,
                &input,
                partition_for(&key, partitions),
                &key,
                &value,
            )?;
            producer.poll(Duration::ZERO);
        }
        producer.flush(TIMEOUT).context("flushing the paced load")
    });
    let mut writer = Some(writer);
    let mut latencies = Vec::with_capacity(records as usize);
    let mut written: Option<Instant> = None;
    while (latencies.len() as u64) < records {
        if let Some(m) = reader.poll(Duration::from_millis(100)) {
            let received = now_us();
            let m = m.context("reading the output")?;
            match sent_us(m.payload()) {
                Some(0) => {}
                Some(sent) => latencies.push(received.saturating_sub(sent)),
                None => bail!("an output record without a send time"),
            }
        }
        if let Some(w) = writer.take_if(|w| w.is_finished()) {
            w.join()
                .map_err(|_| anyhow::anyhow!("the paced producer panicked"))??;
            written = Some(Instant::now());
        }
        if written.is_some_and(|t| t.elapsed() > TIMEOUT) {
            bail!(
                "{} of {records} paced records came back within {TIMEOUT:?} of the last send",
                latencies.len()
            );
        }
    }
    if let Some(w) = writer {
        w.join()
            .map_err(|_| anyhow::anyhow!("the paced producer panicked"))??;
    }
    Ok(latencies)
}

/// The stamp header lengths of the first records of an output topic.
#[derive(Debug, Clone, Copy)]
pub struct StampLengths {
    /// Records read.
    pub records: u64,
    /// Mean header value length, bytes.
    pub mean: f64,
    /// Shortest, bytes.
    pub min: usize,
    /// Longest, bytes.
    pub max: usize,
}

/// Reads `records` records of `topic` from the middle of its partitions (a run's start, with
/// nothing acknowledged yet, writes shorter stamps than its steady state) and measures their
/// stamp header values.
///
/// # Errors
/// When the topic cannot be read, a record has no stamp header, or fewer than `records`
/// records come back within the timeout.
pub fn stamp_lengths(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    records: u64,
) -> Result<StampLengths> {
    let reader = output_reader(bootstrap, topic, partitions)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (low, high) = reader
            .fetch_watermarks(topic, p, TIMEOUT)
            .with_context(|| format!("reading the end offsets of {topic}"))?;
        tpl.add_partition_offset(topic, p, Offset::Offset(low + (high - low) / 2))
            .context("building the reader's assignment")?;
    }
    reader.assign(&tpl).context("assigning the output")?;
    let (mut n, mut sum, mut min, mut max) = (0u64, 0u64, usize::MAX, 0usize);
    let started = Instant::now();
    while n < records {
        let Some(m) = reader.poll(Duration::from_millis(100)) else {
            if started.elapsed() > TIMEOUT {
                bail!("{n} of {records} records of {topic} read within {TIMEOUT:?}");
            }
            continue;
        };
        let m = m.with_context(|| format!("reading {topic}"))?;
        let len = m
            .headers()
            .and_then(|h| {
                h.iter()
                    .find(|h| parsley_clock::is_stamp_header(h.key))
                    .map(|h| h.value.map_or(0, <[u8]>::len))
            })
            .with_context(|| format!("a record of {topic} without a stamp header"))?;
        n += 1;
        sum += len as u64;
        min = min.min(len);
        max = max.max(len);
    }
    Ok(StampLengths {
        records: n,
        mean: sum as f64 / n.max(1) as f64,
        min,
        max,
    })
}
