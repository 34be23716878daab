//! Writing the workload to Kafka: topics, the history (with a progress bar) and live traffic
//! on a thread of its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::ProgressBar;
use parsley_runtime::{Admin, TopicInfo, TopicSpec};
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use tracing::debug;

use crate::error::{Error, Result};
use crate::workload::{EventValue, History, Phase, Workload, parse_product, product_key};

/// Deadline of a producer flush.
const FLUSH_DEADLINE: Duration = Duration::from_secs(60);

/// Wall-clock time, ms since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Creates every topic of `workload` (fresh names expected) with `retention.ms = -1`: days
/// of history must not meet the broker's time-based retention while a run reads them.
///
/// # Errors
/// [`Error::Runtime`] from the admin call.
pub fn create_topics(admin: &Admin, workload: &Workload) -> Result<Vec<TopicInfo>> {
    let specs: Vec<TopicSpec> = workload
        .topics()
        .into_iter()
        .map(|t| TopicSpec::new(t, workload.config().partitions).config("retention.ms", "-1"))
        .collect();
    admin
        .create_topics(&specs)
        .map_err(|e| Error::runtime("creating the workload's topics", e))
}

/// A live event the broker acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// Product index.
    pub product: u32,
    /// Event time (= when it was produced), ms since the epoch.
    pub event_time_ms: i64,
}

/// Counts the records the broker did not acknowledge; logs the live events it did, if asked.
#[derive(Default)]
struct Acks {
    failed: AtomicU64,
    first: Mutex<Option<String>>,
    /// `Some`: every acknowledged live event is logged here.
    live: Option<Mutex<Vec<Acked>>>,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first.lock() {
                    first.get_or_insert_with(|| e.to_string());
                }
            }
            Ok(m) => {
                let Some(log) = &self.live else { return };
                let live = m
                    .payload()
                    .and_then(|v| EventValue::decode(v).ok())
                    .is_some_and(|v| v.phase == Phase::Live);
                let product = m.key().and_then(|k| parse_product(k).ok());
                if let (true, Some(product), Some(event_time_ms)) =
                    (live, product, m.timestamp().to_millis())
                    && let Ok(mut log) = log.lock()
                {
                    log.push(Acked {
                        product,
                        event_time_ms,
                    });
                }
            }
        }
    }
}

/// An idempotent producer that reports lost records.
struct Writer {
    producer: BaseProducer<Acks>,
    what: &'static str,
}

impl Writer {
    fn new(bootstrap: &str, what: &'static str, linger_ms: u32, log_live: bool) -> Result<Self> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            // The Java client's partitioner, which the workload's product partitions and the
            // stages' key check assume (librdkafka's default, consistent_random, is CRC32).
            .set("partitioner", "murmur2_random")
            .set("enable.idempotence", "true")
            .set("linger.ms", linger_ms.to_string())
            .set("queue.buffering.max.messages", "200000")
            .create_with_context(Acks {
                live: log_live.then(Mutex::default),
                ..Acks::default()
            })
            .map_err(|e| Error::kafka(format!("creating the {what} producer"), e))?;
        Ok(Writer { producer, what })
    }

    /// Enqueues one record; a full queue is waited out by serving delivery reports (evidence
    /// of progress), never by sleeping.
    fn send(&self, topic: &str, key: &str, value: &str, timestamp_ms: i64) -> Result<()> {
        let mut record = BaseRecord::to(topic)
            .key(key)
            .payload(value)
            .timestamp(timestamp_ms);
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => {
                    return Err(Error::kafka(format!("sending a {} record", self.what), e));
                }
            }
        }
    }

    /// Flushes and fails if any record was not acknowledged.
    fn finish(&self) -> Result<()> {
        self.producer
            .flush(FLUSH_DEADLINE)
            .map_err(|e| Error::kafka(format!("flushing the {} producer", self.what), e))?;
        let acks = self.producer.context();
        let failed = acks.failed.load(Ordering::Relaxed);
        if failed > 0 {
            let first = acks
                .first
                .lock()
                .map(|f| f.clone().unwrap_or_default())
                .unwrap_or_default();
            return Err(Error::Delivery {
                what: self.what,
                failed,
                first,
            });
        }
        Ok(())
    }
}

