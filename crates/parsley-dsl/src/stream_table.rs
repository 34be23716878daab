//! Stream–table joins: the causal join with a table's latest value per key, and versioned
//! tables with the join by timestamp — Kafka Streams' versioned key-value store (KIP-889), its
//! source table and stream–table join (KIP-914) and the join's grace period (KIP-923), for
//! pipelines whose writers do not stamp but whose timestamps can be trusted.
//!
//! The causal join keeps its own copy of the table's latest value per key and looks it up for
//! each record of the stream; the gate has delivered every table update the record's stamp
//! claims before it.
//!
//! A versioned source table ([`Consumed::versioned`]) keeps, beside each key's latest value,
//! its history: every version `(timestamp, value or deletion)` that a read as of a time within
//! the history retention can still need. The table's *observed stream time* is the highest
//! timestamp put into it, one per task, kept in the task state. A stream–table join with a
//! versioned table joins each record with the table's value as of the record's timestamp; with
//! a grace period ([`Joined::with_grace_period`]) it first holds the record in a buffer of the
//! task until the join's own observed stream time (the highest timestamp of a record held) has
//! passed the record's timestamp by the grace, so that table updates that arrive out of order
//! within the grace are seen.
//!
//! Invariants, as Kafka Streams' `RocksDBVersionedStore` and time-ordered buffer keep them:
//! - an update older than the table's observed stream time minus the history retention is
//!   dropped: not kept, not forwarded;
//! - a key's versions are sorted by timestamp, one per timestamp (a later update of the same
//!   timestamp replaces it); a version is dropped once no read within the retention can reach
//!   it (the next version's timestamp is at or below the observed stream time minus the
//!   retention); the latest version is never dropped;
//! - a read as of `t` below the observed stream time minus the retention finds the latest
//!   version if its timestamp is at or below `t`, else nothing;
//! - the buffer releases its records in ascending (timestamp, key bytes, arrival) order once
//!   their timestamp is at or below the buffer's observed stream time minus the grace; a record
//!   already that far behind is joined at once, not held.
//!
//! Above `table` and `stream` (here, so that neither knows the other's joins): it imports
//! nothing of the windows or aggregations.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parsley_stage::{Error, Header, Part};
use serde::{Deserialize, Serialize};

use crate::data::{Codecs, Data};
use crate::flow::{Change, Children, Ctx, forward, forward_at};
use crate::processor::{Root, Value};
use crate::stream::KStream;
use crate::table::KTable;

/// The slot of a versioned table's history, beside its latest value's slot `table`.
pub(crate) fn history_slot(table: &str) -> String {
    format!("{table}.history")
}

/// A key's versions, ascending by timestamp (ms since the epoch); `None`: a deletion.
pub(crate) type Versions<V> = Vec<(i64, Option<V>)>;

/// What putting an update into a key's versions did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Put {
    /// Older than the observed stream time minus the retention: not kept.
    Expired,
    /// The update is the key's latest version now.
    Latest,
    /// The update went into the key's history before its latest version.
    History,
}

/// The earliest time a read within the retention can ask for: `observed - retention`.
fn horizon(observed: i64, retention: i64) -> i64 {
    observed.saturating_sub(retention)
}

/// Puts version `(at, value)` into `versions`, the observed stream time being `observed`
/// (already moved by `at`), and drops what no read within `retention` can reach.
pub(crate) fn put<V>(
    versions: &mut Versions<V>,
    at: i64,
    value: Option<V>,
    observed: i64,
    retention: i64,
) -> Put {
    if at < horizon(observed, retention) {
        return Put::Expired;
    }
    let latest = versions.last().is_none_or(|(t, _)| *t <= at);
    match versions.binary_search_by_key(&at, |(t, _)| *t) {
        Ok(i) => versions[i].1 = value,
        Err(i) => versions.insert(i, (at, value)),
    }
    // Version i is read only as of times in [its timestamp, the next one's).
    let reachable = horizon(observed, retention);
    let unreachable = versions
        .windows(2)
        .take_while(|w| w[1].0 <= reachable)
        .count();
    versions.drain(..unreachable);
    if latest { Put::Latest } else { Put::History }
}

