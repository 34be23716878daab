//! The coordinators a commit waits on, as the cluster's metadata shows them: the group
//! coordinator of the stage's consumer group (`TxnOffsetCommit`) and the transaction
//! coordinator of its transactional id (`AddOffsetsToTxn`, `EndTxn`). Each is the leader of the
//! partition of an internal topic that holds its key, `abs(key.hashCode()) % partitions`, as
//! Kafka places them.
//!
//! What they are for: librdkafka can keep a commit's request parked on a coordinator whose
//! node has died, long after another node took the coordinator over (until some other broker
//! changes state; it does not re-query the coordinator on its own). So while a commit call
//! waits longer than [`LOOK_AFTER`], the stream thread looks at the metadata (at most every
//! [`LOOK_EVERY`]): once a coordinator has a leader other than the node it had when the stage
//! last committed, the call is given up at once, not at its bound, and the producer replaced
//! (module `commit_call`). When a call is given up at its bound, the error names the
//! coordinator it waited on and what the metadata says of it (its node, or no leader).
//!
//! Invariant: the nodes compared with are those seen after a commit that succeeded, forgotten
//! at every recovery (looked up again after the next commit); a look never blocks the stream
//! thread longer than [`LOOK_TIMEOUT`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use parsley_task::error::{Coordinator, CoordinatorRole, Operation};
use parsley_task::metrics::StageMetrics;
use rdkafka::producer::{BaseProducer, Producer};
use tracing::{debug, warn};

use crate::outbox::AckContext;

/// How long a commit call waits before the stream thread first looks where its coordinators
/// are (a commit takes milliseconds).
pub(super) const LOOK_AFTER: Duration = Duration::from_secs(1);
/// How often it looks again while the call waits.
pub(super) const LOOK_EVERY: Duration = Duration::from_secs(1);
/// The bound of one look (a metadata request).
pub(super) const LOOK_TIMEOUT: Duration = Duration::from_secs(1);

/// Java's `String.hashCode` of `s` (UTF-16 code units, wrapping arithmetic).
fn java_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The partition of an internal topic with `partitions` partitions that holds `key`: Kafka's
/// `Utils.abs(key.hashCode()) % partitions` (`abs(i32::MIN)` is 0).
pub(super) fn partition_for(key: &str, partitions: i32) -> i32 {
    let h = java_hash(key);
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions.max(1)
}

/// The coordinators of one stage and the nodes they had at its last commit.
pub(super) struct Coordinators {
    group: String,
    transactional_id: String,
    /// The stage's metrics, where a long wait is published for the readiness check.
    metrics: Arc<StageMetrics>,
    /// The call a long wait was published for.
    published: Option<Operation>,
    /// The group and the transaction coordinator's nodes after the last commit (`None`: not
    /// looked up since the start or the last recovery).
    known: Option<(Option<i32>, Option<i32>)>,
    /// When the stream thread last looked while a call waited.
    last_look: Option<Instant>,
}

impl Coordinators {
    pub(super) fn new(
        group: impl Into<String>,
        transactional_id: impl Into<String>,
        metrics: Arc<StageMetrics>,
    ) -> Self {
        Coordinators {
            group: group.into(),
            transactional_id: transactional_id.into(),
            metrics,
            published: None,
            known: None,
            last_look: None,
        }
    }

    fn key(&self, role: CoordinatorRole) -> &str {
        match role {
            CoordinatorRole::Group => &self.group,
            CoordinatorRole::Transaction => &self.transactional_id,
        }
    }

    /// The coordinator of `role` as the metadata shows it now; `None` when the metadata does
    /// not answer within [`LOOK_TIMEOUT`] or lists no partition of the internal topic.
    pub(super) fn look_up(
        &self,
        producer: &BaseProducer<AckContext>,
        role: CoordinatorRole,
    ) -> Option<Coordinator> {
        let topic = role.topic();
        let metadata = producer
            .client()
            .fetch_metadata(Some(topic), LOOK_TIMEOUT)
            .ok()?;
        let t = metadata.topics().iter().find(|t| t.name() == topic)?;
        let partitions = i32::try_from(t.partitions().len()).ok()?;
        if partitions == 0 {
            return None;
        }
        let key = self.key(role);
        let partition = partition_for(key, partitions);
        let leader = t
            .partitions()
            .iter()
            .find(|p| p.id() == partition)
            .map_or(-1, |p| p.leader());
        Some(Coordinator {
            role,
            key: key.to_string(),
            partition,
            node: (leader >= 0).then_some(leader),
        })
    }

