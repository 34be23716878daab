//! Whether started stages have consumed and committed everything written to their sources:
//! the evidence behind [`Running::wait_until_caught_up`](crate::Running::wait_until_caught_up)
//! and behind the wait of an event-time input that other stages write (module
//! `stage::upstream`).
//!
//! A stage is caught up when, on every partition of every source (its built-in clock's topic
//! aside), its consumer group has consumed every committed record below that partition's
//! target offset, read now. The group's offsets are committed in the same transaction as
//! the stage's outputs, so a stage found caught up has also committed everything it wrote for
//! those inputs. Stages are checked in topology order, each after the ones before it: a
//! downstream stage's sources (a repartition topic) are read after the stage writing them was
//! found caught up, so they include that stage's last outputs.
//!
//! # Which offset is the target
//! For a source no other stage of the topology writes, the target is the partition's last
//! stable offset (LSO): a transaction a writer outside the topology keeps open is not waited
//! for. For a source another stage writes, it is the **high watermark**. Found caught up, the
//! writing stage's last transaction has committed — its offsets are readable with
//! `read_committed`, and they commit with its outputs — but Kafka writes that transaction's
//! markers partition by partition: the marker in `__consumer_offsets` can be written before
//! the marker in one of the topic's partitions, whose LSO then still stands before the
//! transaction's records. Read at that moment, the LSO would let the downstream stage be
//! judged caught up without those records. The high watermark already counts them; until
//! their marker is written, the read below cannot decide the partition (a `read_committed`
//! read stops at the LSO), so the stage is judged behind for now and looked at again.
//!
//! # Committed offset against the LSO
//! A committed offset at or beyond the LSO proves it at once. One below it does not disprove
//! it: the offsets between may hold only commit or abort markers and aborted records, which
//! no consumer returns (case C02 on the committing side). A stage commits the offset after its
//! last delivered record with that record's transaction, and the offset past a trailing marker
//! only at a later commit, after a poll that consumed the marker: a stage stopped or killed in
//! between keeps, for ever, a committed offset one marker short of the LSO of a source it has
//! read to the end. Judged by `committed >= LSO` alone, whoever waits for it would wait for
//! ever (the inventory demo's ledger did, behind its stopped first stage).
//!
//! So for a partition whose committed offset `c` is below the LSO `e`, the progress reader
//! reads `[c, e)` itself with `read_committed`, from `c`: Kafka's own answer. A committed
//! record below `e` returned means the stage has not consumed it (behind); the position
//! reaching `e` with no record below it, or a first record at or above `e`, means nothing but
//! markers and aborted records lies between (caught up). A read that decides nothing within
//! [`GAP_READ_BUDGET`] is judged behind for now and asked again at the next look.
//!
//! What the reads show is kept per partition ([`Gap`]): the latest committed record found and
//! the range proven to hold none, so a stage that is behind costs one small fetch each time its
//! committed offset passes the record found, and a long run of aborted records is read once,
//! across looks, not again from the committed offset each time. These are facts about the log,
//! not state: nothing is persisted.

use parsley_task::error::Operation;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use parsley_stage::StageSpec;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tracing::debug;

use crate::admin::Admin;
use crate::client_error::transient;
use crate::config::RuntimeConfig;
use parsley_task::error::{Error, Result, SetupError};

/// What is needed to read one stage's progress.
pub(crate) struct StageProgress {
    spec: StageSpec,
    /// A consumer of the stage's group that never joins it and never commits: it reads
    /// committed offsets (with `read_committed`, so offsets of open transactions are waited
    /// for, not read) and, assigned for the length of one look, the records between a
    /// committed offset and the LSO (module docs).
    consumer: BaseConsumer,
    /// What reads between committed offsets and LSOs found, per source partition.
    gaps: BTreeMap<(String, i32), Gap>,
    /// The stage's sources that another stage of the topology writes: their target is the
    /// high watermark, not the LSO (module docs).
    written_by_stages: BTreeSet<String>,
}

/// The longest a look reads between committed offsets and LSOs before it judges the stage
/// behind for now (module docs). One fetch round trip decides the usual case.
pub(crate) const GAP_READ_BUDGET: Duration = Duration::from_secs(1);

/// What reads of one source partition with `read_committed` showed (module docs): facts about
/// the log, independent of the offsets a stage commits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Gap {
    /// A committed record read at this offset.
    record: Option<i64>,
    /// `[from, to)`: read through without a committed record (markers and aborted records
    /// only).
    empty: Option<(i64, i64)>,
}

/// What [`Gap::judge`] decides for a committed offset and an LSO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every committed record below the LSO is consumed.
    Reached,
    /// A committed record below the LSO is not consumed.
    Behind,
    /// Not known: read with `read_committed` from this offset (below the LSO).
    Read(i64),
}

