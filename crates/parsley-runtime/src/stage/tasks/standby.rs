//! Standbys: warm copies of tasks this instance does not own (Kafka Streams' standby
//! replicas), so that a task assigned here after a member died or left restores only the
//! changelog's tail.
//!
//! A standby of task `p` reads partition `p` of the stage's changelog `read_committed`, as a
//! restore does (module `restore`), and keeps what it read as the restore would: in memory, the
//! fold of its records ([`Restored`]) and the next offset to read; with a state directory, in
//! the task's keyspace of the state store, each batch written with the checkpoint after it.
//! When the task is assigned here its restore starts from there: from the standby's fold and
//! position in memory, from the keyspace's checkpoint on disk.
//!
//! **Which tasks.** The stage's consumer uses the eager range assignor (librdkafka's assignors
//! are fixed): contiguous ranges of partitions over the members sorted by member id. When a
//! member leaves, the ranges are recomputed over the members left: its range goes to the members
//! beside it in that order and the others' ranges shift toward it, so the tasks that move to an
//! instance are the ones next to its own. After each assignment an instance therefore warms
//! the `replicas × owned` tasks it does not own that are nearest its own in partition order,
//! circularly, ties to the lower partition ([`choose`]); `replicas` is
//! [`RuntimeConfig::standby_replicas`](crate::RuntimeConfig::standby_replicas). With every
//! member owning as many tasks, that makes `replicas` copies per task on average, what Kafka
//! Streams' `num.standby.replicas` counts. An instance that owns no task (more instances than
//! partitions) warms `replicas` tasks from the place its instance id hashes to.
//!
//! **Rebalances.** The choice is made at an assignment only: a revocation keeps every
//! standby, so an eager rebalance, which revokes everything first, throws nothing away. A
//! standby that is no longer chosen is dropped: on disk its keyspace keeps what it read, at its
//! checkpoint, for a later restore or standby of the task; in memory what it read is thrown
//! away and counted (`standby_records_discarded`). A standby whose task is assigned here
//! becomes its restore's start.
//!
//! **Work.** One consumer reads every standby's partition. The stream thread polls it once a
//! turn without waiting, at most [`PER_TURN`] records, so that standbys never hold up the tasks
//! this instance owns; the consumer's prefetch is bounded by [`QUEUE_KBYTES`]. A standby is an
//! optimisation: whatever fails in one (a record that does not decode, the store, the client)
//! drops it with a warning, and the task, if assigned here, restores as without it.
//!
//! **Reads.** A stale interactive query (module `query` of the runtime) reads a standby's fold
//! state: in memory its fold, on disk its keyspace overlaid with the records read and not
//! written yet. Each read takes the pool's lock ([`SharedStandbys`]), as the turn's read of the
//! changelog does, so it never sees a record half applied; it reports where the standby stands
//! then ([`StandbyAt`]: its position, moved past the commit markers read, and the end its
//! consumer last fetched), the figure the standbys' metrics publish.
//!
//! Invariants:
//! - a standby's fold (on disk: its keyspace at its checkpoint) is exactly what a restore reading
//!   the changelog partition up to the standby's position would have built;
//! - no task is both owned here and a standby here: a task's standby is taken before its
//!   restore, and the choice leaves owned tasks out;
//! - with several stream threads per stage ([`SharedStandbys`]), "here" is the process: the
//!   standbys are chosen from the tasks of every thread, and no thread warms a task another
//!   thread of the process owns.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use parsley_stage::changelog::{Restored, STATE_PREFIX};
use parsley_task::metrics::{StageMetrics, StandbyMetrics};
use parsley_task::query::{Entries, StandbyAt};
use parsley_task::state_store::{Checkpoint, StateStores, TaskStore, now_ms};
use parsley_task::topic::TopicInfo;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use crate::admin::Admin;

/// Most changelog records the standbys read in one turn of the stream thread.
pub(crate) const PER_TURN: usize = 20_000;

/// The standby consumer's prefetch bound (`queued.max.messages.kbytes`), KiB.
pub(crate) const QUEUE_KBYTES: &str = "16384";

/// Records a standby on disk writes to the state store in one batch.
const STORE_BATCH: usize = 10_000;

/// How often the standbys' figures are published to the stage's metrics.
const PUBLISH_EVERY: Duration = Duration::from_millis(200);

