//! Interactive queries: reading a running stage's fold state from outside its stream thread
//! ([`Running::store`](crate::Running::store)), as Kafka Streams' `ReadOnlyKeyValueStore`,
//! with a read that waits for a causal stamp ([`ReadOnlyStore::get_at_least`]).
//!
//! A [`ReadOnlyStore`] never touches the state itself: each call files a request with the
//! stage (`parsley_task::query`) and waits for the stream thread's answer, which it gives
//! between two turns (a turn polls for at most 100 ms; a commit can keep it longer). The
//! stream thread answers with bytes; the handle encodes keys with the store's key codec and
//! decodes values on the caller's thread.
//!
//! Opt-in, [`ReadOnlyStore::stale_ok`] gives a [`StaleStore`] whose reads also cover the
//! standbys this instance keeps (module `stale`), each read marked with where it came from
//! ([`Source`]): the owning task, or a standby with its lag.
//!
//! Invariants:
//! - a value read is the one the owning task's last delivered record left — committed or not
//!   yet (read-uncommitted, as Kafka Streams' stores); a transaction that aborts rebuilds the
//!   task from its changelog, and later reads see the rebuilt state;
//! - a read covers the tasks this instance runs when the stream thread answers; a key whose
//!   task runs elsewhere is [`QueryError::NotOwned`], never `None` — for a [`StaleStore`], a
//!   key whose task neither runs here nor has a standby here;
//! - while any task of the stage restores, every read fails with [`QueryError::Restoring`];
//! - no call waits longer than its bound: [`ANSWER_WITHIN`] for `get`, `range` and `all`, the
//!   caller's timeout plus [`ANSWER_WITHIN`] for `get_at_least`.

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::Arc;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use parsley_clock::Clock;
use parsley_stage::Codec;
use parsley_stage::CodecError;
use parsley_stage::StageSpec;
use parsley_stage::store::ValueReader;
use parsley_task::metrics::TaskPhase;

use crate::threads::StageThreads;
use parsley_task::query::{AtLeast, StoreAnswer, StoreQuery};

mod stale;

pub use self::stale::{Read, Source, StaleEntries, StaleStore};

