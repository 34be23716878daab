//! Kafka-Streams-style windowed counting: stream time with grace, on a real consumer.
//!
//! One thread plays a Kafka Streams stream thread with exactly-once (v2) processing:
//!
//! - **one consumer** (`read_committed`) assigned every partition of the event topics from the
//!   beginning; **one task per partition number**, reading that partition of every event
//!   topic (the topics are co-partitioned), with a record queue per input partition;
//! - **which record next** (Kafka Streams' `PartitionGroup`): the head with the smallest
//!   timestamp among the task's non-empty queues, once the task is *ready*. With
//!   `max.task.idle.ms = 0` (the default since KIP-695) a task with an empty queue waits
//!   while that partition's lag is unknown (no fetch response yet) or above 0 (records on the
//!   broker not fetched yet), and goes on without it once its lag is known to be 0; with a
//!   positive `max.task.idle.ms` it waits that much longer; with `-1` it never waits. The lag
//!   is the high watermark of the consumer's latest fetch response for the partition
//!   (librdkafka's cached one) minus the consumer's position;
//! - **stream time** per task: the highest timestamp it has processed (`observedStreamTime`);
//! - **windowed count** per grace `g` (each grace on the same record sequence): a record
//!   whose window's end plus `g` is at or below stream time (after the record itself has
//!   advanced it) is dropped and counted (Kafka Streams: "Skipping record for expired
//!   window"); else it is counted in its window. A window's final result is emitted once
//!   stream time reaches its end plus `g` (`suppress(untilWindowCloses)`; the newer
//!   `EmitStrategy.onWindowClose` looks at most once per second by default and would emit
//!   later), and the window is dropped. Windows that stream time never passes are never
//!   emitted (reported as open at stop);
//! - **commits**: results go out through a transactional producer whose transaction commits
//!   every commit interval (`commit.interval.ms`, 100 ms under exactly-once), as a stream
//!   thread's do; a final result counts when a `read_committed` consumer reads it.
//!
//! A result is written to the grace's output topic, in the task's partition, keyed by the
//! product, with the value `"{window start} {count}"`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parsley::runtime::librdkafka::cached_high_watermark;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::WindowId;
use crate::error::{Error, Result};
use crate::workload::{Workload, parse_product, product_key};

/// Deadline of the producer's transactional calls.
const TXN_DEADLINE: Duration = Duration::from_secs(30);

/// Settings of a stream-time job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTimeSettings {
    /// Tumbling window size, ms.
    pub size_ms: i64,
    /// One windowed count per grace, ms; its results go to the output topic of the same index.
    pub graces_ms: Vec<i64>,
    /// Kafka Streams' `max.task.idle.ms`: 0 (the default) waits for partitions with unknown or
    /// positive lag; `-1` never waits (module docs).
    pub task_idle_ms: i64,
    /// The transaction's commit interval.
    pub commit_interval: Duration,
}

/// What the job reports at its stop, per grace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamTimeReport {
    /// Records dropped because their window had closed.
    pub dropped: Vec<u64>,
    /// Windows still open (never emitted).
    pub open: Vec<u64>,
    /// When each window's result was handed to the producer (before its commit).
    pub emitted: Vec<HashMap<WindowId, Instant>>,
}

/// Counters the job publishes while it runs.
#[derive(Debug, Default)]
struct Progress {
    /// Records processed, as of the last commit.
    committed_records: AtomicU64,
    /// Final results sent, as of the last commit.
    committed_results: AtomicU64,
}

/// The running job.
pub struct StreamTimeJob {
    stop: Arc<AtomicBool>,
    progress: Arc<Progress>,
    handle: JoinHandle<Result<StreamTimeReport>>,
}

