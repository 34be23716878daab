//! [`KTable`]: a table of the latest value per key, its changes, and its joins: stream–table
//! and table–table.
//!
//! A table is a stream of changes: each update of a key carries its old and new value
//! (`None`: absent or deleted). A source table
//! ([`StreamsBuilder::table`](crate::StreamsBuilder::table)), a stream made a table
//! ([`KStream::to_table`]) and an aggregation keep their values in their stage's state;
//! `filter` and `map_values` derive a table from its parent's changes without keeping one;
//! a table–table join keeps
//! both sides' latest values per key, each with the timestamp of its update, and gives each
//! result the later of the update's and the other side's timestamps, as Kafka Streams does.
//! Stream–table joins are in `stream_table`.
//!
//! Above `stream` (a table's updates are a stream; a stream joins a table); below `grouped` and
//! the windows, whose aggregations make tables: it imports nothing of theirs.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use parsley_stage::Error;

use crate::data::{Data, auto_codecs};
use crate::flow::{
    Change, Children, Ctx, NO_TIMESTAMP, Outlet, Push, forward, forward_at, forward_headed,
};
use crate::graph::Graph;
use crate::stream::KStream;

/// A table: the latest value of each key (Kafka Streams' `KTable`).
pub struct KTable<K, V> {
    pub(crate) graph: Rc<RefCell<Graph>>,
    pub(crate) node: usize,
    pub(crate) out: Outlet<K, Change<V>>,
    next_name: Option<String>,
}

impl<K, V> Clone for KTable<K, V> {
    fn clone(&self) -> Self {
        KTable {
            graph: self.graph.clone(),
            node: self.node,
            out: self.out.clone(),
            next_name: self.next_name.clone(),
        }
    }
}

/// Both sides of a table–table join for one key, as the join keeps them: each side's value and
/// the timestamp of its update (ms since the epoch).
type Sides<V, W> = (Option<(V, i64)>, Option<(W, i64)>);

/// Both sides as version 1 of the state encoding kept them, without timestamps.
type SidesV1<V, W> = (Option<V>, Option<W>);

/// The sides of the join in slot `slot` of the context's key (none: both absent).
fn load_sides<V: Data, W: Data>(ctx: &mut Ctx<'_>, slot: &str) -> Result<Sides<V, W>, Error> {
    let unknown = NO_TIMESTAMP;
    Ok(ctx
        .load_upgraded(slot, |(v, w): SidesV1<V, W>| {
            (v.map(|v| (v, unknown)), w.map(|w| (w, unknown)))
        })?
        .unwrap_or((None, None)))
}

/// The timestamp of a join result Kafka Streams gives: the later of the update's and the other
/// side's, when the other side has a value.
fn joined_at<T>(update: i64, other: Option<&(T, i64)>) -> i64 {
    other.map_or(update, |(_, at)| update.max(*at))
}

impl<K: Data, V: Data> KTable<K, V> {
    pub(crate) fn new(graph: Rc<RefCell<Graph>>, node: usize, out: Outlet<K, Change<V>>) -> Self {
        KTable {
            graph,
            node,
            out,
            next_name: None,
        }
    }

    /// The name given to the next operator ([`KTable::named`]), if any.
    pub(crate) fn next_name(&self) -> Option<&String> {
        self.next_name.as_ref()
    }

    /// Names the next operator applied to the returned table (see [`KStream::named`]).
    pub fn named(&self, name: impl Into<String>) -> KTable<K, V> {
        KTable {
            next_name: Some(name.into()),
            ..self.clone()
        }
    }

    fn then<K2: Data, V2: Data>(
        &self,
        kind: &str,
        what: String,
        make: impl FnOnce(Children<K2, Change<V2>>) -> Push<K, Change<V>>,
    ) -> KTable<K2, V2> {
        let mut g = self.graph.borrow_mut();
        let name = g.name(kind, self.next_name.clone());
        let node = g.add(name, what, &[self.node], false, true);
        let (out, freeze) = Outlet::new();
        g.on_freeze(freeze);
        drop(g);
        self.out.attach(make(out.children()));
        KTable::new(self.graph.clone(), node, out)
    }

    /// The table of the values for which `predicate` holds: a value that stops passing is a
    /// deletion downstream.
    pub fn filter(
        &self,
        predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static,
    ) -> KTable<K, V> {
        self.then("table-filter", "filter".into(), |out| {
            Arc::new(move |ctx, k, c: Change<V>| {
                let keep = |v: Option<V>| v.filter(|v| predicate(&k, v));
                let change = Change {
                    old: keep(c.old),
                    new: keep(c.new),
                };
                if change.old.is_none() && change.new.is_none() {
                    return Ok(());
                }
                forward(&out, ctx, k, change)
            })
        })
    }