/// How long a query waits for the stream thread's answer (beyond a `get_at_least`'s own
/// timeout): a turn lasts at most 100 ms, a commit or a restore can last longer.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Why a query of a store failed. Every variant names the store.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// No stage running in this instance declares a store of that name.
    #[error("no store {store} in the stages running here (stores: {known:?})")]
    UnknownStore {
        /// The store asked for.
        store: String,
        /// The stores the running stages declare.
        known: Vec<String>,
    },
    /// The store's keys or values are of other types than asked for.
    #[error("store {store} maps {key} to {value}, not {asked_key} to {asked_value}")]
    WrongTypes {
        /// The store.
        store: String,
        /// Its key type.
        key: &'static str,
        /// Its value type.
        value: &'static str,
        /// The key type asked for.
        asked_key: &'static str,
        /// The value type asked for.
        asked_value: &'static str,
    },
    /// Tasks of the store's stage are restoring from their changelog: reads wait until they
    /// run (Kafka Streams' `InvalidStateStoreException` while rebalancing). Retry.
    #[error("store {store}: tasks {partitions:?} are restoring")]
    Restoring {
        /// The store.
        store: String,
        /// The tasks restoring.
        partitions: Vec<i32>,
    },
    /// The key's task runs on another instance (or on none now):
    /// [`Running::key_owner`](crate::Running::key_owner) names who has it.
    #[error("store {store}: the key's task {partition} does not run on this instance")]
    NotOwned {
        /// The store.
        store: String,
        /// The key's task.
        partition: i32,
    },
    /// The stage's sources are all `KeyPartitioning::Unchecked`: no key has one task.
    #[error("store {store}: the stage's keys are not partitioned by a known partitioner")]
    Unpartitioned {
        /// The store.
        store: String,
    },
    /// The key's task had not delivered everything the stamp claims when the caller's timeout
    /// ran out: the channels still short, each with the offset claimed and the task's frontier.
    #[error("store {store}: task {partition} has not delivered the stamp within {timeout:?}: {}", short_list(.short))]
    NotCaughtUp {
        /// The store.
        store: String,
        /// The key's task.
        partition: i32,
        /// The claims not delivered.
        short: Vec<ShortChannel>,
        /// The caller's timeout.
        timeout: Duration,
    },
    /// The key does not encode with the store's key codec.
    #[error("store {store}: the key does not encode: {message}")]
    Key {
        /// The store.
        store: String,
        /// The codec's error.
        message: String,
    },
    /// A key or value in the store does not decode as the store's types.
    #[error("store {store}: state does not decode: {message}")]
    Decode {
        /// The store.
        store: String,
        /// The codec's error.
        message: String,
    },
    /// Reading the state failed (a state store read).
    #[error("store {store}: reading the state failed: {message}")]
    State {
        /// The store.
        store: String,
        /// The error.
        message: String,
    },
    /// The store's stage has ended: its stream thread answers no more.
    #[error("store {store}: its stage {stage} has ended")]
    StageEnded {
        /// The store.
        store: String,
        /// Its stage.
        stage: String,
    },
    /// No instance that advertises an application endpoint held the key's task at the last
    /// look at the group (every 2 s; none while the group rebalances). Retry.
    #[error("store {store}: no instance advertising an endpoint holds task {partition}")]
    OwnerUnknown {
        /// The store.
        store: String,
        /// The key's task.
        partition: i32,
    },
    /// A [`StaleStore::get_at_least`] of a key whose task is only a standby here: a stamp
    /// claims offsets of the stage's inputs, and a standby follows the task's changelog, which
    /// does not say which inputs its state reflects. Read the owner
    /// ([`Running::key_owner`](crate::Running::key_owner)).
    #[error(
        "store {store}: task {partition} is only a standby here, and a standby cannot wait for a stamp of the stage's inputs: read its owner"
    )]
    StandbyCannotWait {
        /// The store.
        store: String,
        /// The key's task.
        partition: i32,
    },
    /// The stream thread did not answer within its bound ([`ANSWER_WITHIN`]).
    #[error("store {store}: stage {stage} did not answer within {within:?}")]
    NoAnswer {
        /// The store.
        store: String,
        /// Its stage.
        stage: String,
        /// How long the query waited.
        within: Duration,
    },
}

/// The instance that owns a key's task ([`Running::key_owner`](crate::Running::key_owner)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner {
    /// The key's task (partition).
    pub partition: i32,
    /// The owner's [`RuntimeConfig::instance_id`](crate::RuntimeConfig::instance_id).
    pub instance_id: String,
    /// The `host:port` it advertises
    /// ([`RuntimeConfig::application_endpoint`](crate::RuntimeConfig::application_endpoint)).
    pub endpoint: String,
    /// This instance runs the task.
    pub local: bool,
}

/// One claim of a stamp that a task has not delivered yet ([`QueryError::NotCaughtUp`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortChannel {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset the stamp claims (i64).
    pub claimed: i64,
    /// The task's frontier: every offset up to it delivered or absent (i64); `None` while the
    /// channel is not seeded.
    pub delivered: Option<i64>,
}

