//! Offset completeness: the Parsley runtime stage with
//! [`order_by_event_time`](parsley_stage::StageBuilder::order_by_event_time) (completeness from end offsets) and
//! its live clock — the built-in clock ([`Clock::BuiltIn`]: the runtime writes and reads its
//! own ticks) or the hand-run control stream ([`Clock::Ticker`]: the workload's control topic,
//! written by the live traffic's ticker) — measured without touching the runtime.
//!
//! - **Release** is the handler call: the stage's handler, [`Tap`], reports each event it is
//!   handed (and, for tests, forwards it to an output topic, so the committed output is the
//!   release log).
//! - **Arrival** is the runtime's delivery journal: the `parsley::delivery` trace event
//!   ([`DELIVERY_TARGET`]) that the stream thread emits when the gate delivers a record into
//!   the task's timer queue. [`delivery_capture`] builds a `tracing` layer that keeps
//!   the instant of each such event until the handler is handed the record. The records of
//!   this workload carry no stamps, so the gate delivers each record in the poll that fetched
//!   it: the hold measured is the timer queue's, from delivery to release.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use parsley_runtime::{DELIVERY_TARGET, Running, Runtime, RuntimeConfig};
use parsley_stage::{EventTimeOrder, Handler, HandlerResult, Record, Step, Topology, Utf8};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;

use crate::error::{Error, Result};
use crate::measure::Release;
use crate::workload::{EventValue, Workload, parse_product};

/// Name of the stage.
pub const STAGE: &str = "order";

/// Delivery instants by topic, partition and offset, while the capture is installed. Cheap per
/// record, since it runs on the stage's thread for every delivery (it is measurement, not the
/// runtime's work): topics are interned once, and each `(topic, partition)` keeps its instants
/// in a vector indexed by offset (the workload's partitions are dense from offset 0).
#[derive(Default)]
struct Journal {
    /// Interned `(topic, partition)` pairs.
    channels: Vec<(String, i32)>,
    /// Per interned channel: the delivery instant of each offset recorded so far.
    instants: Vec<Vec<Option<Instant>>>,
    /// The channel of the last insert: deliveries come a poll batch at a time, mostly from one
    /// channel, and the workload's topic names differ only at their ends.
    last: usize,
}

impl Journal {
    fn find(&self, topic: &str, partition: i32) -> Option<usize> {
        let is = |(t, p): &(String, i32)| *p == partition && t == topic;
        if self.channels.get(self.last).is_some_and(is) {
            return Some(self.last);
        }
        self.channels.iter().position(is)
    }

    fn channel(&mut self, topic: &str, partition: i32) -> usize {
        let c = match self.find(topic, partition) {
            Some(i) => i,
            None => {
                self.channels.push((topic.to_string(), partition));
                self.instants.push(Vec::new());
                self.channels.len() - 1
            }
        };
        self.last = c;
        c
    }

    fn insert(&mut self, topic: &str, partition: i32, offset: i64, at: Instant) {
        let Ok(offset) = usize::try_from(offset) else {
            return;
        };
        let c = self.channel(topic, partition);
        let v = &mut self.instants[c];
        if v.len() <= offset {
            v.resize(offset + 1, None);
        }
        v[offset] = Some(at);
    }

    fn get(&self, topic: &str, partition: i32, offset: i64) -> Option<Instant> {
        let c = self.find(topic, partition)?;
        *self.instants[c].get(usize::try_from(offset).ok()?)?
    }

    fn remove(&mut self, topic: &str, partition: i32, offset: i64) {
        if let Some(c) = self.find(topic, partition)
            && let Some(slot) = usize::try_from(offset)
                .ok()
                .and_then(|o| self.instants[c].get_mut(o))
        {
            *slot = None;
        }
    }
}

fn journal() -> &'static Mutex<Journal> {
    static JOURNAL: OnceLock<Mutex<Journal>> = OnceLock::new();
    JOURNAL.get_or_init(Default::default)
}

/// Forgets every recorded delivery (call between runs).
pub fn clear_journal() {
    if let Ok(mut j) = journal().lock() {
        *j = Journal::default();
    }
}