/// The tasks to warm: of `tasks` tasks, the `replicas × |owned|` (at least `replicas`) that
/// `owned` does not hold, nearest to the owned ones in partition order, circularly, ties to the
/// lower partition. Without an owned task, `replicas` tasks from `seed % tasks` on.
pub(crate) fn choose(
    owned: &BTreeSet<i32>,
    tasks: i32,
    replicas: usize,
    seed: u64,
) -> BTreeSet<i32> {
    if tasks <= 0 || replicas == 0 {
        return BTreeSet::new();
    }
    let free: Vec<i32> = (0..tasks).filter(|t| !owned.contains(t)).collect();
    let count = (replicas * owned.len().max(1)).min(free.len());
    if owned.is_empty() {
        let start = (seed % tasks as u64) as i32;
        return (0..tasks)
            .map(|i| (start + i) % tasks)
            .take(count)
            .collect();
    }
    let distance = |t: i32| {
        owned
            .iter()
            .map(|&o| (t - o).rem_euclid(tasks).min((o - t).rem_euclid(tasks)))
            .min()
            .unwrap_or(i32::MAX)
    };
    let mut by_distance: Vec<(i32, i32)> = free.into_iter().map(|t| (distance(t), t)).collect();
    by_distance.sort_unstable();
    by_distance
        .into_iter()
        .take(count)
        .map(|(_, t)| t)
        .collect()
}

/// What a standby hands its task's restore: where to start reading and what is folded so far.
pub(crate) struct Handover {
    /// The next changelog offset to read.
    pub(crate) from: i64,
    /// The fold of every record below `from`.
    pub(crate) restored: Restored,
}

/// Changelog records (key, value; `None`: a tombstone) read and not in the state store yet.
type Batch = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// One warm copy.
struct Warm {
    /// The next changelog offset to read.
    next: i64,
    /// In memory: the fold of the records below `next`.
    restored: Restored,
    /// On disk: the task's keyspace, and the records read that are not in it yet.
    store: Option<(TaskStore, Batch)>,
    /// The checkpoint last written to the keyspace.
    written: i64,
    /// Records read since the copy started.
    records: u64,
}

impl Warm {
    /// The fold state of key `k`: in memory from the fold; on disk the last record of
    /// changelog key `0x00 ++ k` read and not written yet, else the keyspace's.
    fn get(&self, k: &[u8]) -> parsley_task::error::Result<Option<Vec<u8>>> {
        match &self.store {
            None => Ok(self.restored.state.get(k).map(|v| v.to_vec())),
            Some((store, batch)) => {
                let unwritten = batch
                    .iter()
                    .rev()
                    .find(|(key, _)| key.split_first() == Some((&STATE_PREFIX, k)));
                match unwritten {
                    Some((_, value)) => Ok(value.clone()),
                    None => store.get(k),
                }
            }
        }
    }

    /// Every key's fold state, in key-byte order (on disk: the keyspace's overlaid with the
    /// records read and not written yet).
    fn entries(&self) -> parsley_task::error::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        match &self.store {
            None => {
                let mut all: Vec<_> = self
                    .restored
                    .state
                    .iter()
                    .map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .collect();
                all.sort_unstable();
                Ok(all)
            }
            Some((store, batch)) => {
                let mut all: BTreeMap<Vec<u8>, Option<Vec<u8>>> = store
                    .state_entries()?
                    .into_iter()
                    .map(|(k, v)| (k, Some(v)))
                    .collect();
                for (key, value) in batch {
                    if let Some((&STATE_PREFIX, k)) = key.split_first() {
                        all.insert(k.to_vec(), value.clone());
                    }
                }
                Ok(all
                    .into_iter()
                    .filter_map(|(k, v)| v.map(|v| (k, v)))
                    .collect())
            }
        }
    }

    /// Writes what the keyspace does not have yet, with checkpoint `next`.
    fn flush(&mut self, changelog: &TopicInfo) -> parsley_task::error::Result<()> {
        let Some((store, batch)) = &mut self.store else {
            return Ok(());
        };
        if batch.is_empty() && self.written >= self.next {
            return Ok(());
        }
        store.write(
            batch.iter().map(|(k, v)| (k.as_slice(), v.as_deref())),
            Checkpoint {
                topic: changelog.id,
                offset: self.next,
                written_ms: now_ms(),
            },
        )?;
        batch.clear();
        self.written = self.next;
        Ok(())
    }
}

/// The standbys of one stage's stream thread (module docs).
pub(crate) struct Standbys {
    /// Copies wanted per task; 0: no standbys.
    replicas: usize,
    /// Where an instance without tasks starts its choice.
    seed: u64,
    /// The stage's changelog.
    changelog: TopicInfo,
    /// The standby consumer's configuration.
    client: ClientConfig,
    /// The consumer, while there are standbys.
    consumer: Option<BaseConsumer>,
    warm: BTreeMap<i32, Warm>,
    published: Option<Instant>,
}

