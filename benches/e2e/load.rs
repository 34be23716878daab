//! The load side, in the parent process: the preloaded backlog of the throughput phase, and
//! the paced producer and the `read_committed` output reader of the latency phase.
//!
//! Records carry an 8-byte decimal key (`partition_for(key)`, murmur2 as Kafka's default
//! partitioner computes it, picks their input partition, so the raw loop's same-partition copy,
//! the Parsley stage's keyed emission and Kafka Streams' default partitioner land alike) and a
//! value of exactly the payload size. Record `i`'s key is `i` modulo the number of distinct
//! keys ([`Keys`]): `00000000`, `00000001`, … In the latency phase the value starts with the
//! send time, µs since the Unix epoch (big-endian); a value starting with eight zero bytes is a
//! warm-up record.
//!
//! [`final_counts`] reads a counting mode's output back and checks it against the input.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use parsley_runtime::partition_for;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Deadline of a flush or of reading the expected records back.
const TIMEOUT: Duration = Duration::from_secs(300);

/// How many distinct keys a preloaded input has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Keys {
    /// This many, cycled: record `i` has key `i % n`.
    Distinct(u64),
    /// Every record its own key (up to [`UNIQUE_KEYS`] records).
    Unique,
}

/// The most distinct 8-digit keys: inputs up to this many records have unique keys.
pub const UNIQUE_KEYS: u64 = 100_000_000;

impl Keys {
    /// Record `i`'s key is `i` modulo this.
    pub fn modulus(self) -> u64 {
        match self {
            Keys::Distinct(n) => n,
            Keys::Unique => UNIQUE_KEYS,
        }
    }

    /// The distinct keys among `records` records.
    pub fn among(self, records: u64) -> u64 {
        self.modulus().min(records)
    }

    /// The number of records with key number `k` among `records` records.
    pub fn count_of(self, k: u64, records: u64) -> u64 {
        let m = self.modulus();
        records / m + u64::from(k < records % m)
    }
}

impl FromStr for Keys {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "unique" {
            return Ok(Keys::Unique);
        }
        match s.replace('_', "").parse::<u64>() {
            Ok(n) if (1..=UNIQUE_KEYS).contains(&n) => Ok(Keys::Distinct(n)),
            _ => Err(format!(
                "{s:?}: expected `unique` or a number of keys from 1 to {UNIQUE_KEYS}"
            )),
        }
    }
}

impl fmt::Display for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Keys::Distinct(n) => write!(f, "{n} keys"),
            Keys::Unique => f.write_str("unique keys"),
        }
    }
}

