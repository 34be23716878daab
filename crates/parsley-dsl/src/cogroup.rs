//! [`CogroupedKStream`]: several grouped streams of one key type folded into one aggregate per
//! key (Kafka Streams' `KGroupedStream#cogroup` and `CogroupedKStream`).
//!
//! Each input keeps its own aggregator; all of them fold into one state slot, the cogroup's,
//! so every record of any input updates the same aggregate and emits it, with the latest
//! timestamp of the records it folded, as an aggregation does. The inputs meet in one stage:
//! each is repartitioned first when its key changed, else its topic must be co-partitioned
//! with the others' (checked when the stage starts).
//!
//! Above `grouped` (it takes grouped streams apart) and `table`; below `window`, `session`
//! and `builder`: it imports nothing of theirs.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use crate::data::Data;
use crate::flow::{Change, Children, Ctx, Outlet, forward_at};
use crate::graph::Graph;
use crate::grouped::KGroupedStream;
use crate::table::KTable;

/// What the aggregate's inputs share: its state slot, its initializer and its children.
struct Shared<K, A> {
    slot: Arc<str>,
    initializer: Arc<dyn Fn() -> A + Send + Sync>,
    children: Children<K, Change<A>>,
}

/// One input, in two steps: given the cogroup's name, the input's position and the other
/// inputs' streams, its keyed stream's node (after a repartition when its key changed, or its
/// partitioner differs from theirs); then, given what the inputs share, its push function
/// attached.
type Input<K, A> =
    Box<dyn FnOnce(&str, usize, &[usize]) -> (usize, Box<dyn FnOnce(&Shared<K, A>)>)>;

/// Grouped streams of one key type cogrouped into one aggregate (Kafka Streams'
/// `CogroupedKStream`), from [`KGroupedStream::cogroup`]: add inputs with
/// [`cogroup`](CogroupedKStream::cogroup), then [`aggregate`](CogroupedKStream::aggregate).
pub struct CogroupedKStream<K, A> {
    graph: Rc<RefCell<Graph>>,
    /// Each input's grouped stream (its node before any repartition) and its two steps.
    inputs: Vec<(usize, Input<K, A>)>,
    name: Option<String>,
}

// A grouped stream's cogroup: here, so that `grouped` knows nothing of cogroups.
impl<K: Data, V: Data> KGroupedStream<K, V> {
    /// Starts a cogroup with this grouped stream and its `aggregator` (Kafka Streams'
    /// `KGroupedStream#cogroup(Aggregator)`): other grouped streams of the same key type join
    /// it with [`CogroupedKStream::cogroup`], each with an aggregator of its own value type,
    /// and [`CogroupedKStream::aggregate`] folds them all into one aggregate per key.
    ///
    /// `KGroupedStream<K, V>` → `CogroupedKStream<K, A>`. The cogroup takes this grouped
    /// stream's name ([`KGroupedStream::named`]) unless it is named itself.
    ///
    /// ```
    /// # use parsley_dsl::StreamsBuilder;
    /// let builder = StreamsBuilder::new("shop");
    /// let views = builder.stream::<String, String>("page-views").group_by_key();
    /// let orders = builder.stream::<String, i64>("orders").group_by_key();
    /// let activity = views
    ///     .cogroup(|_customer, _page, (v, o): (i64, i64)| (v + 1, o))
    ///     .cogroup(orders, |_customer, cents, (v, o): (i64, i64)| (v, o + cents))
    ///     .named("activity")
    ///     .aggregate(|| (0, 0));
    /// activity
    ///     .map_values(|(views, cents)| format!("{views} views, {cents} ct ordered"))
    ///     .to_stream()
    ///     .to("customer-activity");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn cogroup<A: Data>(
        self,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
    ) -> CogroupedKStream<K, A> {
        let graph = self.graph();
        let name = self.name().cloned();
        CogroupedKStream {
            graph,
            inputs: Vec::new(),
            name,
        }
        .cogroup(self, aggregator)
    }
}