/// The value of `versions` as of time `at` (ms since the epoch), the observed stream time
/// being `observed` (`None`: nothing was ever put).
pub(crate) fn as_of<V>(
    versions: &Versions<V>,
    at: i64,
    observed: Option<i64>,
    retention: i64,
) -> Option<&V> {
    let observed = observed?;
    let (latest_at, latest) = versions.last()?;
    if *latest_at <= at {
        return latest.as_ref();
    }
    if at < horizon(observed, retention) {
        return None;
    }
    let i = versions.partition_point(|(t, _)| *t <= at);
    i.checked_sub(1).and_then(|i| versions[i].1.as_ref())
}

/// The options of a stream–table join (Kafka Streams' `Joined`).
#[derive(Debug, Clone, Default)]
pub struct Joined {
    grace_ms: Option<i64>,
}

impl Joined {
    /// Holds each stream record until the join's observed stream time has passed its
    /// timestamp by `grace` before joining it with the table's value as of its timestamp
    /// (KIP-923): updates of a versioned table that arrive up to `grace` out of order are
    /// seen. The table must be versioned ([`Consumed::versioned`]) with a history retention at
    /// least the grace, as Kafka Streams requires; `build` says so otherwise.
    ///
    /// # Panics
    /// When `grace` is over `i64::MAX` ms.
    pub fn with_grace_period(grace: Duration) -> Self {
        Joined {
            grace_ms: Some(
                i64::try_from(grace.as_millis()).expect("a grace of at most i64::MAX ms"),
            ),
        }
    }
}

/// A versioned table's history retention, ms, recorded on its node.
pub(crate) type Retention = i64;

/// The entry point of a versioned source table in slot `slot` (its latest value; the history
/// in [`history_slot`], the observed stream time in the task state's `slot`).
pub(crate) fn source_root<K: Data, V: Data>(
    codecs: Codecs<K, V>,
    slot: String,
    retention: Retention,
    children: Children<K, Change<V>>,
) -> Root {
    let history = history_slot(&slot);
    Arc::new(move |ctx: &mut Ctx<'_>, key, value| {
        let key = ctx.decode_key(&codecs, key)?;
        let new = match value {
            Value::Borrowed(Some(v)) => Some(codecs.value.decode(v)),
            Value::Owned(Some(v)) => Some(codecs.value.decode_owned(v)),
            Value::Borrowed(None) | Value::Owned(None) => None,
        }
        .transpose()
        .map_err(|e| ctx.decode_error(Part::Value, e))?;
        let at = ctx.timestamp;
        let observed: Option<i64> = ctx.load_task(&slot)?;
        if observed.is_some_and(|o| at < horizon(o, retention)) {
            ctx.too_late += 1;
            return Ok(());
        }
        let observed = observed.map_or(at, |o| o.max(at));
        ctx.store_task(&slot, Some(&observed))?;
        let mut versions: Versions<V> = ctx.load(&history)?.unwrap_or_default();
        let put = put(&mut versions, at, new.clone(), observed, retention);
        ctx.store(&history, Some(&versions))?;
        if put != Put::Latest {
            return Ok(()); // history only: the table's value did not change
        }
        let old: Option<V> = ctx.load(&slot)?;
        ctx.store(&slot, new.as_ref())?;
        if old.is_none() && new.is_none() {
            return Ok(());
        }
        forward(&children, ctx, key, Change { old, new })
    })
}

/// A stream record held by a join's grace buffer.
#[derive(Serialize, Deserialize)]
#[serde(bound = "K: Data, V: Data")]
struct Held<K, V> {
    key: K,
    value: V,
    headers: Vec<Header>,
}

/// A join's grace buffer: its observed stream time and its records by (timestamp, key bytes,
/// arrival number).
#[derive(Serialize, Deserialize)]
#[serde(bound = "K: Data, V: Data")]
struct Buffer<K, V> {
    observed: i64,
    arrivals: u64,
    held: BTreeMap<(i64, Vec<u8>, u64), Held<K, V>>,
}

