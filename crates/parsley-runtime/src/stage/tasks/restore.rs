//! Restore: building an assigned task from its changelog partition (the book's specification, §7,
//! exact restore), or, after an abort, from what the task kept of its last commit
//! ([`LastCommit`], module `rollback` of the task): then nothing is read from the changelog,
//! and the rest is the same.
//!
//! The task's changelog partition is read `read_committed` up to its high watermark
//! (`changelog::restore`): fold state, sender incarnation and sequence, node clock, gate
//! snapshot and, for an event-time stage, the watermark and timer queue. The task starts from
//! that snapshot only if it was committed with exactly the group's committed offsets
//! ([`Task::restore`](parsley_task::task::Task::restore)); a task that never committed starts fresh, its gate seeded at the
//! assigned positions ([`Task::fresh`](parsley_task::task::Task::fresh)). A consumed channel the snapshot does not name starts
//! at its log start offset (case C11). An event-time task then reads the startup end of each
//! input (one batched `ListOffsets(LATEST, READ_UNCOMMITTED)`) and follows the restored gate's
//! frontiers (the book's specification, §5).
//!
//! Invariants: a task reports [`TaskPhase::Running`] only once everything restored is in
//! place — the snapshot, the state, the event-time state and its counters; a task built from
//! its last commit in memory is built by the same [`rebuild_task`] from the same fold as a read
//! of its committed changelog would give.

use std::time::Instant;

use parsley_clock::Channel;
use parsley_stage::changelog::Restored;
use tracing::{info, info_span};

use super::Tasks;
use crate::admin::Admin;
use crate::changelog;
use crate::clients::ClientRole;
use crate::config::RuntimeConfig;
use crate::stage::intake::Intake;
use parsley_stage::StageSpec;
use parsley_task::context::TaskContext;
use parsley_task::error::Result;
use parsley_task::metrics::TaskPhase;
use parsley_task::state_store::{self, ChangelogView, StateStores, TaskStore};
use parsley_task::task::{FoldState, LastCommit, RefusedInput};
use parsley_task::task::{StartEvidence, rebuild_task};
use parsley_task::topic::TopicInfo;