impl Standbys {
    /// `replicas` copies per task of the stage whose changelog is `changelog`, read with a
    /// consumer made from `restore_client` (module `restore`); `instance_id` seeds the choice
    /// of an instance without tasks.
    pub(crate) fn new(
        replicas: usize,
        instance_id: &str,
        restore_client: &ClientConfig,
        changelog: &TopicInfo,
    ) -> Self {
        let mut client = restore_client.clone();
        client
            .set("queued.max.messages.kbytes", QUEUE_KBYTES)
            // A position below the log start (a topic deleted and made again) is an error that
            // drops the standbys, never a silent jump.
            .set("auto.offset.reset", "error");
        Standbys {
            replicas,
            seed: instance_id
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))),
            changelog: changelog.clone(),
            client,
            consumer: None,
            warm: BTreeMap::new(),
            published: None,
        }
    }

    /// After an assignment of `owned`: warms the tasks [`choose`] names, dropping the standbys it
    /// no longer names (module docs). `stores`: the state store when state lives on disk;
    /// `admin` reads the changelog's offsets to judge a keyspace's checkpoint.
    pub(crate) fn choose(
        &mut self,
        owned: &BTreeSet<i32>,
        stores: Option<&StateStores>,
        admin: &Admin,
        metrics: &StageMetrics,
    ) {
        if self.replicas == 0 {
            return;
        }
        let wanted = choose(owned, self.changelog.partitions, self.replicas, self.seed);
        let unwanted: Vec<i32> = self
            .warm
            .keys()
            .filter(|p| !wanted.contains(p))
            .copied()
            .collect();
        for partition in unwanted {
            self.drop_warm(partition, metrics, "no longer chosen");
        }
        for &partition in &wanted {
            if self.warm.contains_key(&partition) {
                continue;
            }
            let warm = match stores {
                None => Warm {
                    next: 0,
                    restored: Restored::default(),
                    store: None,
                    written: 0,
                    records: 0,
                },
                Some(stores) => {
                    match super::restore::local_copy(admin, &self.changelog, stores, partition) {
                        Ok((store, from, _)) => Warm {
                            next: from,
                            restored: Restored::default(),
                            store: Some((store, Vec::new())),
                            written: from,
                            records: 0,
                        },
                        Err(e) => {
                            warn!(partition, error = %e, "no standby for the task: its keyspace cannot be read");
                            continue;
                        }
                    }
                }
            };
            info!(
                partition,
                from = warm.next,
                "a standby of the task starts reading its changelog"
            );
            self.warm.insert(partition, warm);
        }
        self.assign();
        self.publish(metrics, true);
    }

    /// The standby of `partition`, taken for the task's restore (module docs): in memory its
    /// fold and position; on disk `None` once its keyspace holds everything it read. `None`
    /// when there is no standby of the task.
    pub(crate) fn take(&mut self, partition: i32, metrics: &StageMetrics) -> Option<Handover> {
        let mut warm = self.warm.remove(&partition)?;
        self.sync_position(partition, &mut warm);
        self.assign();
        self.publish(metrics, true);
        info!(
            partition,
            position = warm.next,
            records = warm.records,
            "the task's standby becomes its restore's start"
        );
        if warm.store.is_some() {
            if let Err(e) = warm.flush(&self.changelog) {
                warn!(partition, error = %e, "the standby's last records could not be written: the restore reads them");
            }
            return None;
        }
        Some(Handover {
            from: warm.next,
            restored: warm.restored,
        })
    }

    /// The heap bytes the standbys hold (module `memory` of `parsley_task`): in memory their
    /// folds' tables at capacity with their keys' and values' own buffers (sampled), on disk
    /// the records read and not in the keyspace yet. Their keyspaces' memtables are the state
    /// store's, counted with it.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let entry = std::mem::size_of::<(
            parsley_stage::changelog::StateBytes,
            parsley_stage::changelog::StateBytes,
        )>() + 1;
        let mut bytes = 0;
        for w in self.warm.values() {
            let state = &w.restored.state;
            bytes += state.capacity() * entry
                + parsley_stage::changelog::heap_bytes(
                    state.len(),
                    state.iter().map(|(k, v)| (k, Some(v))),
                ) as usize;
            if let Some((_, batch)) = &w.store {
                bytes += batch
                    .iter()
                    .map(|(k, v)| 48 + k.len() + v.as_ref().map_or(0, Vec::len))
                    .sum::<usize>();
            }
        }
        bytes as u64
    }

    /// Once a turn: reads what the standby consumer has ready, at most [`PER_TURN`] records,
    /// without waiting, and folds or stores each record into its standby.
    pub(crate) fn read(&mut self, metrics: &StageMetrics) {
        let Some(consumer) = &self.consumer else {
            return;
        };
        let mut failed: Vec<(i32, String)> = Vec::new();
        let mut broken = None;
        for _ in 0..PER_TURN {
            let m = match consumer.poll(Duration::ZERO) {
                None => break,
                Some(Ok(m)) => m,
                Some(Err(e)) if crate::client_error::transient(&e) => break,
                Some(Err(e)) => {
                    broken = Some(e.to_string());
                    break;
                }
            };
            let partition = m.partition();
            let Some(warm) = self.warm.get_mut(&partition) else {
                continue;
            };
            if m.offset() < warm.next {
                continue;
            }
            warm.next = m.offset() + 1;
            warm.records += 1;
            let key = m.key().unwrap_or_default();
            match &mut warm.store {
                None => {
                    if let Err(why) = warm.restored.apply(key, m.payload()) {
                        failed.push((partition, format!("offset {}: {why}", m.offset())));
                    }
                }
                Some((_, batch)) => {
                    batch.push((key.to_vec(), m.payload().map(<[u8]>::to_vec)));
                    if batch.len() >= STORE_BATCH
                        && let Err(e) = warm.flush(&self.changelog)
                    {
                        failed.push((partition, e.to_string()));
                    }
                }
            }
        }
        if let Some(error) = broken {
            warn!(
                error,
                "the standby consumer failed: every standby is dropped until the next assignment"
            );
            for partition in self.warm.keys().copied().collect::<Vec<_>>() {
                self.drop_warm(partition, metrics, "its consumer failed");
            }
            self.assign();
            self.publish(metrics, true);
            return;
        }
        for (partition, why) in failed {
            warn!(partition, why, "the task's standby is dropped");
            self.drop_warm(partition, metrics, "it could not take a record");
        }
        let partitions: Vec<i32> = self.warm.keys().copied().collect();
        for partition in partitions {
            let mut warm = self.warm.remove(&partition).expect("a standby");
            self.sync_position(partition, &mut warm);
            if let Err(e) = warm.flush(&self.changelog) {
                warn!(partition, error = %e, "the task's standby is dropped: its keyspace cannot be written");
                continue;
            }
            self.warm.insert(partition, warm);
        }
        self.publish(metrics, false);
    }

    /// Moves `warm.next` to the consumer's position of `partition` when that is past it (commit
    /// markers read after the last record).
    fn sync_position(&self, partition: i32, warm: &mut Warm) {
        sync_position(
            self.consumer.as_ref(),
            &self.changelog.name,
            partition,
            warm,
        );
    }

    /// Where the standby `warm` of `partition` stands: its position and the changelog
    /// partition's end as last fetched.
    fn at(&self, partition: i32, warm: &Warm) -> StandbyAt {
        StandbyAt {
            position: warm.next,
            end: self.consumer.as_ref().and_then(|c| {
                crate::librdkafka::cached_high_watermark(c, &self.changelog.name, partition)
            }),
        }
    }

    /// The fold state of key `k` in the standby of `partition` and where the standby stands
    /// now (module docs); `None` when there is no standby of that task here.
    pub(crate) fn get(
        &mut self,
        partition: i32,
        k: &[u8],
    ) -> Option<parsley_task::error::Result<(Option<Vec<u8>>, StandbyAt)>> {
        let warm = self.warm.get_mut(&partition)?;
        sync_position(
            self.consumer.as_ref(),
            &self.changelog.name,
            partition,
            warm,
        );
        let warm = self.warm.get(&partition)?;
        Some(warm.get(k).map(|v| (v, self.at(partition, warm))))
    }

    /// Every key's fold state in every standby, `(task, key, state)` by task then key bytes,
    /// and where each standby stands now.
    ///
    /// # Errors
    /// A failed read of the state store.
    pub(crate) fn entries(
        &mut self,
    ) -> parsley_task::error::Result<(Entries, Vec<(i32, StandbyAt)>)> {
        let (consumer, changelog) = (self.consumer.as_ref(), &self.changelog.name);
        for (&partition, warm) in &mut self.warm {
            sync_position(consumer, changelog, partition, warm);
        }
        let mut entries = Vec::new();
        let mut at = Vec::with_capacity(self.warm.len());
        for (&partition, warm) in &self.warm {
            entries.extend(warm.entries()?.into_iter().map(|(k, v)| (partition, k, v)));
            at.push((partition, self.at(partition, warm)));
        }
        Ok((entries, at))
    }

    /// Drops the standby of `partition` (`why`, for the log): on disk its keyspace keeps what
    /// it read; in memory its records are counted as thrown away.
    fn drop_warm(&mut self, partition: i32, metrics: &StageMetrics, why: &str) {
        let Some(mut warm) = self.warm.remove(&partition) else {
            return;
        };
        if warm.store.is_some() {
            if let Err(e) = warm.flush(&self.changelog) {
                debug!(partition, error = %e, "a dropped standby's last records are not kept");
            }
        } else {
            metrics.standby_discarded(warm.records);
        }
        info!(
            partition,
            why,
            records = warm.records,
            "the task's standby is dropped"
        );
    }

    /// Assigns the standby consumer every standby's partition at its next offset, creating the
    /// consumer for the first standby and dropping it after the last.
    fn assign(&mut self) {
        if self.warm.is_empty() {
            self.consumer = None;
            return;
        }
        if self.consumer.is_none() {
            match self.client.create::<BaseConsumer>() {
                Ok(c) => self.consumer = Some(c),
                Err(e) => {
                    warn!(error = %e, "no standby consumer: the standbys wait for the next assignment");
                    self.warm.clear();
                    return;
                }
            }
        }
        let mut tpl = TopicPartitionList::new();
        for (&partition, warm) in &self.warm {
            let at = if warm.next > 0 {
                Offset::Offset(warm.next)
            } else {
                Offset::Beginning
            };
            if let Err(e) = tpl.add_partition_offset(&self.changelog.name, partition, at) {
                warn!(partition, error = %e, "a standby's partition cannot be assigned");
            }
        }
        if let Some(consumer) = &self.consumer
            && let Err(e) = consumer.assign(&tpl)
        {
            warn!(error = %e, "the standby consumer cannot be assigned: the standbys wait for the next assignment");
            self.warm.clear();
            self.consumer = None;
        }
    }

    /// Publishes the standbys' figures to `metrics`: at once when `now`, else at most every
    /// [`PUBLISH_EVERY`].
    fn publish(&mut self, metrics: &StageMetrics, now: bool) {
        if !now && self.published.is_some_and(|t| t.elapsed() < PUBLISH_EVERY) {
            return;
        }
        self.published = Some(Instant::now());
        metrics.set_standbys(self.warm.iter().map(|(&partition, warm)| {
            let StandbyAt { position, end } = self.at(partition, warm);
            StandbyMetrics {
                partition,
                position,
                end,
                records: warm.records,
            }
        }));
    }
}