/// How a join with a versioned table reads it.
struct Versioned {
    /// The table's latest-value slot (its observed stream time is the task state's slot of
    /// the same name).
    table: String,
    /// Its history slot.
    history: String,
    /// Its history retention, ms.
    retention: Retention,
}

impl Versioned {
    /// The table's value of key `key` (bytes) as of `at`, read from the context's own state
    /// when `key` is the context's key, else from the task's other keys.
    fn as_of<T: Data>(&self, ctx: &mut Ctx<'_>, key: &[u8], at: i64) -> Result<Option<T>, Error> {
        let observed: Option<i64> = ctx.load_task(&self.table)?;
        let versions: Option<Versions<T>> = if ctx.raw_key == Some(key) {
            ctx.load(&self.history)?
        } else {
            ctx.load_of(key, &self.history)?
        };
        Ok(versions.and_then(|v| as_of(&v, at, observed, self.retention).cloned()))
    }
}

impl<K: Data, V: Data> KStream<K, V> {
    /// Joins each record with `table`'s value for its key (inner join: records whose key has
    /// no value are dropped). The join is **causally consistent**: a record whose stamp claims
    /// a table update — it was produced after that update was seen — is joined with that
    /// version or a later one, never an older one, whatever the fetch order, at startup and on
    /// replay: the causal gate delivers the update first. The stream is repartitioned first,
    /// co-partitioned with the table, when an operator changed its key. With a versioned table
    /// ([`Consumed::versioned`](crate::Consumed::versioned)) each record is joined with the
    /// table's value as of its timestamp instead (KIP-914; [`KStream::join_with`] for a grace
    /// period).
    pub fn join<T: Data, R: Data>(
        &self,
        table: &KTable<K, T>,
        joiner: impl Fn(V, &T) -> R + Send + Sync + 'static,
    ) -> KStream<K, R> {
        self.join_table(table, "join", move |v, t| t.map(|t| joiner(v, t)))
    }

    /// Joins each record with `table`'s value for its key, `None` when it has none (left
    /// join: every record gives one). Causally consistent as [`KStream::join`].
    pub fn left_join<T: Data, R: Data>(
        &self,
        table: &KTable<K, T>,
        joiner: impl Fn(V, Option<&T>) -> R + Send + Sync + 'static,
    ) -> KStream<K, R> {
        self.join_table(table, "left-join", move |v, t| Some(joiner(v, t)))
    }

    fn join_table<T: Data, R: Data>(
        &self,
        table: &KTable<K, T>,
        kind: &str,
        joiner: impl Fn(V, Option<&T>) -> Option<R> + Send + Sync + 'static,
    ) -> KStream<K, R> {
        if self.graph.borrow().node(table.node).versioned.is_some() {
            return self.join_versioned(table, kind, Joined::default(), joiner);
        }
        let name = self.graph.borrow().name(kind, self.next_name.clone());
        let stream = self.keyed_beside(
            &format!("{name}-input"),
            crate::data::auto_codecs(),
            &[table.node],
        );
        let mut g = self.graph.borrow_mut();
        let what = format!("{kind} stream with table {}", g.node(table.node).name);
        let node = g.add(name.clone(), what, &[stream.node, table.node], true, true);
        let (out, freeze) = crate::flow::Outlet::<K, R>::new();
        g.on_freeze(freeze);
        drop(g);
        let slot: Arc<str> = name.into();
        let s = slot.clone();
        table.out.attach(Arc::new(move |ctx, _k, change| {
            ctx.store(&s, change.new.as_ref())
        }));
        let children = out.children();
        stream.out.attach(Arc::new(move |ctx, k, v| {
            let t: Option<T> = ctx.load(&slot)?;
            match joiner(v, t.as_ref()) {
                Some(r) => forward(&children, ctx, k, r),
                None => Ok(()),
            }
        }));
        KStream::new(self.graph.clone(), node, out, false)
    }
}