/// A `tracing` layer that records the instant of every `parsley::delivery` event. Add it to
/// the process's subscriber with a filter that enables [`DELIVERY_TARGET`] at `TRACE`
/// ([`delivery_capture`] builds both); [`Tap`] reads what it records.
#[derive(Debug, Default, Clone, Copy)]
pub struct DeliveryCapture;

#[derive(Default)]
struct Coordinate {
    /// The topic, formatted into a buffer reused across events.
    topic: String,
    has_topic: bool,
    partition: Option<i64>,
    offset: Option<i64>,
}

impl Visit for Coordinate {
    fn record_i64(&mut self, field: &Field, value: i64) {
        match field.name() {
            "partition" => self.partition = Some(value),
            "offset" => self.offset = Some(value),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "topic" {
            self.topic.clear();
            self.topic.push_str(value);
            self.has_topic = true;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "topic" {
            // `topic = %name`: a Display value, rendered without quotes by `{:?}`.
            use std::fmt::Write as _;
            self.topic.clear();
            let _ = write!(self.topic, "{value:?}");
            self.has_topic = true;
        }
    }
}

impl<S: Subscriber> Layer<S> for DeliveryCapture {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != DELIVERY_TARGET {
            return;
        }
        let now = Instant::now();
        thread_local! {
            static BUFFER: std::cell::RefCell<Coordinate> = Default::default();
        }
        BUFFER.with_borrow_mut(|c| {
            c.has_topic = false;
            c.partition = None;
            c.offset = None;
            event.record(c);
            if let (true, Some(partition), Some(offset)) = (c.has_topic, c.partition, c.offset)
                && let Ok(mut j) = journal().lock()
            {
                j.insert(&c.topic, partition as i32, offset, now);
            }
        });
    }
}

/// The capture layer with its filter: add it to a subscriber, e.g.
/// `tracing_subscriber::registry().with(delivery_capture()).with(fmt_layer).init()`.
pub fn delivery_capture<S>() -> impl Layer<S> + Send + Sync
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::filter::{LevelFilter, Targets};
    DeliveryCapture.with_filter(Targets::new().with_target(DELIVERY_TARGET, LevelFilter::TRACE))
}

/// The stage's handler: reports each released event to the run and, if `output` is set,
/// forwards it there unchanged. Control records (with a hand-run ticker) are passed by.
#[derive(Debug)]
pub struct Tap {
    /// The hand-run control topic, if the stage reads one.
    control: Option<String>,
    /// Shared with each emission (no allocation per record).
    output: Option<Arc<str>>,
    out: Sender<Release>,
}

impl Handler for Tap {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> HandlerResult<String, String, ()> {
        let released = Instant::now();
        let mut j = journal()
            .lock()
            .map_err(|_| "the delivery journal is poisoned")?;
        if self.control.as_deref() == Some(r.topic) {
            j.remove(r.topic, r.partition, r.offset);
            return Ok(Step::none());
        }
        // Kept, not removed: a record released in a transaction that aborts is restored
        // parked and released again without a new delivery (counted as a duplicate).
        let arrived = j.get(r.topic, r.partition, r.offset);
        drop(j);
        let arrived = arrived.ok_or_else(|| {
            format!(
                "no delivery event for {}/{} at {}: install the delivery capture \
                 (offsets::delivery_capture) in the process's tracing subscriber",
                r.topic, r.partition, r.offset
            )
        })?;
        let product = parse_product(r.key.as_bytes())?;
        let value = EventValue::decode(r.value.as_bytes())?;
        // The receiver is gone only when the run is over.
        let _ = self.out.send(Release {
            product,
            seq: value.seq,
            phase: value.phase,
            event_time_ms: r.timestamp,
            arrived,
            released,
        });
        Ok(match &self.output {
            Some(topic) => Step::none().emit(Arc::clone(topic), r.key, r.value),
            None => Step::none(),
        })
    }
}

