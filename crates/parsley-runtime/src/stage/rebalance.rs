//! Rebalance: what the consumer's callback records, and the checks before the stream thread
//! hands tasks in (`StageRunner::handle_rebalance`).
//!
//! On assignment the callback reads the group's committed offsets (librdkafka asks with
//! `require_stable` under `read_committed`) or, without one, the log start offset, and assigns
//! those positions explicitly; the stream thread then checks the assignment
//! ([`check_assignment`]) and restores each task from its changelog partition (module
//! `tasks::restore`). On revocation the stream thread commits first (with the group generation that
//! is still its own), then unassigns and drops its tasks; the next owner restores exactly that
//! commit.
//!
//! Invariant: a revoked task's work is committed before its partitions are given up, and no
//! task starts on an assignment that breaks co-partitioning or a source that changed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parsley_clock::Channel;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};

use tracing::{debug, info};

use crate::admin::Admin;
use crate::config::{RuntimeConfig, StatisticsSink, forward_statistics};
use parsley_task::error::{Error, Result};
use parsley_task::error::{Operation, RecordError, SetupError};
use parsley_task::topic::TopicInfo;

/// What the rebalance callback tells the stream thread.
#[derive(Debug)]
pub(crate) enum RebalanceEvent {
    /// Partitions assigned at these positions (topic, partition, next offset to fetch).
    Assigned(Vec<(String, i32, i64)>),
    /// Partitions revoked. `lost`: the group already dropped this member (its session timed
    /// out, librdkafka's `rd_kafka_assignment_lost`), so its generation is gone and nothing
    /// may be committed for these partitions any more.
    Revoked {
        partitions: Vec<(String, i32)>,
        lost: bool,
    },
    /// The rebalance failed: the stage stops with this error.
    Failed(Error),
}

/// A rebalance failure described by `message`.
fn rebalance_failed(message: String) -> Error {
    Error::admin(Operation::Rebalance, message)
}

/// The consumer's context: records rebalance events for the stream thread.
pub(crate) struct RebalanceContext {
    events: Mutex<Vec<RebalanceEvent>>,
    /// `events` is not empty: read after every polled record without taking the lock.
    pending: AtomicBool,
    timeout: Duration,
    /// The stage's admin client (log start offsets, asked again while a leader moves).
    admin: Arc<Admin>,
    /// Set when the stream thread is done with the consumer: a revocation while closing is
    /// acknowledged at once (nothing is left to commit).
    closing: AtomicBool,
    /// Where librdkafka's statistics go, when the runtime was asked for them.
    statistics: Option<StatisticsSink>,
}

impl RebalanceContext {
    pub(crate) fn new(config: &RuntimeConfig, admin: Arc<Admin>) -> Self {
        RebalanceContext {
            events: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            timeout: config.timeout,
            admin,
            statistics: config.statistics_sink(),
        }
    }

    /// `true` when events wait.
    pub(crate) fn has_events(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// The events recorded since the last call.
    pub(crate) fn take_events(&self) -> Vec<RebalanceEvent> {
        let mut events = self.events.lock().expect("rebalance events");
        self.pending.store(false, Ordering::Release);
        std::mem::take(&mut *events)
    }

    /// From now on, a revocation is acknowledged at once.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// The committed offset of each partition, or its log start offset when the group has
    /// none. A committed offset below the log start offset is an error naming the lost range
    /// (retention or a deletion removed records this stage never delivered; case C12) —
    /// never a silent jump.
    pub(crate) fn start_positions(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &TopicPartitionList,
    ) -> Result<Vec<(String, i32, i64)>> {
        let committed = committed_offsets(consumer, tpl, self.timeout)?;
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
                        return Err(Error::Record(RecordError::RecordsLost {
                            topic: e.topic().to_string(),
                            partition: e.partition(),
                            from: o,
                            log_start: low,
                        }));
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
                            Err(e) => RebalanceEvent::Failed(crate::client_error::kafka(
                                Operation::Assign,
                                e,
                            )),
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
                RebalanceEvent::Revoked {
                    partitions: revoked,
                    lost: consumer.assignment_lost(),
                }
            }
            other => {
                let _ = consumer.unassign();
                RebalanceEvent::Failed(rebalance_failed(format!("rebalance error {other:?}")))
            }
        };
        let mut events = self.events.lock().expect("rebalance events");
        events.push(event);
        self.pending.store(true, Ordering::Release);
    }
}

