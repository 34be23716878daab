//! The three baselines: what Flink and Kafka Streams jobs do, on real consumers.
//!
//! Each topic is read by its own rdkafka consumer on its own thread, as a Flink source would
//! be: it is assigned every partition of its topic from the beginning and starts after the
//! topic's configured start delay (topics whose consumers start at different speeds: the
//! startup race). Like a Flink source, each consumer thread keeps its own per-partition
//! watermarks and idleness and emits its status every `watermark_interval` (Flink's
//! `pipeline.auto-watermark-interval`, 200 ms by default) *in band*, after the records it
//! read: idleness is judged where records are read, so a backlog between a source and the
//! operator never makes a source look idle. The idle timers run from the job's start, as a
//! source operator's do while its consumer is still connecting. One operator thread combines
//! the statuses into a watermark that never moves back, keeps a timer queue
//! ([`TimerQueue`], the same sort Parsley uses) and releases everything parked at or below
//! the watermark, in ascending event time. No out-of-orderness is allowed beyond the
//! mechanism:
//!
//! - [`Mechanism::Window`]: a fixed event-time window `W`. The watermark is the highest event
//!   time seen on any input minus `W`; records are grouped in tumbling windows of `W` and a
//!   window is released, sorted by event time, when the watermark passes its end. A record of
//!   a window already released goes out at once.
//! - [`Mechanism::OneLayer`]: per-partition idleness. Every (topic, partition) is an input
//!   whose watermark is the highest event time it delivered; an input that delivered nothing
//!   for `idle` is idle and leaves the minimum until it delivers again.
//! - [`Mechanism::TwoLayer`]: the same per-partition idleness at the source (`source_idle`),
//!   each topic's source watermark being the minimum over its non-idle partitions; and a
//!   second, shorter idleness (`union_idle`) at the union of the topic streams: a topic that
//!   sent nothing for `union_idle` leaves the union's minimum.
//!
//! With the idleness mechanisms, the control topic (valid products, no event time) is a source
//! whose watermark is processing time minus the control lag (a processing-time generator,
//! emitting from the job's start), and it is never idle: once every event input is idle, the
//! clock runs at "now".
//!
//! A record whose event time is below the watermark when it arrives is released at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parsley_gate::{Parking, Released, TimerQueue};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::error::{Error, Result};
use crate::measure::Release;
use crate::produce::now_ms;
use crate::workload::{EventValue, Phase, Workload, parse_product};

/// How a baseline decides that event time has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// A fixed event-time window of `window_ms` (module docs).
    Window {
        /// The window, ms of event time.
        window_ms: i64,
    },
    /// Idleness at the source per partition, then a shorter one per topic at the union.
    TwoLayer {
        /// A partition with no record for this long is idle at its source.
        source_idle: Duration,
        /// A topic with no record for this long is idle at the union.
        union_idle: Duration,
    },
    /// Idleness per partition across all inputs, one timeout.
    OneLayer {
        /// A partition with no record for this long is idle.
        idle: Duration,
    },
}

/// Settings of a baseline run.
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineSettings {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// How often the watermark is emitted.
    pub watermark_interval: Duration,
    /// The control source's watermark is processing time minus this, ms.
    pub control_lag_ms: i64,
    /// Per topic, in [`Workload::topics`] order (event topics, then the control topic): how
    /// long after the job's start its consumer starts.
    pub start_delays: Vec<Duration>,
}

/// A record as a consumer thread hands it to the operator.
struct Fetched {
    product: u32,
    value: EventValue,
    event_time_ms: i64,
    arrived: Instant,
}

enum Msg {
    /// Records of one topic, in fetch order.
    Records(Vec<Fetched>),
    /// A source's periodic status, after the records it read before it.
    Status(usize, SourceStatus),
}

/// A partition's state as its source reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PartitionStatus {
    /// No record for the idle timeout.
    idle: bool,
    /// Highest event time read, ms.
    max_event_ms: Option<i64>,
}