/// Writes the valid-products catalogue (one control record per product, timestamp = now) and
/// the history events (record timestamp = event time), in `history`'s order, ticking `bar`
/// once per record; returns when every record is acknowledged.
///
/// # Errors
/// [`Error::Kafka`] or [`Error::Delivery`].
pub fn write_history(
    bootstrap: &str,
    workload: &Workload,
    history: &History,
    bar: &ProgressBar,
) -> Result<()> {
    let writer = Writer::new(bootstrap, "history", 20, false)?;
    let topics = workload.event_topics();
    let control = workload.control_topic();
    let now = now_ms();
    for product in 0..workload.config().products {
        writer.send(&control, &product_key(product), "valid", now)?;
    }
    for (i, e) in history.events.iter().enumerate() {
        let value = EventValue {
            phase: Phase::History,
            seq: e.seq,
        };
        writer.send(
            &topics[e.topic],
            &product_key(e.product),
            &value.encode(),
            e.event_time_ms,
        )?;
        if i % 1024 == 0 {
            bar.set_position(i as u64);
            writer.producer.poll(Duration::ZERO);
        }
    }
    writer.finish()?;
    bar.set_position(history.events.len() as u64);
    Ok(())
}

/// What [`LiveTraffic`] reports while it runs.
#[derive(Debug, Default)]
pub struct LiveProgress {
    /// Live events enqueued so far.
    written: AtomicU64,
    /// Set once every live event is written and acknowledged (control records go on).
    done: Mutex<bool>,
    done_changed: Condvar,
}

impl LiveProgress {
    fn set_done(&self) {
        if let Ok(mut d) = self.done.lock() {
            *d = true;
        }
        self.done_changed.notify_all();
    }
}

/// What live traffic wrote.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LiveSummary {
    /// Live events.
    pub records: u64,
    /// Control records.
    pub control_records: u64,
    /// Every live event the broker acknowledged, in acknowledgement order.
    pub acked: Vec<Acked>,
}

/// Live traffic on its own thread: `live_rate` events per second for `live_ms` (event time =
/// now), then control records only (if any), until [`LiveTraffic::stop`].
pub struct LiveTraffic {
    progress: Arc<LiveProgress>,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<LiveSummary>>,
}

impl LiveTraffic {
    /// Starts writing. `history` gives each product's next sequence number and last event
    /// time.
    ///
    /// # Errors
    /// [`Error::Kafka`] when the producer cannot be created, [`Error::Worker`] when the thread
    /// cannot be spawned.
    pub fn start(bootstrap: &str, workload: &Workload, history: &History) -> Result<Self> {
        let writer = Writer::new(bootstrap, "live", 1, true)?;
        let progress = Arc::new(LiveProgress::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s, w) = (progress.clone(), stop.clone(), workload.clone());
        let next_seq = history.per_product.clone();
        let last_ms = history.last_event_ms.clone();
        let handle = std::thread::Builder::new()
            .name("live-traffic".into())
            .spawn(move || live(&writer, &w, next_seq, last_ms, &p, &s))
            .map_err(|e| Error::Worker(format!("live-traffic: {e}")))?;
        Ok(LiveTraffic {
            progress,
            stop,
            handle,
        })
    }

    /// Live events written so far (all of them once [`LiveTraffic::is_done`]).
    pub fn records_written(&self) -> u64 {
        self.progress.written.load(Ordering::Acquire)
    }

    /// `true` once every live event is written and acknowledged.
    pub fn is_done(&self) -> bool {
        self.progress.done.lock().is_ok_and(|d| *d)
    }