impl StreamTimeJob {
    /// Starts the job on `workload`'s event topics, writing each grace's results to the
    /// output topic of the same index (they must exist), with consumer group and
    /// transactional id `{name}`.
    ///
    /// # Errors
    /// [`Error::Config`] when outputs and graces differ in number; [`Error::Kafka`] for the
    /// clients; [`Error::Worker`] when the thread cannot start.
    pub fn start(
        bootstrap: &str,
        workload: &Workload,
        outputs: &[String],
        name: &str,
        settings: &StreamTimeSettings,
    ) -> Result<Self> {
        if outputs.len() != settings.graces_ms.len() || settings.size_ms <= 0 {
            return Err(Error::config(
                "stream time",
                format!(
                    "{} outputs for {} graces, window {} ms",
                    outputs.len(),
                    settings.graces_ms.len(),
                    settings.size_ms
                ),
            ));
        }
        let topics = workload.event_topics();
        let partitions = workload.config().partitions;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", name)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            // As the Parsley runtime's consumer: the same fetch behaviour on both sides.
            .set("fetch.wait.max.ms", "50")
            .set("fetch.queue.backoff.ms", "10")
            .create()
            .map_err(|e| Error::kafka("creating the stream-time consumer", e))?;
        let mut tpl = TopicPartitionList::new();
        for t in &topics {
            for p in 0..partitions {
                tpl.add_partition_offset(t, p, Offset::Beginning)
                    .map_err(|e| Error::kafka("building the stream-time assignment", e))?;
            }
        }
        consumer
            .assign(&tpl)
            .map_err(|e| Error::kafka("assigning the stream-time consumer", e))?;
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("transactional.id", name)
            .set("linger.ms", "5")
            .create()
            .map_err(|e| Error::kafka("creating the stream-time producer", e))?;
        producer
            .init_transactions(TXN_DEADLINE)
            .map_err(|e| Error::kafka("initialising the stream-time transactions", e))?;
        let job = Job {
            consumer,
            producer,
            topics: topics.clone(),
            topic_index: topics
                .iter()
                .enumerate()
                .map(|(i, t)| (t.clone(), i))
                .collect(),
            outputs: outputs.to_vec(),
            tasks: (0..partitions)
                .map(|p| Task::new(p, topics.len(), settings.graces_ms.len()))
                .collect(),
            emitted: vec![HashMap::new(); settings.graces_ms.len()],
            settings: settings.clone(),
            sent: 0,
            processed: 0,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(Progress::default());
        let (s, p) = (stop.clone(), progress.clone());
        let handle = std::thread::Builder::new()
            .name("stream-time".into())
            .spawn(move || job.run(&s, &p))
            .map_err(|e| Error::Worker(format!("stream-time: {e}")))?;
        Ok(StreamTimeJob {
            stop,
            progress,
            handle,
        })
    }

    /// Records processed, as of the last commit.
    pub fn committed_records(&self) -> u64 {
        self.progress.committed_records.load(Ordering::Acquire)
    }

    /// Final results sent (all graces), as of the last commit.
    pub fn committed_results(&self) -> u64 {
        self.progress.committed_results.load(Ordering::Acquire)
    }

    /// `true` once the job's thread has ended (an error, or a stop).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Commits what is pending, stops, and reports.
    ///
    /// # Errors
    /// The job's error, or [`Error::Worker`] if it panicked.
    pub fn stop(self) -> Result<StreamTimeReport> {
        self.stop.store(true, Ordering::Release);
        self.handle
            .join()
            .map_err(|_| Error::Worker("stream-time".into()))?
    }
}

/// A record in a task's queue.
#[derive(Debug, Clone, Copy)]
struct Queued {
    product: u32,
    timestamp: i64,
}

/// One windowed count (one grace) of a task.
#[derive(Debug, Default)]
struct Windows {
    /// Open windows by start: count per product.
    open: BTreeMap<i64, HashMap<u32, u64>>,
    dropped: u64,
}

/// A task: the partition `partition` of every event topic.
struct Task {
    partition: i32,
    /// Per event topic: records fetched and not processed yet.
    queues: Vec<VecDeque<Queued>>,
    /// Per event topic: the consumer's position (the next offset it returns).
    positions: Vec<i64>,
    /// Per event topic: when an empty queue with lag 0 stops holding the task.
    idle_deadlines: Vec<Option<Instant>>,
    /// The highest timestamp processed.
    stream_time: Option<i64>,
    /// Per grace.
    windows: Vec<Windows>,
}

impl Task {
    fn new(partition: i32, topics: usize, graces: usize) -> Self {
        Task {
            partition,
            queues: vec![VecDeque::new(); topics],
            positions: vec![0; topics],
            idle_deadlines: vec![None; topics],
            stream_time: None,
            windows: (0..graces).map(|_| Windows::default()).collect(),
        }
    }