/// What moves the stage's clock once its inputs are live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The runtime's built-in clock (`EventTimeOrder::clock`): each task writes a tick to its
    /// partition of the stage's clock topic every `tick_interval_ms`, in its transaction. No
    /// ticker process, no control topic among the sources.
    BuiltIn {
        /// The tick interval, ms.
        tick_interval_ms: i64,
    },
    /// The hand-run control stream (`EventTimeOrder::control`): the workload's control topic,
    /// a source of the stage, ticked by the live traffic's writer.
    Ticker,
}

impl Clock {
    /// How it reads in the table and the log.
    pub fn describe(&self) -> String {
        match self {
            Clock::BuiltIn { tick_interval_ms } => {
                format!("built-in clock, a tick every {tick_interval_ms} ms")
            }
            Clock::Ticker => "hand-run control stream".to_string(),
        }
    }
}

/// Settings of the offset-completeness run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetsSettings {
    /// Order by event time (offset completeness); `false`: the same stage in arrival order,
    /// the reference row that shows what ordering costs.
    pub event_time: bool,
    /// The live clock.
    pub clock: Clock,
    /// The clock's lag, ms: live records wait until processing time passes their event time
    /// by this much.
    pub lag_ms: i64,
    /// The runtime's commit interval.
    pub commit_interval: Duration,
    /// Forward every released event to this topic (must exist), for tests.
    pub output: Option<String>,
}

/// The topics the stage reads: the event topics, and the control topic with a hand-run
/// ticker.
pub fn sources(workload: &Workload, clock: Clock) -> Vec<String> {
    match clock {
        Clock::BuiltIn { .. } => workload.event_topics(),
        Clock::Ticker => workload.topics(),
    }
}

/// The topology: one stage reading [`sources`], ordered by event time with `settings.clock`
/// (or, with `settings.event_time` off, in arrival order).
///
/// # Errors
/// [`Error::Config`] when the topology does not validate.
pub fn topology(
    application: &str,
    workload: &Workload,
    settings: &OffsetsSettings,
    out: Sender<Release>,
) -> Result<Topology> {
    let control = workload.control_topic();
    let tap = Tap {
        control: (settings.clock == Clock::Ticker).then(|| control.clone()),
        output: settings.output.as_deref().map(Arc::from),
        out,
    };
    // Unaligned, as the baselines it is compared with fetch every input as fast as it comes;
    // the `scale` binary measures the aligned drain.
    let order = match settings.clock {
        Clock::BuiltIn { tick_interval_ms } => EventTimeOrder::new()
            .clock(settings.lag_ms)
            .tick_interval_ms(tick_interval_ms),
        Clock::Ticker => EventTimeOrder::new().control(&control, settings.lag_ms),
    }
    .unaligned();
    Topology::builder(application)
        .stage(STAGE, tap, |s| {
            let s = sources(workload, settings.clock)
                .iter()
                .fold(s, |s, t| s.source(t));
            let s = match &settings.output {
                Some(o) => s.sink(o),
                None => s,
            };
            let s = s.key_codec(Utf8).value_codec(Utf8).output_codec(Utf8);
            if settings.event_time {
                s.order_by_event_time(order)
            } else {
                s
            }
        })
        .build()
        .map_err(|e| Error::config("topology", e.to_string()))
}

/// Starts the runtime on `topology`.
///
/// # Errors
/// [`Error::Runtime`] when it does not start.
pub fn start(bootstrap: &str, topology: Topology, settings: &OffsetsSettings) -> Result<Running> {
    Runtime::new(
        topology,
        RuntimeConfig::new(bootstrap).commit_interval(settings.commit_interval),
    )
    .start()
    .map_err(|e| Error::runtime("starting the offset-completeness stage", e))
}

/// Reads the runtime's pending progress events; fails with the stage's error if one failed.
///
/// # Errors
/// [`Error::StageFailed`].
pub fn check(running: &Running) -> Result<()> {
    while let Some(p) = running.next_progress(Duration::ZERO) {
        if let parsley_runtime::Progress::Failed { stage, error } = p {
            return Err(Error::StageFailed {
                stage,
                source: error,
            });
        }
    }
    Ok(())
}