    /// The table of the values for which `predicate` does not hold.
    pub fn filter_not(
        &self,
        predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static,
    ) -> KTable<K, V> {
        self.filter(move |k, v| !predicate(k, v))
    }

    /// The table of each value replaced by `mapper`'s.
    pub fn map_values<V2: Data>(
        &self,
        mapper: impl Fn(&V) -> V2 + Send + Sync + 'static,
    ) -> KTable<K, V2> {
        self.then("table-map-values", "map values".into(), |out| {
            Arc::new(move |ctx, k, c: Change<V>| {
                let change = Change {
                    old: c.old.as_ref().map(&mapper),
                    new: c.new.as_ref().map(&mapper),
                };
                forward(&out, ctx, k, change)
            })
        })
    }

    /// The table of each value replaced by `mapper`'s, which sees the key too (Kafka Streams'
    /// `KTable.mapValues(ValueMapperWithKey)`): an update maps its old and new values, a
    /// deletion stays a deletion.
    ///
    /// `KTable<K, V>` → `KTable<K, V2>`.
    ///
    /// ```
    /// # use parsley_dsl::StreamsBuilder;
    /// let builder = StreamsBuilder::new("app");
    /// builder
    ///     .table::<String, i64>("balances")
    ///     .map_values_with_key(|account, cents| format!("{account}: {cents} ct"))
    ///     .to_change_stream()
    ///     .to("statements");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn map_values_with_key<V2: Data>(
        &self,
        mapper: impl Fn(&K, &V) -> V2 + Send + Sync + 'static,
    ) -> KTable<K, V2> {
        self.then("table-map-values", "map values (with key)".into(), |out| {
            Arc::new(move |ctx, k, c: Change<V>| {
                let change = Change {
                    old: c.old.as_ref().map(|v| mapper(&k, v)),
                    new: c.new.as_ref().map(|v| mapper(&k, v)),
                };
                forward(&out, ctx, k, change)
            })
        })
    }

    /// The table with rows that expire by event time: a row is deleted — from this table's
    /// state, and as a deletion downstream, so a join no longer finds it — once the stage's
    /// watermark reaches its last update's event time plus `retention`. An update in between
    /// keeps it. Kafka's evidence decides, not the wall clock: the watermark passes a time only
    /// once every record up to it has been handed over. For a source table or an aggregation;
    /// the stage then orders by event time.
    ///
    /// # Panics
    /// When `retention` is over `i64::MAX` ms.
    pub fn expire_after(&self, retention: std::time::Duration) -> KTable<K, V> {
        let retention_ms =
            i64::try_from(retention.as_millis()).expect("a retention of at most i64::MAX ms");
        let mut g = self.graph.borrow_mut();
        let table = g.node(self.node).name.clone();
        if !g.node(self.node).materialised {
            g.problem(format!(
                "expire_after on {table}: only a source table or an aggregation keeps rows to expire"
            ));
        }
        let name = g.name("expire", self.next_name.clone());
        let what = format!("expire rows of {table} {retention_ms} ms after their last update");
        let node = g.add(name.clone(), what, &[self.node], true, true);
        let (out, freeze) = Outlet::<K, Change<V>>::new();
        g.on_freeze(freeze);
        let children = out.children();
        let (timer_children, slot, timer_table) = (children.clone(), name.clone(), table.clone());
        g.add_timer(
            node,
            Arc::new(move |ctx: &mut Ctx<'_>| {
                let Some((key, updated)) = ctx.load::<(K, i64)>(&slot)? else {
                    return Ok(());
                };
                if updated.saturating_add(retention_ms) > ctx.timestamp {
                    return Ok(()); // updated since: a later timer expires it
                }
                let old: Option<V> = ctx.load(&timer_table)?;
                ctx.store::<V>(&timer_table, None)?;
                ctx.store::<(K, i64)>(&slot, None)?;
                // The deletion carries the headers of the row's last update.
                let headers = ctx.take_headers(&slot, &())?;
                let at = ctx.timestamp;
                forward_headed(
                    &timer_children,
                    ctx,
                    (at, headers),
                    key,
                    Change { old, new: None },
                )
            }),
        );
        drop(g);
        let slot = name;
        self.out
            .attach(Arc::new(move |ctx: &mut Ctx<'_>, k: K, c: Change<V>| {
                if c.new.is_some() {
                    let t = ctx.timestamp;
                    ctx.store(&slot, Some(&(k.clone(), t)))?;
                    ctx.keep_headers(&slot, ())?;
                    ctx.timers.push(t.saturating_add(retention_ms));
                } else {
                    ctx.store::<(K, i64)>(&slot, None)?;
                    ctx.take_headers(&slot, &())?;
                }
                forward(&children, ctx, k, c)
            }));
        KTable::new(self.graph.clone(), node, out)
    }

    /// The table's updates as a stream: the new value of each update; deletions are left out
    /// (see [`KTable::to_change_stream`]).
    pub fn to_stream(&self) -> KStream<K, V> {
        self.stream_of("to-stream", |c: Change<V>| c.new)
    }

    /// The table's updates as a stream of `Option`s, `None` for a deletion (Kafka Streams'
    /// `toStream`, whose deletions are null values): written to a topic with a codec that
    /// maps `None` to an absent value, a deletion is a tombstone.
    pub fn to_change_stream(&self) -> KStream<K, Option<V>> {
        self.stream_of("to-change-stream", |c: Change<V>| Some(c.new))
    }

    fn stream_of<V2: Data>(
        &self,
        kind: &str,
        pick: impl Fn(Change<V>) -> Option<V2> + Send + Sync + 'static,
    ) -> KStream<K, V2> {
        let mut g = self.graph.borrow_mut();
        let name = g.name(kind, self.next_name.clone());
        let node = g.add(name, "to stream".into(), &[self.node], false, true);
        let (out, freeze) = Outlet::<K, V2>::new();
        g.on_freeze(freeze);
        drop(g);
        let children = out.children();
        self.out.attach(Arc::new(move |ctx, k, c| match pick(c) {
            Some(v) => forward(&children, ctx, k, v),
            None => Ok(()),
        }));
        KStream::new(self.graph.clone(), node, out, false)
    }

    /// The inner join with `other`: a value for each key both tables have, `joiner`'s of the
    /// two. Both tables end up in one stage: their topics must be co-partitioned.
    pub fn join<W: Data, R: Data>(
        &self,
        other: &KTable<K, W>,
        joiner: impl Fn(&V, &W) -> R + Send + Sync + 'static,
    ) -> KTable<K, R> {
        self.join_tables(other, "table-join", move |v, w| match (v, w) {
            (Some(v), Some(w)) => Some(joiner(v, w)),
            _ => None,
        })
    }

    /// The left join with `other`: a value for each key this table has.
    pub fn left_join<W: Data, R: Data>(
        &self,
        other: &KTable<K, W>,
        joiner: impl Fn(&V, Option<&W>) -> R + Send + Sync + 'static,
    ) -> KTable<K, R> {
        self.join_tables(other, "table-left-join", move |v, w| {
            v.map(|v| joiner(v, w))
        })
    }

    /// The outer join with `other`: a value for each key either table has.
    pub fn outer_join<W: Data, R: Data>(
        &self,
        other: &KTable<K, W>,
        joiner: impl Fn(Option<&V>, Option<&W>) -> R + Send + Sync + 'static,
    ) -> KTable<K, R> {
        self.join_tables(other, "table-outer-join", move |v, w| {
            (v.is_some() || w.is_some()).then(|| joiner(v, w))
        })
    }

    fn join_tables<W: Data, R: Data>(
        &self,
        other: &KTable<K, W>,
        kind: &str,
        joiner: impl Fn(Option<&V>, Option<&W>) -> Option<R> + Send + Sync + 'static,
    ) -> KTable<K, R> {
        let mut g = self.graph.borrow_mut();
        let name = g.name(kind, self.next_name.clone());
        let what = format!(
            "{kind} of {} with {}",
            g.node(self.node).name,
            g.node(other.node).name
        );
        let node = g.add(name.clone(), what, &[self.node, other.node], true, true);
        let (out, freeze) = Outlet::<K, Change<R>>::new();
        g.on_freeze(freeze);
        drop(g);
        let joiner = Arc::new(joiner);
        let slot: Arc<str> = name.into();
        // One update function per side: store the side's new value, emit the join's change
        // with the later of the two sides' timestamps (Kafka Streams').
        let (children, j, s) = (out.children(), joiner.clone(), slot.clone());
        self.out.attach(Arc::new(move |ctx, k, c: Change<V>| {
            let (_, right): Sides<V, W> = load_sides(ctx, &s)?;
            let r = right.as_ref().map(|(w, _)| w);
            let old = j(c.old.as_ref(), r);
            let new = j(c.new.as_ref(), r);
            let at = joined_at(ctx.timestamp, right.as_ref());
            let sides: Sides<V, W> = (c.new.map(|v| (v, ctx.timestamp)), right);
            store_sides(ctx, &s, sides)?;
            emit(&children, ctx, at, k, old, new)
        }));
        let children = out.children();
        other.out.attach(Arc::new(move |ctx, k, c: Change<W>| {
            let (left, _): Sides<V, W> = load_sides(ctx, &slot)?;
            let l = left.as_ref().map(|(v, _)| v);
            let old = joiner(l, c.old.as_ref());
            let new = joiner(l, c.new.as_ref());
            let at = joined_at(ctx.timestamp, left.as_ref());
            store_sides(ctx, &slot, (left, c.new.map(|w| (w, ctx.timestamp))))?;
            emit(&children, ctx, at, k, old, new)
        }));
        KTable::new(self.graph.clone(), node, out)
    }
}