    /// Kafka Streams' `readyToProcess` (module docs); `lag(t)` is input `t`'s lag, `None` while
    /// unknown.
    fn ready(
        &mut self,
        idle_ms: i64,
        now: Instant,
        lag: impl Fn(usize, i64) -> Option<i64>,
    ) -> bool {
        if self.queues.iter().all(VecDeque::is_empty) {
            return false;
        }
        if idle_ms < 0 {
            return true;
        }
        for t in 0..self.queues.len() {
            if !self.queues[t].is_empty() {
                continue;
            }
            match lag(t, self.positions[t]) {
                Some(0) => {
                    let deadline = *self.idle_deadlines[t]
                        .get_or_insert(now + Duration::from_millis(idle_ms as u64));
                    if now < deadline {
                        return false;
                    }
                }
                // Unknown, or records on the broker not fetched yet.
                _ => {
                    self.idle_deadlines[t] = None;
                    return false;
                }
            }
        }
        true
    }

    /// Takes the head with the smallest timestamp (ties: the lower topic index).
    fn next(&mut self) -> Option<Queued> {
        let t = (0..self.queues.len())
            .filter_map(|t| self.queues[t].front().map(|q| (q.timestamp, t)))
            .min()?
            .1;
        self.idle_deadlines[t] = None;
        self.queues[t].pop_front()
    }

    /// Processes `r` in every grace's windows; returns the final results due, per grace:
    /// (grace index, product, window start, count).
    fn process(
        &mut self,
        r: Queued,
        size_ms: i64,
        graces_ms: &[i64],
    ) -> Vec<(usize, u32, i64, u64)> {
        let stream_time = self.stream_time.map_or(r.timestamp, |s| s.max(r.timestamp));
        self.stream_time = Some(stream_time);
        let start = super::window_start(r.timestamp, size_ms);
        let mut due = Vec::new();
        for (g, (w, grace)) in self.windows.iter_mut().zip(graces_ms).enumerate() {
            if start + size_ms + grace <= stream_time {
                w.dropped += 1;
            } else {
                *w.open
                    .entry(start)
                    .or_default()
                    .entry(r.product)
                    .or_insert(0) += 1;
            }
            while let Some(entry) = w.open.first_entry() {
                if *entry.key() + size_ms + grace > stream_time {
                    break;
                }
                let start = *entry.key();
                for (product, count) in entry.remove() {
                    due.push((g, product, start, count));
                }
            }
        }
        due
    }
}

/// The job's thread state.
struct Job {
    consumer: BaseConsumer,
    producer: BaseProducer,
    topics: Vec<String>,
    topic_index: HashMap<String, usize>,
    outputs: Vec<String>,
    tasks: Vec<Task>,
    settings: StreamTimeSettings,
    /// Per grace: when each result was sent.
    emitted: Vec<HashMap<WindowId, Instant>>,
    /// Results sent so far.
    sent: u64,
    /// Records processed so far.
    processed: u64,
}

impl Job {
    fn run(mut self, stop: &AtomicBool, progress: &Progress) -> Result<StreamTimeReport> {
        self.producer
            .begin_transaction()
            .map_err(|e| Error::kafka("beginning a stream-time transaction", e))?;
        let mut last_commit = Instant::now();
        while !stop.load(Ordering::Acquire) {
            self.poll()?;
            self.process()?;
            if last_commit.elapsed() >= self.settings.commit_interval {
                self.commit(progress)?;
                last_commit = Instant::now();
            }
        }
        self.commit(progress)?;
        Ok(StreamTimeReport {
            dropped: (0..self.outputs.len())
                .map(|g| self.tasks.iter().map(|t| t.windows[g].dropped).sum())
                .collect(),
            open: (0..self.outputs.len())
                .map(|g| {
                    self.tasks
                        .iter()
                        .map(|t| {
                            t.windows[g]
                                .open
                                .values()
                                .map(|m| m.len() as u64)
                                .sum::<u64>()
                        })
                        .sum()
                })
                .collect(),
            emitted: self.emitted,
        })
    }