/// Checks an assignment before any task starts: every task must get partition `p` of every
/// source (co-partitioning holds for this member's assignment, not only for the topics'
/// partition counts), and no source may have changed since the stage started — its partition
/// count (keys would move between tasks under the stage's feet) or its identity.
///
/// `sources` are the stage's sources as resolved at its start (`global` says which are global
/// sources, not assigned by the group), `now` the same topics described again, `by_task` the
/// assigned channels with their positions, by task.
///
/// # Errors
/// [`RecordError::SourceChanged`] or [`SetupError::NotCoPartitioned`], naming the topic and
/// partition.
pub(crate) fn check_assignment(
    stage: &str,
    sources: &[TopicInfo],
    global: impl Fn(&str) -> bool,
    now: &[TopicInfo],
    by_task: &BTreeMap<i32, Vec<(Channel, i64)>>,
) -> Result<()> {
    super::sources::compare(stage, sources, now)?;
    // The global sources are not the group's (module `tasks::global`).
    let sources: Vec<&TopicInfo> = sources.iter().filter(|t| !global(&t.name)).collect();
    for (partition, positions) in by_task {
        if positions.len() != sources.len() {
            return Err(Error::Setup(SetupError::NotCoPartitioned {
                stage: stage.to_string(),
                partitions: sources
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
            }));
        }
    }
    Ok(())
}

/// The group's committed offsets of `tpl` (`OffsetFetch` to the group coordinator), asked
/// again until `timeout` while the coordinator moves: librdkafka returns `NOT_COORDINATOR`,
/// `COORDINATOR_NOT_AVAILABLE` or `COORDINATOR_LOAD_IN_PROGRESS` (the coordinator's node died
/// and another is taking its partition over, or is loading it) and connection states
/// ([`crate::client_error::transient`]) to the caller instead of retrying them; each clears
/// within seconds of the move.
fn committed_offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: &TopicPartitionList,
    timeout: Duration,
) -> Result<TopicPartitionList> {
    let deadline = Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        // One request is given a slice of the bound, not all of it: a request sent just
        // before a broker restart can sit unanswered on the old connection until
        // `socket.timeout.ms`, while a fresh one is answered at once.
        let slice = remaining.min(COMMITTED_OFFSETS_SLICE);
        match consumer.committed_offsets(tpl.clone(), slice) {
            Ok(committed) => return Ok(committed),
            Err(e) if !remaining.is_zero() && timed_out(&e) && slice < remaining => {
                info!(
                    slice_ms = slice.as_millis() as u64,
                    "committed offsets: no answer from the group coordinator, asking again"
                );
            }
            Err(e) if !remaining.is_zero() && coordinator_moving(&e) => {
                debug!(error = %e, "committed offsets: the group coordinator moves, asking again");
                std::thread::sleep(Duration::from_millis(100).min(remaining));
            }
            Err(e) => {
                return Err(crate::client_error::kafka(
                    Operation::ReadCommittedOffsets,
                    e,
                ));
            }
        }
    }
}

/// The longest one `OffsetFetch` is waited for before it is asked again.
const COMMITTED_OFFSETS_SLICE: Duration = Duration::from_secs(10);

/// Whether `e` is librdkafka's local timeout of the call.
fn timed_out(e: &rdkafka::error::KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::OperationTimedOut)
}

/// Whether `e` says the group coordinator is moving or out of reach for now.
fn coordinator_moving(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    crate::client_error::transient(e)
        || matches!(
            e.rdkafka_error_code(),
            Some(C::NotCoordinator | C::CoordinatorNotAvailable | C::CoordinatorLoadInProgress)
        )
}