impl Tasks {
    /// Builds the task of `partition`, assigned at `positions` (the group's committed offsets,
    /// or the log start where it has none), from its changelog partition (module docs), or from
    /// `last`, its last commit kept in memory, with the inputs `refused` for good kept refused,
    /// and takes it in. Channels whose start moved are sought in `intake`; `admin` reads the
    /// changelog's and the sources' offsets.
    ///
    /// # Errors
    /// The changelog's read and decoding errors; [`crate::ProcessingError::RestoreMismatch`];
    /// [`crate::ProcessingError::EventTime`]; admin errors.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn restore(
        &mut self,
        ctx: &TaskContext,
        intake: &mut Intake,
        admin: &Admin,
        config: &RuntimeConfig,
        partition: i32,
        positions: Vec<(Channel, i64)>,
        refused: impl IntoIterator<Item = RefusedInput>,
        last: Option<LastCommit>,
    ) -> Result<()> {
        let _span = info_span!("restore", partition).entered();
        let started = Instant::now();
        let metrics = ctx.metrics.clone();
        metrics.task(partition, |m| m.phase = TaskPhase::Restoring);
        let in_memory = last.is_some();
        let (from, restored, fold, replaced, records) = match last {
            Some(LastCommit { restored, fold }) => (None, restored, Some(fold), 0, 0),
            None => {
                let (from, restored, fold, replaced, records) =
                    self.read_changelog(ctx, admin, config, partition)?;
                (Some(from), restored, fold, replaced, records)
            }
        };
        metrics.task(partition, |m| {
            m.restore_records = records;
            m.rollbacks += u64::from(in_memory);
            m.restores += u64::from(!in_memory);
        });
        #[cfg(feature = "fault-injection")]
        if records > 0 {
            crate::fault::reached(
                config.crash_point(),
                crate::fault::CrashPoint::DuringRestore,
                || Ok(()),
            )?;
        }
        let mut cluster = Cluster(admin);
        // The global channels: the group has no offset for them; a task new to them starts at
        // their log start.
        let mut positions = positions;
        let global = ctx.global_channels();
        for &channel in &global {
            positions.push((channel, cluster.log_start(ctx, channel)?));
        }
        let (mut task, moved) = rebuild_task(
            ctx,
            self.event_time.as_ref(),
            partition,
            positions,
            restored,
            fold,
            &mut cluster,
        )?;
        for (channel, start) in moved {
            if !ctx.is_global(channel) {
                intake.seek(ctx, channel, start, config.timeout)?;
            }
        }
        if let Some(readers) = &mut self.global {
            readers.open(ctx, partition, &task.global_positions(ctx))?;
        }
        if task.event_time().is_some() {
            self.wait_for_upstream(ctx, admin, partition)?;
        }
        let took = started.elapsed();
        metrics.task(partition, |m| {
            m.phase = TaskPhase::Running;
            m.restore_ms = took.as_millis() as u64;
        });
        info!(
            partition,
            in_memory,
            from = from.unwrap_or(-1),
            records,
            consumers_replaced = replaced,
            keys = task.state_len(),
            sender = %task.clock().sender(),
            next_seq = task.clock().next_seq(),
            took_ms = took.as_millis() as u64,
            "task restored"
        );
        task.refuse(refused);
        self.tasks.insert(partition, task);
        Ok(())
    }

    /// Reads the changelog partition of task `partition` (module docs): from the state
    /// store's checkpoint when fold state lives on disk and it can be trusted, else from where
    /// a standby of the task stopped (module `standby`), else from 0. Returns where the read
    /// started, what it folded, the fold state on disk (`None`: in `Restored::state`), the
    /// restore consumers it replaced and the records it read (a standby's were read before).
    ///
    /// # Errors
    /// The changelog's read and decoding errors; the state store's; admin errors.
    fn read_changelog(
        &mut self,
        ctx: &TaskContext,
        admin: &Admin,
        config: &RuntimeConfig,
        partition: i32,
    ) -> Result<(i64, Restored, Option<FoldState>, u64, u64)> {
        let metrics = &ctx.metrics;
        // A standby of the task hands over what it read: on disk its keyspace is written up to
        // its checkpoint first (module `standby`).
        let warm = self.standbys.take(self.thread, partition);
        let changelog = &self.changelog;
        let (from, restored, store) = match (&self.stores, warm) {
            (Some(stores), _) => {
                let (store, from, restored) = local_copy(admin, changelog, stores, partition)?;
                (from, restored, Some(store))
            }
            (None, Some(warm)) => (warm.from, warm.restored, None),
            (None, None) => (0, Restored::default(), None),
        };
        let before = restored.records;
        metrics.task(partition, |m| m.restore_start = from);
        let (restored, replaced) = changelog::restore(
            &self.restore_client,
            admin,
            (&changelog.name, partition),
            (from, restored, store.as_ref().map(|s| (s, changelog.id))),
            (config.timeout, config.transaction_timeout()),
            &mut |position, end| {
                metrics.task(partition, |m| {
                    m.restore_position = position;
                    m.restore_end = end;
                })
            },
            &mut |wait| metrics.explained().set_restore(partition, wait),
        )?;
        let fold = store.map(|s| FoldState::disk(s, changelog.id));
        // What this restore read (a standby's records were read before it).
        let records = restored.records - before;
        Ok((from, restored, fold, replaced, records))
    }
}