    /// One poll batch into the tasks' queues: up to 2,000 records, waiting at most 10 ms
    /// for the first.
    fn poll(&mut self) -> Result<()> {
        let mut wait = Duration::from_millis(10);
        for _ in 0..2_000 {
            let Some(m) = self.consumer.poll(wait) else {
                break;
            };
            wait = Duration::ZERO;
            let m = m.map_err(|e| Error::kafka("polling the stream-time consumer", e))?;
            let Some(&t) = self.topic_index.get(m.topic()) else {
                continue;
            };
            let foreign = |why: String| Error::Foreign {
                topic: m.topic().to_string(),
                partition: m.partition(),
                offset: m.offset(),
                why,
            };
            let product = parse_product(m.key().unwrap_or_default()).map_err(foreign)?;
            let timestamp = m
                .timestamp()
                .to_millis()
                .ok_or_else(|| foreign("no record timestamp".into()))?;
            let task = self
                .tasks
                .get_mut(m.partition() as usize)
                .ok_or_else(|| foreign("a partition beyond the workload's".into()))?;
            task.queues[t].push_back(Queued { product, timestamp });
            task.positions[t] = m.offset() + 1;
        }
        Ok(())
    }

    /// Processes every task while it is ready.
    fn process(&mut self) -> Result<()> {
        let now = Instant::now();
        let idle = self.settings.task_idle_ms;
        for i in 0..self.tasks.len() {
            loop {
                let partition = self.tasks[i].partition;
                let (consumer, topics) = (&self.consumer, &self.topics);
                let lag = |t: usize, position: i64| {
                    cached_high_watermark(consumer, &topics[t], partition).map(|hw| hw - position)
                };
                if !self.tasks[i].ready(idle, now, lag) {
                    break;
                }
                let Some(r) = self.tasks[i].next() else { break };
                self.processed += 1;
                let due = self.tasks[i].process(r, self.settings.size_ms, &self.settings.graces_ms);
                for (g, product, start, count) in due {
                    self.send(g, partition, product, start, count)?;
                }
            }
        }
        Ok(())
    }

    fn send(
        &mut self,
        grace: usize,
        partition: i32,
        product: u32,
        start: i64,
        count: u64,
    ) -> Result<()> {
        let key = product_key(product);
        let value = format!("{start} {count}");
        let mut record = BaseRecord::to(&self.outputs[grace])
            .partition(partition)
            .key(&key)
            .payload(&value);
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(Error::kafka("sending a stream-time result", e)),
            }
        }
        self.sent += 1;
        self.emitted[grace]
            .entry((product, start))
            .or_insert_with(Instant::now);
        Ok(())
    }

    fn commit(&mut self, progress: &Progress) -> Result<()> {
        self.producer
            .commit_transaction(TXN_DEADLINE)
            .map_err(|e| Error::kafka("committing a stream-time transaction", e))?;
        progress
            .committed_records
            .store(self.processed, Ordering::Release);
        progress
            .committed_results
            .store(self.sent, Ordering::Release);
        self.producer
            .begin_transaction()
            .map_err(|e| Error::kafka("beginning a stream-time transaction", e))
    }
}