// A stream of changes made a table: here, so that `stream` knows nothing of tables.
impl<K: Data, V: Data> KStream<K, Option<V>> {
    /// The table of this stream's latest value per key (Kafka Streams' `KStream#toTable`):
    /// each record upserts its key's row, a `None` value (a tombstone) deletes it. The table
    /// is kept in the state of its stage, as a source table is ([`StreamsBuilder::table`]),
    /// so it can be joined, filtered, expired ([`KTable::expire_after`]) and turned back into
    /// a stream. The stream is repartitioned first when an operator changed its key, through
    /// `{application}-{name}-repartition`; name it ([`KStream::named`]) to keep its state when
    /// the pipeline changes around it.
    ///
    /// `KStream<K, Option<V>>` → `KTable<K, V>`: map a stream of plain values with
    /// `map_values(Some)` first. Each change keeps the record's timestamp. A deletion of a key
    /// the table does not hold changes nothing and forwards nothing. A record without a key,
    /// where `K` has no absent value, is a `MissingKey` bad record, as at every keyed operator
    /// (Kafka Streams drops it).
    ///
    /// [`StreamsBuilder::table`]: crate::StreamsBuilder::table
    ///
    /// ```
    /// # use parsley_dsl::StreamsBuilder;
    /// let builder = StreamsBuilder::new("app");
    /// let latest = builder
    ///     .stream::<String, Option<i64>>("prices")
    ///     .named("latest-price")
    ///     .to_table();
    /// builder
    ///     .stream::<String, i64>("orders")
    ///     .join(&latest, |quantity, price| quantity * price)
    ///     .to("order-values");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn to_table(&self) -> KTable<K, V> {
        let name = self.graph.borrow().name("to-table", self.next_name.clone());
        let stream = self.keyed(&name, auto_codecs());
        let mut g = self.graph.borrow_mut();
        let node = g.add(name.clone(), "to table".into(), &[stream.node], true, true);
        g.materialised(node);
        let (out, freeze) = Outlet::<K, Change<V>>::new();
        g.on_freeze(freeze);
        drop(g);
        let children = out.children();
        let slot = name;
        stream.out.attach(Arc::new(move |ctx, k, new: Option<V>| {
            let old: Option<V> = ctx.load(&slot)?;
            if old.is_none() && new.is_none() {
                return Ok(());
            }
            ctx.store(&slot, new.as_ref())?;
            forward(&children, ctx, k, Change { old, new })
        }));
        KTable::new(self.graph.clone(), node, out)
    }
}

fn store_sides<V: Data, W: Data>(
    ctx: &mut Ctx<'_>,
    slot: &str,
    sides: Sides<V, W>,
) -> Result<(), Error> {
    if sides.0.is_none() && sides.1.is_none() {
        ctx.store::<Sides<V, W>>(slot, None)
    } else {
        ctx.store(slot, Some(&sides))
    }
}

fn emit<K: Data, R: Data>(
    children: &Children<K, Change<R>>,
    ctx: &mut Ctx<'_>,
    at: i64,
    k: K,
    old: Option<R>,
    new: Option<R>,
) -> Result<(), Error> {
    if old.is_none() && new.is_none() {
        return Ok(());
    }
    forward_at(children, ctx, at, k, Change { old, new })
}
