//! The stream thread of one stage: consume, gate, handle, stamp, send, commit.
//!
//! One consumer group per stage (`{application}.{stage}`), `read_committed`, range assignment
//! over co-partitioned sources, so task `p` gets partition `p` of every source. One
//! transactional producer per stream thread (EOS v2: the consumer's group metadata goes with
//! the offsets). Every commit interval one transaction commits the outputs of the deliveries
//! since the last commit, each changed task's fold state and snapshot in the stage's changelog
//! (see `changelog`), and, per consumed channel, the first undelivered offset — records
//! fetched but not delivered are simply re-read after a crash.
//!
//! Per delivered record, in this order: the task's node clock observes the record (its
//! coordinate and its stamp, and the coordinates replacing its in-flight claims), the handler
//! runs, the fold state changes, and each emission is stamped with the node clock and sent. The
//! clock is transactional: sends not acknowledged yet are claimed in flight, so no send waits
//! for another's ack (see `parsley_clock::CausalClock`).
//!
//! Rebalance: on assignment the thread reads the group's committed offsets (librdkafka asks
//! with `require_stable` under `read_committed`) or, without one, the log start offset, and
//! assigns those positions explicitly; then each task is restored from its changelog partition
//! — state, sender incarnation and sequence, clock, gate snapshot — and starts only if the
//! snapshot was committed with exactly those offsets. On revocation the thread commits first
//! (with the group generation that is still its own), then unassigns and drops its tasks; the
//! next owner restores exactly that commit.
//!
//! Commit overlap: once a transaction's outputs, changelog records and offsets are fixed, its
//! round trips (`AddOffsetsToTxn`, `TxnOffsetCommit`, `EndTxn`) run on a helper thread while
//! the stream thread goes on polling, gating and delivering: handlers run and event-time tasks
//! park and release, but each send is only stamped and kept until the commit returns; then
//! the next transaction begins and the kept sends go first, in the order made. A failed
//! commit is recovered like any other: the tasks return to their last commit, the kept sends
//! are dropped and the records taken meanwhile are read again.
//!
//! Invariant: a task's committed offsets and its last committed snapshot describe the same
//! moment — both are written in the same transaction, after its outputs are acknowledged.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parsley_clock::{CausalClock, Channel, Coordinate, SenderId, Stamp, TopicId, codec};
use parsley_gate::{Arrival, Awaiting, Gate, Part, Resolution};
use parsley_stage::{ImpossiblePolicy, RawDelivery, RawEmission, StageSpec, StateChange};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, debug_span, info, info_span, trace, trace_span, warn};

use crate::admin::{Admin, TopicInfo};
use crate::changelog::{self, EVENT_TIME_KEY, META_KEY, STATE_PREFIX, TaskSnapshot};
use crate::config::{GateMode, RuntimeConfig, StatisticsSink, forward_statistics};
use crate::error::{Error, Result};
use crate::event_time::{
    Delivered, EventTime, HandOver, HeadEvidence, ParkedRecord, head_evidence,
};
use crate::metrics::{Progress, StageMetrics, TaskPhase};
use crate::outbox::{Outbox, SendTag, partition_for};

/// Header of a dead-lettered record naming where it came from (`topic/partition@offset`).
pub const DLQ_SOURCE_HEADER: &str = "parsley.dlq.source";
/// Header of a dead-lettered record saying why it was dead-lettered.
pub const DLQ_REASON_HEADER: &str = "parsley.dlq.reason";

/// Most records taken from the consumer in one poll batch (one evidence epoch). Positions,
/// high watermarks and deliveries are read once per batch, so a larger batch spreads that work
/// over more records during catch-up (500 spent about a tenth of a history drain on it); a live
/// batch holds only what is ready.
const MAX_BATCH: usize = 2000;

/// A transactional producer for `config`, its transactions initialised.
fn transactional_outbox(
    config: &ClientConfig,
    statistics: Option<StatisticsSink>,
    timeout: Duration,
) -> Result<Outbox> {
    let outbox = Outbox::new(config, statistics)?;
    outbox.init_transactions(timeout)?;
    Ok(outbox)
}

/// The stage's consumer (`read_committed`, explicit positions, range assignment), subscribed
/// to the sources: it joins the group while the caller goes on. Its rebalance events are
/// served only when it is first polled, so the assignment is handled once everything else is
/// ready.
fn subscribed_consumer(
    config: &RuntimeConfig,
    group: &str,
    admin: &Arc<Admin>,
    sources: &[String],
) -> Result<BaseConsumer<RebalanceContext>> {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &config.bootstrap)
        .set("group.id", group)
        .set("client.id", format!("{group}-consumer"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // Positions are always explicit; a fetch position that falls out of range (retention
        // overtook a lagging task) is an error, never a silent reset.
        .set("auto.offset.reset", "error")
        // Notice a source's partition count changing within seconds, not librdkafka's
        // default five minutes: the rebalance it causes is checked and stops the stage.
        .set("topic.metadata.refresh.interval.ms", "5000")
        .set("partition.assignment.strategy", "range")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "50")
        // librdkafka stops fetching while 100,000 records (`queued.min.messages`) wait in
        // the consumer's queue and looks again only after `fetch.queue.backoff.ms` (1 s by
        // default): a stage working through a backlog drains its queue in a fraction of
        // that and then waits for records (measured: a 0.5-0.7 s stall every half second
        // at 100 B). Looking again after 10 ms keeps the queue from running dry.
        .set("fetch.queue.backoff.ms", "10");
    config.apply_properties(&mut cc, &config.consumer_properties);
    let consumer: BaseConsumer<RebalanceContext> = cc
        .create_with_context(RebalanceContext {
            events: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
            timeout: config.timeout,
            admin: admin.clone(),
            statistics: config.statistics_sink(),
        })
        .map_err(|e| Error::kafka(format!("creating the consumer of group {group}"), e))?;
    let topics: Vec<&str> = sources.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|e| Error::kafka("subscribing", e))?;
    debug!("subscribed: joining the group");
    Ok(consumer)
}

/// A fault the process injects into itself, named by the `PARSLEY_FAULT` environment
/// variable (read once): for fault-injection tests, never for production.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `abort-after-changelog`: at the first commit of a transaction with deliveries, once its
    /// changelog records are appended and before its offsets and commit, abort the process
    /// (no cleanup, no transaction abort: as `kill -9` there; case C10).
    AbortAfterChangelog,
}

/// The fault `PARSLEY_FAULT` names, if any (an unknown name is logged and ignored).
fn fault() -> Option<Fault> {
    static FAULT: std::sync::OnceLock<Option<Fault>> = std::sync::OnceLock::new();
    *FAULT.get_or_init(|| match std::env::var("PARSLEY_FAULT").ok()?.as_str() {
        "abort-after-changelog" => Some(Fault::AbortAfterChangelog),
        other => {
            warn!(fault = other, "PARSLEY_FAULT names no fault: ignored");
            None
        }
    })
}

/// Recoveries in a row, without a commit in between, before a stage gives up.
const MAX_RECOVERIES: u32 = 5;

/// Errors after which the transaction can be aborted and the tasks returned to their last
/// commit: the transaction or one of its sends failed (a timed-out transaction shows up as
/// `INVALID_PRODUCER_EPOCH` on the next send), not the data or the handler. A fenced or
/// otherwise fatal producer cannot abort: [`StageRunner::recover`] then replaces it, unless
/// the fence came from another process running as this instance ([`Error::Fenced`], which
/// ends the stage).
fn recoverable(e: &Error) -> bool {
    match e {
        // A fence seen at the commit goes to the recovery too, which tells a timed-out
        // transaction (redone) from a zombie (ends the stage: `Error::Fenced`).
        Error::Transaction { fatal, code, .. } => !*fatal || crate::error::fencing(*code),
        // The abort decides: a fenced producer cannot abort, and the stage ends then.
        Error::Send { .. } => true,
        Error::Kafka {
            source: rdkafka::error::KafkaError::Transaction(t),
            ..
        } => (t.txn_requires_abort() && !t.is_fatal()) || crate::error::fencing(t.code()),
        _ => false,
    }
}

/// What the rebalance callback tells the stream thread.
#[derive(Debug)]
enum RebalanceEvent {
    /// Partitions assigned at these positions (topic, partition, next offset to fetch).
    Assigned(Vec<(String, i32, i64)>),
    /// Partitions revoked.
    Revoked(Vec<(String, i32)>),
    /// The rebalance failed: the stage stops with this error.
    Failed(Error),
}

/// A rebalance failure described by `message`.
fn rebalance_failed(message: String) -> Error {
    Error::Admin {
        operation: "rebalancing".into(),
        message,
    }
}

struct RebalanceContext {
    events: Mutex<Vec<RebalanceEvent>>,
    timeout: Duration,
    /// The stage's admin client (log start offsets, asked again while a leader moves).
    admin: Arc<Admin>,
    /// Set when the stream thread is done with the consumer: a revocation while closing is
    /// acknowledged at once (nothing is left to commit).
    closing: AtomicBool,
    /// Where librdkafka's statistics go, when the runtime was asked for them.
    statistics: Option<StatisticsSink>,
}

impl ClientContext for RebalanceContext {
    fn stats_raw(&self, statistics: &[u8]) {
        forward_statistics(self.statistics.as_ref(), statistics);
    }
}

impl ConsumerContext for RebalanceContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let event = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                match self.start_positions(consumer, tpl) {
                    Ok(positions) => {
                        let mut assign = TopicPartitionList::new();
                        for (t, p, o) in &positions {
                            // Positions come from the broker; adding them cannot fail.
                            let _ = assign.add_partition_offset(t, *p, Offset::Offset(*o));
                        }
                        match consumer.assign(&assign) {
                            Ok(()) => RebalanceEvent::Assigned(positions),
                            Err(e) => RebalanceEvent::Failed(Error::kafka("assigning", e)),
                        }
                    }
                    Err(e) => {
                        let _ = consumer.unassign();
                        RebalanceEvent::Failed(e)
                    }
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                if self.closing.load(Ordering::SeqCst) {
                    let _ = consumer.unassign();
                    return;
                }
                let revoked = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_string(), e.partition()))
                    .collect();
                // Not unassigned here: the stream thread commits first and then unassigns
                // (librdkafka waits for the unassign call, within the session timeout).
                RebalanceEvent::Revoked(revoked)
            }
            other => {
                let _ = consumer.unassign();
                RebalanceEvent::Failed(rebalance_failed(format!("rebalance error {other:?}")))
            }
        };
        self.events.lock().expect("rebalance events").push(event);
    }
}

impl RebalanceContext {
    /// The committed offset of each partition, or its log start offset when the group has
    /// none. A committed offset below the log start offset is an error naming the lost range
    /// (retention or a deletion removed records this stage never delivered; case C12) —
    /// never a silent jump.
    fn start_positions(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &TopicPartitionList,
    ) -> Result<Vec<(String, i32, i64)>> {
        let committed = consumer
            .committed_offsets(tpl.clone(), self.timeout)
            .map_err(|e| Error::kafka("reading committed offsets", e))?;
        let elements = committed.elements();
        let partitions: Vec<(&str, i32)> = elements
            .iter()
            .map(|e| (e.topic(), e.partition()))
            .collect();
        let starts = self.admin.log_start_offsets(&partitions)?;
        let mut out = Vec::new();
        for (e, low) in elements.iter().zip(starts) {
            let position = match e.offset() {
                Offset::Offset(o) if o >= 0 => {
                    if o < low {
                        return Err(Error::RecordsLost {
                            topic: e.topic().to_string(),
                            partition: e.partition(),
                            from: o,
                            log_start: low,
                        });
                    }
                    o
                }
                _ => low,
            };
            out.push((e.topic().to_string(), e.partition(), position));
        }
        Ok(out)
    }
}

