//! The three baselines: what Flink and Kafka Streams jobs do, on real consumers.
//!
//! Each topic is read by its own rdkafka consumer on its own thread, as a Flink source would
//! be: it is assigned every partition of its topic from the beginning and starts after the
//! topic's configured start delay (topics whose consumers start at different speeds: the
//! startup race). The consumers hand records to one operator thread that keeps a watermark and
//! a timer queue ([`TimerQueue`], the same sort Parsley uses) and releases everything parked at
//! or below the watermark, in ascending event time. The watermark is emitted periodically,
//! every `watermark_interval` (Flink's `pipeline.auto-watermark-interval`, 200 ms by default),
//! never moves back, and allows no out-of-orderness beyond its mechanism:
//!
//! - [`Mechanism::Window`]: a fixed event-time window `W`. The watermark is the highest event
//!   time seen on any input minus `W`; records are grouped in tumbling windows of `W` and a
//!   window is released, sorted by event time, when the watermark passes its end. A record of
//!   a window already released goes out at once.
//! - [`Mechanism::OneLayer`]: per-partition idleness. Every (topic, partition) is an input
//!   whose watermark is the highest event time it delivered; an input that delivered nothing
//!   for `idle` is idle and leaves the minimum until it delivers again. The idle timers run
//!   from the job's start, as a source operator's do while its consumer is still connecting.
//! - [`Mechanism::TwoLayer`]: the same per-partition idleness at the source (`source_idle`),
//!   each topic's source watermark being the minimum over its non-idle partitions; and a
//!   second, shorter idleness (`union_idle`) at the union of the topic streams: a topic that
//!   sent nothing for `union_idle` leaves the union's minimum.
//!
//! With the idleness mechanisms, the control topic (valid products, no event time) is a source
//! whose watermark is processing time minus the control lag from the moment its consumer runs,
//! and it is never idle: once every event input is idle, the clock runs at "now".
//!
//! A record whose event time is below the watermark when it arrives is released at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
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
    partition: i32,
    product: u32,
    value: EventValue,
    event_time_ms: i64,
    arrived: Instant,
}

