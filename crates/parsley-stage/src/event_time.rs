//! A stage's event-time order ([`EventTimeOrder`]) and what moves its clock: nothing (the inputs
//! alone), a hand-run [`ControlStream`], or the [`BuiltInClock`] the runtime runs itself.
//!
//! Validation (in [`TopologyBuilder::build`](crate::TopologyBuilder::build), with every other
//! problem of the topology): a control topic is one of the stage's sources and not its only one,
//! a lag is `>= 0`, a tick interval is `> 0`, and a stage has a hand-run control stream or the
//! built-in clock, not both.
//!
//! At the bottom of the crate: it imports none of its modules (`topology` re-exports its types).

/// The built-in clock's tick interval unless [`EventTimeOrder::tick_interval_ms`] sets another:
/// 100 ms. Each task writes a tick at most this often; the clock trails wall time by about one
/// interval plus one commit interval (the runtime's default commit interval is 100 ms too).
pub const DEFAULT_TICK_INTERVAL_MS: i64 = 100;

/// How far beyond the watermark an input's records may go to the task before the rest of the
/// input waits, unless [`EventTimeOrder::max_drift_ms`] sets another: one minute.
pub const DEFAULT_MAX_DRIFT_MS: i64 = 60_000;

/// Orders a stage's deliveries by event time per task (completeness from end offsets; the book.s chapter
/// "Ordering by event time").
///
/// The **event time** of a record is its Kafka record timestamp, ms since the Unix epoch;
/// there is no extractor. On a source topic with `message.timestamp.type=CreateTime` (Kafka's
/// default) that is the time the producer set. On a topic with
/// `message.timestamp.type=LogAppendTime` the broker overwrites every record's timestamp with
/// the time it appended the record, so event time is **append time**: the stage orders that
/// source by when the broker wrote each record, which follows the partition's offset order,
/// whatever timestamps the producers gave (case C17). Each task parks every record the causal
/// gate delivers in a timer queue and hands it to the handler when the task's watermark reaches
/// it, in ascending event time (ties in delivery order). The watermark is moved only by
/// Kafka's evidence: the end offsets read at task start, the gate's frontiers and the last
/// stable offsets read after each poll batch, and, with a [`ControlStream`] or the
/// [`BuiltInClock`], processing time minus a lag. A record that arrives with an event time
/// below the watermark is handed over at once and counted as late.
///
/// ```
/// use parsley_stage::EventTimeOrder;
///
/// // The runtime's own clock: live records wait 500 ms, a tick every 100 ms (the default).
/// let order = EventTimeOrder::new().clock(500);
/// assert_eq!(order.clock.unwrap().tick_interval_ms, parsley_stage::DEFAULT_TICK_INTERVAL_MS);
/// let faster = EventTimeOrder::new().clock(500).tick_interval_ms(20);
/// assert_eq!(faster.clock.unwrap().tick_interval_ms, 20);
/// ```
///
/// # Watermark alignment
/// Records delivered above the watermark wait in the task's timer queue, in memory, and are
/// written to its changelog. When one input's history runs far ahead of another's in event
/// time — a partition holding a week while another is still at its first day — everything the
/// fast one delivers waits, and the queue would grow with the history. So the task aligns its
/// inputs, as Flink's watermark alignment does (FLIP-182, FLIP-217), record by record: a record
/// whose event time lies more than [`EventTimeOrder::max_drift_ms`] beyond the watermark is
/// held before the task (in memory, not delivered, not changelogged; a restart reads it again)
/// with every later record of its input, and goes on as the watermark rises. An input a blocked
/// record's claim waits on, an unordered input and one that has delivered nothing are never
/// held, and the input that holds the watermark always lets its next record go on, so alignment
/// cannot deadlock. What the queue holds is then about the drift's worth of each input's event
/// time, not the history. Live records run at most the lag ahead of the watermark and are never
/// held for it. On by default ([`DEFAULT_MAX_DRIFT_MS`]); [`EventTimeOrder::unaligned`] turns
/// it off.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventTimeOrder {
    /// The hand-run control stream; `None`: none.
    pub control: Option<ControlStream>,
    /// The built-in clock; `None`: none. Not together with `control`.
    pub clock: Option<BuiltInClock>,
    /// Watermark alignment: how far beyond the watermark an input's records may go to the task
    /// before the rest of the input waits, ms (`> 0`); `None`: no alignment.
    pub max_drift_ms: Option<i64>,
}