/// What the gate hands back on delivery.
struct Payload {
    /// Index of the source topic.
    source: usize,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    arrived: Instant,
    /// The Kafka record timestamp, ms since the epoch (the event time of an event-time stage);
    /// `None` when the record has none.
    record_timestamp: Option<i64>,
    /// The stamp, when the gate does not check it ([`GateMode::Off`]): still merged into the
    /// node clock on delivery. Boxed, like the rare fields below: every record moves through
    /// the gate by value, and the common case should be small (112 bytes, not 208).
    unchecked_stamp: Option<Box<Stamp>>,
    /// Why the record goes to the dead-letter topic instead of the handler, if it does.
    dead_letter: Option<Box<str>>,
}

/// A polled record, copied out of the consumer's buffer.
struct Fetched {
    partition: i32,
    channel: Channel,
    arrival: Arrival<Payload>,
    /// The stamp header could not be decoded (the record is unstamped in `arrival`).
    malformed: Option<Box<Error>>,
}

/// One task: partition `p` of every source.
/// The timestamp a handler sees for a record without one (a message format before v1), and
/// the emission timestamp that leaves the choice to the producer's clock.
pub const NO_TIMESTAMP: i64 = -1;

struct Task {
    partition: i32,
    gate: Gate<Payload>,
    clock: CausalClock,
    state: HashMap<Vec<u8>, Vec<u8>>,
    /// State keys changed since the last commit (written to the changelog at commit).
    dirty: BTreeSet<Vec<u8>>,
    /// Deliveries since the last commit (the clock and gate changed: write a snapshot).
    changed: bool,
    /// The input offsets of the last snapshot written.
    snapshot_offsets: Vec<(Channel, i64)>,
    /// Deliveries not yet added to the task's metrics.
    pending: TaskCounts,
    /// Event-time order (watermark and timer queue), when the stage orders by event time.
    event_time: Option<EventTime>,
}

