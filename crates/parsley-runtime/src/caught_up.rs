//! Whether started stages have consumed and committed everything written to their sources:
//! the evidence behind [`Running::wait_until_caught_up`](crate::Running::wait_until_caught_up).
//!
//! A stage is caught up when its consumer group's committed offset of every partition of
//! every source (its built-in clock's topic aside) is at or beyond that partition's last
//! stable offset (LSO), both read now. The group's offsets are committed in the same
//! transaction as the stage's outputs, so a stage found caught up has also committed
//! everything it wrote for those inputs. Stages are checked
//! in topology order, each after the ones before it: a downstream stage's sources (a
//! repartition topic) are read after the stage writing them was found caught up, so they
//! include that stage's last outputs.

use std::time::Duration;

use parsley_stage::StageSpec;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tracing::debug;

use crate::admin::Admin;
use crate::clients::ClientRole;
use crate::config::RuntimeConfig;
use crate::error::{Error, Result, transient};

/// What is needed to read one stage's progress.
pub(crate) struct StageProgress {
    spec: StageSpec,
    /// A consumer of the stage's group that never joins it: it only reads committed offsets
    /// (with `read_committed`, so offsets of open transactions are waited for, not read).
    consumer: BaseConsumer,
}

impl StageProgress {
    pub(crate) fn new(app: &str, spec: &StageSpec, config: &RuntimeConfig) -> Result<Self> {
        let group = spec.group_id(app);
        let consumer = config
            .client_config(
                &format!("{group}.progress"),
                ClientRole::Consumer,
                &[
                    ("group.id", group.as_str()),
                    ("isolation.level", "read_committed"),
                    ("enable.auto.commit", "false"),
                ],
            )
            .create()
            .map_err(|e| Error::kafka(format!("create a progress reader of group {group}"), e))?;
        Ok(StageProgress {
            spec: spec.clone(),
            consumer,
        })
    }

    /// Whether the stage is caught up now (module docs).
    pub(crate) fn caught_up(&self, admin: &Admin, timeout: Duration) -> Result<bool> {
        let ends = self.stable_ends(admin)?;
        self.reached(&ends, timeout)
    }

    /// Every partition of every source of the stage (its built-in clock's topic aside) with
    /// its last stable offset read now: what the stage must commit to be caught up with what
    /// its sources hold now.
    pub(crate) fn stable_ends(&self, admin: &Admin) -> Result<Vec<(String, i32, i64)>> {
        // A built-in clock's topic is left out: it is not an input to catch up with, and the
        // stage's own ticks run ahead of what it has committed (a commit can carry the next
        // one), so its LSO is reached only at some moments.
        let names: Vec<&str> = self
            .spec
            .sources()
            .iter()
            .map(String::as_str)
            .filter(|t| Some(*t) != self.spec.clock_topic())
            .collect();
        let topics = admin.describe_topics(&names)?;
        let partitions: Vec<(&str, i32)> = topics
            .iter()
            .flat_map(|t| (0..t.partitions).map(move |p| (t.name.as_str(), p)))
            .collect();
        let stable = admin.last_stable_offsets(&partitions)?;
        Ok(partitions
            .iter()
            .zip(stable)
            .map(|((t, p), lso)| (t.to_string(), *p, lso))
            .collect())
    }

    /// Whether the stage's group has committed, on every `(topic, partition, offset)` of
    /// `targets`, an offset at or beyond it (the next offset to read: every record below it is
    /// consumed, and the outputs of a stage that does not order by event time committed with
    /// it). `false` while the group's coordinator is not ready.
    pub(crate) fn reached(
        &self,
        targets: &[(String, i32, i64)],
        timeout: Duration,
    ) -> Result<bool> {
        if targets.iter().all(|(_, _, end)| *end <= 0) {
            return Ok(true);
        }
        let mut tpl = TopicPartitionList::new();
        for (topic, partition, _) in targets {
            tpl.add_partition(topic, *partition);
        }
        let committed = match self.consumer.committed_offsets(tpl, timeout) {
            Ok(committed) => committed,
            // The group's coordinator is being chosen or loaded (a broker's offsets topic is
            // created by its first group): ask again, until the caller's deadline.
            Err(e) if not_yet(&e) => {
                debug!(stage = self.spec.name(), error = %e, "committed offsets not readable yet");
                return Ok(false);
            }
            Err(e) => return Err(Error::kafka("read committed offsets", e)),
        };
        Ok(targets.iter().all(|(topic, p, end)| {
            let at = committed
                .find_partition(topic, *p)
                .map(|e| match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                })
                .unwrap_or(0);
            at >= *end
        }))
    }

    /// The stage's name.
    pub(crate) fn stage(&self) -> &str {
        self.spec.name()
    }
}

/// Whether reading a group's committed offsets failed only because its coordinator is not
/// ready yet (being elected or loading its offsets, as while a new broker creates its offsets
/// topic) or the network hiccupped: worth asking again.
fn not_yet(e: &KafkaError) -> bool {
    transient(e)
        || matches!(
            e.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::NotCoordinator
                    | RDKafkaErrorCode::CoordinatorLoadInProgress
                    | RDKafkaErrorCode::CoordinatorNotAvailable
            )
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coordinator_not_ready_yet_is_asked_again_and_other_errors_end_the_wait() {
        for code in [
            RDKafkaErrorCode::NotCoordinator,
            RDKafkaErrorCode::CoordinatorLoadInProgress,
            RDKafkaErrorCode::CoordinatorNotAvailable,
            RDKafkaErrorCode::RequestTimedOut,
        ] {
            assert!(not_yet(&KafkaError::MetadataFetch(code)), "{code:?}");
        }
        assert!(!not_yet(&KafkaError::MetadataFetch(
            RDKafkaErrorCode::GroupAuthorizationFailed
        )));
    }
}