fn short_list(short: &[ShortChannel]) -> String {
    short
        .iter()
        .map(|s| match s.delivered {
            Some(d) => format!(
                "{}/{} claimed {} delivered {d}",
                s.topic, s.partition, s.claimed
            ),
            None => format!(
                "{}/{} claimed {} not seeded",
                s.topic, s.partition, s.claimed
            ),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The view of store `name` typed `K` → `V`, among `stages` (each running stage's spec and
/// metrics): [`Running::store`](crate::Running::store).
pub(crate) fn open<'a, K: 'static, V: 'static>(
    name: &str,
    stages: impl IntoIterator<Item = (&'a StageSpec, &'a StageThreads)>,
) -> Result<ReadOnlyStore<K, V>, QueryError> {
    let mut known = Vec::new();
    for (spec, metrics) in stages {
        let Some(store) = spec.store(name) else {
            known.extend(spec.stores().iter().map(|s| s.name().to_string()));
            continue;
        };
        let typed = store.typed::<K, V>().ok_or_else(|| {
            let (key, value) = store.types();
            QueryError::WrongTypes {
                store: name.to_string(),
                key,
                value,
                asked_key: std::any::type_name::<K>(),
                asked_value: std::any::type_name::<V>(),
            }
        })?;
        return Ok(ReadOnlyStore::new(
            name,
            spec.name(),
            metrics.clone(),
            typed,
        ));
    }
    Err(QueryError::UnknownStore {
        store: name.to_string(),
        known,
    })
}

/// [`QueryError::UnknownStore`] for `name`, naming the stores of `stages`.
fn unknown_store(name: &str, stages: &[(&StageSpec, &StageThreads)]) -> QueryError {
    QueryError::UnknownStore {
        store: name.to_string(),
        known: stages
            .iter()
            .flat_map(|(spec, _)| spec.stores().iter().map(|s| s.name().to_string()))
            .collect(),
    }
}

/// The value of the `String` key `key` in store `name`, as JSON text, among `stages`: the
/// metrics endpoint's `GET /store/{name}/{key}`.
///
/// # Errors
/// [`QueryError::UnknownStore`]; [`QueryError::WrongTypes`] when the store's keys are not
/// `String`; then as [`ReadOnlyStore::get`].
pub(crate) fn get_json<'a>(
    name: &str,
    key: &str,
    stages: impl IntoIterator<Item = (&'a StageSpec, &'a StageThreads)>,
) -> Result<Option<String>, QueryError> {
    json_view(name, stages)?.get(&key.to_string())
}

/// [`get_json`] from the owning task or a standby here, marked with its source: the metrics
/// endpoint's `GET /store/{name}/{key}?stale=true`.
///
/// # Errors
/// As [`get_json`], then as [`StaleStore::get`].
pub(crate) fn get_json_stale<'a>(
    name: &str,
    key: &str,
    stages: impl IntoIterator<Item = (&'a StageSpec, &'a StageThreads)>,
) -> Result<Read<String>, QueryError> {
    json_view(name, stages)?.stale_ok().get(&key.to_string())
}

/// The view of store `name`, among `stages`, with `String` keys and its values as JSON text.
fn json_view<'a>(
    name: &str,
    stages: impl IntoIterator<Item = (&'a StageSpec, &'a StageThreads)>,
) -> Result<ReadOnlyStore<String, String>, QueryError> {
    let stages: Vec<_> = stages.into_iter().collect();
    let Some((spec, metrics, store)) = stages
        .iter()
        .find_map(|(spec, metrics)| spec.store(name).map(|store| (*spec, *metrics, store)))
    else {
        return Err(unknown_store(name, &stages));
    };
    let codec = store.key_codec::<String>().ok_or_else(|| {
        let (key, value) = store.types();
        QueryError::WrongTypes {
            store: name.to_string(),
            key,
            value,
            asked_key: std::any::type_name::<String>(),
            asked_value: value,
        }
    })?;
    Ok(ReadOnlyStore::new(
        name,
        spec.name(),
        metrics.clone(),
        (codec, store.json()),
    ))
}

/// Who owns the task of `key` in store `name`, among `stages` (each running stage's spec and
/// metrics), this instance being `own` (its instance id and advertised endpoint):
/// [`Running::key_owner`](crate::Running::key_owner).
pub(crate) fn key_owner<'a, K: 'static>(
    name: &str,
    key: &K,
    stages: impl IntoIterator<Item = (&'a StageSpec, &'a StageThreads)>,
    (own_id, own_endpoint): (&str, Option<&str>),
) -> Result<KeyOwner, QueryError> {
    let stages: Vec<_> = stages.into_iter().collect();
    let found = stages
        .iter()
        .find_map(|(spec, metrics)| spec.store(name).map(|store| (*spec, *metrics, store)));
    let Some((spec, metrics, store)) = found else {
        return Err(unknown_store(name, &stages));
    };
    let codec = store.key_codec::<K>().ok_or_else(|| {
        let (key, value) = store.types();
        QueryError::WrongTypes {
            store: name.to_string(),
            key,
            value,
            asked_key: std::any::type_name::<K>(),
            asked_value: value,
        }
    })?;
    // A view with the key codec only: the task of a key needs no value.
    let view = ReadOnlyStore::<K, ()>::new(
        name,
        spec.name(),
        metrics.clone(),
        (codec, Arc::new(|_: &[u8]| Ok(None))),
    );
    let partition = view.task_of(key)?;
    let runs_here = metrics
        .tasks()
        .iter()
        .any(|t| t.partition == partition && t.phase == TaskPhase::Running);
    if let (true, Some(endpoint)) = (runs_here, own_endpoint) {
        return Ok(KeyOwner {
            partition,
            instance_id: own_id.to_string(),
            endpoint: endpoint.to_string(),
            local: true,
        });
    }
    // A listing that names this instance for a task it does not run is out of date (the
    // group rebalanced since): no owner is known then.
    metrics
        .owners()
        .into_iter()
        .find(|o| o.partition == partition && o.instance_id != own_id)
        .map(|o| KeyOwner {
            partition,
            local: false,
            instance_id: o.instance_id,
            endpoint: o.endpoint,
        })
        .ok_or(QueryError::OwnerUnknown {
            store: name.to_string(),
            partition,
        })
}