impl<K: Data, V: Data> KStream<K, V> {
    /// [`KStream::join`] with `joined`'s options: with a versioned table and a grace period,
    /// each record is held until the join's observed stream time passes its timestamp by the
    /// grace, then joined with the table's value as of its timestamp (KIP-923). The results
    /// of held records are made when a later record releases them, so an operator after the
    /// join that keeps state by key reads them through a repartition topic.
    pub fn join_with<T: Data, R: Data>(
        &self,
        table: &KTable<K, T>,
        joiner: impl Fn(V, &T) -> R + Send + Sync + 'static,
        joined: Joined,
    ) -> KStream<K, R> {
        self.join_versioned(table, "join", joined, move |v, t| t.map(|t| joiner(v, t)))
    }

    /// [`KStream::left_join`] with `joined`'s options ([`KStream::join_with`]).
    pub fn left_join_with<T: Data, R: Data>(
        &self,
        table: &KTable<K, T>,
        joiner: impl Fn(V, Option<&T>) -> R + Send + Sync + 'static,
        joined: Joined,
    ) -> KStream<K, R> {
        self.join_versioned(table, "left-join", joined, move |v, t| Some(joiner(v, t)))
    }

    /// A stream–table join with a versioned `table` (as of each record's timestamp), held
    /// for `joined`'s grace when it has one.
    pub(crate) fn join_versioned<T: Data, R: Data>(
        &self,
        table: &KTable<K, T>,
        kind: &str,
        joined: Joined,
        joiner: impl Fn(V, Option<&T>) -> Option<R> + Send + Sync + 'static,
    ) -> KStream<K, R> {
        if joined.grace_ms.is_none() && self.graph.borrow().node(table.node).versioned.is_none() {
            return self.join_table(table, kind, joiner);
        }
        let name = self.graph.borrow().name(kind, self.next_name.clone());
        let stream = self.keyed_beside(
            &format!("{name}-input"),
            crate::data::auto_codecs(),
            &[table.node],
        );
        let mut g = self.graph.borrow_mut();
        let table_node = g.node(table.node);
        let (table_name, retention) = (table_node.name.clone(), table_node.versioned);
        let what = match joined.grace_ms {
            Some(grace) => format!(
                "{kind} stream with versioned table {table_name} as of each record's time, \
                 {grace} ms grace"
            ),
            None => {
                format!("{kind} stream with versioned table {table_name} as of each record's time")
            }
        };
        let retention = retention.unwrap_or_else(|| {
            g.problem(format!(
                "{name}: a grace period needs a versioned table, and {table_name} is not one \
                 (read it with Consumed::versioned)"
            ));
            0
        });
        if let Some(grace) = joined.grace_ms.filter(|g| *g > retention) {
            g.problem(format!(
                "{name}: the grace period ({grace} ms) is longer than the history retention of \
                 {table_name} ({retention} ms): a held record could find its version gone"
            ));
        }
        let node = g.add(name.clone(), what, &[stream.node, table.node], true, true);
        let (out, freeze) = crate::flow::Outlet::<K, R>::new();
        g.on_freeze(freeze);
        drop(g);
        let versioned = Versioned {
            history: history_slot(&table_name),
            table: table_name,
            retention,
        };
        let children = out.children();
        let joiner = Arc::new(joiner);
        let join_one = move |ctx: &mut Ctx<'_>, key_bytes: &[u8], k: K, v: V, at: i64| {
            let t: Option<T> = versioned.as_of(ctx, key_bytes, at)?;
            match joiner(v, t.as_ref()) {
                Some(r) => forward_at(&children, ctx, at, k, r),
                None => Ok(()),
            }
        };
        let Some(grace) = joined.grace_ms else {
            stream.out.attach(Arc::new(move |ctx, k, v| {
                let key = ctx.raw_key.unwrap_or_default().to_vec();
                let at = ctx.timestamp;
                join_one(ctx, &key, k, v, at)
            }));
            return KStream::new(self.graph.clone(), node, out, false);
        };
        let slot = name;
        stream.out.attach(Arc::new(move |ctx, k, v| {
            let key = ctx.raw_key.unwrap_or_default().to_vec();
            let at = ctx.timestamp;
            let mut buffer: Buffer<K, V> = ctx.load_task(&slot)?.unwrap_or(Buffer {
                observed: i64::MIN,
                arrivals: 0,
                held: BTreeMap::new(),
            });
            if at < buffer.observed.saturating_sub(grace) {
                return join_one(ctx, &key, k, v, at); // too late to hold: joined at once
            }
            buffer.observed = buffer.observed.max(at);
            let headers = ctx.headers().to_vec();
            buffer.held.insert(
                (at, key, buffer.arrivals),
                Held {
                    key: k,
                    value: v,
                    headers,
                },
            );
            buffer.arrivals += 1;
            let until = buffer.observed.saturating_sub(grace);
            let mut due = Vec::new();
            while buffer
                .held
                .first_key_value()
                .is_some_and(|((t, ..), _)| *t <= until)
            {
                due.push(buffer.held.pop_first().expect("a first record"));
            }
            if buffer.held.is_empty() {
                buffer.arrivals = 0;
            }
            ctx.store_task(&slot, Some(&buffer))?;
            for ((at, key, _), held) in due {
                let before = ctx.headers.replace(held.headers);
                let joined = join_one(ctx, &key, held.key, held.value, at);
                ctx.headers = before;
                joined?;
            }
            Ok(())
        }));
        // Results of held records are made while another key's record is handled.
        KStream::new(self.graph.clone(), node, out, true)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Kafka Streams' rules over every version ever put, nothing dropped: the model the
    /// trimmed history must answer like.
    fn model(puts: &[(i64, Option<u8>)], at: i64, retention: i64) -> Option<u8> {
        let mut observed: Option<i64> = None;
        let mut all: BTreeMap<i64, Option<u8>> = BTreeMap::new();
        for &(t, v) in puts {
            if observed.is_some_and(|o| t < o - retention) {
                continue;
            }
            observed = Some(observed.map_or(t, |o| o.max(t)));
            all.insert(t, v);
        }
        let observed = observed?;
        let (&latest_at, latest) = all.last_key_value()?;
        if latest_at <= at {
            return *latest;
        }
        if at < observed - retention {
            return None;
        }
        all.range(..=at).next_back().and_then(|(_, v)| *v)
    }

