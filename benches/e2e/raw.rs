//! The baseline: a plain rdkafka transactional consume→produce loop, no stamps, no gate.
//!
//! One `read_committed` consumer in a group (subscribe, range assignment) and one
//! transactional producer; each record's key and value go to the same partition of the output
//! topic, and every commit interval the consumed offsets are added to the transaction, which
//! commits, and the next one begins. The client settings and the pacing are the runtime's own
//! (see `parsley-runtime`'s `stage.rs`): poll batches of at most 500 records, the first poll of
//! a batch waiting at most until the next commit is due, the interval counted from the start of
//! the previous commit, `fetch.wait.max.ms=50`, `fetch.queue.backoff.ms=10`,
//! `fetch.max.bytes=4194304`, `linger.ms=5`,
//! `retry.backoff.ms=10` — so the difference to the Parsley case is Parsley's own work.
//!
//! With a stamp length (`raw-stamped`, a reference mode) each output also carries a
//! stamp header of that many filler bytes, built per record as a client must (one
//! `OwnedHeaders` per send): what Parsley's wire format alone costs — librdkafka's header
//! allocation and copy, bigger batches for the broker — without Parsley's own work (gate,
//! clock, stamp encoding, changelog). The benchmark sets the length to the mean length of the
//! headers a Parsley run of the same workload wrote.
//!
//! With `--spin-ns`, the loop busy-waits that long after each send: work of a known cost in
//! its thread, in place of Parsley's, to measure how much work per record a throughput ratio
//! to the raw loops leaves room for.
//!
//! One trap for a hand-written loop: rdkafka 0.39's `commit_transaction` first calls `flush`,
//! which serves delivery reports with `BaseProducer::poll` in steps of up to 100 ms, and that
//! `poll` returns only when its timeout has passed. With sends still unacknowledged, every
//! commit then takes 100 ms longer than it needs (measured here: a live record's median
//! latency 260 ms instead of about 100 ms). The loop below serves the reports in 1 ms steps
//! until nothing is in flight before it commits; the runtime avoids the same trap by waiting on
//! its delivery callbacks and calling librdkafka's commit directly.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::statistics::{self, StatisticsFile};
use crate::worker::{Measured, WorkerArgs, check_deadline};