/// The key of record `i` of an input with `keys`.
fn key(i: u64, keys: Keys) -> Vec<u8> {
    format!("{:08}", i % keys.modulus()).into_bytes()
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

/// Writes `records` records of `payload` bytes with `keys` to `topic` and waits until all
/// are acknowledged.
///
/// # Errors
/// When a send or the flush fails, or `keys` is unique and `records` more than
/// [`UNIQUE_KEYS`].
pub fn preload(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    records: u64,
    payload: usize,
    keys: Keys,
) -> Result<()> {
    if keys == Keys::Unique && records > UNIQUE_KEYS {
        bail!("{records} records cannot have unique 8-digit keys (at most {UNIQUE_KEYS})");
    }
    let producer = producer(bootstrap, 20)?;
    let value = value(payload, 0);
    for i in 0..records {
        let key = key(i, keys);
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

/// Writes one record to `partition` of `topic` (of `partitions` partitions), under the first
/// key murmur2 puts there ([`key_on`]), and waits for its acknowledgement.
///
/// # Errors
/// When the send or the flush fails.
pub fn send_one(
    producer: &BaseProducer,
    topic: &str,
    partition: i32,
    partitions: i32,
) -> Result<()> {
    send(
        producer,
        topic,
        partition,
        &key_on(partition, partitions),
        &value(8, 0),
    )?;
    producer
        .flush(TIMEOUT)
        .with_context(|| format!("flushing a record to {topic}/{partition}"))
}

/// Sends one 8-byte record under key number `k` (as the preload names keys, unique) to the
/// partition murmur2 gives it among `partitions`, without waiting for its acknowledgement.
///
/// # Errors
/// When the send fails.
pub fn send_keyed(producer: &BaseProducer, topic: &str, partitions: i32, k: u64) -> Result<()> {
    let key = key(k, Keys::Unique);
    send(
        producer,
        topic,
        partition_for(&key, partitions),
        &key,
        &value(8, 0),
    )?;
    producer.poll(Duration::ZERO);
    Ok(())
}

/// Waits until every record `producer` sent is acknowledged.
///
/// # Errors
/// When the flush times out.
pub fn flush(producer: &BaseProducer) -> Result<()> {
    producer.flush(TIMEOUT).context("flushing the producer")
}

/// The first key (`00000000`, `00000001`, …) that murmur2 puts on `partition` of `partitions`:
/// a record a stage's key-partition check accepts there.
fn key_on(partition: i32, partitions: i32) -> Vec<u8> {
    (0..)
        .map(|i| key(i, Keys::Unique))
        .find(|k| partition_for(k, partitions) == partition)
        .expect("murmur2 reaches every partition")
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
        let key = key_on(p, partitions);
        send(producer, input, p, &key, &value(payload, 0))?;
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
            let key = key(i, Keys::Unique);
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
            .with_context(|| {
                let keys: Vec<String> = m
                    .headers()
                    .map(|h| h.iter().map(|h| h.key.to_string()).collect())
                    .unwrap_or_default();
                format!(
                    "record {}/{} of {topic} has no stamp header (headers: {keys:?})",
                    m.partition(),
                    m.offset()
                )
            })?;
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

/// How a counting mode writes a count: Kafka Streams' `Long` serde (8 bytes, big-endian) or
/// Parsley's `Auto` codec for an `i64` (a JSON number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountEncoding {
    /// 8 bytes, big-endian.
    Long,
    /// A JSON number, as text.
    Json,
}

impl CountEncoding {
    /// The count in `bytes`, when they hold a non-negative count.
    fn decode(self, bytes: &[u8]) -> Option<u64> {
        match self {
            CountEncoding::Long => Some(u64::from_be_bytes(bytes.try_into().ok()?)),
            CountEncoding::Json => std::str::from_utf8(bytes).ok()?.parse().ok(),
        }
    }
}

/// The last count of every key, as a counting mode's output holds them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    /// Output records read (count updates).
    pub updates: u64,
    /// By key number (the key's digits): its last count, 0 when it had none.
    pub last: Vec<u64>,
}

impl Counts {
    /// Records that key number `k` was counted up to `count` (a later update of the same key
    /// replaces an earlier one: each key lives in one partition, read in order).
    ///
    /// # Errors
    /// When `k` is not a key of the input.
    pub fn update(&mut self, k: u64, count: u64) -> Result<()> {
        let keys = self.last.len();
        let slot = usize::try_from(k)
            .ok()
            .and_then(|k| self.last.get_mut(k))
            .with_context(|| format!("key {k:08} is not among the input's {keys} keys"))?;
        *slot = count;
        self.updates += 1;
        Ok(())
    }

    /// Checks the counts against an input of `records` records with `keys`: one update per
    /// record (the count's record cache is off on both sides) and each key's last count equal
    /// to its number of records.
    ///
    /// # Errors
    /// What differs: the number of updates, or the first keys whose counts differ.
    pub fn check(&self, records: u64, keys: Keys) -> Result<()> {
        let wrong: Vec<String> = (0..self.last.len() as u64)
            .filter(|&k| self.last[k as usize] != keys.count_of(k, records))
            .take(5)
            .map(|k| {
                format!(
                    "key {k:08}: {} instead of {}",
                    self.last[k as usize],
                    keys.count_of(k, records)
                )
            })
            .collect();
        if !wrong.is_empty() {
            bail!("counts differ from the input's: {}", wrong.join(", "));
        }
        if self.updates != records {
            bail!(
                "{} count updates for {records} input records (expected one per record)",
                self.updates
            );
        }
        Ok(())
    }
}

/// A consumer context that does not log the end of a partition as an error (rdkafka's default
/// context logs every error event; the checker asks for these events).
struct QuietEof;

impl ClientContext for QuietEof {
    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(
            error,
            KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
        ) {
            eprintln!("e2e: the output checker: {error}: {reason}");
        }
    }
}

impl ConsumerContext for QuietEof {}

/// Reads a counting mode's output `topic` to its end (`read_committed`, after the mode's
/// process has exited) and checks it against an input of `records` records with `keys`
/// ([`Counts::check`]); returns the number of distinct keys.
///
/// # Errors
/// When the topic cannot be read, holds a malformed record or a wrong count.
pub fn check_counts(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    records: u64,
    keys: Keys,
    encoding: CountEncoding,
) -> Result<u64> {
    let consumer: BaseConsumer<QuietEof> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-checker"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create_with_context(QuietEof)
        .context("creating the output checker")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .context("building the checker's assignment")?;
    }
    consumer.assign(&tpl).context("assigning the output")?;
    let mut counts = Counts {
        updates: 0,
        last: vec![0; usize::try_from(keys.among(records)).context("too many keys")?],
    };
    let mut at_end = std::collections::BTreeSet::new();
    let mut progress = Instant::now();
    while at_end.len() < partitions as usize {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(e).with_context(|| format!("reading {topic}")),
            Some(Ok(m)) => {
                let k = m
                    .key()
                    .and_then(|k| std::str::from_utf8(k).ok()?.parse::<u64>().ok())
                    .with_context(|| format!("a record of {topic} without a numeric key"))?;
                let count = m
                    .payload()
                    .and_then(|v| encoding.decode(v))
                    .with_context(|| format!("a record of {topic} without a {encoding:?} count"))?;
                counts.update(k, count)?;
                at_end.remove(&m.partition());
                progress = Instant::now();
            }
        }
        if progress.elapsed() > TIMEOUT {
            bail!(
                "reading {topic}: no record within {TIMEOUT:?}, {} of {partitions} partitions at their end",
                at_end.len()
            );
        }
    }
    counts.check(records, keys)?;
    Ok(counts.last.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_unique_or_a_number_and_count_records_per_key() {
        assert_eq!("unique".parse::<Keys>(), Ok(Keys::Unique));
        assert_eq!("10_000".parse::<Keys>(), Ok(Keys::Distinct(10_000)));
        assert!("0".parse::<Keys>().is_err());
        assert!("many".parse::<Keys>().is_err());
        assert!("100000001".parse::<Keys>().is_err());
        let ten = Keys::Distinct(10);
        assert_eq!((ten.among(25), ten.among(7)), (10, 7));
        // 25 records over 10 keys: keys 0–4 three times, 5–9 twice.
        let per_key: Vec<u64> = (0..10).map(|k| ten.count_of(k, 25)).collect();
        assert_eq!(per_key, [3, 3, 3, 3, 3, 2, 2, 2, 2, 2]);
        assert_eq!(per_key.iter().sum::<u64>(), 25);
        assert_eq!(Keys::Unique.among(1_000), 1_000);
        assert_eq!(Keys::Unique.count_of(999, 1_000), 1);
        assert_eq!(key(12_345, ten), b"00000005");
        assert_eq!(key(12_345, Keys::Unique), b"00012345");
    }

    #[test]
    fn each_partition_s_warm_up_key_is_one_murmur2_puts_there() {
        for p in 0..4 {
            assert_eq!(partition_for(&key_on(p, 4), 4), p);
        }
    }

    #[test]
    fn count_encodings_decode_kafka_streams_longs_and_json_numbers() {
        assert_eq!(CountEncoding::Long.decode(&7u64.to_be_bytes()), Some(7));
        assert_eq!(CountEncoding::Long.decode(b"7"), None);
        assert_eq!(CountEncoding::Json.decode(b"42"), Some(42));
        assert_eq!(CountEncoding::Json.decode(b"-1"), None);
    }

    #[test]
    fn the_count_check_wants_one_update_per_record_and_every_key_at_its_count() {
        let keys = Keys::Distinct(3);
        let mut counts = Counts {
            updates: 0,
            last: vec![0; 3],
        };
        // 7 records: keys 0, 1, 2, 0, 1, 2, 0.
        for (i, n) in [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2), (0, 3)] {
            counts.update(i, n).unwrap();
        }
        counts.check(7, keys).unwrap();
        assert!(counts.update(3, 1).is_err(), "key 3 is not in the input");
        let mut short = counts.clone();
        short.last[2] = 1;
        let err = short.check(7, keys).unwrap_err().to_string();
        assert!(err.contains("key 00000002: 1 instead of 2"), "{err}");
        let mut cached = counts.clone();
        cached.updates = 3;
        let err = cached.check(7, keys).unwrap_err().to_string();
        assert!(err.contains("3 count updates for 7"), "{err}");
    }
}