    proptest! {
        #[test]
        fn the_trimmed_history_answers_every_read_as_all_versions_would(
            puts in prop::collection::vec((0i64..60, prop::option::of(0u8..4)), 0..30),
            retention in 0i64..20,
            reads in prop::collection::vec(0i64..70, 1..10),
        ) {
            let mut versions: Versions<u8> = Vec::new();
            let mut observed: Option<i64> = None;
            for &(t, v) in &puts {
                if observed.is_some_and(|o| t < horizon(o, retention)) {
                    continue;
                }
                let o = observed.map_or(t, |o| o.max(t));
                observed = Some(o);
                prop_assert_ne!(put(&mut versions, t, v, o, retention), Put::Expired);
                prop_assert!(versions.windows(2).all(|w| w[0].0 < w[1].0));
            }
            for at in reads {
                prop_assert_eq!(
                    as_of(&versions, at, observed, retention).copied(),
                    model(&puts, at, retention),
                    "as of {}", at
                );
            }
        }
    }

    #[test]
    fn a_put_says_whether_it_is_the_latest_and_drops_an_expired_one() {
        let mut v: Versions<&str> = Vec::new();
        assert_eq!(put(&mut v, 10, Some("a"), 10, 5), Put::Latest);
        assert_eq!(put(&mut v, 12, Some("b"), 12, 5), Put::Latest);
        assert_eq!(put(&mut v, 11, Some("x"), 12, 5), Put::History);
        assert_eq!(put(&mut v, 12, None, 12, 5), Put::Latest);
        assert_eq!(put(&mut v, 6, Some("old"), 12, 5), Put::Expired);
        assert_eq!(v, [(10, Some("a")), (11, Some("x")), (12, None)]);
        assert_eq!(put(&mut v, 30, Some("c"), 30, 5), Put::Latest);
        assert_eq!(
            v,
            [(12, None), (30, Some("c"))],
            "10 and 11 can no longer be read"
        );
    }
}