/// What a source emits every watermark interval.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SourceStatus {
    /// An event topic: its partitions, and whether the whole stream is idle (the union's
    /// layer; `false` when there is none).
    Events {
        partitions: Vec<PartitionStatus>,
        stream_idle: bool,
    },
    /// The control topic: processing time minus the lag, ms.
    Control(i64),
}

/// A source's own clock: per partition the highest event time and the last record.
#[derive(Debug, Clone)]
struct SourceClock {
    /// `(highest event time, last record or the job's start)` per partition.
    partitions: Vec<(Option<i64>, Instant)>,
    /// The last record of the topic, or the job's start.
    last: Instant,
}

impl SourceClock {
    fn new(partitions: i32, start: Instant) -> Self {
        SourceClock {
            partitions: vec![(None, start); partitions.max(0) as usize],
            last: start,
        }
    }

    fn record(&mut self, partition: i32, event_time_ms: i64, at: Instant) {
        if let Some(p) = self.partitions.get_mut(partition as usize) {
            p.0 = p.0.max(Some(event_time_ms));
            p.1 = at;
        }
        self.last = at;
    }

    /// The status at `now`: a partition with no record for `partition_idle` is idle; the stream
    /// is idle after `stream_idle` without records, if that layer exists.
    fn status(
        &self,
        now: Instant,
        partition_idle: Duration,
        stream_idle: Option<Duration>,
    ) -> SourceStatus {
        let idle = |last: Instant, t: Duration| now.saturating_duration_since(last) >= t;
        SourceStatus::Events {
            partitions: self
                .partitions
                .iter()
                .map(|&(max_event_ms, last)| PartitionStatus {
                    idle: idle(last, partition_idle),
                    max_event_ms,
                })
                .collect(),
            stream_idle: stream_idle.is_some_and(|t| idle(self.last, t)),
        }
    }
}

/// A running baseline job: one consumer thread per topic and the operator thread.
pub struct Job {
    stop: Arc<AtomicBool>,
    threads: Vec<(String, JoinHandle<Result<()>>)>,
}

impl Job {
    /// Starts the job on `workload`'s topics; every released event goes to `out`.
    ///
    /// # Errors
    /// [`Error::Config`] for start delays that do not match the topics, [`Error::Worker`]
    /// when a thread cannot be spawned.
    pub fn start(
        bootstrap: &str,
        workload: &Workload,
        settings: &BaselineSettings,
        out: Sender<Release>,
    ) -> Result<Job> {
        let topics = workload.topics();
        if settings.start_delays.len() != topics.len() {
            return Err(Error::config(
                "start_delays",
                format!(
                    "{} delays for {} topics",
                    settings.start_delays.len(),
                    topics.len()
                ),
            ));
        }
        let start = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut threads = Vec::new();
        let operator = Operator::new(workload, settings);
        let s = stop.clone();
        threads.push((
            "operator".to_string(),
            spawn("operator", move || operator.run(&rx, &out, &s))?,
        ));
        let (partition_idle, stream_idle) = match settings.mechanism {
            Mechanism::OneLayer { idle } => (idle, None),
            Mechanism::TwoLayer {
                source_idle,
                union_idle,
            } => (source_idle, Some(union_idle)),
            // The window has no idleness: its sources' statuses are not used.
            Mechanism::Window { .. } => (Duration::MAX, None),
        };
        for (i, topic) in topics.iter().enumerate() {
            let source = Source {
                bootstrap: bootstrap.to_string(),
                topic: topic.clone(),
                index: i,
                control: i == workload.config().event_topics,
                partitions: workload.config().partitions,
                start,
                start_at: start + settings.start_delays[i],
                interval: settings.watermark_interval.max(Duration::from_millis(1)),
                partition_idle,
                stream_idle,
                control_lag_ms: settings.control_lag_ms,
            };
            let (tx, s) = (tx.clone(), stop.clone());
            threads.push((topic.clone(), spawn(topic, move || source.run(&tx, &s))?));
        }
        Ok(Job { stop, threads })
    }