impl Default for EventTimeOrder {
    fn default() -> Self {
        EventTimeOrder {
            control: None,
            clock: None,
            max_drift_ms: Some(DEFAULT_MAX_DRIFT_MS),
        }
    }
}

impl EventTimeOrder {
    /// Event-time order with no control stream: once every input is caught up and at its live
    /// head, records are released on arrival (late ones counted). Watermark alignment is on,
    /// with a drift of [`DEFAULT_MAX_DRIFT_MS`].
    pub fn new() -> Self {
        EventTimeOrder::default()
    }

    /// Sets the watermark alignment's drift, ms (type docs): an input's record with a later
    /// event time than the watermark plus the drift waits, with the rest of its input, in memory
    /// before the task (up to 2 MiB per input, then its partition is paused at the consumer too,
    /// until it holds half of that) and goes on as the watermark rises; the stage's consumer
    /// fetches at most 256 KiB of one partition per response (`max.partition.fetch.bytes`,
    /// which a consumer property set on the runtime overrides). A value `<= 0` is
    /// reported by [`TopologyBuilder::build`](crate::TopologyBuilder::build).
    pub fn max_drift_ms(mut self, drift_ms: i64) -> Self {
        self.max_drift_ms = Some(drift_ms);
        self
    }

    /// Turns watermark alignment off: every input is fetched as fast as it comes, and the timer
    /// queue holds whatever runs ahead of the watermark.
    pub fn unaligned(mut self) -> Self {
        self.max_drift_ms = None;
        self
    }

    /// Adds a control stream: `topic` (one of the stage's sources, with no event time of its
    /// own) contributes processing time minus `lag_ms` milliseconds. Its records go to the
    /// handler like any other; the records and the service that writes them are the user's.
    pub fn control(mut self, topic: impl Into<String>, lag_ms: i64) -> Self {
        self.control = Some(ControlStream {
            topic: topic.into(),
            lag_ms,
        });
        self
    }

    /// Turns on the **built-in clock**: the runtime writes the ticks itself, and the watermark
    /// follows wall time minus `lag_ms` milliseconds (see [`BuiltInClock`]), a tick every
    /// [`DEFAULT_TICK_INTERVAL_MS`] unless [`EventTimeOrder::tick_interval_ms`] sets another.
    /// Called again, it changes the lag and keeps the interval.
    ///
    /// [`TopologyBuilder::build`](crate::TopologyBuilder::build) adds the clock's topic
    /// ([`clock_topic`]) to the stage's sources and to the topology's internal topics, and
    /// reports a negative lag or a hand-run [`EventTimeOrder::control`] stream on the same
    /// stage.
    pub fn clock(mut self, lag_ms: i64) -> Self {
        let tick_interval_ms = self
            .clock
            .map_or(DEFAULT_TICK_INTERVAL_MS, |c| c.tick_interval_ms);
        self.clock = Some(BuiltInClock {
            lag_ms,
            tick_interval_ms,
        });
        self
    }

    /// Sets the built-in clock's tick interval, ms (default [`DEFAULT_TICK_INTERVAL_MS`]). A
    /// value `<= 0` is reported by [`TopologyBuilder::build`](crate::TopologyBuilder::build).
    ///
    /// # Panics
    /// When the built-in clock is not turned on: call [`EventTimeOrder::clock`] first.
    pub fn tick_interval_ms(mut self, interval_ms: i64) -> Self {
        let clock = self
            .clock
            .as_mut()
            .expect("EventTimeOrder::tick_interval_ms: turn the built-in clock on first (clock)");
        clock.tick_interval_ms = interval_ms;
        self
    }
}