    /// Waits until every live event is written and acknowledged, at most `timeout`; returns
    /// [`LiveTraffic::is_done`].
    pub fn wait_done(&self, timeout: Duration) -> bool {
        let Ok(d) = self.progress.done.lock() else {
            return false;
        };
        self.progress
            .done_changed
            .wait_timeout_while(d, timeout, |d| !*d)
            .is_ok_and(|(d, _)| *d)
    }

    /// Stops the control records (and live events, if still going) and reports.
    ///
    /// # Errors
    /// The writer's error, or [`Error::Worker`] if it panicked.
    pub fn stop(self) -> Result<LiveSummary> {
        self.stop.store(true, Ordering::Release);
        self.handle
            .join()
            .map_err(|_| Error::Worker("live-traffic".into()))?
    }
}

fn live(
    writer: &Writer,
    workload: &Workload,
    mut next_seq: Vec<u64>,
    mut last_ms: Vec<i64>,
    progress: &LiveProgress,
    stop: &AtomicBool,
) -> Result<LiveSummary> {
    let c = workload.config();
    let mut rng = StdRng::seed_from_u64(c.seed.wrapping_add(0x11fe));
    let topics = workload.event_topics();
    let control = workload.control_topic();
    let total = u64::from(c.live_rate) * c.live_ms / 1000;
    let per_partition: Vec<Vec<u32>> = (0..c.partitions).map(|p| workload.products_of(p)).collect();
    // No hand-run ticker: the next tick never comes.
    let ticker = c.control_interval_ms > 0;
    let tick = Duration::from_millis(c.control_interval_ms.max(1));
    let started = Instant::now();
    let mut next_tick = if ticker {
        started
    } else {
        started + Duration::from_secs(86_400 * 365)
    };
    let mut summary = LiveSummary::default();
    let mut records_done = total == 0;
    if records_done {
        progress.set_done();
    }
    while !stop.load(Ordering::Acquire) {
        let elapsed = started.elapsed();
        if !records_done {
            let due = (elapsed.as_millis() as u64 * u64::from(c.live_rate) / 1000).min(total);
            let silent_open = c
                .silent
                .is_none_or(|s| elapsed >= Duration::from_millis(s.live_delay_ms));
            while summary.records < due {
                let product = rng.random_range(0..c.products);
                let topic = workload.choose_topic(&mut rng, product, silent_open);
                let t = now_ms().max(last_ms[product as usize].saturating_add(1));
                last_ms[product as usize] = t;
                let seq = next_seq[product as usize];
                next_seq[product as usize] += 1;
                let value = EventValue {
                    phase: Phase::Live,
                    seq,
                };
                writer.send(&topics[topic], &product_key(product), &value.encode(), t)?;
                summary.records += 1;
                progress.written.store(summary.records, Ordering::Release);
            }
            if summary.records == total {
                writer.finish()?;
                records_done = true;
                progress.set_done();
                debug!(records = total, "live events written");
            }
        }
        if Instant::now() >= next_tick {
            let t = now_ms();
            for (p, products) in per_partition.iter().enumerate() {
                if products.is_empty() {
                    continue;
                }
                let product = products
                    [(summary.control_records as usize / per_partition.len()) % products.len()];
                // The key decides the partition; checked, so a tick never lands elsewhere.
                debug_assert_eq!(workload.partition_of(product), p as i32);
                writer.send(&control, &product_key(product), "valid", t)?;
                summary.control_records += 1;
            }
            next_tick += tick;
        }
        writer.producer.poll(Duration::ZERO);
        // Pacing the workload (shaping, not synchronisation): until the next record or tick.
        let next_record = if records_done {
            next_tick
        } else {
            started
                + Duration::from_micros((summary.records + 1) * 1_000_000 / u64::from(c.live_rate))
        };
        let wake = next_tick.min(next_record);
        if let Some(wait) = wake.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait.min(Duration::from_millis(5)));
        }
    }
    writer.finish()?;
    if let Some(log) = &writer.producer.context().live {
        summary.acked = std::mem::take(&mut *log.lock().map_err(|_| {
            Error::Worker("live-traffic: the acknowledgement log is poisoned".into())
        })?);
    }
    Ok(summary)
}