/// A read-only view of a store of a running stage (module docs): `get`, `range`, `all` over
/// the tasks this instance runs, and `get_at_least`. Cheap to clone; usable from any thread.
pub struct ReadOnlyStore<K, V> {
    store: String,
    stage: String,
    /// The stage's stream threads here.
    metrics: StageThreads,
    key: Arc<dyn Codec<K>>,
    value: ValueReader<V>,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Clone for ReadOnlyStore<K, V> {
    fn clone(&self) -> Self {
        ReadOnlyStore {
            store: self.store.clone(),
            stage: self.stage.clone(),
            metrics: self.metrics.clone(),
            key: self.key.clone(),
            value: self.value.clone(),
            _types: PhantomData,
        }
    }
}

impl<K, V> fmt::Debug for ReadOnlyStore<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadOnlyStore")
            .field("store", &self.store)
            .field("stage", &self.stage)
            .finish_non_exhaustive()
    }
}

impl<K, V> ReadOnlyStore<K, V> {
    /// A view of `store` of stage `stage` (whose stream threads' metrics are `metrics`), typed
    /// by `key` and `value`.
    pub(crate) fn new(
        store: &str,
        stage: &str,
        metrics: StageThreads,
        (key, value): (Arc<dyn Codec<K>>, ValueReader<V>),
    ) -> Self {
        ReadOnlyStore {
            store: store.to_string(),
            stage: stage.to_string(),
            metrics,
            key,
            value,
            _types: PhantomData,
        }
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.store
    }

    /// A view of the same store whose reads also cover the standbys this instance keeps
    /// ([`RuntimeConfig::standby_replicas`](crate::RuntimeConfig::standby_replicas)), each read
    /// marked with its source and a standby's lag (Kafka Streams'
    /// `StoreQueryParameters.enableStaleStores`): [`StaleStore`].
    pub fn stale_ok(&self) -> StaleStore<K, V> {
        StaleStore::new(self.clone())
    }

    /// The value of `key` now: the one the owning task's last delivered record left; `None`
    /// when the key has none.
    ///
    /// # Errors
    /// [`QueryError::NotOwned`] when the key's task runs elsewhere, [`QueryError::Restoring`],
    /// [`QueryError::Key`], [`QueryError::Decode`], [`QueryError::State`],
    /// [`QueryError::StageEnded`], [`QueryError::NoAnswer`].
    pub fn get(&self, key: &K) -> Result<Option<V>, QueryError> {
        self.get_when(key, None, Duration::ZERO)
    }

    /// The value of `key` once the task that owns it has delivered everything `stamp` claims
    /// on the channels it reads (for each claim `(channel, offset)` on one of them, every
    /// offset up to `offset` delivered or absent), waiting at most `timeout`; then as
    /// [`ReadOnlyStore::get`]. With the clock a `CausalProducer` holds after its write is
    /// acknowledged ([`CausalProducer::clock`](crate::CausalProducer::clock)), a service reads
    /// its own write through the stage's state. Claims on channels the task does not read are
    /// not waited for: the stamp should be of a write to a topic the store's stage reads.
    ///
    /// # Errors
    /// [`QueryError::NotCaughtUp`] naming the channels still short when `timeout` runs out;
    /// otherwise as [`ReadOnlyStore::get`].
    pub fn get_at_least(
        &self,
        key: &K,
        stamp: &Clock,
        timeout: Duration,
    ) -> Result<Option<V>, QueryError> {
        self.get_when(key, Some(stamp), timeout)
    }