/// A send made while the previous transaction committed: stamped when the handler emitted it,
/// sent once the next transaction is open ([`StageRunner::overlap_batch`]).
struct Unsent {
    topic: Arc<str>,
    tag: SendTag,
    key: Vec<u8>,
    value: Vec<u8>,
    stamp: Vec<u8>,
    extra: Vec<(&'static str, Vec<u8>)>,
    timestamp: Option<i64>,
}

/// Per-task deliveries counted by [`StageRunner::deliver_task`], added to the task's
/// [`crate::TaskMetrics`] after each delivery round (one lock per round, not per record).
#[derive(Default)]
struct TaskCounts {
    delivered: u64,
    held: u64,
    gate_wait_us: u64,
    max_gate_wait_us: u64,
    late: u64,
    raised: u64,
}

/// A blocked head that waits on the open transaction's own write (see
/// [`StageRunner::waits_on_own_writes`]).
struct OwnWait {
    head: Coordinate,
    awaits_offset: Coordinate,
}

/// Deliveries and sends since the last commit.
#[derive(Default)]
struct Uncommitted {
    deliveries: u64,
    emissions: u64,
    /// Gate deliveries parked in an event-time queue (the queue changed: commit it).
    parked: u64,
}

pub(crate) struct StageRunner {
    app: String,
    spec: StageSpec,
    config: RuntimeConfig,
    consumer: BaseConsumer<RebalanceContext>,
    outbox: Outbox,
    /// The producer's configuration, to make a new one after a fatal producer error.
    producer_config: ClientConfig,
    sources: Vec<TopicInfo>,
    /// The declared sinks. Looked up by name per emission with a linear scan: a stage has
    /// few sinks, and comparing a name is cheaper than hashing it.
    sinks: Vec<TopicInfo>,
    /// The dead-letter topic of [`ImpossiblePolicy::DeadLetter`].
    dead_letter_topic: Option<TopicInfo>,
    /// The stage's changelog: task state and Parsley's own state.
    changelog: TopicInfo,
    tasks: BTreeMap<i32, Task>,
    paused: HashSet<(usize, i32)>,
    uncommitted: Uncommitted,
    /// Set while a commit runs on a helper thread and the stream thread goes on
    /// ([`StageRunner::overlap_batch`]): sends wait in `unsent`.
    committing: bool,
    /// Sends made while the last commit was in flight, in the order made.
    unsent: Vec<Unsent>,
    /// A record polled while a commit was in flight, behind a rebalance event: offered after
    /// that event is handled.
    deferred: Option<Fetched>,
    /// Poll batches so far: the epoch of the records of the current batch.
    epoch: u64,
    /// Records fetched so far (orders deliveries in arrival order under [`GateMode::Off`]).
    arrivals: u64,
    /// The stamp encoder's buffer, reused across sends.
    stamp_buf: Vec<u8>,
    admin: Arc<Admin>,
    /// Names of topics by id, for evidence requests (sources, sinks, then resolved on demand).
    topic_names: HashMap<TopicId, String>,
    last_commit: Instant,
    /// When the open transaction began: a fence seen before `transaction.timeout.ms` has
    /// passed since cannot be the coordinator's (case C09, [`Error::Fenced`]).
    txn_began: Instant,
    /// The topics the stage both reads and writes (a loop through itself); empty for most
    /// stages, which then never look for waits on their own transaction.
    looped: Vec<TopicId>,
    /// For each channel of `looped`: the lowest offset the open transaction wrote there, from
    /// the acks. A gate awaiting that offset or a later one waits on the open transaction
    /// itself: `read_committed` shows it only after the commit (DESIGN.md §7, "commit first").
    own_writes: BTreeMap<Channel, i64>,
    metrics: Arc<StageMetrics>,
    observer: Option<Sender<Progress>>,
    shutdown: Arc<AtomicBool>,
}

impl StageRunner {
    /// Resolves the stage's topics, checks co-partitioning, creates the clients and
    /// initialises transactions.
    pub(crate) fn new(
        app: &str,
        spec: StageSpec,
        config: RuntimeConfig,
        metrics: Arc<StageMetrics>,
        observer: Option<Sender<Progress>>,
        shutdown: Arc<AtomicBool>,
    ) -> Result<Self> {
        let started = Instant::now();
        let admin = Arc::new(Admin::new(&config.bootstrap, config.timeout)?);
        let group = spec.group_id(app);
        let mut pc = ClientConfig::new();
        pc.set("bootstrap.servers", &config.bootstrap)
            .set("transactional.id", config.transactional_id(&group))
            .set("client.id", format!("{group}-producer"))
            .set("linger.ms", "5")
            .set("partitioner", "murmur2_random");
        config.apply_properties(&mut pc, &config.producer_properties);
        // The producer's `InitProducerId` (fencing an earlier incarnation) needs nothing from
        // the topics: it runs while the topics are described and the changelog is made ready.
        let (described, outbox) = std::thread::scope(|scope| {
            let producing =
                scope.spawn(|| transactional_outbox(&pc, config.statistics_sink(), config.timeout));
            let described = (|| -> Result<_> {
                let source_names: Vec<&str> = spec.sources().iter().map(String::as_str).collect();
                let sources = admin.describe_topics(&source_names)?;
                if sources
                    .iter()
                    .any(|t| t.partitions != sources[0].partitions)
                {
                    return Err(Error::NotCoPartitioned {
                        stage: spec.name().to_string(),
                        partitions: sources
                            .iter()
                            .map(|t| (t.name.clone(), t.partitions))
                            .collect(),
                    });
                }
                let sink_names: Vec<&str> = spec.sinks().iter().map(String::as_str).collect();
                let sinks = if sink_names.is_empty() {
                    Vec::new()
                } else {
                    admin.describe_topics(&sink_names)?
                };
                let dead_letter_topic = match spec.impossible_policy() {
                    ImpossiblePolicy::DeadLetter { topic } => {
                        Some(admin.describe_topics(&[topic.as_str()])?.remove(0))
                    }
                    _ => None,
                };
                debug!(
                    took_ms = started.elapsed().as_millis() as u64,
                    "startup: topics described"
                );
                // The group join runs while the changelog is made ready and the producer
                // initialises (the assignment waits for the first poll).
                let consumer = subscribed_consumer(&config, &group, &admin, spec.sources())?;
                let changelog = changelog::ensure_topic(
                    &admin,
                    &changelog::changelog_topic(&group),
                    sources[0].partitions,
                )?;
                debug!(
                    took_ms = started.elapsed().as_millis() as u64,
                    "startup: changelog ready"
                );
                Ok((sources, sinks, dead_letter_topic, changelog, consumer))
            })();
            let outbox = match producing.join() {
                Ok(outbox) => outbox,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            (described, outbox)
        });
        let (sources, sinks, dead_letter_topic, changelog, consumer) = described?;
        let outbox = outbox?;
        debug!(
            took_ms = started.elapsed().as_millis() as u64,
            "startup: transactions initialised"
        );

        let topic_names = sources
            .iter()
            .chain(sinks.iter())
            .map(|t| (t.id, t.name.clone()))
            .collect();
        let looped = sinks
            .iter()
            .filter(|k| sources.iter().any(|s| s.id == k.id))
            .map(|k| k.id)
            .collect();
        Ok(StageRunner {
            app: app.to_string(),
            spec,
            config,
            consumer,
            outbox,
            producer_config: pc,
            sources,
            sinks,
            dead_letter_topic,
            changelog,
            tasks: BTreeMap::new(),
            paused: HashSet::new(),
            uncommitted: Uncommitted::default(),
            committing: false,
            unsent: Vec::new(),
            deferred: None,
            epoch: 0,
            arrivals: 0,
            stamp_buf: Vec::with_capacity(256),
            topic_names,
            admin,
            last_commit: Instant::now(),
            txn_began: Instant::now(),
            looped,
            own_writes: BTreeMap::new(),
            metrics,
            observer,
            shutdown,
        })
    }

    /// Runs until shutdown (Ok, after a final commit) or the first error (the open
    /// transaction is aborted).
    pub(crate) fn run(mut self) -> Result<()> {
        let span = info_span!("stage", app = %self.app, stage = %self.spec.name());
        let _entered = span.enter();
        self.begin()?;
        let result = self.run_loop();
        self.consumer
            .context()
            .closing
            .store(true, Ordering::SeqCst);
        match &result {
            Ok(()) => info!("stopped"),
            Err(e) => {
                warn!(error = %e, "failed; aborting the open transaction");
                let _ = self.outbox.abort_transaction(self.config.timeout);
                self.metrics.aborted();
            }
        }
        result
    }

    /// Runs batches until shutdown. A transaction that cannot commit (a timed-out or otherwise
    /// aborted transaction, a send the broker refused) is aborted and every task returns to its
    /// last commit ([`StageRunner::recover`]), with a new producer if this one is fenced or
    /// failed; a fence by another process running as this instance ([`Error::Fenced`]) or any
    /// other error ends the stage. Recoveries without a commit in between are bounded, so a
    /// persistent fault cannot loop forever.
    fn run_loop(&mut self) -> Result<()> {
        let mut recoveries = 0;
        loop {
            let transactions = self.metrics.snapshot().transactions;
            match self.run_batch() {
                Ok(true) => return Ok(()),
                Ok(false) => {
                    if self.metrics.snapshot().transactions > transactions {
                        recoveries = 0;
                    }
                }
                Err(e) if recoverable(&e) && recoveries < MAX_RECOVERIES => {
                    recoveries += 1;
                    self.recover(&e)?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One poll batch with its evidence, deliveries and (when due) commit; `Ok(true)` after the
    /// final commit of a shutdown.
    fn run_batch(&mut self) -> Result<bool> {
        if self.shutdown.load(Ordering::Relaxed) {
            self.commit(false)?;
            return Ok(true);
        }
        if let Some(f) = self.deferred.take() {
            // Polled while the last commit was in flight, behind a rebalance event: the event
            // first, as for any polled record.
            self.handle_rebalance()?;
            self.accept(f)?;
        }
        let wait = self
            .config
            .commit_interval
            .saturating_sub(self.last_commit.elapsed())
            .min(Duration::from_millis(100));
        // One poll batch = one epoch: what the consumer has ready, up to a bound. Evidence
        // (positions, high watermarks) is read once per batch, after it.
        self.epoch += 1;
        let mut timeout = wait;
        // The arrival time of every record of the batch (gate-wait metrics; one clock read
        // per batch, not per record).
        let mut batch_time = None;
        for _ in 0..MAX_BATCH {
            let arrival = self.arrivals + 1;
            let fetched = match self.consumer.poll(timeout) {
                Some(Ok(message)) => {
                    let at = *batch_time.get_or_insert_with(Instant::now);
                    Some(self.fetched(&message, arrival, at)?)
                }
                Some(Err(e)) => {
                    self.poll_failed(e)?;
                    None
                }
                None => None,
            };
            // Seed newly assigned channels before offering their records.
            self.handle_rebalance()?;
            let Some(f) = fetched else { break };
            self.arrivals = arrival;
            self.accept(f)?;
            timeout = Duration::ZERO;
        }
        self.read_positions()?;
        self.read_evidence()?;
        self.resolve_impossible()?;
        let partitions: Vec<i32> = self.tasks.keys().copied().collect();
        for &partition in &partitions {
            self.deliver(partition)?;
        }
        if self.spec.event_time().is_some() {
            // The live heads of the caught-up channels, then what the watermark now releases.
            self.read_heads()?;
            for &partition in &partitions {
                self.deliver(partition)?;
            }
        }
        self.apply_backpressure()?;
        self.settle_acks(None)?;
        if self.last_commit.elapsed() >= self.config.commit_interval {
            self.commit(true)?;
        } else if let Some(head) = self.waits_on_own_writes() {
            // Commit first: the record the gate waits for is this transaction's own, visible
            // to `read_committed` only after the commit. Waiting for the interval would hold
            // the head up to a whole interval for nothing, and forever with no interval.
            debug!(
                head = %head.head,
                awaits = %head.awaits_offset,
                "commit first: a gate waits on the open transaction's own write"
            );
            self.metrics.own_write_commit();
            self.commit(true)?;
        }
        Ok(false)
    }

    /// A blocked head whose gate awaits a frontier at or beyond an offset that the open
    /// transaction wrote on the same channel (only stages that read a topic they write: with
    /// `looped` empty this is one branch). Acked writes only: an unacked send's offset is
    /// unknown, and the next batch (at most 100 ms later) looks again.
    fn waits_on_own_writes(&self) -> Option<OwnWait> {
        if self.own_writes.is_empty() {
            return None;
        }
        self.tasks.values().find_map(|task| {
            task.gate
                .blocked_heads()
                .into_iter()
                .find_map(|b| match b.awaits {
                    Awaiting::Frontier(c)
                        if self
                            .own_writes
                            .get(&c.channel)
                            .is_some_and(|&lowest| c.offset >= lowest) =>
                    {
                        Some(OwnWait {
                            head: b.head,
                            awaits_offset: c,
                        })
                    }
                    _ => None,
                })
        })
    }

    /// One poll batch while the transaction commits on a helper thread (see
    /// [`StageRunner::commit`]): the records the consumer has ready now (it never waits for
    /// more) are offered to the gates, the positions and high watermarks read, and the tasks
    /// deliver — handlers run, event-time tasks park and release — but every send waits in
    /// `unsent`, stamped, until the next transaction is open. The work belongs to that
    /// transaction, and an abort of the committing one returns the tasks to their last commit
    /// like any other. Live-head readings (a request to the leaders) wait for the next batch.
    ///
    /// `Ok(false)` when nothing was ready, or when a rebalance event arrived (the record
    /// polled with it waits in `deferred`, unoffered, so no position passes it).
    fn overlap_batch(&mut self) -> Result<bool> {
        let events_pending = |s: &Self| {
            !s.consumer
                .context()
                .events
                .lock()
                .expect("events")
                .is_empty()
        };
        if self.deferred.is_some() || events_pending(self) {
            return Ok(false);
        }
        self.epoch += 1;
        let mut batch_time = None;
        let mut took = 0;
        for _ in 0..MAX_BATCH {
            let arrival = self.arrivals + 1;
            let f = match self.consumer.poll(Duration::ZERO) {
                Some(Ok(message)) => {
                    let at = *batch_time.get_or_insert_with(Instant::now);
                    self.fetched(&message, arrival, at)?
                }
                Some(Err(e)) => {
                    self.poll_failed(e)?;
                    break;
                }
                None => break,
            };
            self.arrivals = arrival;
            took += 1;
            if events_pending(self) {
                self.deferred = Some(f);
                return Ok(false);
            }
            self.accept(f)?;
        }
        if took == 0 {
            return Ok(false);
        }
        self.metrics.overlapped(took);
        self.read_positions()?;
        self.read_evidence()?;
        let partitions: Vec<i32> = self.tasks.keys().copied().collect();
        for partition in partitions {
            self.deliver(partition)?;
        }
        self.apply_backpressure()?;
        Ok(true)
    }

    /// Sends `record` in the open transaction, or, while a commit is in flight, keeps it for
    /// [`StageRunner::send_unsent`]. A send the producer refuses releases its claim in
    /// `task`'s clock.
    fn send(&mut self, task: &mut Task, record: Unsent) -> Result<()> {
        let tag = record.tag;
        if let Err(err) = self.transmit(record) {
            task.clock.failed(tag.seq, tag.channel)?;
            return Err(err);
        }
        Ok(())
    }

    /// [`StageRunner::send`] without the task: the caller releases the claim of a refused
    /// send.
    fn transmit(&mut self, record: Unsent) -> Result<()> {
        if self.committing {
            self.unsent.push(record);
            return Ok(());
        }
        let extra: Vec<(&str, &[u8])> = record
            .extra
            .iter()
            .map(|(k, v)| (*k, v.as_slice()))
            .collect();
        self.outbox.send(
            &record.topic,
            record.tag,
            &record.key,
            record.value,
            &record.stamp,
            &extra,
            record.timestamp,
            self.config.timeout,
        )
    }

    /// Sends, in the order made, what the tasks sent while the last commit was in flight. The
    /// tasks stay in their map (a task is large: taking it out and putting it back per record
    /// moved it twice per send).
    fn send_unsent(&mut self) -> Result<()> {
        for record in std::mem::take(&mut self.unsent) {
            let tag = record.tag;
            if !self.tasks.contains_key(&tag.task) {
                // Not possible: tasks change only between batches, after this.
                return Err(Error::Gate {
                    stage: self.spec.name().to_string(),
                    partition: tag.task,
                    source: Box::new(parsley_gate::GateError::NotSeeded {
                        channel: tag.channel,
                    }),
                });
            }
            if let Err(err) = self.transmit(record) {
                if let Some(task) = self.tasks.get_mut(&tag.task) {
                    task.clock.failed(tag.seq, tag.channel)?;
                }
                return Err(err);
            }
        }
        Ok(())
    }

    /// Aborts the open transaction and returns every task to its last commit: restored from
    /// the changelog at the group's committed offsets (read with `require_stable`), the
    /// consumer sought back there, fetch evidence dropped (DESIGN.md §7).
    ///
    /// # Errors
    /// The abort's own error when the producer cannot abort (fatal): the stage ends.
    fn recover(&mut self, cause: &Error) -> Result<()> {
        warn!(error = %cause, "aborting the transaction; every task returns to its last commit");
        match self.outbox.abort_transaction(self.config.timeout) {
            Ok(()) => {
                self.outbox.wait_acked(self.config.timeout)?;
                self.outbox.discard();
            }
            Err(rdkafka::error::KafkaError::Transaction(t)) if t.is_fatal() => {
                // Fenced: the coordinator bumped the epoch (it aborted a timed-out transaction,
                // case C08) or another producer took the transactional id (case C09); librdkafka
                // reports both as `_FENCED`. The transaction's age tells them apart: the
                // coordinator aborts only a transaction open longer than its timeout, counted
                // from its first partition, which is after `begin`. A younger one was fenced by
                // another process running as this instance: this stage is the zombie and gives
                // up its tasks; taking the id back would fence the live owner in turn.
                let open = self.txn_began.elapsed();
                let timeout = self.config.transaction_timeout();
                if crate::error::fencing(t.code()) && open < timeout {
                    let group = self.spec.group_id(&self.app);
                    return Err(Error::Fenced {
                        transactional_id: self.config.transactional_id(&group),
                        open_ms: open.as_millis() as u64,
                        timeout_ms: timeout.as_millis() as u64,
                        message: t.to_string(),
                    });
                }
                // A timed-out transaction (or another fatal producer error): this producer is
                // done; a new one takes the id (initialising it completes or aborts whatever
                // the old one left open), and the tasks are rebuilt from the last commit. If
                // the group moved them elsewhere, the next commit is refused and the rebalance
                // hands them over.
                warn!(error = %t, open_ms = open.as_millis() as u64, "the producer is fenced or failed: replacing it");
                self.outbox = transactional_outbox(
                    &self.producer_config,
                    self.config.statistics_sink(),
                    self.config.timeout,
                )?;
            }
            Err(e) => return Err(Error::kafka(format!("aborting after: {cause}"), e)),
        }
        self.metrics.aborted();
        self.uncommitted = Uncommitted::default();
        // A record held behind a rebalance event is read again from the committed offsets.
        self.deferred = None;
        self.unsent.clear();
        let assignment = self
            .consumer
            .assignment()
            .map_err(|e| Error::kafka("reading the assignment", e))?;
        let positions = self
            .consumer
            .context()
            .start_positions(&self.consumer, &assignment)?;
        for &(source, partition) in &self.paused {
            self.set_paused(source, partition, false)?;
        }
        self.paused.clear();
        self.tasks.clear();
        let mut by_task: BTreeMap<i32, Vec<(Channel, i64)>> = BTreeMap::new();
        for (topic, partition, position) in positions {
            let source = self.source_index(&topic)?;
            let channel = Channel::new(self.sources[source].id, partition);
            self.seek(channel, position)?;
            by_task
                .entry(partition)
                .or_default()
                .push((channel, position));
        }
        for (partition, positions) in by_task {
            let task = self.restore_task(partition, positions)?;
            self.tasks.insert(partition, task);
        }
        self.begin()?;
        self.last_commit = Instant::now();
        Ok(())
    }

    /// The consumer's position (the offset after the last record it returned) of every
    /// channel the tasks consume, as `(topic, partition, position)`; a channel it has returned
    /// nothing from yet is left out.
    ///
    /// The positions are read for the tasks' own channels with `rd_kafka_position`, a local
    /// read. rdkafka's `Consumer::position` would first ask librdkafka's main thread for the
    /// assignment (a request and a reply between threads, once per poll batch); the tasks are
    /// the assignment's partitions, and a channel the consumer no longer has reads as no
    /// position.
    fn consumer_positions(&self) -> Result<Vec<(String, i32, i64)>> {
        let mut positions =
            TopicPartitionList::with_capacity(self.tasks.len() * self.sources.len());
        for (partition, task) in &self.tasks {
            for source in &self.sources {
                if task
                    .gate
                    .baseline(&Channel::new(source.id, *partition))
                    .is_some()
                {
                    positions.add_partition(&source.name, *partition);
                }
            }
        }
        // SAFETY: the client handle is alive for as long as `self.consumer` is; the list is a
        // valid list owned by `positions`, which librdkafka only updates in place.
        let err = unsafe {
            rdkafka::bindings::rd_kafka_position(
                self.consumer.client().native_ptr(),
                positions.ptr(),
            )
        };
        if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(Error::kafka(
                "reading positions",
                rdkafka::error::KafkaError::MetadataFetch(err.into()),
            ));
        }
        Ok(positions
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(position) => Some((e.topic().to_string(), e.partition(), position)),
                _ => None,
            })
            .collect())
    }

    /// Decides what a poll's error means: `Ok` to carry on, or the error that ends the stage.
    /// - A transient connection error (a broker restarting, a network blip): librdkafka
    ///   reconnects by itself; carry on.
    /// - An unknown topic or partition: [`Error::SourceDeleted`] when the cluster confirms a
    ///   source is gone; otherwise metadata not caught up yet (a topic just created, a leader
    ///   moving): carry on.
    /// - A fetch position that fell out of range (with `auto.offset.reset=error`) while the
    ///   stage runs: [`Error::RecordsLost`] for the channel whose position now lies below its
    ///   log start offset (retention or `DeleteRecords` removed records the stage had not
    ///   fetched: case C12 mid-stream); librdkafka's error names no partition, so the positions
    ///   are compared with the log start offsets read now.
    /// - Anything else is the client's error.
    fn poll_failed(&self, e: rdkafka::error::KafkaError) -> Result<()> {
        use rdkafka::types::RDKafkaErrorCode as C;
        if crate::error::transient(&e) {
            warn!(error = %e, "consumer: transient error, carrying on");
            return Ok(());
        }
        match e.rdkafka_error_code() {
            Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition) => {
                let names: Vec<&str> = self.sources.iter().map(|t| t.name.as_str()).collect();
                return match self.admin.describe_topics(&names) {
                    Err(Error::UnknownTopic { topic }) => Err(Error::SourceDeleted {
                        stage: self.spec.name().to_string(),
                        topic,
                    }),
                    Err(other) => Err(other),
                    Ok(_) => {
                        warn!(error = %e, "consumer: a source is unknown to it but exists: carrying on");
                        Ok(())
                    }
                };
            }
            Some(C::AutoOffsetReset) => match self.records_lost() {
                Ok(Some(lost)) => return Err(lost),
                Ok(None) => {}
                Err(lookup) => warn!(error = %lookup, "cannot name the channel a fetch lost"),
            },
            _ => {}
        }
        Err(Error::kafka("polling", e))
    }

    /// [`Error::RecordsLost`] for the first channel whose consumer position lies below its log
    /// start offset, if any.
    fn records_lost(&self) -> Result<Option<Error>> {
        let positions = self.consumer_positions()?;
        let channels: Vec<(&str, i32)> =
            positions.iter().map(|(t, p, _)| (t.as_str(), *p)).collect();
        let starts = self.admin.log_start_offsets(&channels)?;
        Ok(positions
            .into_iter()
            .zip(starts)
            .find(|((_, _, position), start)| position < start)
            .map(|((topic, partition, from), log_start)| Error::RecordsLost {
                topic,
                partition,
                from,
                log_start,
            }))
    }

    /// Hands every task the consumer's application position of its channels (read after the
    /// batch's polls, whose records were all offered): position advance (DESIGN.md §4).
    fn read_positions(&mut self) -> Result<()> {
        if self.tasks.is_empty() {
            return Ok(());
        }
        for (topic, partition, position) in self.consumer_positions()? {
            let source = self.source_index(&topic)?;
            let channel = Channel::new(self.sources[source].id, partition);
            if let Some(task) = self.tasks.get_mut(&partition) {
                task.gate
                    .position(channel, position)
                    .map_err(|source| Error::Gate {
                        stage: self.spec.name().to_string(),
                        partition,
                        source: Box::new(source),
                    })?;
            }
        }
        Ok(())
    }

    /// Reads the high watermarks the gates ask for, with one batched
    /// `ListOffsets(LATEST, READ_UNCOMMITTED)` after the batch's polls.
    fn read_evidence(&mut self) -> Result<()> {
        // A reading can unblock a record that then needs evidence on another channel: ask
        // again until the gates want nothing new (each channel at most once per batch).
        let mut served: BTreeSet<Channel> = BTreeSet::new();
        loop {
            let mut wanted: BTreeSet<Channel> = BTreeSet::new();
            for task in self.tasks.values() {
                wanted.extend(task.gate.evidence_wanted());
            }
            wanted.retain(|c| !served.contains(c));
            if wanted.is_empty() {
                return Ok(());
            }
            self.read_high_watermarks(&wanted)?;
            served.extend(wanted);
        }
    }

    /// One batched `ListOffsets(LATEST, READ_UNCOMMITTED)` for `wanted`, handed to every gate.
    fn read_high_watermarks(&mut self, wanted: &BTreeSet<Channel>) -> Result<()> {
        let unknown: Vec<_> = wanted
            .iter()
            .map(|c| c.topic)
            .filter(|id| !self.topic_names.contains_key(id))
            .collect();
        if !unknown.is_empty() {
            let found = self.admin.topic_names(&unknown)?;
            self.topic_names.extend(found);
        }
        let mut asked: Vec<(Channel, &str)> = Vec::new();
        let mut gone = Vec::new();
        for c in wanted {
            match self.topic_names.get(&c.topic) {
                Some(name) => asked.push((*c, name.as_str())),
                None => gone.push(*c),
            }
        }
        let request: Vec<(&str, i32)> = asked.iter().map(|(c, n)| (*n, c.partition)).collect();
        let answers = self.admin.high_watermarks(&request)?;
        let mut readings: Vec<(Channel, i64)> = asked
            .iter()
            .zip(answers)
            .map(|((c, _), hw)| (*c, hw))
            .collect();
        for c in gone {
            // A claimed channel whose topic no longer exists has nothing left to read:
            // its claims are replaced by nothing (DESIGN.md §2: deletion is loss).
            warn!(channel = %c, "a claim names a topic that does not exist any more");
            readings.push((c, 0));
        }
        let epoch = self.epoch;
        for task in self.tasks.values_mut() {
            for &(c, hw) in &readings {
                task.gate.high_watermark(c, hw, epoch);
            }
        }
        Ok(())
    }

    /// Applies the stage's policy to the impossible stamps the gates found.
    fn resolve_impossible(&mut self) -> Result<()> {
        let partitions: Vec<i32> = self.tasks.keys().copied().collect();
        for partition in partitions {
            let found = self
                .tasks
                .get_mut(&partition)
                .map(|t| t.gate.take_impossible())
                .unwrap_or_default();
            for stamp in found {
                self.metrics.impossible();
                self.metrics.task(partition, |m| m.impossible_stamps += 1);
                let topic = self
                    .sources
                    .iter()
                    .find(|t| t.id == stamp.record.channel.topic)
                    .map_or_else(String::new, |t| t.name.clone());
                let error = Error::ImpossibleStamp {
                    stage: self.spec.name().to_string(),
                    topic,
                    stamp: Box::new(stamp),
                };
                let resolution = match self.spec.impossible_policy() {
                    ImpossiblePolicy::Fail => return Err(error),
                    ImpossiblePolicy::DeliverAndCount => {
                        warn!(%error, "delivering without its impossible claims");
                        Resolution::Deliver
                    }
                    ImpossiblePolicy::DeadLetter { .. } => Resolution::Discard,
                };
                let mut task = self.tasks.remove(&partition).expect("task exists");
                let discarded = task
                    .gate
                    .resolve(stamp.record, resolution)
                    .map_err(|source| Error::Gate {
                        stage: self.spec.name().to_string(),
                        partition,
                        source: Box::new(source),
                    });
                let sent = match discarded {
                    Ok(Some(d)) => {
                        self.uncommitted.deliveries += 1;
                        self.dead_letter(&mut task, &d.payload, d.coordinate, &error.to_string())
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                };
                self.tasks.insert(partition, task);
                sent?;
            }
        }
        Ok(())
    }

    /// Sends a record to the stage's dead-letter topic in the open transaction, stamped by the
    /// task, with headers naming its source coordinate and the reason.
    fn dead_letter(
        &mut self,
        task: &mut Task,
        payload: &Payload,
        record: parsley_clock::Coordinate,
        reason: &str,
    ) -> Result<()> {
        let Some(dlq) = self.dead_letter_topic.clone() else {
            return Err(Error::UnknownTopic {
                topic: "(no dead-letter topic)".into(),
            });
        };
        let key = payload.key.clone().unwrap_or_default();
        let channel = Channel::new(dlq.id, partition_for(&key, dlq.partitions));
        let stamp = task.clock.stamp(channel)?;
        let tag = SendTag {
            task: task.partition,
            channel,
            seq: stamp.sender.expect("stage stamps carry a sender").seq,
        };
        let source = format!(
            "{}/{}@{}",
            self.sources[payload.source].name, record.channel.partition, record.offset
        );
        warn!(%source, reason, topic = %dlq.name, "dead-lettered");
        self.send(
            task,
            Unsent {
                topic: dlq.name.as_str().into(),
                tag,
                key,
                value: payload.value.clone().unwrap_or_default(),
                stamp: codec::encode(&stamp),
                extra: vec![
                    (DLQ_SOURCE_HEADER, source.into_bytes()),
                    (DLQ_REASON_HEADER, reason.as_bytes().to_vec()),
                ],
                timestamp: payload.record_timestamp,
            },
        )?;
        self.uncommitted.emissions += 1;
        self.metrics.dead_lettered();
        Ok(())
    }

    fn begin(&mut self) -> Result<()> {
        self.txn_began = Instant::now();
        self.own_writes.clear();
        self.outbox
            .producer()
            .begin_transaction()
            .map_err(|e| Error::kafka("beginning a transaction", e))
    }

    fn handle_rebalance(&mut self) -> Result<()> {
        let events = std::mem::take(&mut *self.consumer.context().events.lock().expect("events"));
        for event in events {
            match event {
                RebalanceEvent::Assigned(positions) => {
                    info!(?positions, "assigned");
                    let mut by_task: BTreeMap<i32, Vec<(Channel, i64)>> = BTreeMap::new();
                    for (topic, partition, position) in positions {
                        let source = self.source_index(&topic)?;
                        by_task
                            .entry(partition)
                            .or_default()
                            .push((Channel::new(self.sources[source].id, partition), position));
                    }
                    self.check_assignment(&by_task)?;
                    for (partition, positions) in by_task {
                        let task = self.restore_task(partition, positions)?;
                        self.tasks.insert(partition, task);
                    }
                }
                RebalanceEvent::Revoked(partitions) => {
                    // Commit first: what was delivered is not done again by the next owner,
                    // and the next owner restores exactly this state. The group generation is
                    // still ours until the unassign below.
                    info!(
                        ?partitions,
                        "revoked: committing, then handing the tasks over"
                    );
                    self.commit(false)?;
                    self.consumer
                        .unassign()
                        .map_err(|e| Error::kafka("unassigning after revocation", e))?;
                    self.tasks.clear();
                    self.paused.clear();
                    self.metrics.retain_tasks(|_| false);
                }
                RebalanceEvent::Failed(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Checks an assignment before any task starts: every task must get partition `p` of every
    /// source (co-partitioning holds for this member's assignment, not only for the topics'
    /// partition counts), and no source may have changed its partition count since the stage
    /// started (keys would move between tasks under the stage's feet).
    fn check_assignment(&self, by_task: &BTreeMap<i32, Vec<(Channel, i64)>>) -> Result<()> {
        let names: Vec<&str> = self.sources.iter().map(|t| t.name.as_str()).collect();
        let now = self.admin.describe_topics(&names)?;
        for (before, now) in self.sources.iter().zip(&now) {
            if before.partitions != now.partitions || before.id != now.id {
                return Err(Error::SourceChanged {
                    stage: self.spec.name().to_string(),
                    topic: before.name.clone(),
                    partitions: (before.partitions, now.partitions),
                    recreated: before.id != now.id,
                });
            }
        }
        for (partition, positions) in by_task {
            if positions.len() != self.sources.len() {
                return Err(Error::NotCoPartitioned {
                    stage: self.spec.name().to_string(),
                    partitions: self
                        .sources
                        .iter()
                        .map(|t| {
                            let got = positions.iter().any(|(c, _)| c.topic == t.id);
                            (
                                format!(
                                    "{} (partition {partition} {})",
                                    t.name,
                                    if got { "assigned" } else { "missing" }
                                ),
                                t.partitions,
                            )
                        })
                        .collect(),
                });
            }
        }
        Ok(())
    }

    /// Builds the task of `partition`, assigned at `positions` (the group's committed offsets,
    /// or the log start where it has none), from its changelog partition: exact restore
    /// (DESIGN.md §7) when a snapshot exists and was committed with exactly these offsets,
    /// a fresh incarnation (new sender id, gates seeded at the positions) when none exists.
    fn restore_task(&mut self, partition: i32, mut positions: Vec<(Channel, i64)>) -> Result<Task> {
        let _span = info_span!("restore", partition).entered();
        let started = Instant::now();
        let metrics = self.metrics.clone();
        metrics.task(partition, |m| m.phase = TaskPhase::Restoring);
        let mut restored = changelog::restore(
            &self.config.bootstrap,
            &self.admin,
            &self.changelog.name,
            partition,
            self.config.timeout,
            &mut |position, end| {
                metrics.task(partition, |m| {
                    m.restore_position = position;
                    m.restore_end = end;
                })
            },
        )?;
        positions.sort();
        let consumed: Vec<Channel> = self
            .sources
            .iter()
            .map(|t| Channel::new(t.id, partition))
            .collect();
        let gate_error = |source| Error::Gate {
            stage: self.spec.name().to_string(),
            partition,
            source: Box::new(source),
        };
        // The event-time record belongs to the snapshot it was committed with.
        let event_bytes = restored
            .snapshot
            .as_ref()
            .and(restored.event_time.as_ref())
            .cloned();
        let timers = std::mem::take(&mut restored.timers);
        let task = match restored.snapshot {
            Some(mut snapshot) => {
                // Channels the snapshot names that this task no longer consumes belong to a
                // deleted topic (a recreated topic is a new channel); consumed channels the
                // snapshot does not name are new: they start at their log start offset, since a
                // group offset for them can only be left over from the topic's previous
                // incarnation (case C11).
                let gone: Vec<Channel> = snapshot
                    .offsets
                    .iter()
                    .map(|(c, _)| *c)
                    .filter(|c| !consumed.contains(c))
                    .collect();
                if !gone.is_empty() {
                    warn!(
                        partition,
                        ?gone,
                        "channels of the snapshot are gone (topic deleted or recreated)"
                    );
                }
                snapshot.offsets.retain(|(c, _)| consumed.contains(c));
                snapshot
                    .gate
                    .channels
                    .retain(|c| consumed.contains(&c.channel));
                let mut fresh = Vec::new();
                positions.retain(|&(c, o)| {
                    let known = snapshot.offsets.iter().any(|(s, _)| *s == c);
                    if !known {
                        fresh.push((c, o));
                    }
                    known
                });
                let mut committed_with = snapshot.offsets.clone();
                committed_with.sort();
                if committed_with != positions {
                    let name = |cs: &[(Channel, i64)]| {
                        cs.iter()
                            .map(|(c, o)| {
                                let topic = self.topic_names.get(&c.topic).cloned();
                                format!(
                                    "{}/{}@{o}",
                                    topic.unwrap_or_else(|| c.topic.to_string()),
                                    c.partition
                                )
                            })
                            .collect()
                    };
                    return Err(Error::RestoreMismatch {
                        stage: self.spec.name().to_string(),
                        partition,
                        changelog: name(&committed_with),
                        group: name(&positions),
                    });
                }
                let mut gate =
                    Gate::restore(consumed.iter().copied(), &snapshot.gate).map_err(gate_error)?;
                for (channel, position) in fresh {
                    let start = self.log_start(channel)?;
                    info!(partition, %channel, group_offset = position, start, "a channel new to the task starts at its log start");
                    if start != position {
                        self.seek(channel, start)?;
                    }
                    gate.seed(channel, start).map_err(gate_error)?;
                }
                Task {
                    partition,
                    gate,
                    clock: CausalClock::resume(
                        snapshot.sender,
                        snapshot.next_seq,
                        snapshot.clock,
                        true,
                    ),
                    state: restored.state,
                    dirty: BTreeSet::new(),
                    changed: false,
                    snapshot_offsets: committed_with,
                    pending: TaskCounts::default(),
                    event_time: None,
                }
            }
            None => {
                let mut gate = Gate::new(consumed);
                for (channel, position) in &positions {
                    gate.seed(*channel, *position).map_err(gate_error)?;
                }
                Task {
                    partition,
                    gate,
                    clock: CausalClock::transactional(SenderId::random()),
                    state: restored.state,
                    dirty: BTreeSet::new(),
                    changed: false,
                    snapshot_offsets: Vec::new(),
                    pending: TaskCounts::default(),
                    event_time: None,
                }
            }
        };
        let mut task = task;
        task.event_time = self.start_event_time(&task, event_bytes.as_deref(), &timers)?;
        self.metrics.set_late_keys(
            partition,
            true,
            task.event_time.iter().flat_map(EventTime::late_by_key),
        );
        // Running once everything restored is in place: the snapshot, the state, the
        // event-time state and its counters.
        self.metrics
            .task(partition, |m| m.phase = TaskPhase::Running);
        info!(
            partition,
            records = restored.records,
            consumers_replaced = restored.replaced,
            keys = task.state.len(),
            sender = %task.clock.sender(),
            next_seq = task.clock.next_seq(),
            took_ms = started.elapsed().as_millis() as u64,
            "task restored"
        );
        Ok(task)
    }

    /// The event-time state of a task just restored, when the stage orders by event time:
    /// restored from `bytes` (the changelog's event-time record committed with the task's
    /// snapshot) or fresh, then started with the task's startup ends — one batched
    /// `ListOffsets(LATEST, READ_UNCOMMITTED)` for its event-time inputs — and the restored
    /// gate's frontiers (DESIGN.md §5).
    ///
    /// # Errors
    /// [`Error::EventTime`] for a record that does not decode, or for parked records in the
    /// changelog of a stage that no longer orders by event time (they would be lost); admin
    /// errors.
    fn start_event_time(
        &self,
        task: &Task,
        bytes: Option<&[u8]>,
        timers: &BTreeMap<Part<Vec<u8>>, Vec<u8>>,
    ) -> Result<Option<EventTime>> {
        let partition = task.partition;
        let event_error = |message: String| Error::EventTime {
            stage: self.spec.name().to_string(),
            partition,
            message,
        };
        let Some(order) = self.spec.event_time() else {
            if timers.keys().any(|p| matches!(p, Part::Segment(_))) {
                return Err(event_error(
                    "the changelog holds parked records but the stage no longer orders by event time; they would be lost".into(),
                ));
            }
            return Ok(None);
        };
        let control = match &order.control {
            Some(c) => {
                let source = self.source_index(&c.topic)?;
                Some((self.sources[source].id, c.lag_ms))
            }
            None => None,
        };
        let inputs: Vec<Channel> = self
            .sources
            .iter()
            .filter(|t| Some(t.id) != control.map(|(id, _)| id))
            .map(|t| Channel::new(t.id, partition))
            .collect();
        let topics = self.sources.iter().map(|t| (t.id, t.name.clone()));
        let mut et = match bytes {
            Some(b) => {
                EventTime::decode(inputs, control, topics, b, timers).map_err(event_error)?
            }
            None => EventTime::new(inputs, control, topics),
        };
        let inputs = et.inputs();
        let mut request = Vec::with_capacity(inputs.len());
        for c in &inputs {
            request.push((self.source_of(*c)?.name.as_str(), c.partition));
        }
        let ends = self.admin.high_watermarks(&request)?;
        let stable = self.admin.last_stable_offsets(&request)?;
        let gate_error = |source| Error::Gate {
            stage: self.spec.name().to_string(),
            partition,
            source: Box::new(source),
        };
        for ((c, end), lso) in inputs.iter().zip(ends).zip(stable) {
            et.start(*c, end).map_err(gate_error)?;
            // Completeness waits for an open transaction to resolve (DESIGN.md §5): say which
            // channel waits and for what, rather than guess.
            if lso < end && task.gate.first_undelivered(c).is_some_and(|f| f < end) {
                info!(
                    topic = %self.source_of(*c)?.name,
                    partition = c.partition,
                    last_stable_offset = lso,
                    startup_end = end,
                    "event-time catch-up waits for an open transaction: history ends at the \
                     high watermark, above the last stable offset, until it commits or aborts"
                );
            }
        }
        et.follow(&task.gate).map_err(gate_error)?;
        info!(
            partition,
            parked = et.parked(),
            watermark = ?et.watermark(),
            catching_up = et.catching_up(),
            "event-time order started"
        );
        Ok(Some(et))
    }

    /// Hands the trackers the live-head evidence of every caught-up event-time input of every
    /// task, after the batch's polls and deliveries (DESIGN.md §5; `event_time::head_evidence`):
    /// the high watermark of the channel's latest fetch response when the frontier has reached
    /// it (a local read), an earlier LSO reading when the frontier has not reached that, and
    /// otherwise the LSO read from the leaders, with one batched
    /// `ListOffsets(LATEST, READ_COMMITTED)` for every channel that needs it.
    fn read_heads(&mut self) -> Result<()> {
        let stage = self.spec.name().to_string();
        let gate_error = |partition: i32, source| Error::Gate {
            stage: stage.clone(),
            partition,
            source: Box::new(source),
        };
        let mut ask: Vec<Channel> = Vec::new();
        for task in self.tasks.values_mut() {
            let Some(et) = task.event_time.as_mut() else {
                continue;
            };
            for c in et.caught_up_inputs() {
                let Some(frontier) = task.gate.frontier(&c) else {
                    ask.push(c);
                    continue;
                };
                let source = source_position(&self.sources, c)?;
                // A paused partition is not fetched: its last response says nothing about
                // what was appended since.
                let fetched = if self.paused.contains(&(source, c.partition)) {
                    None
                } else {
                    cached_high_watermark(&self.consumer, &self.sources[source].name, c.partition)
                };
                match head_evidence(frontier + 1, fetched, et.last_stable(&c)) {
                    HeadEvidence::Fetched(hw) => et
                        .fetched_head(c, hw, false)
                        .map_err(|e| gate_error(c.partition, e))?,
                    HeadEvidence::Behind(lso) => et
                        .fetched_head(c, lso, false)
                        .map_err(|e| gate_error(c.partition, e))?,
                    HeadEvidence::Ask => ask.push(c),
                }
            }
        }
        if ask.is_empty() {
            return Ok(());
        }
        let mut request = Vec::with_capacity(ask.len());
        for c in &ask {
            request.push((self.source_of(*c)?.name.as_str(), c.partition));
        }
        let heads = self.admin.last_stable_offsets(&request)?;
        for (c, lso) in ask.iter().zip(heads) {
            if let Some(et) = self
                .tasks
                .get_mut(&c.partition)
                .and_then(|t| t.event_time.as_mut())
            {
                et.fetched_head(*c, lso, true)
                    .map_err(|e| gate_error(c.partition, e))?;
            }
        }
        Ok(())
    }

    /// The log start offset of source channel `channel`.
    fn log_start(&self, channel: Channel) -> Result<i64> {
        let topic = &self.source_of(channel)?.name;
        Ok(self
            .admin
            .log_start_offsets(&[(topic.as_str(), channel.partition)])?[0])
    }

    /// Moves the consumer's fetch position of source channel `channel` to `offset`.
    fn seek(&self, channel: Channel, offset: i64) -> Result<()> {
        let topic = &self.source_of(channel)?.name;
        self.consumer
            .seek(
                topic,
                channel.partition,
                Offset::Offset(offset),
                self.config.timeout,
            )
            .map_err(|e| Error::kafka(format!("seeking {channel} to {offset}"), e))
    }

    /// The index of source `topic` in `sources`, looked up per record: a linear scan (a stage
    /// has few sources, and comparing a name is cheaper than hashing it).
    ///
    /// # Errors
    /// [`Error::UnknownTopic`] when `topic` is not a source of the stage.
    fn source_index(&self, topic: &str) -> Result<usize> {
        self.sources
            .iter()
            .position(|t| t.name == topic)
            .ok_or_else(|| Error::UnknownTopic {
                topic: topic.to_string(),
            })
    }

    fn source_of(&self, channel: Channel) -> Result<&TopicInfo> {
        Ok(&self.sources[source_position(&self.sources, channel)?])
    }

    /// Copies what the task needs out of a polled message and decodes its stamp.
    fn fetched(&self, m: &BorrowedMessage<'_>, arrival: u64, arrived: Instant) -> Result<Fetched> {
        let source = self.source_index(m.topic())?;
        let channel = Channel::new(self.sources[source].id, m.partition());
        let (stamp, malformed) = match decode_stamp(m, channel) {
            Ok(stamp) => (stamp, None),
            Err(e) => (None, Some(Box::new(e))),
        };
        let record_timestamp = m.timestamp().to_millis();
        // Kafka's v2 record format always has a timestamp; it only orders deliverable records.
        let mut timestamp = record_timestamp.unwrap_or(i64::MIN);
        let (stamp, unchecked_stamp) = match self.config.gate {
            GateMode::Causal => (stamp, None),
            GateMode::Off => {
                // A plain consumer: deliver in arrival order.
                timestamp = arrival as i64;
                (None, stamp.map(Box::new))
            }
        };
        Ok(Fetched {
            partition: m.partition(),
            channel,
            arrival: Arrival {
                offset: m.offset(),
                epoch: self.epoch,
                timestamp,
                stamp,
                payload: Payload {
                    source,
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                    arrived,
                    record_timestamp,
                    unchecked_stamp,
                    dead_letter: None,
                },
            },
            malformed,
        })
    }

    /// Hands a fetched record to its task's gate.
    fn accept(&mut self, f: Fetched) -> Result<()> {
        let Fetched {
            partition,
            channel,
            mut arrival,
            malformed,
        } = f;
        if let Some(error) = malformed {
            self.metrics.impossible();
            self.metrics.task(partition, |m| m.impossible_stamps += 1);
            match self.spec.impossible_policy() {
                ImpossiblePolicy::Fail => return Err(*error),
                ImpossiblePolicy::DeliverAndCount => {
                    warn!(%error, "delivering a record with a malformed stamp as unstamped");
                }
                ImpossiblePolicy::DeadLetter { .. } => {
                    arrival.payload.dead_letter = Some(error.to_string().into());
                }
            }
        }
        // The stage's name is copied into an error only when there is one (not per record).
        let stage = self.spec.name();
        let cap = self.config.max_queued_per_channel;
        let task = self.tasks.get_mut(&partition).ok_or_else(|| Error::Gate {
            stage: stage.to_string(),
            partition,
            source: Box::new(parsley_gate::GateError::NotSeeded { channel }),
        })?;
        let refetching = task.gate.refetching(&channel).is_some();
        let refetched = if refetching {
            task.gate.metrics().refetched
        } else {
            0
        };
        task.gate
            .offer(channel, arrival)
            .map_err(|refused| Error::Gate {
                stage: stage.to_string(),
                partition,
                source: Box::new(refused.kind),
            })?;
        self.metrics.fetched();
        if refetching {
            self.metrics
                .refetched(task.gate.metrics().refetched - refetched);
        }
        if task.gate.held(&channel) > cap {
            // Mid-batch: a channel an in-flight claim needs spills at once; any other is
            // paused after the batch.
            if task.gate.refetching(&channel).is_none() && task.gate.needs_reading(&channel) {
                let n = task.gate.spill(&channel);
                debug!(%channel, spilled = n, "spilling a channel a claim needs");
                self.metrics.spilled(n);
            }
            if task.gate.held(&channel) > cap {
                self.metrics.beyond_cap();
            }
        }
        Ok(())
    }

    /// Bounds what each channel holds (DESIGN.md §4), once per poll batch:
    /// - a full channel is paused — unless an unsettled in-flight claim needs it read: then it
    ///   **spills** (untracked records drop their payloads, leaving stubs) and is read on;
    /// - a needed spilled record is **re-fetched**: the channel seeks back to it (spilling
    ///   records nobody waits for to make room) and re-reads until where reading had stopped,
    ///   or until it is full again and no needed record lies ahead;
    /// - a paused channel resumes once it holds at most half the cap.
    fn apply_backpressure(&mut self) -> Result<()> {
        let cap = self.config.max_queued_per_channel;
        let mut pauses = Vec::new();
        let mut seeks = Vec::new();
        for (partition, task) in &mut self.tasks {
            let wanted = task.gate.refetch_wanted();
            for (source, info) in self.sources.iter().enumerate() {
                let channel = Channel::new(info.id, *partition);
                if task.gate.baseline(&channel).is_none() {
                    continue;
                }
                let held = task.gate.held(&channel);
                let paused = self.paused.contains(&(source, *partition));
                let want = wanted.iter().find(|(c, _)| *c == channel).map(|(_, o)| *o);
                let mut pause = paused;
                if let Some(r) = task.gate.refetching(&channel) {
                    if held >= cap {
                        if want.is_some() {
                            let n = task.gate.spill(&channel);
                            self.metrics.spilled(n);
                        } else {
                            task.gate.end_refetch(&channel);
                            seeks.push((source, *partition, r.resume));
                            debug!(%channel, resume = r.resume, "re-fetch ends early: full");
                        }
                    }
                    pause = false;
                } else if let Some(from) = want {
                    if held >= cap {
                        let n = task.gate.spill(&channel);
                        self.metrics.spilled(n);
                    }
                    let resume =
                        task.gate
                            .begin_refetch(channel, from)
                            .map_err(|source| Error::Gate {
                                stage: self.spec.name().to_string(),
                                partition: *partition,
                                source: Box::new(source),
                            })?;
                    debug!(%channel, from, resume, "re-fetching spilled records");
                    seeks.push((source, *partition, from));
                    pause = false;
                } else if held >= cap {
                    if task.gate.needs_reading(&channel) {
                        let n = task.gate.spill(&channel);
                        self.metrics.spilled(n);
                        debug!(%channel, spilled = n, "spilling a channel a claim needs");
                        pause = false;
                    } else {
                        pause = true;
                    }
                } else if held <= cap / 2 {
                    pause = false;
                }
                if pause != paused {
                    pauses.push((source, *partition, pause));
                }
            }
        }
        for (source, partition, pause) in pauses {
            debug!(topic = %self.sources[source].name, partition, pause, "backpressure");
            if pause {
                self.paused.insert((source, partition));
            } else {
                self.paused.remove(&(source, partition));
            }
            self.set_paused(source, partition, pause)?;
        }
        for (source, partition, offset) in seeks {
            self.consumer
                .seek(
                    &self.sources[source].name,
                    partition,
                    Offset::Offset(offset),
                    self.config.timeout,
                )
                .map_err(|e| Error::kafka("seeking to re-fetch spilled records", e))?;
        }
        Ok(())
    }

    fn set_paused(&self, source: usize, partition: i32, pause: bool) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.sources[source].name, partition);
        if pause {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        }
        .map_err(|e| Error::kafka("pausing or resuming a partition", e))
    }

    /// Delivers every deliverable record of the task of `partition`.
    fn deliver(&mut self, partition: i32) -> Result<()> {
        let Some(mut task) = self.tasks.remove(&partition) else {
            return Ok(());
        };
        let _span = trace_span!("deliver", partition).entered();
        let result = self.deliver_task(&mut task);
        let counts = std::mem::take(&mut task.pending);
        let blocked = task.gate.blocked_count() as u64;
        let event_time = task
            .event_time
            .as_ref()
            .map(|et| (et.parked() as u64, et.watermark(), et.catching_up() as u64));
        self.metrics.task(partition, |m| {
            m.delivered += counts.delivered;
            m.held += counts.held;
            m.gate_wait_us += counts.gate_wait_us;
            m.max_gate_wait_us = m.max_gate_wait_us.max(counts.max_gate_wait_us);
            m.blocked_heads = blocked;
            m.late += counts.late;
            m.raised += counts.raised;
            if let Some((parked, watermark, catching_up)) = event_time {
                m.parked = parked;
                m.watermark_ms = watermark;
                m.catching_up = catching_up;
            }
        });
        self.metrics.blocked_heads(
            self.tasks
                .values()
                .map(|t| t.gate.blocked_count() as u64)
                .sum::<u64>()
                + task.gate.blocked_count() as u64,
        );
        self.tasks.insert(partition, task);
        if self.spec.event_time().is_some() {
            self.metrics.parked(
                self.tasks
                    .values()
                    .filter_map(|t| t.event_time.as_ref())
                    .map(|et| et.parked() as u64)
                    .sum(),
            );
        }
        result
    }

    /// Delivers what the gate releases; for an event-time stage, parks each delivery in the
    /// task's timer queue and hands over what the watermark releases (module docs of
    /// `event_time`).
    fn deliver_task(&mut self, task: &mut Task) -> Result<()> {
        let processor = self.spec.processor().clone();
        while let Some(d) = task.gate.next_delivery() {
            task.changed = true;
            let payload = d.payload;
            let stamp = d.stamp.as_ref().or(payload.unchecked_stamp.as_deref());
            task.clock.observe(d.coordinate, stamp);
            for r in &d.replacements {
                task.clock.learn(*r)?;
            }
            if d.lookahead {
                self.metrics.lookahead();
            }
            if let Some(reason) = payload.dead_letter.clone() {
                self.dead_letter(task, &payload, d.coordinate, &reason)?;
                self.uncommitted.deliveries += 1;
                self.metrics.delivered();
                task.pending.delivered += 1;
                continue;
            }
            let topic = &self.sources[payload.source].name;
            // `topic` as a `&str` field: a subscriber gets it without formatting.
            trace!(target: DELIVERY_TARGET, topic = topic.as_str(), partition = task.partition,
                offset = d.coordinate.offset, "delivered");
            let waited_us = d
                .waited
                .then(|| payload.arrived.elapsed().as_micros() as u64);
            if let Some(us) = waited_us {
                trace!(topic = %topic, partition = task.partition, offset = d.coordinate.offset,
                    waited_us = us, "held record delivered");
                self.metrics.held(us);
                task.pending.held += 1;
                task.pending.gate_wait_us += us;
                task.pending.max_gate_wait_us = task.pending.max_gate_wait_us.max(us);
            }
            let Some(et) = task.event_time.as_mut() else {
                self.handle(
                    &processor,
                    task,
                    payload.source,
                    d.coordinate.offset,
                    payload.record_timestamp.unwrap_or(NO_TIMESTAMP),
                    payload.key.as_deref(),
                    payload.value,
                )?;
                continue;
            };
            let timestamp = payload.record_timestamp.ok_or_else(|| Error::NoEventTime {
                stage: self.spec.name().to_string(),
                topic: topic.clone(),
                partition: task.partition,
                offset: d.coordinate.offset,
            })?;
            let record = ParkedRecord {
                channel: (
                    d.coordinate.channel.topic.to_bytes(),
                    d.coordinate.channel.partition,
                ),
                offset: d.coordinate.offset,
                timestamp,
                keyless: payload.key.is_none(),
                value: payload.value,
                sender: stamp
                    .and_then(|s| s.sender)
                    .map(|t| (*t.sender.as_bytes(), t.seq)),
            };
            let delivered = et
                .deliver(stamp, &d.replacements, payload.key, record)
                .map_err(|source| Error::Gate {
                    stage: self.spec.name().to_string(),
                    partition: task.partition,
                    source: Box::new(source),
                })?;
            self.uncommitted.parked += 1;
            match delivered {
                Delivered::Parked { late, raised } => {
                    if late {
                        task.pending.late += 1;
                        self.metrics.late();
                    }
                    if raised {
                        task.pending.raised += 1;
                        self.metrics.raised();
                    }
                }
                Delivered::Now(h) => {
                    if h.late {
                        task.pending.late += 1;
                        self.metrics.late();
                    }
                    self.hand_over(&processor, task, h)?;
                }
            }
        }
        if let Some(et) = task.event_time.as_mut() {
            et.follow(&task.gate).map_err(|source| Error::Gate {
                stage: self.spec.name().to_string(),
                partition: task.partition,
                source: Box::new(source),
            })?;
            if et.release() > 0 {
                task.changed = true;
            }
            while let Some(h) = task.event_time.as_mut().and_then(EventTime::next_release) {
                self.hand_over(&processor, task, h)?;
            }
        }
        Ok(())
    }

    /// Hands a record released by the task's timer queue to the handler (late records are
    /// counted when the queue takes them, not here).
    fn hand_over(
        &mut self,
        processor: &Arc<dyn parsley_stage::Processor>,
        task: &mut Task,
        h: HandOver,
    ) -> Result<()> {
        let record = h.record;
        let id = TopicId::from_bytes(record.channel.0);
        // A record parked before its topic was recreated (a new id) goes to the source of the
        // same name, as it did when parked.
        let source = match self.sources.iter().position(|t| t.id == id) {
            Some(s) => s,
            None => {
                let name = task.event_time.as_ref().and_then(|et| et.topic_name(id));
                self.source_index(name.ok_or_else(|| Error::UnknownTopic {
                    topic: id.to_string(),
                })?)?
            }
        };
        self.handle(
            processor,
            task,
            source,
            record.offset,
            record.timestamp,
            h.key.as_deref(),
            record.value,
        )
    }

    /// Runs the handler on one record of `task`: fold state, emissions, counts. `timestamp` is
    /// the record's Kafka timestamp (ms since the epoch, [`NO_TIMESTAMP`] when it has none): the
    /// handler sees it, and every emission carries it (timestamp propagation, as in Kafka
    /// Streams), so a downstream stage that orders by event time sees the event time of the
    /// record that caused each output, not the moment it was produced.
    #[allow(clippy::too_many_arguments)]
    fn handle(
        &mut self,
        processor: &Arc<dyn parsley_stage::Processor>,
        task: &mut Task,
        source: usize,
        offset: i64,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<Vec<u8>>,
    ) -> Result<()> {
        let state_key = key.unwrap_or_default();
        let step = processor.process_delivery(
            RawDelivery {
                topic: &self.sources[source].name,
                partition: task.partition,
                offset,
                timestamp,
                key,
                value,
            },
            task.state.get(state_key).map(Vec::as_slice),
        )?;
        match step.state {
            StateChange::Keep => {}
            StateChange::Set(s) => {
                task.state.insert(state_key.to_vec(), s);
                task.dirty.insert(state_key.to_vec());
            }
            StateChange::Delete => {
                task.state.remove(state_key);
                task.dirty.insert(state_key.to_vec());
            }
        }
        for emission in step.emit {
            self.emit(task, emission, timestamp)?;
        }
        self.uncommitted.deliveries += 1;
        self.metrics.delivered();
        task.pending.delivered += 1;
        Ok(())
    }

    /// Stamps and sends one emission of `task` with record timestamp `timestamp` (ms since the
    /// epoch; [`NO_TIMESTAMP`]: the producer's clock).
    fn emit(&mut self, task: &mut Task, e: RawEmission, timestamp: i64) -> Result<()> {
        let sink = self
            .sinks
            .iter()
            .find(|t| *t.name == *e.topic)
            .ok_or_else(|| Error::UnknownTopic {
                topic: e.topic.to_string(),
            })?;
        let channel = Channel::new(sink.id, partition_for(&e.key, sink.partitions));
        // A task's clock is transactional: sends not acknowledged yet are claimed in flight,
        // so no send waits for another's acknowledgement.
        let mut bytes = std::mem::take(&mut self.stamp_buf);
        bytes.clear();
        let sender = task.clock.stamp_into(channel, &mut bytes);
        let sender = match sender {
            Ok(s) => s,
            Err(e) => {
                self.stamp_buf = bytes;
                return Err(e.into());
            }
        };
        let tag = SendTag {
            task: task.partition,
            channel,
            seq: sender.seq,
        };
        let timestamp = (timestamp != NO_TIMESTAMP).then_some(timestamp);
        if self.committing {
            self.stamp_buf = Vec::with_capacity(bytes.len());
            self.unsent.push(Unsent {
                topic: e.topic,
                tag,
                key: e.key,
                value: e.value,
                stamp: bytes,
                extra: Vec::new(),
                timestamp,
            });
        } else {
            let sent = self.outbox.send(
                &e.topic,
                tag,
                &e.key,
                e.value,
                &bytes,
                &[],
                timestamp,
                self.config.timeout,
            );
            self.stamp_buf = bytes;
            if let Err(err) = sent {
                task.clock.failed(tag.seq, channel)?;
                return Err(err);
            }
        }
        self.uncommitted.emissions += 1;
        self.metrics.emitted();
        Ok(())
    }

    /// Applies the delivery reports recorded so far to the tasks' clocks; `current` is a task
    /// taken out of the map while it delivers.
    fn settle_acks(&mut self, mut current: Option<&mut Task>) -> Result<()> {
        for ack in self.outbox.drain() {
            let Some(tag) = ack.tag else {
                // A changelog write: only its failure matters.
                if let Err(source) = ack.result {
                    return Err(Error::Send {
                        topic: self.changelog.name.clone(),
                        channel: Box::new(Channel::new(self.changelog.id, -1)),
                        source,
                    });
                }
                continue;
            };
            let task = match current.as_deref_mut() {
                Some(t) if t.partition == tag.task => t,
                _ => match self.tasks.get_mut(&tag.task) {
                    Some(t) => t,
                    // The task was dropped (revoked) with its aborted transaction.
                    None => continue,
                },
            };
            match ack.result {
                Ok(offset) => {
                    task.clock.acked(tag.seq, tag.channel.at(offset))?;
                    if self.looped.contains(&tag.channel.topic) {
                        let lowest = self.own_writes.entry(tag.channel).or_insert(offset);
                        *lowest = (*lowest).min(offset);
                    }
                }
                Err(source) => {
                    let topic = self
                        .sinks
                        .iter()
                        .find(|t| t.id == tag.channel.topic)
                        .map_or_else(String::new, |t| t.name.clone());
                    return Err(Error::Send {
                        topic,
                        channel: Box::new(tag.channel),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// The input offsets `task` would commit now: the first undelivered offset of each of its
    /// channels, sorted by channel.
    fn input_offsets(&self, task: &Task) -> Vec<(Channel, i64)> {
        let mut committed: Vec<(Channel, i64)> = self
            .sources
            .iter()
            .filter_map(|source| {
                let channel = Channel::new(source.id, task.partition);
                task.gate
                    .first_undelivered(&channel)
                    .map(|next| (channel, next))
            })
            .collect();
        committed.sort();
        committed
    }

    /// `true` when a task that has committed before would now commit other input offsets
    /// with no delivery in between: its position moved over commit markers or aborted
    /// records (case C01 — the committed position after a trailing marker is the end). Such
    /// a move is committed at the next interval in an offsets-only transaction (case C06).
    fn positions_moved(&self) -> bool {
        self.tasks.values().any(|task| {
            !task.snapshot_offsets.is_empty() && self.input_offsets(task) != task.snapshot_offsets
        })
    }

    /// Adds the input offsets of `task` to `offsets` and writes its changed state and, when
    /// anything changed, its snapshot to the changelog, in the open transaction.
    fn write_changelog(&self, task: &mut Task, offsets: &mut TopicPartitionList) -> Result<()> {
        let committed = self.input_offsets(task);
        for &(channel, next) in &committed {
            let topic = &self.source_of(channel)?.name;
            offsets
                .add_partition_offset(topic, task.partition, Offset::Offset(next))
                .map_err(|e| Error::kafka("building the offsets to commit", e))?;
        }
        let channel = Channel::new(self.changelog.id, task.partition);
        let topic = &self.changelog.name;
        let mut key = vec![STATE_PREFIX];
        for k in std::mem::take(&mut task.dirty) {
            key.truncate(1);
            key.extend_from_slice(&k);
            let value = task.state.get(&k).map(Vec::as_slice);
            self.outbox
                .send_changelog(channel, topic, &key, value, self.config.timeout)?;
        }
        // The timer queue's changes (records parked and released since the last commit): they
        // change only with deliveries and releases, which also write the snapshot below.
        if let Some(et) = &task.event_time {
            self.metrics
                .set_late_keys(task.partition, false, et.late_changed());
        }
        let event_time = match task.event_time.as_mut() {
            Some(et) => Some(et.take_changes().map_err(|source| Error::Gate {
                stage: self.spec.name().to_string(),
                partition: task.partition,
                source: Box::new(source),
            })?),
            None => None,
        };
        for (key, record) in event_time.iter().flat_map(|c| &c.parts) {
            self.outbox.send_changelog(
                channel,
                topic,
                key,
                record.as_deref(),
                self.config.timeout,
            )?;
        }
        // A timer-queue change needs its header (watermark, segment numbers) in the same
        // transaction.
        let queue_changed = event_time.as_ref().is_some_and(|c| !c.parts.is_empty());
        if task.changed || committed != task.snapshot_offsets || queue_changed {
            let snapshot = TaskSnapshot {
                sender: task.clock.sender(),
                next_seq: task.clock.next_seq(),
                clock: task.clock.clock().clone(),
                gate: task.gate.snapshot(),
                offsets: committed.clone(),
            };
            self.outbox.send_changelog(
                channel,
                topic,
                META_KEY,
                Some(&snapshot.encode()),
                self.config.timeout,
            )?;
            if let Some(changes) = &event_time {
                // Written with the snapshot, in the same transaction: restored together.
                self.outbox.send_changelog(
                    channel,
                    topic,
                    EVENT_TIME_KEY,
                    Some(&changes.record),
                    self.config.timeout,
                )?;
            }
            task.changed = false;
            task.snapshot_offsets = committed;
        }
        Ok(())
    }

    /// Sets every task's frontier lag from the end offsets of the consumer's last fetch
    /// responses (a local read, no request).
    fn publish_frontier_lag(&self) {
        for task in self.tasks.values() {
            let mut lag = Some(0);
            for source in &self.sources {
                let channel = Channel::new(source.id, task.partition);
                let end = cached_high_watermark(&self.consumer, &source.name, task.partition);
                let first = task.gate.first_undelivered(&channel);
                lag = match (lag, end, first) {
                    (Some(l), Some(end), Some(first)) => Some(l + (end - first).max(0)),
                    _ => None,
                };
            }
            self.metrics.task(task.partition, |m| m.frontier_lag = lag);
        }
    }

    /// Commits the open transaction with the input offsets of every task, then begins the
    /// next one.
    ///
    /// With `overlap` (and no shutdown pending), the commit's round trips (`AddOffsetsToTxn`,
    /// `TxnOffsetCommit`, `EndTxn`) run on a helper thread while this thread takes the records
    /// the consumer has ready ([`StageRunner::overlap_batch`]); their sends wait for the next
    /// transaction. Everything the committing transaction holds — outputs, changelog, offsets
    /// — is fixed before the helper starts.
    fn commit(&mut self, overlap: bool) -> Result<()> {
        // The interval runs from the start of a commit, as Kafka Streams counts
        // `commit.interval.ms`: a record that arrives during a commit waits for that commit and
        // at most one interval after its start, not a whole interval after its end.
        let commit_started = Instant::now();
        let _span = debug_span!("commit").entered();
        self.publish_frontier_lag();
        if self.uncommitted.deliveries == 0
            && self.uncommitted.emissions == 0
            && self.uncommitted.parked == 0
            && !self.positions_moved()
        {
            self.last_commit = commit_started;
            return Ok(());
        }
        // Every output of the transaction acknowledged: the clocks claim coordinates only.
        let flush_started = Instant::now();
        self.outbox.flush(self.config.timeout)?;
        let flush_us = flush_started.elapsed().as_micros() as u64;
        self.settle_acks(None)?;
        let mut offsets = TopicPartitionList::new();
        let changelog_started = Instant::now();
        let mut tasks = std::mem::take(&mut self.tasks);
        let written = tasks
            .values_mut()
            .try_for_each(|task| self.write_changelog(task, &mut offsets));
        self.tasks = tasks;
        written?;
        if self.uncommitted.deliveries > 0 && fault() == Some(Fault::AbortAfterChangelog) {
            // Fault injection (case C10): the changelog records of a transaction with
            // deliveries are in the log, uncommitted; the process dies before its offsets and
            // its commit, with no cleanup, as under `kill -9`.
            self.outbox.flush(self.config.timeout)?;
            warn!("PARSLEY_FAULT=abort-after-changelog: aborting the process");
            std::process::abort();
        }
        let metadata = self.consumer.group_metadata().ok_or_else(|| Error::Admin {
            operation: "committing".into(),
            message: "the consumer has no group metadata".into(),
        })?;
        let changelog_us = changelog_started.elapsed().as_micros() as u64;
        let started = Instant::now();
        // Counted from here: what an overlapped commit takes belongs to the next transaction.
        let done = std::mem::take(&mut self.uncommitted);
        let mut overlapped = Ok(());
        let overlap = overlap && !self.shutdown.load(Ordering::Relaxed);
        if overlap {
            // The changelog's sends are not waited for here: the helper's commit flushes them,
            // and this thread serves their delivery reports between the batches it takes
            // meanwhile.
            let (committed, taken) = self.commit_overlapped(&offsets, &metadata);
            committed?;
            overlapped = taken;
        } else {
            self.outbox
                .producer()
                .send_offsets_to_transaction(&offsets, &metadata, self.config.timeout)
                .map_err(|e| Error::kafka("sending offsets to the transaction", e))?;
            self.outbox.commit_transaction(self.config.timeout)?;
        }
        self.outbox.wait_acked(self.config.timeout)?;
        self.settle_acks(None)?;
        self.metrics.committed(done.deliveries, done.emissions);
        debug!(
            deliveries = done.deliveries,
            emissions = done.emissions,
            took_us = started.elapsed().as_micros() as u64,
            flush_us,
            changelog_us,
            poll_batches = self.epoch,
            "committed"
        );
        if let Some(o) = &self.observer {
            let _ = o.send(Progress::Committed {
                stage: self.spec.name().to_string(),
                metrics: self.metrics.snapshot(),
            });
        }
        // After an overlapped commit a transaction opens even if a shutdown arrived meanwhile:
        // the work done during the commit goes into it, and the shutdown commits it.
        if overlap || !self.shutdown.load(Ordering::Relaxed) {
            self.begin()?;
        }
        self.last_commit = commit_started;
        // An error of the work done during the commit surfaces now, with the next transaction
        // open: the recovery aborts it and returns the tasks to the commit just made.
        overlapped?;
        self.send_unsent()
    }

    /// Sends the offsets and commits on a helper thread while this thread runs
    /// [`StageRunner::overlap_batch`] until the commit returns or nothing is ready; returns
    /// the commit's result and the overlapped work's.
    fn commit_overlapped(
        &mut self,
        offsets: &TopicPartitionList,
        metadata: &rdkafka::consumer::ConsumerGroupMetadata,
    ) -> (Result<()>, Result<()>) {
        let producer = self.outbox.shared_producer();
        let timeout = self.config.timeout;
        let finished = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let finished = &finished;
            let helper = scope.spawn(move || {
                let result = producer
                    .send_offsets_to_transaction(offsets, metadata, timeout)
                    .map_err(|e| Error::kafka("sending offsets to the transaction", e))
                    .and_then(|()| Outbox::commit_served(&producer, timeout));
                finished.store(true, Ordering::Release);
                producer.context().signal();
                result
            });
            self.committing = true;
            let mut taken = Ok(());
            while !finished.load(Ordering::Acquire) {
                // The commit's flush waits for the changelog's delivery reports: served
                // between batches.
                self.outbox.serve();
                match self.overlap_batch() {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        taken = Err(e);
                        break;
                    }
                }
            }
            self.outbox.serve_until(|| finished.load(Ordering::Acquire));
            self.committing = false;
            let committed = match helper.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            (committed, taken)
        })
    }
}

/// The `tracing` target of the event sent for every record delivered to the handler, at
/// `TRACE` level, with fields `topic` (a `&str`: `fmt` prints it quoted), `partition` and
/// `offset` (committed or not): a delivery
/// journal for audits such as the fault-injection suite's re-read measurement. Off unless a
/// subscriber enables it (e.g. `RUST_LOG=parsley::delivery=trace`).
pub const DELIVERY_TARGET: &str = "parsley::delivery";

/// librdkafka's cached high watermark of `topic`/`partition`, from the consumer's last fetch
/// response (`rd_kafka_get_watermark_offsets`: a local read, no request; the rdkafka crate does
/// not wrap it); `None` before the first fetch response. Not evidence for the causal gate
/// (DESIGN.md §4 wants a `READ_UNCOMMITTED` `ListOffsets` after the poll: a claim on another
/// channel can name a record appended after that channel's last fetch response); used for the
/// frontier-lag metric and, when the frontier has reached it, as the live-head evidence of
/// event-time ordering (DESIGN.md §5: the latest fetch response, whose LSO is at or below it).
fn cached_high_watermark<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1_i64, -1_i64);
    // SAFETY: the client handle is alive for as long as `consumer` is borrowed; `topic` is a
    // NUL-terminated string that outlives the call; `low` and `high` are valid for writes.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}

/// The index in `sources` (a stage's source topics) of the topic of `channel`.
///
/// # Errors
/// [`Error::UnknownTopic`] (naming the topic id) when it is not a source of the stage.
fn source_position(sources: &[TopicInfo], channel: Channel) -> Result<usize> {
    sources
        .iter()
        .position(|t| t.id == channel.topic)
        .ok_or_else(|| Error::UnknownTopic {
            topic: channel.topic.to_string(),
        })
}

/// Decodes the `parsley.stamp` header of `m`; `None` when the record has none.
fn decode_stamp(m: &BorrowedMessage<'_>, channel: Channel) -> Result<Option<Stamp>> {
    let Some(headers) = m.headers() else {
        return Ok(None);
    };
    let Some(value) = headers
        .iter()
        .find(|h| h.key == parsley_clock::STAMP_HEADER)
        .map(|h| h.value.unwrap_or_default())
    else {
        return Ok(None);
    };
    codec::decode(value)
        .map(Some)
        .map_err(|source| Error::MalformedStamp {
            topic: m.topic().to_string(),
            partition: m.partition(),
            offset: m.offset(),
            record: channel.at(m.offset()),
            source: Box::new(source),
        })
}