    /// Stops every thread and returns the first error any of them met.
    ///
    /// # Errors
    /// A consumer's or the operator's error, or [`Error::Worker`] for a panicked thread.
    pub fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Release);
        let mut first = Ok(());
        for (name, t) in self.threads {
            let r = t.join().map_err(|_| Error::Worker(name)).and_then(|r| r);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

fn spawn(
    name: &str,
    f: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<JoinHandle<Result<()>>> {
    std::thread::Builder::new()
        .name(format!("baseline-{name}"))
        .spawn(f)
        .map_err(|e| Error::Worker(format!("{name}: {e}")))
}

/// One topic's consumer, with its source clock.
struct Source {
    bootstrap: String,
    topic: String,
    index: usize,
    control: bool,
    partitions: i32,
    start: Instant,
    start_at: Instant,
    interval: Duration,
    partition_idle: Duration,
    stream_idle: Option<Duration>,
    control_lag_ms: i64,
}

impl Source {
    fn status(&self, clock: &SourceClock) -> SourceStatus {
        if self.control {
            SourceStatus::Control(now_ms() - self.control_lag_ms)
        } else {
            clock.status(Instant::now(), self.partition_idle, self.stream_idle)
        }
    }

    fn run(self, tx: &Sender<Msg>, stop: &AtomicBool) -> Result<()> {
        let mut clock = SourceClock::new(self.partitions, self.start);
        let mut next_emit = self.start + self.interval;
        // Emits the status when due; `false` once the operator is gone.
        let mut emit = |clock: &SourceClock| -> bool {
            if Instant::now() < next_emit {
                return true;
            }
            while next_emit <= Instant::now() {
                next_emit += self.interval;
            }
            tx.send(Msg::Status(self.index, self.status(clock))).is_ok()
        };
        // The configured startup race: this consumer connects late (workload shaping); the
        // source runs meanwhile, so its idle timers do too.
        while let Some(left) = self.start_at.checked_duration_since(Instant::now()) {
            if stop.load(Ordering::Acquire) || !emit(&clock) {
                return Ok(());
            }
            std::thread::sleep(left.min(Duration::from_millis(10)));
        }
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", format!("baseline-{}", self.topic))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .create()
            .map_err(|e| Error::kafka(format!("creating the consumer of {}", self.topic), e))?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition_offset(&self.topic, p, Offset::Beginning)
                .map_err(|e| Error::kafka("building an assignment", e))?;
        }
        consumer
            .assign(&tpl)
            .map_err(|e| Error::kafka(format!("assigning {}", self.topic), e))?;
        while !stop.load(Ordering::Acquire) {
            let mut batch = Vec::new();
            let mut wait = Duration::from_millis(10);
            while batch.len() < 1_000 {
                let Some(m) = consumer.poll(wait) else { break };
                wait = Duration::ZERO;
                let m = m.map_err(|e| Error::kafka(format!("polling {}", self.topic), e))?;
                if self.control {
                    continue;
                }
                let foreign = |why: String| Error::Foreign {
                    topic: self.topic.clone(),
                    partition: m.partition(),
                    offset: m.offset(),
                    why,
                };
                let product = parse_product(m.key().unwrap_or_default()).map_err(foreign)?;
                let value = EventValue::decode(m.payload().unwrap_or_default()).map_err(foreign)?;
                let event_time_ms = m
                    .timestamp()
                    .to_millis()
                    .ok_or_else(|| foreign("no record timestamp".into()))?;
                let arrived = Instant::now();
                clock.record(m.partition(), event_time_ms, arrived);
                batch.push(Fetched {
                    product,
                    value,
                    event_time_ms,
                    arrived,
                });
            }
            if !batch.is_empty() && tx.send(Msg::Records(batch)).is_err() {
                return Ok(());
            }
            if !emit(&clock) {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// What the operator parks.
struct Parked {
    seq: u64,
    phase: Phase,
    arrived: Instant,
}

/// The operator: combines the sources' statuses into a watermark and keeps the timer queue
/// (module docs).
struct Operator {
    mechanism: Mechanism,
    /// The latest status of each source (event topics, then control); `None` before its first.
    statuses: Vec<Option<SourceStatus>>,
    /// Highest event time seen on any input (the window's clock).
    max_seen_ms: Option<i64>,
    queue: TimerQueue<u32, Parked>,
}

impl Operator {
    fn new(workload: &Workload, settings: &BaselineSettings) -> Self {
        Operator {
            mechanism: settings.mechanism,
            statuses: vec![None; workload.topics().len()],
            max_seen_ms: None,
            queue: TimerQueue::new(),
        }
    }

    fn run(mut self, rx: &Receiver<Msg>, out: &Sender<Release>, stop: &AtomicBool) -> Result<()> {
        while !stop.load(Ordering::Acquire) {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Msg::Records(records)) => {
                    for r in records {
                        if let Some(released) = self.park(r) {
                            send(out, &[released]);
                        }
                    }
                }
                Ok(Msg::Status(source, status)) => {
                    if let Some(s) = self.statuses.get_mut(source) {
                        *s = Some(status);
                    }
                    if let Some(w) = self.watermark() {
                        let mut released = self.queue.advance(w);
                        if matches!(self.mechanism, Mechanism::Window { .. }) {
                            // A closed window goes out sorted by event time.
                            released.sort_by_key(|r| (r.event_time_ms, r.arrival));
                        }
                        send(out, &released);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        Ok(())
    }

    /// Parks one record; returns it when it is released at once.
    fn park(&mut self, r: Fetched) -> Option<Released<u32, Parked>> {
        self.max_seen_ms = self.max_seen_ms.max(Some(r.event_time_ms));
        let window_end = match self.mechanism {
            Mechanism::Window { window_ms } => {
                let w = window_ms.max(1);
                Some(r.event_time_ms.div_euclid(w) * w + w - 1)
            }
            _ => None,
        };
        let parked = Parked {
            seq: r.value.seq,
            phase: r.value.phase,
            arrived: r.arrived,
        };
        match self
            .queue
            .park(r.product, r.event_time_ms, window_end, parked)
        {
            Parking::Released(released) => Some(released),
            Parking::Parked { .. } => None,
        }
    }

    /// The combined watermark, ms; `None` while it is held (a source with no status yet, or
    /// an active input that has read nothing).
    fn watermark(&self) -> Option<i64> {
        if let Mechanism::Window { window_ms } = self.mechanism {
            return self.max_seen_ms.map(|m| m - window_ms);
        }
        let two_layers = matches!(self.mechanism, Mechanism::TwoLayer { .. });
        // Each contribution: `Some(t)`, or `None` to hold the watermark.
        let mut contributions: Vec<Option<i64>> = Vec::new();
        for status in &self.statuses {
            match status {
                None => return None,
                Some(SourceStatus::Control(t)) => contributions.push(Some(*t)),
                Some(SourceStatus::Events {
                    partitions,
                    stream_idle,
                }) => {
                    let active = partitions
                        .iter()
                        .filter(|p| !p.idle)
                        .map(|p| p.max_event_ms);
                    if !two_layers {
                        contributions.extend(active);
                    } else if !*stream_idle {
                        // The source's watermark: the minimum over its active partitions; a
                        // source whose partitions are all idle is idle.
                        let mut active = active.peekable();
                        if active.peek().is_some() {
                            contributions
                                .push(active.try_fold(i64::MAX, |m, p| p.map(|p| m.min(p))));
                        }
                    }
                }
            }
        }
        contributions
            .into_iter()
            .try_fold(None, |m: Option<i64>, c| {
                c.map(|c| Some(m.map_or(c, |m| m.min(c))))
            })
            .flatten()
    }
}

fn send(out: &Sender<Release>, released: &[Released<u32, Parked>]) {
    let now = Instant::now();
    for r in released {
        // The receiver is gone only when the run is over: nothing left to measure.
        let _ = out.send(Release {
            product: r.key,
            seq: r.value.seq,
            phase: r.value.phase,
            event_time_ms: r.event_time_ms,
            arrived: r.value.arrived,
            released: now,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::WorkloadConfig;

    fn operator(mechanism: Mechanism) -> Operator {
        let w = Workload::new(WorkloadConfig {
            event_topics: 2,
            partitions: 2,
            silent: None,
            ..WorkloadConfig::default()
        })
        .unwrap();
        let settings = BaselineSettings {
            mechanism,
            watermark_interval: Duration::from_millis(200),
            control_lag_ms: 100,
            start_delays: vec![Duration::ZERO; 3],
        };
        Operator::new(&w, &settings)
    }

    fn fetched(t: i64) -> Fetched {
        Fetched {
            product: 1,
            value: EventValue {
                phase: Phase::History,
                seq: 0,
            },
            event_time_ms: t,
            arrived: Instant::now(),
        }
    }

    fn p(idle: bool, max_event_ms: Option<i64>) -> PartitionStatus {
        PartitionStatus { idle, max_event_ms }
    }

    fn events(partitions: Vec<PartitionStatus>, stream_idle: bool) -> Option<SourceStatus> {
        Some(SourceStatus::Events {
            partitions,
            stream_idle,
        })
    }

    #[test]
    fn a_source_clock_marks_quiet_partitions_and_a_quiet_stream_idle() {
        let s = Instant::now();
        let ms = |n| s + Duration::from_millis(n);
        let mut c = SourceClock::new(2, s);
        c.record(0, 10, ms(400));
        let second = Duration::from_secs(1);
        assert_eq!(
            c.status(ms(1_000), second, Some(Duration::from_millis(500))),
            SourceStatus::Events {
                partitions: vec![p(false, Some(10)), p(true, None)],
                stream_idle: true,
            }
        );
        assert_eq!(
            c.status(ms(800), second, None),
            SourceStatus::Events {
                partitions: vec![p(false, Some(10)), p(false, None)],
                stream_idle: false,
            }
        );
    }

    #[test]
    fn one_layer_takes_the_minimum_over_active_partitions_and_the_control() {
        let mut op = operator(Mechanism::OneLayer {
            idle: Duration::from_secs(1),
        });
        op.statuses = vec![
            events(vec![p(false, Some(10)), p(false, Some(20))], false),
            events(vec![p(false, Some(30)), p(false, None)], false),
            Some(SourceStatus::Control(1_000)),
        ];
        // An active partition that read nothing holds the watermark.
        assert_eq!(op.watermark(), None);
        op.statuses[1] = events(vec![p(false, Some(30)), p(true, None)], false);
        assert_eq!(op.watermark(), Some(10));
        // Every event partition idle: the control stream's processing time.
        op.statuses[0] = events(vec![p(true, Some(10)), p(true, Some(20))], false);
        op.statuses[1] = events(vec![p(true, Some(30)), p(true, None)], false);
        assert_eq!(op.watermark(), Some(1_000));
        // A source with no status yet holds it.
        op.statuses[2] = None;
        assert_eq!(op.watermark(), None);
    }

    #[test]
    fn two_layers_drop_an_idle_stream_at_the_union() {
        let mut op = operator(Mechanism::TwoLayer {
            source_idle: Duration::from_secs(1),
            union_idle: Duration::from_millis(500),
        });
        op.statuses = vec![
            events(vec![p(false, Some(10)), p(false, Some(20))], false),
            events(vec![p(false, None), p(false, None)], true),
            Some(SourceStatus::Control(1_000)),
        ];
        assert_eq!(op.watermark(), Some(10));
        op.statuses[1] = events(vec![p(false, None), p(false, Some(5))], false);
        assert_eq!(op.watermark(), None);
        op.statuses[1] = events(vec![p(true, None), p(false, Some(5))], false);
        assert_eq!(op.watermark(), Some(5));
    }

    #[test]
    fn the_window_trails_the_highest_event_time_and_releases_whole_windows() {
        let mut op = operator(Mechanism::Window { window_ms: 100 });
        assert!(op.park(fetched(1_050)).is_none());
        assert_eq!(op.watermark(), Some(950));
        op.park(fetched(1_250));
        assert_eq!(op.watermark(), Some(1_150));
        let released = op.queue.advance(1_150);
        assert_eq!(released.len(), 1);
        // A record of a released window goes out at once.
        assert!(op.park(fetched(1_020)).is_some());
    }
}