    fn get_when(
        &self,
        key: &K,
        stamp: Option<&Clock>,
        timeout: Duration,
    ) -> Result<Option<V>, QueryError> {
        let key = self.encode(key)?;
        let at_least = stamp.map(|stamp| AtLeast {
            stamp: stamp.clone(),
            deadline: Instant::now() + timeout,
        });
        match self.ask(StoreQuery::Get { key, at_least }, timeout)? {
            StoreAnswer::Value(None) => Ok(None),
            StoreAnswer::Value(Some(state)) => self.value_of(&state),
            StoreAnswer::Short { partition, short } => {
                Err(self.not_caught_up(partition, short, timeout))
            }
            other => Err(self.unexpected(other)),
        }
    }

    /// [`QueryError::NotCaughtUp`] for task `partition`, with the claims `short` not
    /// delivered within `timeout`.
    fn not_caught_up(
        &self,
        partition: i32,
        short: Vec<(String, parsley_task::query::Shortfall)>,
        timeout: Duration,
    ) -> QueryError {
        QueryError::NotCaughtUp {
            store: self.store.clone(),
            partition,
            short: short
                .into_iter()
                .map(|(topic, s)| ShortChannel {
                    topic,
                    partition: s.channel.partition,
                    claimed: s.claimed,
                    delivered: s.delivered,
                })
                .collect(),
            timeout,
        }
    }

    /// The key's bytes by the store's key codec.
    fn encode(&self, key: &K) -> Result<Vec<u8>, QueryError> {
        self.key.encode(key).map_err(|e| QueryError::Key {
            store: self.store.clone(),
            message: e.to_string(),
        })
    }

    /// Every key with a value in the tasks this instance runs, with its value, by task then
    /// key bytes.
    ///
    /// # Errors
    /// [`QueryError::Restoring`], [`QueryError::Decode`], [`QueryError::State`],
    /// [`QueryError::StageEnded`], [`QueryError::NoAnswer`].
    pub fn all(&self) -> Result<Vec<(K, V)>, QueryError> {
        match self.ask(StoreQuery::All, Duration::ZERO)? {
            StoreAnswer::Entries(entries) => {
                let mut out = Vec::with_capacity(entries.len());
                for (_, key, state) in entries {
                    if let Some(value) = self.value_of(&state)? {
                        out.push((self.key_of(&key)?, value));
                    }
                }
                Ok(out)
            }
            other => Err(self.unexpected(other)),
        }
    }