    /// The coordinator `operation` waits on, for an error naming it.
    pub(super) fn waited_on(
        &self,
        producer: &BaseProducer<AckContext>,
        operation: Operation,
    ) -> Option<Coordinator> {
        let role = match operation {
            Operation::TxnOffsetCommit => CoordinatorRole::Group,
            _ => CoordinatorRole::Transaction,
        };
        self.look_up(producer, role)
    }

    /// While `operation` has waited `waited`, longer than `notice`: published once per call for
    /// the readiness check (`StageMetrics::commit_wait`), naming the coordinator it waits on.
    pub(super) fn long_wait(
        &mut self,
        producer: &BaseProducer<AckContext>,
        operation: Operation,
        waited: Duration,
        notice: Duration,
    ) {
        if waited < notice || self.published == Some(operation) {
            return;
        }
        self.published = Some(operation);
        let on = self.waited_on(producer, operation).map_or_else(
            || "its coordinator (the metadata does not answer)".to_string(),
            |c| c.to_string(),
        );
        self.metrics.set_commit_wait(Some(format!(
            "{operation} has waited {} ms on {on}",
            waited.as_millis()
        )));
    }

    /// The end of a commit, or of its wait: nothing published any more.
    fn clear_wait(&mut self) {
        if self.published.take().is_some() {
            self.metrics.set_commit_wait(None);
        }
    }

    /// After a commit that succeeded: the coordinators' nodes looked up when not known.
    pub(super) fn committed(&mut self, producer: &BaseProducer<AckContext>) {
        self.clear_wait();
        self.last_look = None;
        if self.known.is_none() {
            let group = self.look_up(producer, CoordinatorRole::Group);
            let txn = self.look_up(producer, CoordinatorRole::Transaction);
            if let (Some(g), Some(t)) = (group, txn) {
                self.known = Some((g.node, t.node));
            }
        }
    }

    /// After a recovery: the coordinators may have moved; looked up after the next commit.
    pub(super) fn forget(&mut self) {
        self.clear_wait();
        self.known = None;
        self.last_look = None;
    }

    /// While a call has waited `waited`: the coordinator that has moved to another node since
    /// the last commit, if a look (after [`LOOK_AFTER`], at most every [`LOOK_EVERY`]) shows
    /// one. A coordinator without a leader has not moved (yet): the call waits on.
    pub(super) fn moved(
        &mut self,
        producer: &BaseProducer<AckContext>,
        waited: Duration,
    ) -> Option<Coordinator> {
        let (group_node, txn_node) = self.known?;
        if waited < LOOK_AFTER || self.last_look.is_some_and(|l| l.elapsed() < LOOK_EVERY) {
            return None;
        }
        self.last_look = Some(Instant::now());
        for (role, known) in [
            (CoordinatorRole::Group, group_node),
            (CoordinatorRole::Transaction, txn_node),
        ] {
            match self.look_up(producer, role) {
                Some(now) if now.node.is_some() && now.node != known => {
                    warn!(
                        coordinator = %now,
                        was = ?known,
                        waited_ms = waited.as_millis() as u64,
                        "the coordinator moved while the commit waited: giving the call up"
                    );
                    return Some(now);
                }
                Some(now) => {
                    debug!(coordinator = %now, waited_ms = waited.as_millis() as u64, "the commit waits; its coordinator has not moved");
                }
                None => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_go_to_the_partition_kafka_computes() {
        // Java: "".hashCode() == 0, "a".hashCode() == 97, "polygenelubricants".hashCode() ==
        // Integer.MIN_VALUE (Utils.abs gives 0).
        assert_eq!(java_hash("a"), 97);
        assert_eq!(partition_for("", 50), 0);
        assert_eq!(partition_for("a", 50), 97 % 50);
        assert_eq!(java_hash("polygenelubricants"), i32::MIN);
        assert_eq!(partition_for("polygenelubricants", 50), 0);
        // "app.forward".hashCode() is negative: its absolute value is taken.
        let h = java_hash("app.forward");
        assert!(h < 0, "{h}");
        assert_eq!(partition_for("app.forward", 6), h.abs() % 6);
        assert_eq!(
            partition_for("x", 0),
            0,
            "no partition: never a division by 0"
        );
    }
}