/// Parses a result as the job writes it: (product, window start, count).
pub fn parse_result(key: &[u8], value: &[u8]) -> Option<(u32, i64, u64)> {
    let product = parse_product(key).ok()?;
    let text = std::str::from_utf8(value).ok()?;
    let (start, count) = text.split_once(' ')?;
    Some((product, start.parse().ok()?, count.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(product: u32, timestamp: i64) -> Queued {
        Queued { product, timestamp }
    }

    #[test]
    fn stream_time_closes_windows_at_end_plus_grace_and_drops_what_comes_after() {
        let mut t = Task::new(0, 2, 2);
        let graces = [0, 500];
        assert!(t.process(q(1, 100), 1_000, &graces).is_empty());
        assert!(t.process(q(2, 900), 1_000, &graces).is_empty());
        // Stream time 1,000: window [0, 1000) closes without grace.
        let mut due = t.process(q(1, 1_000), 1_000, &graces);
        due.sort_unstable();
        assert_eq!(due, vec![(0, 1, 0, 1), (0, 2, 0, 1)]);
        // A record of the closed window: dropped without grace, counted with 500 ms.
        assert!(t.process(q(3, 999), 1_000, &graces).is_empty());
        assert_eq!((t.windows[0].dropped, t.windows[1].dropped), (1, 0));
        // Stream time 1,500 closes it with grace 500: three products.
        let mut due = t.process(q(1, 1_500), 1_000, &graces);
        due.sort_unstable();
        assert_eq!(due, vec![(1, 1, 0, 1), (1, 2, 0, 1), (1, 3, 0, 1)]);
        // Stream time never moves back: an older record does not reopen anything.
        assert!(t.process(q(1, 10), 1_000, &graces).is_empty());
        assert_eq!((t.windows[0].dropped, t.windows[1].dropped), (2, 1));
    }

    #[test]
    fn a_task_takes_the_smallest_head_and_waits_for_unknown_or_positive_lag() {
        let now = Instant::now();
        let mut t = Task::new(0, 2, 1);
        assert!(!t.ready(0, now, |_, _| Some(0)), "nothing queued");
        t.queues[0].push_back(q(1, 50));
        t.queues[0].push_back(q(1, 70));
        t.positions[0] = 2;
        // Input 1 is empty: its lag decides.
        assert!(
            !t.ready(0, now, |i, _| (i == 0).then_some(0)),
            "unknown lag"
        );
        assert!(
            !t.ready(0, now, |i, _| Some(if i == 1 { 3 } else { 0 })),
            "records to fetch"
        );
        assert!(
            t.ready(0, now, |_, _| Some(0)),
            "lag 0: enforced processing"
        );
        assert!(t.ready(-1, now, |_, _| None), "-1 never waits");
        let mut idle = Task::new(0, 2, 1);
        idle.queues[0].push_back(q(1, 50));
        assert!(
            !idle.ready(100, now, |_, _| Some(0)),
            "waits max.task.idle.ms"
        );
        assert!(idle.ready(100, now + Duration::from_millis(100), |_, _| Some(0)));
        t.queues[1].push_back(q(2, 60));
        assert_eq!(t.next().map(|r| r.timestamp), Some(50));
        assert_eq!(t.next().map(|r| r.timestamp), Some(60));
        assert_eq!(t.next().map(|r| r.timestamp), Some(70));
    }

    #[test]
    fn results_parse_back() {
        assert_eq!(parse_result(b"p00042", b"1000 3"), Some((42, 1_000, 3)));
        assert_eq!(parse_result(b"p00042", b"1000"), None);
        assert_eq!(parse_result(b"x", b"1000 3"), None);
    }
}