/// Most records taken from the consumer in one poll batch (the runtime's `MAX_BATCH`).
const MAX_BATCH: usize = 500;
/// Deadline of each blocking Kafka call (the runtime's default).
const TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the loop until the commit that covers `args.records` records; with `stamp_bytes`,
/// every output carries a stamp header of that many bytes (module docs).
///
/// # Errors
/// Any consumer, producer or transaction error: the benchmark stops.
pub fn run(args: &WorkerArgs, stamp_bytes: Option<usize>) -> Result<Measured> {
    let statistics = match &args.statistics {
        Some(path) => Some(StatisticsFile::create(path)?),
        None => None,
    };
    let mut consumer_config = ClientConfig::new();
    let mut producer_config = ClientConfig::new();
    if statistics.is_some() {
        let ms = statistics::INTERVAL.as_millis().to_string();
        consumer_config.set("statistics.interval.ms", &ms);
        producer_config.set("statistics.interval.ms", &ms);
    }
    let consumer: BaseConsumer<RawContext> = consumer_config
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &args.group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "range")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "50")
        .set("fetch.queue.backoff.ms", "10")
        .set("fetch.max.bytes", "4194304")
        .create_with_context(RawContext(statistics.clone()))
        .context("creating the consumer")?;
    let producer: BaseProducer<RawContext> = producer_config
        .set("bootstrap.servers", &args.bootstrap)
        .set("transactional.id", format!("{}-raw", args.group))
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("retry.backoff.ms", "10")
        .create_with_context(RawContext(statistics))
        .context("creating the transactional producer")?;
    producer
        .init_transactions(TIMEOUT)
        .context("initialising transactions")?;
    consumer
        .subscribe(&[&args.input])
        .context("subscribing to the input")?;
    producer
        .begin_transaction()
        .context("beginning a transaction")?;

    let stamp = stamp_bytes.map(|n| vec![0x5a_u8; n]);
    let interval = args.commit_interval();
    let started = Instant::now();
    let mut next_offsets: BTreeMap<i32, i64> = BTreeMap::new();
    let (mut committed, mut uncommitted, mut transactions) = (0u64, 0u64, 0u64);
    let mut first_fetch: Option<Instant> = None;
    let mut last_commit = Instant::now();
    // The end of the last commit: the run's end.
    let mut finished = last_commit;
    while committed < args.records {
        let mut timeout = interval
            .saturating_sub(last_commit.elapsed())
            .min(Duration::from_millis(100));
        for _ in 0..MAX_BATCH {
            let Some(polled) = consumer.poll(timeout) else {
                break;
            };
            let m = polled.context("polling the input")?;
            first_fetch.get_or_insert_with(Instant::now);
            let mut record = BaseRecord::to(&args.output)
                .partition(m.partition())
                .key(m.key().unwrap_or_default())
                .payload(m.payload().unwrap_or_default());
            if let Some(stamp) = &stamp {
                record = record.headers(OwnedHeaders::new_with_capacity(1).insert(Header {
                    key: parsley_clock::STAMP_HEADER,
                    value: Some(stamp.as_slice()),
                }));
            }
            send(&producer, record)?;
            spin(args.spin_ns);
            next_offsets.insert(m.partition(), m.offset() + 1);
            uncommitted += 1;
            timeout = Duration::ZERO;
        }
        producer.poll(Duration::ZERO);
        if last_commit.elapsed() >= interval {
            // The interval runs from the start of a commit, as in the runtime.
            let commit_started = Instant::now();
            if uncommitted > 0 {
                commit(&consumer, &producer, &args.input, &next_offsets)?;
                committed += uncommitted;
                uncommitted = 0;
                transactions += 1;
                if committed < args.records {
                    producer
                        .begin_transaction()
                        .context("beginning a transaction")?;
                }
                finished = Instant::now();
            }
            last_commit = commit_started;
        }
        check_deadline(started, "the raw loop")?;
    }
    let elapsed = first_fetch.map_or(Duration::ZERO, |t| finished.duration_since(t));
    Ok(Measured {
        records: committed,
        elapsed,
        transactions,
    })
}

/// The clients' context: librdkafka's statistics go to the file, when asked for; delivery
/// reports are only counted by librdkafka (`in_flight_count`).
struct RawContext(Option<StatisticsFile>);

impl ClientContext for RawContext {
    fn stats_raw(&self, statistics: &[u8]) {
        if let Some(file) = &self.0 {
            file.write(statistics);
        }
    }
}

impl ConsumerContext for RawContext {}

impl ProducerContext for RawContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// Busy-waits `ns` nanoseconds on this thread (`--spin-ns`; nothing for 0).
fn spin(ns: u64) {
    if ns == 0 {
        return;
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_nanos(ns) {
        std::hint::spin_loop();
    }
}

/// Sends `record`; when librdkafka's queue is full, serves delivery reports to make room.
fn send(producer: &BaseProducer<RawContext>, mut record: BaseRecord<'_, [u8], [u8]>) -> Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(e).context("sending to the output"),
        }
    }
}

/// Adds the consumed offsets to the open transaction and commits it, once every send is
/// acknowledged (see the module docs for why it does not leave that to `commit_transaction`).
fn commit(
    consumer: &BaseConsumer<RawContext>,
    producer: &BaseProducer<RawContext>,
    input: &str,
    next_offsets: &BTreeMap<i32, i64>,
) -> Result<()> {
    let mut offsets = TopicPartitionList::new();
    for (&partition, &next) in next_offsets {
        offsets
            .add_partition_offset(input, partition, Offset::Offset(next))
            .context("building the offsets to commit")?;
    }
    let started = Instant::now();
    while producer.in_flight_count() > 0 {
        producer.poll(Duration::from_millis(1));
        if started.elapsed() > TIMEOUT {
            bail!(
                "{} sends not acknowledged after {TIMEOUT:?}",
                producer.in_flight_count()
            );
        }
    }
    let metadata = consumer
        .group_metadata()
        .context("the consumer has no group metadata")?;
    producer
        .send_offsets_to_transaction(&offsets, &metadata, TIMEOUT)
        .context("sending offsets to the transaction")?;
    producer
        .commit_transaction(TIMEOUT)
        .context("committing the transaction")
}