impl Gap {
    /// Whether a group that committed `committed` has consumed every committed record below
    /// `end` (an LSO or a high watermark), by what is known; `committed` below `end` alone proves nothing.
    pub(crate) fn judge(&self, committed: i64, end: i64) -> Verdict {
        if committed >= end {
            return Verdict::Reached;
        }
        if self.record.is_some_and(|r| committed <= r && r < end) {
            return Verdict::Behind;
        }
        let from = match self.empty {
            Some((from, to)) if from <= committed && committed < to => to,
            _ => committed,
        };
        if from >= end {
            Verdict::Reached
        } else {
            Verdict::Read(from)
        }
    }

    /// Records a read with `read_committed` from `from`: the first record it returned, if
    /// any, else the position it reached (`None` before any fetch response).
    pub(crate) fn read(&mut self, from: i64, first_record: Option<i64>, position: Option<i64>) {
        let to = match first_record {
            Some(r) => {
                self.record = Some(r);
                r
            }
            None => match position {
                Some(p) => p,
                None => return,
            },
        };
        if to <= from {
            return;
        }
        self.empty = match self.empty {
            Some((f, t)) if f <= from && from <= t => Some((f, t.max(to))),
            _ => Some((from, to)),
        };
    }
}

impl StageProgress {
    /// The progress reader of `spec`, a stage of application `app`; `others` are stages of
    /// the same topology that may write its sources (`spec` itself among them is ignored).
    ///
    /// # Errors
    /// Creating the consumer.
    pub(crate) fn new<'a>(
        app: &str,
        spec: &StageSpec,
        others: impl IntoIterator<Item = &'a StageSpec>,
        config: &RuntimeConfig,
    ) -> Result<Self> {
        let group = spec.group_id(app);
        let consumer = config
            .internal_consumer_config(
                &format!("{group}.progress"),
                &[
                    ("group.id", group.as_str()),
                    ("isolation.level", "read_committed"),
                    ("enable.auto.commit", "false"),
                    ("enable.auto.offset.store", "false"),
                    // A look reads little: the first records after a committed offset.
                    ("max.partition.fetch.bytes", "65536"),
                    ("queued.max.messages.kbytes", "1024"),
                ],
            )
            .create()
            .map_err(|e| {
                parsley_task::error::Error::from(
                    crate::client_error::client(Operation::CreateProgressReader, e)
                        .with_group(group),
                )
            })?;
        Ok(StageProgress {
            written_by_stages: written_by_stages(spec, others),
            spec: spec.clone(),
            consumer,
            gaps: BTreeMap::new(),
        })
    }

    /// Whether the stage is caught up now (module docs): the targets it reached, or `None`.
    pub(crate) fn caught_up(
        &mut self,
        admin: &Admin,
        timeout: Duration,
    ) -> Result<Option<Vec<(String, i32, i64)>>> {
        let ends = match self.targets(admin) {
            Ok(ends) => ends,
            // A source another stage writes that is not created yet: the stages that create
            // it (this one among them) have not started, so nothing is caught up yet. The
            // first stage checked can read one (a foreign-key join's answers).
            Err(Error::Setup(SetupError::UnknownTopic { topic }))
                if self.written_by_stages.contains(&topic) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        Ok(self.reached(&ends, timeout)?.then_some(ends))
    }

    /// Every partition of every source of the stage (its built-in clock's topic aside) with
    /// its target offset read now — the high watermark for a source another stage writes, the
    /// last stable offset for the others (module docs): what the stage must commit to be
    /// caught up with what its sources hold now.
    ///
    /// # Errors
    /// Describing the sources ([`SetupError::UnknownTopic`](parsley_task::error::SetupError)
    /// for one not created yet); listing their offsets.
    pub(crate) fn targets(&self, admin: &Admin) -> Result<Vec<(String, i32, i64)>> {
        // A built-in clock's topic is left out: it is not an input to catch up with, and the
        // stage's own ticks run ahead of what it has committed (a commit can carry the next
        // one), so its LSO is reached only at some moments.
        let names: Vec<&str> = self
            .spec
            .sources()
            .iter()
            .map(String::as_str)
            .filter(|t| Some(*t) != self.spec.clock_topic())
            // A global source's positions are each task's own, never the group's: a stage is
            // caught up with the sources it reads by partition.
            .filter(|t| !self.spec.is_global(t))
            .collect();
        let topics = admin.describe_topics(&names)?;
        let partitions = topics
            .iter()
            .flat_map(|t| (0..t.partitions).map(move |p| (t.name.as_str(), p)));
        let (internal, external): (Vec<_>, Vec<_>) =
            partitions.partition(|(t, _)| self.written_by_stages.contains(*t));
        let mut out = Vec::with_capacity(internal.len() + external.len());
        for (partitions, ends) in [
            (&external, admin.last_stable_offsets(&external)?),
            (&internal, admin.high_watermarks(&internal)?),
        ] {
            out.extend(
                partitions
                    .iter()
                    .zip(ends)
                    .map(|((t, p), end)| (t.to_string(), *p, end)),
            );
        }
        Ok(out)
    }

    /// Whether the stage's group has consumed, on every `(topic, partition, offset)` of
    /// `targets`, every committed record below the offset (a target offset, [`Self::targets`]): its committed offset (the
    /// next offset to read) is at or beyond it, or only markers and aborted records lie between
    /// (module docs). The outputs of a stage that does not order by event time are committed
    /// with those offsets. `false` while the group's coordinator is not ready.
    pub(crate) fn reached(
        &mut self,
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
            Err(e) => {
                return Err(crate::client_error::kafka(
                    Operation::ReadProgressOffsets,
                    e,
                ));
            }
        };
        // Per partition to read: topic, partition, committed offset, where to read from, LSO.
        let mut reads: Vec<(String, i32, i64, i64, i64)> = Vec::new();
        for (topic, p, end) in targets {
            let at = committed
                .find_partition(topic, *p)
                .map(|e| match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                })
                .unwrap_or(0);
            let gap = self.gaps.entry((topic.clone(), *p)).or_default();
            match gap.judge(at, *end) {
                Verdict::Reached => {}
                Verdict::Behind => return Ok(false),
                Verdict::Read(from) => reads.push((topic.clone(), *p, at, from, *end)),
            }
        }
        if reads.is_empty() {
            return Ok(true);
        }
        let to_read: Vec<(String, i32, i64, i64)> = reads
            .iter()
            .map(|(topic, p, _, from, end)| (topic.clone(), *p, *from, *end))
            .collect();
        self.read_gaps(&to_read)?;
        Ok(reads.iter().all(|(topic, p, at, _, end)| {
            self.gaps[&(topic.clone(), *p)].judge(*at, *end) == Verdict::Reached
        }))
    }

    /// Reads each `(topic, partition, from, end)` with `read_committed` from `from` until its
    /// first record or a position at or beyond `end` decides it, for at most
    /// [`GAP_READ_BUDGET`], and keeps what it showed in [`StageProgress::gaps`].
    ///
    /// # Errors
    /// Assigning the partitions.
    fn read_gaps(&mut self, reads: &[(String, i32, i64, i64)]) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        for (topic, p, from, _) in reads {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*from))
                .map_err(|e| crate::client_error::kafka(Operation::BuildProgressPartitions, e))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| crate::client_error::kafka(Operation::AssignProgressPartitions, e))?;
        let mut open: Vec<(String, i32, i64, i64)> = reads.to_vec();
        let deadline = Instant::now() + GAP_READ_BUDGET;
        let position = |consumer: &BaseConsumer, topic: &str, p: i32| -> Option<i64> {
            let positions = consumer.position().ok()?;
            match positions.find_partition(topic, p)?.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            }
        };
        while !open.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.consumer.poll(left.min(Duration::from_millis(50))) {
                Some(Ok(m)) => {
                    let (topic, p, offset) = (m.topic().to_string(), m.partition(), m.offset());
                    if let Some(i) = open.iter().position(|(t, q, _, _)| *t == topic && *q == p) {
                        let (_, _, from, _) = open.swap_remove(i);
                        self.gaps
                            .entry((topic, p))
                            .or_default()
                            .read(from, Some(offset), None);
                    }
                }
                Some(Err(e)) => {
                    debug!(stage = self.spec.name(), error = %e, "reading past a committed offset");
                }
                None => {}
            }
            open.retain(
                |(topic, p, from, end)| match position(&self.consumer, topic, *p) {
                    Some(at) if at >= *end => {
                        self.gaps.entry((topic.clone(), *p)).or_default().read(
                            *from,
                            None,
                            Some(at),
                        );
                        false
                    }
                    _ => true,
                },
            );
        }
        // What an undecided read went through is kept: the next look goes on from there.
        for (topic, p, from, _) in &open {
            let at = position(&self.consumer, topic, *p);
            self.gaps
                .entry((topic.clone(), *p))
                .or_default()
                .read(*from, None, at);
        }
        self.consumer
            .unassign()
            .map_err(|e| crate::client_error::kafka(Operation::UnassignProgressPartitions, e))?;
        Ok(())
    }

    /// The stage's name.
    pub(crate) fn stage(&self) -> &str {
        self.spec.name()
    }
}