enum Msg {
    /// The topic's consumer is running.
    Started(usize),
    /// Records of one topic, in fetch order.
    Records(usize, Vec<Fetched>),
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
                format!("{} delays for {} topics", settings.start_delays.len(), topics.len()),
            ));
        }
        let start = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut threads = Vec::new();
        let operator = Operator::new(workload, settings, start);
        let s = stop.clone();
        threads.push((
            "operator".to_string(),
            spawn("operator", move || operator.run(&rx, &out, &s))?,
        ));
        for (i, topic) in topics.iter().enumerate() {
            let source = Source {
                bootstrap: bootstrap.to_string(),
                topic: topic.clone(),
                index: i,
                control: i == workload.config().event_topics,
                partitions: workload.config().partitions,
                start_at: start + settings.start_delays[i],
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

fn spawn(name: &str, f: impl FnOnce() -> Result<()> + Send + 'static) -> Result<JoinHandle<Result<()>>> {
    std::thread::Builder::new()
        .name(format!("baseline-{name}"))
        .spawn(f)
        .map_err(|e| Error::Worker(format!("{name}: {e}")))
}

/// One topic's consumer.
struct Source {
    bootstrap: String,
    topic: String,
    index: usize,
    control: bool,
    partitions: i32,
    start_at: Instant,
}

impl Source {
    fn run(self, tx: &Sender<Msg>, stop: &AtomicBool) -> Result<()> {
        // The configured startup race: this consumer connects late (workload shaping).
        while let Some(left) = self.start_at.checked_duration_since(Instant::now()) {
            if stop.load(Ordering::Acquire) {
                return Ok(());
            }
            std::thread::sleep(left.min(Duration::from_millis(20)));
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
        if tx.send(Msg::Started(self.index)).is_err() {
            return Ok(());
        }
        while !stop.load(Ordering::Acquire) {
            let mut batch = Vec::new();
            let mut wait = Duration::from_millis(50);
            while batch.len() < 2_000 {
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
                batch.push(Fetched {
                    partition: m.partition(),
                    product,
                    value,
                    event_time_ms,
                    arrived: Instant::now(),
                });
            }
            if !batch.is_empty() && tx.send(Msg::Records(self.index, batch)).is_err() {
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

/// Per (topic, partition) input of the operator.
#[derive(Debug, Clone, Copy)]
struct Input {
    /// Highest event time delivered, ms.
    max_event_ms: Option<i64>,
    /// The last record, or the job's start.
    last: Instant,
}

/// The operator: watermark and timer queue (module docs).
struct Operator {
    settings: BaselineSettings,
    /// `[topic][partition]`, event topics only.
    inputs: Vec<Vec<Input>>,
    /// Per event topic: its last record, or the job's start.
    topic_last: Vec<Instant>,
    control_started: bool,
    control_index: usize,
    /// Highest event time seen on any input (the window's clock).
    max_seen_ms: Option<i64>,
    queue: TimerQueue<u32, Parked>,
    start: Instant,
}

impl Operator {
    fn new(workload: &Workload, settings: &BaselineSettings, start: Instant) -> Self {
        let c = workload.config();
        let input = Input {
            max_event_ms: None,
            last: start,
        };
        Operator {
            settings: settings.clone(),
            inputs: vec![vec![input; c.partitions as usize]; c.event_topics],
            topic_last: vec![start; c.event_topics],
            control_started: false,
            control_index: c.event_topics,
            max_seen_ms: None,
            queue: TimerQueue::new(),
            start,
        }
    }

    fn run(mut self, rx: &Receiver<Msg>, out: &Sender<Release>, stop: &AtomicBool) -> Result<()> {
        let interval = self.settings.watermark_interval.max(Duration::from_millis(1));
        let mut next_emit = self.start + interval;
        while !stop.load(Ordering::Acquire) {
            let wait = next_emit.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Msg::Started(i)) => {
                    if i == self.control_index {
                        self.control_started = true;
                    }
                }
                Ok(Msg::Records(topic, records)) => {
                    for r in records {
                        if let Some(released) = self.park(topic, r) {
                            send(out, &[released]);
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let now = Instant::now();
            if now >= next_emit {
                if let Some(w) = self.watermark(now) {
                    let mut released = self.queue.advance(w);
                    if matches!(self.settings.mechanism, Mechanism::Window { .. }) {
                        // A closed window goes out sorted by event time.
                        released.sort_by_key(|r| (r.event_time_ms, r.arrival));
                    }
                    send(out, &released);
                }
                while next_emit <= now {
                    next_emit += interval;
                }
            }
        }
        Ok(())
    }

    /// Parks one record; returns it when it is released at once.
    fn park(&mut self, topic: usize, r: Fetched) -> Option<Released<u32, Parked>> {
        let input = &mut self.inputs[topic][r.partition as usize];
        input.max_event_ms = input.max_event_ms.max(Some(r.event_time_ms));
        input.last = r.arrived;
        self.topic_last[topic] = r.arrived;
        self.max_seen_ms = self.max_seen_ms.max(Some(r.event_time_ms));
        let window_end = match self.settings.mechanism {
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
        match self.queue.park(r.product, r.event_time_ms, window_end, parked) {
            Parking::Released(released) => Some(released),
            Parking::Parked { .. } => None,
        }
    }

    /// The watermark now, ms; `None` while an input that is not idle has delivered nothing.
    fn watermark(&self, now: Instant) -> Option<i64> {
        let idle = |last: Instant, timeout: Duration| now.saturating_duration_since(last) >= timeout;
        let control = self
            .control_started
            .then(|| now_ms() - self.settings.control_lag_ms);
        // `None` in the minimum holds the watermark (an active input with no data yet).
        let min_of = |values: &mut dyn Iterator<Item = Option<i64>>| -> Option<Option<i64>> {
            values.fold(None, |acc: Option<Option<i64>>, v| match acc {
                None => Some(v),
                Some(a) => Some(match (a, v) {
                    (Some(a), Some(v)) => Some(a.min(v)),
                    _ => None,
                }),
            })
        };
        match self.settings.mechanism {
            Mechanism::Window { window_ms } => self.max_seen_ms.map(|m| m - window_ms),
            Mechanism::OneLayer { idle: timeout } => {
                let mut active = self
                    .inputs
                    .iter()
                    .flatten()
                    .filter(|i| !idle(i.last, timeout))
                    .map(|i| i.max_event_ms)
                    .chain(control.map(Some));
                min_of(&mut active).flatten()
            }
            Mechanism::TwoLayer {
                source_idle,
                union_idle,
            } => {
                let mut sources = self
                    .inputs
                    .iter()
                    .zip(&self.topic_last)
                    .filter(|(_, last)| !idle(**last, union_idle))
                    .filter_map(|(partitions, _)| {
                        // `None`: the source is idle (every partition is).
                        let mut active = partitions
                            .iter()
                            .filter(|i| !idle(i.last, source_idle))
                            .map(|i| i.max_event_ms);
                        min_of(&mut active)
                    })
                    .chain(control.map(Some));
                min_of(&mut sources).flatten()
            }
        }
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

    fn operator(mechanism: Mechanism) -> (Operator, Instant) {
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
        let start = Instant::now();
        (Operator::new(&w, &settings, start), start)
    }

    fn fetched(partition: i32, t: i64, arrived: Instant) -> Fetched {
        Fetched {
            partition,
            product: 1,
            value: EventValue {
                phase: Phase::History,
                seq: 0,
            },
            event_time_ms: t,
            arrived,
        }
    }

    #[test]
    fn one_layer_holds_until_every_input_delivered_then_drops_idle_ones() {
        let (mut op, s) = operator(Mechanism::OneLayer {
            idle: Duration::from_secs(1),
        });
        let ms = |n| s + Duration::from_millis(n);
        op.park(0, fetched(0, 10, ms(1)));
        op.park(0, fetched(1, 20, ms(1)));
        op.park(1, fetched(0, 30, ms(1)));
        // Topic 1 partition 1 has delivered nothing and is not idle yet.
        assert_eq!(op.watermark(ms(500)), None);
        // It is idle after 1 s: the minimum of the others.
        assert_eq!(op.watermark(ms(1_000)), Some(10));
        // Everything idle and no control stream: nothing contributes.
        assert_eq!(op.watermark(ms(1_002)), None);
    }

    #[test]
    fn two_layers_drop_a_quiet_topic_at_the_union_first() {
        let (mut op, s) = operator(Mechanism::TwoLayer {
            source_idle: Duration::from_secs(1),
            union_idle: Duration::from_millis(300),
        });
        let ms = |n| s + Duration::from_millis(n);
        op.park(0, fetched(0, 10, ms(400)));
        op.park(0, fetched(1, 20, ms(400)));
        // Topic 1 sent nothing for 300 ms: out of the union; topic 0 holds at 10.
        assert_eq!(op.watermark(ms(500)), Some(10));
        // Topic 0 partition 0 idle at its source after 1 s without records.
        op.park(0, fetched(1, 25, ms(1_200)));
        assert_eq!(op.watermark(ms(1_450)), Some(25));
    }

    #[test]
    fn the_window_trails_the_highest_event_time_and_releases_whole_windows() {
        let (mut op, s) = operator(Mechanism::Window { window_ms: 100 });
        assert!(op.park(0, fetched(0, 1_050, s)).is_none());
        assert_eq!(op.watermark(s), Some(950));
        op.park(1, fetched(0, 1_250, s));
        assert_eq!(op.watermark(s), Some(1_150));
        let released = op.queue.advance(1_150);
        assert_eq!(released.len(), 1);
        // A record of a released window goes out at once.
        assert!(op.park(1, fetched(1, 1_020, s)).is_some());
    }
}