/// The keyspace of task `partition` in the stage's state store, the changelog offset to
/// read from and what the keyspace holds besides fold state: from its checkpoint when that
/// can be trusted (`state_store::judge`), else from 0 with the keyspace cleared.
///
/// # Errors
/// [`crate::ProcessingError::StateStore`]; admin errors.
pub(super) fn local_copy(
    admin: &Admin,
    changelog: &TopicInfo,
    stores: &StateStores,
    partition: i32,
) -> Result<(TaskStore, i64, Restored)> {
    let store = stores.task(partition)?;
    let at = [(changelog.name.as_str(), partition)];
    let view = ChangelogView {
        topic: changelog.id,
        log_start: admin.log_start_offsets(&at)?[0],
        end: admin.high_watermarks(&at)?[0],
        delete_retention_ms: stores.delete_retention_ms(),
        now_ms: state_store::now_ms(),
    };
    let mut restored = Restored {
        state_elsewhere: true,
        ..Restored::default()
    };
    match state_store::judge(store.checkpoint()?, view) {
        Ok(from) => {
            store.load_into(&mut restored)?;
            Ok((store, from, restored))
        }
        Err(why) => {
            info!(
                partition,
                why, "the state store's copy is not used: reading the changelog whole"
            );
            store.clear()?;
            Ok((store, 0, restored))
        }
    }
}

/// The configuration of the consumer that reads a changelog partition of the stage of `spec`
/// in application `app` (`read_committed`, assigned explicitly; its group is never joined).
pub(super) fn restore_client(
    app: &str,
    spec: &StageSpec,
    config: &RuntimeConfig,
    changelog: &TopicInfo,
) -> rdkafka::ClientConfig {
    let group = spec.group_id(app);
    let restore_group = format!("{}.restore", changelog.name);
    config.client_config(
        &group,
        ClientRole::Restore,
        &[
            ("group.id", &restore_group),
            ("isolation.level", "read_committed"),
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
            ("fetch.wait.max.ms", "50"),
            // As the stage's consumer: librdkafka stops fetching while 100,000 records
            // wait in the queue and looks again only after `fetch.queue.backoff.ms` (1 s
            // by default), so a restore that folds slower than it fetches would stand
            // still for most of each second (measured on 2 M records: 2.5-4.1x a plain
            // read of the changelog with the default, 0.8-1.2x with 10 ms).
            ("fetch.queue.backoff.ms", "10"),
        ],
    )
}

/// The configuration of the consumers that read the global sources of the stage of `spec` for
/// its tasks (module `global`): as a changelog's restore consumer, with a group of their own
/// that is never joined.
pub(super) fn global_client(
    app: &str,
    spec: &StageSpec,
    config: &RuntimeConfig,
) -> rdkafka::ClientConfig {
    let group = spec.group_id(app);
    let global_group = format!("{group}.global");
    config.client_config(
        &group,
        ClientRole::Restore,
        &[
            ("group.id", &global_group),
            ("isolation.level", "read_committed"),
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
            // A position out of range is an error, not a silent jump (as the stage's consumer).
            ("auto.offset.reset", "error"),
            ("fetch.wait.max.ms", "50"),
            ("fetch.queue.backoff.ms", "10"),
        ],
    )
}

/// The cluster, through the stage's admin client.
struct Cluster<'a>(&'a Admin);

impl StartEvidence for Cluster<'_> {
    fn log_start(&mut self, ctx: &TaskContext, channel: Channel) -> Result<i64> {
        let topic = &ctx.source_of(channel)?.name;
        Ok(self
            .0
            .log_start_offsets(&[(topic.as_str(), channel.partition)])?[0])
    }

    fn ends(&mut self, ctx: &TaskContext, channels: &[Channel]) -> Result<Vec<(i64, i64)>> {
        let mut request = Vec::with_capacity(channels.len());
        for c in channels {
            request.push((ctx.source_of(*c)?.name.as_str(), c.partition));
        }
        let ends = self.0.high_watermarks(&request)?;
        let stable = self.0.last_stable_offsets(&request)?;
        Ok(ends.into_iter().zip(stable).collect())
    }
}