/// Moves `warm.next` to `consumer`'s position of `partition` of `changelog` when that is past
/// it (commit markers read after the last record).
fn sync_position(
    consumer: Option<&BaseConsumer>,
    changelog: &str,
    partition: i32,
    warm: &mut Warm,
) {
    let Some(Ok(positions)) = consumer.map(Consumer::position) else {
        return;
    };
    if let Some(Offset::Offset(p)) = positions
        .find_partition(changelog, partition)
        .map(|e| e.offset())
        && p > warm.next
    {
        warm.next = p;
    }
}

/// The standbys of a stage in one process, shared by its stream threads (module `siblings`):
/// chosen from the tasks every thread owns, read by whichever thread comes first in a turn, and
/// taken over by the thread the task is assigned to. One lock covers the choice, the reads
/// and the handovers, so a standby never writes a task's keyspace after a thread took the task.
#[derive(Clone)]
pub(crate) struct SharedStandbys(Arc<Mutex<Pool>>);

/// What [`SharedStandbys`] guards.
struct Pool {
    standbys: Standbys,
    /// The tasks each stream thread owns, by thread, as each last said.
    owned: BTreeMap<usize, BTreeSet<i32>>,
    /// Where the standbys' figures go: the metrics of the thread that made them.
    metrics: Arc<StageMetrics>,
}