    /// The keys in `range` with a value in the tasks this instance runs, with their values,
    /// in key order (`K`'s `Ord`; Kafka Streams orders by the serialized key bytes instead).
    ///
    /// # Errors
    /// As [`ReadOnlyStore::all`].
    pub fn range(&self, range: impl RangeBounds<K>) -> Result<Vec<(K, V)>, QueryError>
    where
        K: Ord,
    {
        let mut out: Vec<(K, V)> = self
            .all()?
            .into_iter()
            .filter(|(k, _)| range.contains(k))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// The task (partition) that owns `key` by the stage's partitioner.
    ///
    /// # Errors
    /// [`QueryError::Unpartitioned`], [`QueryError::Key`], [`QueryError::StageEnded`],
    /// [`QueryError::NoAnswer`].
    pub fn task_of(&self, key: &K) -> Result<i32, QueryError> {
        let key = self.encode(key)?;
        match self.ask_thread(StoreQuery::TaskOf { key }, ANSWER_WITHIN)? {
            StoreAnswer::Task(Some(partition)) => Ok(partition),
            other => Err(self.unexpected(other)),
        }
    }

    /// Files `query` after checking that no task restores, and waits for the answer at most
    /// `timeout` plus [`ANSWER_WITHIN`].
    fn ask(&self, query: StoreQuery, timeout: Duration) -> Result<StoreAnswer, QueryError> {
        let restoring: Vec<i32> = self
            .metrics
            .tasks()
            .into_iter()
            .filter(|t| t.phase == TaskPhase::Restoring)
            .map(|t| t.partition)
            .collect();
        if !restoring.is_empty() {
            return Err(QueryError::Restoring {
                store: self.store.clone(),
                partitions: restoring,
            });
        }
        self.ask_thread(query, timeout + ANSWER_WITHIN)
    }

    /// Files `query` with the stage's stream threads and waits for the answer at most `within`
    /// in all. A `get` goes to the thread that runs the key's task (the first to answer other
    /// than [`StoreAnswer::NotOwned`]); `all` gathers every thread's entries (a stale `all` the
    /// standbys from the first thread only: they are the process's, and a task a thread runs
    /// wins over a standby of it); the task of a key is the same on every thread.
    fn ask_thread(&self, query: StoreQuery, within: Duration) -> Result<StoreAnswer, QueryError> {
        let deadline = Instant::now() + within;
        let threads = self.metrics.threads();
        let mut entries = Vec::new();
        let mut stale: Option<stale::StaleParts> = None;
        let mut not_owned = None;
        for (i, metrics) in threads.iter().enumerate() {
            let last = i + 1 == threads.len();
            let ask = match &query {
                StoreQuery::AllStale { standbys } => StoreQuery::AllStale {
                    standbys: *standbys && i == 0,
                },
                other => other.clone(),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            match self.ask_one(metrics, ask, left)? {
                StoreAnswer::Entries(more) => entries.extend(more),
                StoreAnswer::StaleEntries {
                    entries: more,
                    owned,
                    standbys,
                } => stale.get_or_insert_default().add(more, owned, standbys),
                StoreAnswer::NotOwned { partition } if !last => {
                    not_owned = Some(partition);
                }
                answer => return Ok(answer),
            }
        }
        match (not_owned, stale) {
            (Some(partition), _) => Ok(StoreAnswer::NotOwned { partition }),
            (None, None) => Ok(StoreAnswer::Entries(entries)),
            (None, Some(parts)) => Ok(parts.finish()),
        }
    }

    /// Files `query` with the stream thread whose metrics are `metrics` and waits for its
    /// answer at most `within`.
    fn ask_one(
        &self,
        metrics: &parsley_task::metrics::StageMetrics,
        query: StoreQuery,
        within: Duration,
    ) -> Result<StoreAnswer, QueryError> {
        let ended = || QueryError::StageEnded {
            store: self.store.clone(),
            stage: self.stage.clone(),
        };
        if metrics.ended().is_some() {
            return Err(ended());
        }
        match metrics.queries().ask(query).recv_timeout(within) {
            Ok(answer) => Ok(answer),
            Err(RecvTimeoutError::Disconnected) => Err(ended()),
            Err(RecvTimeoutError::Timeout) if metrics.ended().is_some() => Err(ended()),
            Err(RecvTimeoutError::Timeout) => Err(QueryError::NoAnswer {
                store: self.store.clone(),
                stage: self.stage.clone(),
                within,
            }),
        }
    }

    fn value_of(&self, state: &[u8]) -> Result<Option<V>, QueryError> {
        (self.value)(state).map_err(|e| self.decode_error(&e))
    }

    fn key_of(&self, key: &[u8]) -> Result<K, QueryError> {
        self.key.decode(key).map_err(|e| self.decode_error(&e))
    }

    fn decode_error(&self, e: &CodecError) -> QueryError {
        QueryError::Decode {
            store: self.store.clone(),
            message: e.to_string(),
        }
    }

    /// The error an answer other than the one asked for stands for.
    fn unexpected(&self, answer: StoreAnswer) -> QueryError {
        let store = self.store.clone();
        match answer {
            StoreAnswer::NotOwned { partition } => QueryError::NotOwned { store, partition },
            StoreAnswer::Task(None) => QueryError::Unpartitioned { store },
            StoreAnswer::Failed(message) => QueryError::State { store, message },
            StoreAnswer::StandbyCannotWait { partition } => {
                QueryError::StandbyCannotWait { store, partition }
            }
            other => QueryError::State {
                store,
                message: format!("unexpected answer {other:?}"),
            },
        }
    }
}