/// The control stream of an [`EventTimeOrder`]: a source topic with no event time whose
/// records tick the task's processing-time clock.
///
/// Its records are not parked: each is handed to the handler when the gate delivers it (after
/// its parked causal ancestors, if any), and its **record timestamp** (ms since the epoch) is
/// the processing time it contributes. The clock therefore moves only when control records
/// arrive — nothing is released on silence — and replays the same way after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlStream {
    /// The control topic: must also be a source of the stage (co-partitioned: task `p` reads
    /// its partition `p` through the same gate).
    pub topic: String,
    /// How far the control clock runs behind the control records' timestamps, ms (`>= 0`):
    /// the longest a live record is held, and the producer delay beyond which it is late.
    pub lag_ms: i64,
}

/// The built-in clock of an [`EventTimeOrder`] ([`EventTimeOrder::clock`]): a control stream
/// that the runtime writes and reads itself.
///
/// Its topic is internal ([`clock_topic`]: `{application}-{stage}-clock`, one per stage, with
/// the partitions of the stage's other sources), created by the runtime at start and read as
/// one more source of the stage, so task `p` reads partition `p`. Each task writes a **tick** to
/// its own partition whenever `tick_interval_ms` has passed since its last one, in the stage's
/// transaction: no stamp (it claims nothing), the task's partition number as key (the topic is
/// compacted), an empty value, and wall-clock now (ms since the epoch) as record timestamp.
/// Ticks become visible when the transaction commits, so the clock trails wall time by at most
/// about one tick interval plus one commit interval; a fenced or aborted transaction's ticks
/// never count. Read back, a tick moves processing time to its timestamp (the watermark to
/// that minus `lag_ms`, once every input is caught up and at its live head) and is **never
/// handed to the handler**.
///
/// When every instance stops, no tick is written: the watermark stays and parked records stay
/// parked until an instance returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltInClock {
    /// How far the watermark runs behind the ticks' timestamps, ms (`>= 0`): the longest a
    /// live record is held beyond the clock's own delay, and the producer delay beyond which a
    /// record is late.
    pub lag_ms: i64,
    /// How often each task writes a tick, ms (`> 0`).
    pub tick_interval_ms: i64,
}

/// The topic of the built-in clock of stage `stage` in application `application_id`:
/// `{application_id}-{stage}-clock` (the naming of Kafka Streams' internal topics).
pub fn clock_topic(application_id: &str, stage: &str) -> String {
    format!("{application_id}-{stage}-clock")
}

/// The problems of stage `name`'s event-time order `order` over `sources`, appended to
/// `problems`.
pub(crate) fn problems(
    name: &str,
    sources: &[String],
    order: &EventTimeOrder,
    problems: &mut Vec<String>,
) {
    if let Some(control) = &order.control {
        if !sources.contains(&control.topic) {
            problems.push(format!(
                "stage {name:?}: control topic {:?} is not a source of the stage",
                control.topic
            ));
        } else if sources.len() == 1 {
            problems.push(format!(
                "stage {name:?}: control topic {:?} is the only source: nothing has an event time",
                control.topic
            ));
        }
        if control.lag_ms < 0 {
            problems.push(format!(
                "stage {name:?}: control lag {} ms is negative",
                control.lag_ms
            ));
        }
    }
    if let Some(drift) = order.max_drift_ms.filter(|d| *d <= 0) {
        problems.push(format!(
            "stage {name:?}: watermark alignment drift {drift} ms is not positive"
        ));
    }
    if let Some(clock) = &order.clock {
        if let Some(control) = &order.control {
            problems.push(format!(
                "stage {name:?}: the built-in clock and the control stream {:?} together: \
                 choose one",
                control.topic
            ));
        }
        if clock.lag_ms < 0 {
            problems.push(format!(
                "stage {name:?}: clock lag {} ms is negative",
                clock.lag_ms
            ));
        }
        if clock.tick_interval_ms <= 0 {
            problems.push(format!(
                "stage {name:?}: clock tick interval {} ms is not positive",
                clock.tick_interval_ms
            ));
        }
    }
}