impl std::fmt::Debug for SharedStandbys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedStandbys")
    }
}

impl SharedStandbys {
    /// `standbys`, shared; their figures go to `metrics`.
    pub(crate) fn new(standbys: Standbys, metrics: Arc<StageMetrics>) -> Self {
        SharedStandbys(Arc::new(Mutex::new(Pool {
            standbys,
            owned: BTreeMap::new(),
            metrics,
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stream thread `thread` was just assigned `owned`: no standby is chosen for them any
    /// more, whichever thread chooses.
    pub(crate) fn own(&self, thread: usize, owned: &BTreeSet<i32>) {
        self.lock().owned.insert(thread, owned.clone());
    }

    /// Stream thread `thread` stopped: its tasks count no more.
    pub(crate) fn leave(&self, thread: usize) {
        self.lock().owned.remove(&thread);
    }

    /// Stream thread `thread` owns `owned` after an assignment: the standbys are chosen again
    /// from the tasks every thread owns ([`Standbys::choose`]).
    pub(crate) fn choose(
        &self,
        thread: usize,
        owned: &BTreeSet<i32>,
        stores: Option<&StateStores>,
        admin: &Admin,
    ) {
        let mut pool = self.lock();
        pool.owned.insert(thread, owned.clone());
        let all: BTreeSet<i32> = pool.owned.values().flatten().copied().collect();
        let Pool {
            standbys, metrics, ..
        } = &mut *pool;
        standbys.choose(&all, stores, admin, metrics);
    }

    /// The standby of `partition`, taken by stream thread `thread` for the task's restore
    /// ([`Standbys::take`]); from now on no thread warms it.
    pub(crate) fn take(&self, thread: usize, partition: i32) -> Option<Handover> {
        let mut pool = self.lock();
        pool.owned.entry(thread).or_default().insert(partition);
        let Pool {
            standbys, metrics, ..
        } = &mut *pool;
        standbys.take(partition, metrics)
    }

    /// What the standbys hold ([`Standbys::memory_bytes`]), heap bytes.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.lock().standbys.memory_bytes()
    }

    /// The fold state of key `k` in the standby of `partition` ([`Standbys::get`]), under the
    /// pool's lock: never while a thread applies changelog records to it.
    pub(crate) fn get(
        &self,
        partition: i32,
        k: &[u8],
    ) -> Option<parsley_task::error::Result<(Option<Vec<u8>>, StandbyAt)>> {
        self.lock().standbys.get(partition, k)
    }

    /// Whether this instance keeps a standby of `partition`.
    pub(crate) fn holds(&self, partition: i32) -> bool {
        self.lock().standbys.warm.contains_key(&partition)
    }

    /// Every standby's fold state ([`Standbys::entries`]), under the pool's lock.
    ///
    /// # Errors
    /// A failed read of the state store.
    pub(crate) fn entries(&self) -> parsley_task::error::Result<(Entries, Vec<(i32, StandbyAt)>)> {
        self.lock().standbys.entries()
    }

    /// Once a turn ([`Standbys::read`]), unless another thread reads them now.
    pub(crate) fn read(&self) {
        let mut pool = match self.0.try_lock() {
            Ok(pool) => pool,
            Err(std::sync::TryLockError::WouldBlock) => return,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let Pool {
            standbys, metrics, ..
        } = &mut *pool;
        standbys.read(metrics);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[i32]) -> BTreeSet<i32> {
        v.iter().copied().collect()
    }

    #[test]
    fn the_nearest_tasks_are_chosen_as_many_per_owned_task_as_replicas() {
        // Six tasks over three members, two each: the middle member warms its neighbours.
        assert_eq!(choose(&set(&[2, 3]), 6, 1, 0), set(&[1, 4]));
        // Circularly: the first member's neighbours are 2 and 5.
        assert_eq!(choose(&set(&[0, 1]), 6, 1, 0), set(&[2, 5]));
        // Two copies per task: four tasks, the nearest first, ties to the lower partition.
        assert_eq!(choose(&set(&[2, 3]), 6, 2, 0), set(&[0, 1, 4, 5]));
        assert_eq!(choose(&set(&[0]), 5, 1, 0), set(&[1]));
        assert_eq!(choose(&set(&[0]), 5, 3, 0), set(&[1, 2, 4]));
    }

    #[test]
    fn the_choice_never_holds_an_owned_task_and_stops_at_the_free_ones() {
        assert_eq!(choose(&set(&[0, 1, 2]), 4, 5, 0), set(&[3]));
        assert_eq!(choose(&set(&[0, 1]), 2, 1, 0), set(&[]));
        assert_eq!(choose(&set(&[1]), 3, 0, 0), set(&[]));
    }

    #[test]
    fn an_instance_without_tasks_warms_from_where_its_id_hashes() {
        assert_eq!(choose(&set(&[]), 4, 2, 7), set(&[3, 0]));
        assert_eq!(choose(&set(&[]), 4, 1, 5), set(&[1]));
    }

    /// The range assignor's ranges of `tasks` tasks over `members` members, in member order.
    fn range(tasks: i32, members: i32) -> Vec<BTreeSet<i32>> {
        let (per, extra) = (tasks / members, tasks % members);
        (0..members)
            .map(|i| {
                let start = i * per + i.min(extra);
                (start..start + per + i32::from(i < extra)).collect()
            })
            .collect()
    }

    /// The share of the tasks that move to a survivor when one member leaves that were warm
    /// there, and the warm tasks per owned task, over 2–16 tasks, 2–4 members (at most one per
    /// task) and every member leaving, for `replicas` 1 and 2. The figures of the book's
    /// benchmarks chapter: `cargo test -p parsley-runtime --lib standby::tests::coverage --
    /// --nocapture`.
    /// A choice to measure against: as many tasks, all after the owned ones (circularly).
    fn after_only(owned: &BTreeSet<i32>, tasks: i32, replicas: usize, _: u64) -> BTreeSet<i32> {
        let last = owned.iter().max().copied().unwrap_or(-1);
        let count = (replicas * owned.len().max(1)).min(tasks as usize - owned.len());
        (1..tasks)
            .map(|i| (last + i).rem_euclid(tasks))
            .filter(|t| !owned.contains(t))
            .take(count)
            .collect()
    }

    #[test]
    fn coverage_of_the_nearest_tasks_choice_under_the_range_assignor() {
        type Choice = fn(&BTreeSet<i32>, i32, usize, u64) -> BTreeSet<i32>;
        for (name, choose, replicas) in [
            ("nearest", choose as Choice, 1),
            ("nearest", choose, 2),
            ("after only", after_only, 1),
            ("after only", after_only, 2),
        ] {
            let (mut moved, mut warm_moved, mut owned, mut warm) = (0, 0, 0, 0);
            for tasks in 2..=16 {
                for members in 2..=4.min(tasks) {
                    let before = range(tasks, members);
                    for leaving in 0..members as usize {
                        let survivors: Vec<&BTreeSet<i32>> = before
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| *i != leaving)
                            .map(|(_, s)| s)
                            .collect();
                        let after = range(tasks, members - 1);
                        for (old, new) in survivors.iter().zip(&after) {
                            let chosen = choose(old, tasks, replicas, 0);
                            owned += old.len();
                            warm += chosen.len();
                            for t in new.difference(old) {
                                moved += 1;
                                warm_moved += usize::from(chosen.contains(t));
                            }
                        }
                    }
                }
            }
            let share = warm_moved as f64 / moved as f64;
            println!(
                "{name}, replicas {replicas}: {warm_moved} of {moved} moved tasks warm ({:.0} %), {:.2} warm tasks per owned task",
                100.0 * share,
                warm as f64 / owned as f64
            );
            if name == "nearest" {
                assert!(share > if replicas == 1 { 0.7 } else { 0.95 }, "{share}");
            }
        }
    }

    /// The standbys of a stage's stream threads in one process: chosen from the tasks every
    /// thread owns, never a task another thread owns, and taken over by whichever thread the
    /// task is assigned to. In memory, without a broker (the consumer is made and assigned,
    /// never polled).
    #[test]
    fn the_threads_of_a_process_never_warm_a_task_one_of_them_owns() {
        let changelog = TopicInfo {
            name: "app.stage-changelog".into(),
            id: parsley_clock::TopicId::from_bytes([9; 16]),
            partitions: 6,
        };
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("group.id", "app.stage.standby")
            .set("enable.auto.commit", "false");
        let metrics = Arc::new(StageMetrics::default());
        let shared =
            SharedStandbys::new(Standbys::new(1, "i", &client, &changelog), metrics.clone());
        let admin = Admin::new("127.0.0.1:9", Duration::from_secs(1)).unwrap();
        let warm = || -> BTreeSet<i32> { metrics.standbys().iter().map(|s| s.partition).collect() };
        // Thread 0 owns task 0, thread 1 task 3: one copy per owned task, the nearest free
        // ones to either, none of them owned by the other thread.
        shared.choose(0, &set(&[0]), None, &admin);
        assert_eq!(warm(), set(&[1]), "before thread 1 said what it owns");
        shared.choose(1, &set(&[3]), None, &admin);
        assert_eq!(warm(), set(&[1, 2]));
        // A rebalance gives task 2 to thread 1: it takes the standby the process kept, and no
        // thread warms it any more.
        shared.own(1, &set(&[2, 3]));
        assert!(shared.take(1, 2).is_some(), "the standby is handed over");
        shared.choose(0, &set(&[0]), None, &admin);
        let now = warm();
        assert!(now.is_disjoint(&set(&[0, 2, 3])), "{now:?}");
        assert_eq!(now.len(), 3, "one copy per task the process owns: {now:?}");
        // A thread that stops: its tasks may be warmed again.
        shared.leave(1);
        shared.choose(0, &set(&[0]), None, &admin);
        assert_eq!(warm(), set(&[1]));
    }

    /// A standby's reads (module docs, reads): in memory from its fold; on disk from its
    /// keyspace overlaid with the records read and not written yet, the last record of a key
    /// winning and a tombstone hiding the keyspace's value; each with where the standby stands.
    /// Without a broker: the consumer is never made, so the end is not known.
    #[test]
    fn a_standby_is_read_from_its_fold_or_from_its_keyspace_under_the_records_not_written_yet() {
        let changelog = TopicInfo {
            name: "app.stage-changelog".into(),
            id: parsley_clock::TopicId::from_bytes([9; 16]),
            partitions: 4,
        };
        let mut standbys = Standbys::new(1, "i", &ClientConfig::new(), &changelog);
        let pairs = |v: &[(&str, &str)]| -> Vec<(Vec<u8>, Vec<u8>)> {
            v.iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect()
        };

        let mut restored = Restored::default();
        for (key, value) in [
            (&b"\x00a"[..], Some(&b"1"[..])),
            (b"\x00b", Some(b"2")),
            (b"\x00b", None),
            (b"\x00c", Some(b"3")),
        ] {
            restored.apply(key, value).unwrap();
        }
        let memory = Warm {
            next: 4,
            restored,
            store: None,
            written: 0,
            records: 4,
        };
        assert_eq!(memory.get(b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(memory.get(b"b").unwrap(), None, "deleted");
        assert_eq!(memory.entries().unwrap(), pairs(&[("a", "1"), ("c", "3")]));

        let dir = std::env::temp_dir().join(format!(
            "parsley-standby-read-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let stores = StateStores::open(&dir, "app.stage", 86_400_000).unwrap();
        let keyspace = stores.task(2).unwrap();
        keyspace
            .write(
                [
                    (&b"\x00a"[..], Some(&b"1"[..])),
                    (b"\x00b", Some(b"2")),
                    (b"\x00d", Some(b"5")),
                ],
                Checkpoint {
                    topic: changelog.id,
                    offset: 3,
                    written_ms: 1,
                },
            )
            .unwrap();
        let unwritten: Batch = vec![
            (b"\x00b".to_vec(), None),
            (b"\x00c".to_vec(), Some(b"3".to_vec())),
            (b"\x00a".to_vec(), Some(b"9".to_vec())),
            (b"\x00c".to_vec(), Some(b"4".to_vec())),
            // Not fold state: never a key of the store.
            (b"\x01x".to_vec(), Some(b"meta".to_vec())),
        ];
        let disk = Warm {
            next: 8,
            restored: Restored::default(),
            store: Some((keyspace, unwritten)),
            written: 3,
            records: 8,
        };
        assert_eq!(disk.get(b"a").unwrap(), Some(b"9".to_vec()), "read since");
        assert_eq!(disk.get(b"b").unwrap(), None, "deleted since");
        assert_eq!(
            disk.get(b"c").unwrap(),
            Some(b"4".to_vec()),
            "the last record"
        );
        assert_eq!(
            disk.get(b"d").unwrap(),
            Some(b"5".to_vec()),
            "the keyspace's"
        );
        assert_eq!(disk.get(b"x").unwrap(), None);
        assert_eq!(
            disk.entries().unwrap(),
            pairs(&[("a", "9"), ("c", "4"), ("d", "5")])
        );

        standbys.warm.insert(1, memory);
        standbys.warm.insert(2, disk);
        let at = |position| StandbyAt {
            position,
            end: None,
        };
        let (value, standing) = standbys.get(2, b"c").unwrap().unwrap();
        assert_eq!((value, standing), (Some(b"4".to_vec()), at(8)));
        assert!(standbys.get(0, b"a").is_none(), "no standby of task 0");
        let (entries, standing) = standbys.entries().unwrap();
        let tagged = |p: i32, k: &str, v: &str| (p, k.as_bytes().to_vec(), v.as_bytes().to_vec());
        assert_eq!(
            entries,
            vec![
                tagged(1, "a", "1"),
                tagged(1, "c", "3"),
                tagged(2, "a", "9"),
                tagged(2, "c", "4"),
                tagged(2, "d", "5"),
            ]
        );
        assert_eq!(standing, vec![(1, at(4)), (2, at(8))]);
        drop((standbys, stores));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// With members owning range-assigned blocks, when one member leaves, each task that moves
    /// to a survivor was warm on it whenever the blocks moved by at most one task per side.
    #[test]
    fn a_leaving_members_neighbour_tasks_are_warm_on_their_new_owner() {
        // Range assignment of 6 tasks over 3 members, then over the 2 left when the middle one
        // leaves: [0,1] [2,3] [4,5] -> [0,1,2] [3,4,5].
        let before = [set(&[0, 1]), set(&[2, 3]), set(&[4, 5])];
        let after = [set(&[0, 1, 2]), set(&[3, 4, 5])];
        for (owned, now) in [(&before[0], &after[0]), (&before[2], &after[1])] {
            let warm = choose(owned, 6, 1, 0);
            for moved in now.difference(owned) {
                assert!(warm.contains(moved), "{moved} warm on {owned:?}: {warm:?}");
            }
        }
    }
}