/// The sources of `spec` that a stage of `others` other than `spec` writes.
fn written_by_stages<'a>(
    spec: &StageSpec,
    others: impl IntoIterator<Item = &'a StageSpec>,
) -> BTreeSet<String> {
    let writes: BTreeSet<&String> = others
        .into_iter()
        .filter(|s| s.name() != spec.name())
        .flat_map(|s| s.sinks())
        .collect();
    spec.sources()
        .iter()
        .filter(|t| writes.contains(t))
        .cloned()
        .collect()
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
    fn a_committed_offset_one_commit_marker_short_of_the_lso_is_reached_once_read_through() {
        // `T(r0, r1) + C`: records 0 and 1, the marker at 2, LSO 3. The stage committed 2 with
        // r1's transaction and was stopped before a commit carried it over the marker.
        let mut gap = Gap::default();
        assert_eq!(
            gap.judge(2, 3),
            Verdict::Read(2),
            "2 < 3 alone proves nothing"
        );
        // A read_committed read from 2 returns nothing and moves its position to 3.
        gap.read(2, None, Some(3));
        assert_eq!(gap.judge(2, 3), Verdict::Reached);
        // Known from then on, without reading again; a later LSO is read from the end of what
        // was read through.
        assert_eq!(gap.judge(2, 3), Verdict::Reached);
        assert_eq!(gap.judge(2, 10), Verdict::Read(3));
    }

    #[test]
    fn a_committed_record_between_the_committed_offset_and_the_lso_is_behind() {
        // Records 0..=9 committed, the group committed 4: the read returns record 4.
        let mut gap = Gap::default();
        assert_eq!(gap.judge(4, 11), Verdict::Read(4));
        gap.read(4, Some(4), None);
        assert_eq!(gap.judge(4, 11), Verdict::Behind);
        // No second read while the committed offset has not passed the record found.
        assert_eq!(gap.judge(4, 11), Verdict::Behind);
        // Past it: read again from the new committed offset.
        assert_eq!(gap.judge(10, 11), Verdict::Read(10));
        gap.read(10, None, Some(11));
        assert_eq!(gap.judge(10, 11), Verdict::Reached);
        assert_eq!(gap.judge(11, 11), Verdict::Reached);
    }

    #[test]
    fn trailing_aborted_records_are_read_through_across_looks() {
        // Committed 5; an aborted transaction at 5..=104, its marker at 105, LSO 106. The
        // first look's budget ends at position 60, the next goes on from there.
        let mut gap = Gap::default();
        assert_eq!(gap.judge(5, 106), Verdict::Read(5));
        gap.read(5, None, Some(60));
        assert_eq!(gap.judge(5, 106), Verdict::Read(60));
        gap.read(60, None, Some(106));
        assert_eq!(gap.judge(5, 106), Verdict::Reached);
        // A first record at or above the LSO (written after it was read) decides it too.
        let mut later = Gap::default();
        later.read(5, Some(106), None);
        assert_eq!(later.judge(5, 106), Verdict::Reached);
    }

    #[test]
    fn a_read_with_no_answer_proves_nothing() {
        let mut gap = Gap::default();
        gap.read(7, None, None);
        gap.read(7, None, Some(7));
        assert_eq!(gap, Gap::default());
        assert_eq!(gap.judge(7, 8), Verdict::Read(7));
        assert_eq!(gap.judge(0, 0), Verdict::Reached, "an empty partition");
    }

    #[test]
    fn a_source_another_stage_writes_is_judged_against_its_high_watermark() {
        use parsley_stage::Topology;
        use parsley_testkit::fixtures::{Forward, utf8_stage};
        // `a` writes `mid` from `in`; `b` reads `mid` and `side`, and writes `mid` and `out`.
        let topology = Topology::builder("app")
            .stage("a", Forward("mid".into()), |s| {
                utf8_stage(s, &["in"], &["mid"])
            })
            .stage("b", Forward("out".into()), |s| {
                utf8_stage(s, &["mid", "side", "loop"], &["out", "loop"])
            })
            .build()
            .unwrap();
        let (a, b) = (topology.stage("a").unwrap(), topology.stage("b").unwrap());
        let set = |v: &[&str]| v.iter().map(|t| t.to_string()).collect::<BTreeSet<_>>();
        // `b`'s own loop is not another stage's output: its end stays the LSO.
        assert_eq!(written_by_stages(b, topology.stages()), set(&["mid"]));
        assert_eq!(written_by_stages(a, topology.stages()), set(&[]));
        assert_eq!(
            written_by_stages(b, [b]),
            set(&[]),
            "only other stages count"
        );
    }

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
