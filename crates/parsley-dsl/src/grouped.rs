//! [`KGroupedStream`]: a stream grouped by key, and its aggregations into tables.
//!
//! An aggregation keeps one value per key in the state of its stage (so in the stage's
//! changelog, committed with the outputs and input offsets) and emits the key's new value
//! after each record: the resulting [`KTable`]'s changes. As in Kafka Streams, an aggregate's
//! timestamp is the latest of the records it folded (kept with it in its slot), and each
//! update is emitted with it. A grouped stream whose key changed
//! is sent through a repartition topic first, so each key's records are aggregated in one
//! task.
//!
//! Above `stream`, whose grouping operators (`group_by`, `group_by_key`) it defines, and
//! `table`; below `window` and `session`, which window a grouped stream: it imports nothing of
//! theirs.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use parsley_stage::Codec;
use parsley_stage::store::StoreSpec;

use crate::data::{Codecs, Data, auto_codecs};
use crate::flow::{Change, Ctx, Outlet, forward_at};
use crate::graph::Graph;
use crate::state::slot_reader;
use crate::stream::KStream;
use crate::table::KTable;

/// A stream grouped by key (Kafka Streams' `KGroupedStream`), from [`KStream::group_by_key`]
/// or [`KStream::group_by`].
pub struct KGroupedStream<K, V> {
    stream: KStream<K, V>,
    name: Option<String>,
    codecs: Codecs<K, V>,
}

// A stream's grouping: here, so that `stream` knows nothing of grouped streams.
impl<K: Data, V: Data> KStream<K, V> {
    /// Groups the records by their key for an aggregation (repartitioned first when an
    /// operator changed the key).
    pub fn group_by_key(&self) -> KGroupedStream<K, V> {
        KGroupedStream::new(self.clone())
    }

    /// Groups the records by the key `selector` gives (always repartitioned).
    pub fn group_by<K2: Data>(
        &self,
        selector: impl Fn(&K, &V) -> K2 + Send + Sync + 'static,
    ) -> KGroupedStream<K2, V> {
        let name = self.next_name.clone();
        let mut grouped = KGroupedStream::new(
            KStream {
                next_name: None,
                ..self.clone()
            }
            .select_key(selector),
        );
        grouped.name = name;
        grouped
    }
}

impl<K: Data, V: Data> KGroupedStream<K, V> {
    fn new(stream: KStream<K, V>) -> Self {
        let name = stream.next_name.clone();
        KGroupedStream {
            stream,
            name,
            codecs: auto_codecs(),
        }
    }

    /// Names the aggregation (Kafka Streams' `Grouped.as` and `Materialized.as` in one): its
    /// state slot, its repartition topic `{application}-{name}-repartition` and its line in
    /// `describe`. Name aggregations to keep their state when the pipeline changes around
    /// them.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The codecs of the repartition topic, when there is one (Kafka Streams' `Grouped.with`;
    /// default [`Auto`](parsley_stage::Auto)).
    pub fn with_codecs(
        mut self,
        key: impl Codec<K> + 'static,
        value: impl Codec<V> + 'static,
    ) -> Self {
        self.codecs = Codecs {
            key: Arc::new(key),
            value: Arc::new(value),
        };
        self
    }

    /// The number of records per key.
    pub fn count(self) -> KTable<K, i64> {
        self.fold("count", "count", |_k: &K, _v, n: Option<i64>| {
            n.unwrap_or(0) + 1
        })
    }

    /// Per key, the records' values combined by `reducer` (the first value as it is).
    pub fn reduce(self, reducer: impl Fn(V, V) -> V + Send + Sync + 'static) -> KTable<K, V> {
        self.fold("reduce", "reduce", move |_k, v, agg: Option<V>| match agg {
            Some(agg) => reducer(agg, v),
            None => v,
        })
    }

    /// Per key, `initializer()` folded with `aggregator` over the records' values.
    pub fn aggregate<A: Data>(
        self,
        initializer: impl Fn() -> A + Send + Sync + 'static,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
    ) -> KTable<K, A> {
        self.fold("aggregate", "aggregate", move |k, v, agg: Option<A>| {
            aggregator(k, v, agg.unwrap_or_else(&initializer))
        })
    }

    /// The graph the grouped stream is in.
    pub(crate) fn graph(&self) -> Rc<RefCell<Graph>> {
        self.stream.graph.clone()
    }

    /// The name given to the grouped stream ([`KGroupedStream::named`]), if any.
    pub(crate) fn name(&self) -> Option<&String> {
        self.name.as_ref()
    }

    /// The grouped stream keyed as its records' partitions are, beside the operators `beside`
    /// (the other inputs of the operator it feeds): sent through the repartition its name
    /// names, else `default_name`, when an operator changed its key or its partitioner differs
    /// ([`KStream::keyed_beside`]).
    pub(crate) fn keyed_input_beside(self, default_name: &str, beside: &[usize]) -> KStream<K, V> {
        let name = self.name.unwrap_or_else(|| default_name.to_string());
        self.stream.keyed_beside(&name, self.codecs, beside)
    }

    /// The codec of the grouped stream's keys: the bytes its aggregations key their state
    /// with.
    pub(crate) fn key_codec(&self) -> Arc<dyn Codec<K>> {
        self.codecs.key.clone()
    }

    /// The grouped stream's operator, before any repartition.
    pub(crate) fn node(&self) -> usize {
        self.stream.node
    }

    /// The stateful operator an aggregation of `kind` adds, doing `what` (for `describe`):
    /// its graph, its node, the outlet of its keyed input (after a repartition when the key
    /// changed) to attach its push function to, and its name (its state slot).
    pub(crate) fn stateful_node(
        self,
        kind: &str,
        what: String,
    ) -> (Rc<RefCell<Graph>>, usize, Outlet<K, V>, String) {
        let name = self
            .name
            .clone()
            .unwrap_or_else(|| self.stream.graph.borrow().name(kind, None));
        let input = self.stream.keyed(&name, self.codecs);
        let graph = input.graph.clone();
        let node = graph
            .borrow_mut()
            .add(name.clone(), what, &[input.node], true, true);
        (graph, node, input.out, name)
    }

    fn fold<A: Data>(
        self,
        kind: &str,
        what: &str,
        step: impl Fn(&K, V, Option<A>) -> A + Send + Sync + 'static,
    ) -> KTable<K, A> {
        let key_codec = self.key_codec();
        let (graph, node, input, name) = self.stateful_node(kind, what.to_string());
        let (out, freeze) = Outlet::<K, Change<A>>::new();
        graph.borrow_mut().on_freeze(freeze);
        graph.borrow_mut().materialised(node);
        graph.borrow_mut().queryable(
            node,
            StoreSpec::new::<K, A>(name.clone(), key_codec, slot_reader(name.clone())),
        );
        let children = out.children();
        let slot = name;
        input.attach(Arc::new(move |ctx: &mut Ctx<'_>, k, v| {
            let (old, at): (Option<A>, Option<i64>) = match ctx.load_timestamped(&slot)? {
                Some((old, at)) => (Some(old), at),
                None => (None, None),
            };
            // Kafka Streams' timestamp of an aggregate: the latest of its records'.
            let t = at.map_or(ctx.timestamp, |at| at.max(ctx.timestamp));
            let new = step(&k, v, old.clone());
            ctx.store_timestamped(&slot, Some(&new), t)?;
            forward_at(
                &children,
                ctx,
                t,
                k,
                Change {
                    old,
                    new: Some(new),
                },
            )
        }));
        KTable::new(graph, node, out)
    }
}