impl<K: Data, A: Data> CogroupedKStream<K, A> {
    /// Adds `grouped` and its `aggregator` to the cogroup (Kafka Streams'
    /// `CogroupedKStream#cogroup`): each of its records folds into the same aggregate.
    /// Repartitioned first when its key changed, through
    /// `{application}-{name}-repartition`, `name` its own ([`KGroupedStream::named`]) or the
    /// cogroup's followed by its position (`-0` for the first input, `-1` for the next).
    pub fn cogroup<V: Data>(
        mut self,
        grouped: KGroupedStream<K, V>,
        aggregator: impl Fn(&K, V, A) -> A + Send + Sync + 'static,
    ) -> Self {
        let stream = grouped.node();
        self.inputs.push((
            stream,
            Box::new(move |cogroup: &str, position: usize, beside: &[usize]| {
                let input = grouped.keyed_input_beside(&format!("{cogroup}-{position}"), beside);
                let node = input.node;
                let attach = move |shared: &Shared<K, A>| {
                    let (slot, initializer) = (shared.slot.clone(), shared.initializer.clone());
                    let children = shared.children.clone();
                    input
                        .out
                        .attach(Arc::new(move |ctx: &mut Ctx<'_>, k: K, v: V| {
                            let (old, at): (Option<A>, Option<i64>) =
                                match ctx.load_timestamped(&slot)? {
                                    Some((old, at)) => (Some(old), at),
                                    None => (None, None),
                                };
                            // Kafka Streams' timestamp of an aggregate: the latest of its records'.
                            let t = at.map_or(ctx.timestamp, |at| at.max(ctx.timestamp));
                            let agg = old.clone().unwrap_or_else(|| initializer());
                            let new = aggregator(&k, v, agg);
                            ctx.store_timestamped(&slot, Some(&new), t)?;
                            let change = Change {
                                old,
                                new: Some(new),
                            };
                            forward_at(&children, ctx, t, k, change)
                        }));
                };
                (node, Box::new(attach) as Box<dyn FnOnce(&Shared<K, A>)>)
            }),
        ));
        self
    }

    /// Names the cogroup (as [`KGroupedStream::named`] names an aggregation): its state slot,
    /// its line in `describe` and the prefix of its inputs' repartition topics. Name it to keep
    /// its state when the pipeline changes around it.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Per key, `initializer()` folded over the records of every input, each by its own
    /// aggregator, in the order the stage handles them (Kafka Streams'
    /// `CogroupedKStream#aggregate`). Each record emits the key's new aggregate with the
    /// latest timestamp of the records it folded.
    ///
    /// `CogroupedKStream<K, A>` → `KTable<K, A>`.
    pub fn aggregate(self, initializer: impl Fn() -> A + Send + Sync + 'static) -> KTable<K, A> {
        let graph = self.graph;
        let name = self
            .name
            .unwrap_or_else(|| graph.borrow().name("cogroup", None));
        let streams: Vec<usize> = self.inputs.iter().map(|(stream, _)| *stream).collect();
        let (nodes, attaches): (Vec<usize>, Vec<_>) = self
            .inputs
            .into_iter()
            .enumerate()
            .map(|(position, (stream, input))| {
                let beside: Vec<usize> = streams.iter().copied().filter(|s| *s != stream).collect();
                input(&name, position, &beside)
            })
            .unzip();
        let mut g = graph.borrow_mut();
        let what = format!("cogroup of {} streams", nodes.len());
        let node = g.add(name.clone(), what, &nodes, true, true);
        g.materialised(node);
        let (out, freeze) = Outlet::<K, Change<A>>::new();
        g.on_freeze(freeze);
        drop(g);
        let shared = Shared {
            slot: name.into(),
            initializer: Arc::new(initializer),
            children: out.children(),
        };
        for attach in attaches {
            attach(&shared);
        }
        KTable::new(graph, node, out)
    }
}
