//! The entry point: [`StreamsBuilder`], the streams and tables it reads, its settings for every
//! stage, and the compilation of what was built.
//!
//! The top of the crate: it hands out the [`KStream`]s and [`KTable`]s every operator module
//! adds to; no module imports it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use parsley_stage::store::StoreSpec;
use parsley_stage::{BadRecordPolicy, Error, EventTimeOrder, ImpossiblePolicy, Part, Topology};

use crate::data::{Consumed, Data};
use crate::flow::{Change, Ctx, Outlet, forward};
use crate::global::GlobalKTable;
use crate::graph::Graph;
use crate::late::LatePolicy;
use crate::processor::{Root, Value};
use crate::state::slot_reader;
use crate::stream::KStream;
use crate::table::KTable;

/// Builds a DSL topology (Kafka Streams' `StreamsBuilder`): read streams and tables, chain
/// operators on them, then [`StreamsBuilder::build`] compiles the pipeline into stages.
///
/// ```
/// use parsley_dsl::StreamsBuilder;
///
/// let builder = StreamsBuilder::new("wordcount");
/// builder
///     .stream::<(), String>("lines")
///     .flat_map_values(|line| line.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>())
///     .group_by(|_, word| word.clone())
///     .count()
///     .to_stream()
///     .to("word-counts");
/// let topology = builder.build()?;
/// assert_eq!(topology.stages().len(), 2); // split, then count after the repartition
/// # Ok::<(), parsley_stage::Error>(())
/// ```
pub struct StreamsBuilder {
    pub(crate) graph: Rc<RefCell<Graph>>,
}

impl StreamsBuilder {
    /// A builder for the application `application_id`: the prefix of every consumer group,
    /// transactional id, changelog and repartition topic.
    pub fn new(application_id: impl Into<String>) -> Self {
        StreamsBuilder {
            graph: Rc::new(RefCell::new(Graph::new(application_id.into()))),
        }
    }

    /// What every stage does with a record it cannot process (default: fail the stage);
    /// Kafka Streams' deserialization and processing exception handlers.
    pub fn on_bad_record(&self, policy: BadRecordPolicy) -> &Self {
        self.graph.borrow_mut().set_bad_records(policy);
        self
    }

    /// What every stage does with a record whose stamp is impossible (default: fail the task).
    pub fn on_impossible_stamp(&self, policy: ImpossiblePolicy) -> &Self {
        self.graph.borrow_mut().set_impossible(policy);
        self
    }

    /// The event-time order of every stage with a windowed operator (default:
    /// `EventTimeOrder::new()`, moved by the inputs' evidence alone).
    pub fn event_time(&self, order: EventTimeOrder) -> &Self {
        self.graph.borrow_mut().set_event_time(order);
        self
    }

    /// What windowed operators added from now on do with a record that arrives after its
    /// windows closed (default: count it; [`LatePolicy`]).
    pub fn on_late_record(&self, policy: LatePolicy) -> &Self {
        self.graph.borrow_mut().set_late(policy);
        self
    }

    /// The records of `topic` as a stream, read with [`Auto`](parsley_stage::Auto) codecs.
    ///
    /// # Panics
    /// After [`StreamsBuilder::build`].
    pub fn stream<K: Data, V: Data>(&self, topic: impl Into<String>) -> KStream<K, V> {
        self.stream_with(topic, Consumed::default())
    }

    /// The records of `topic` as a stream, read with `consumed`'s codecs.
    ///
    /// # Panics
    /// After [`StreamsBuilder::build`].
    pub fn stream_with<K: Data, V: Data>(
        &self,
        topic: impl Into<String>,
        consumed: Consumed<K, V>,
    ) -> KStream<K, V> {
        let topic = topic.into();
        if consumed.versioned.is_some() {
            self.graph.borrow_mut().problem(format!(
                "the stream of {topic}: Consumed::versioned is for a table (table_with)"
            ));
        }
        let stream = KStream::source(
            &self.graph,
            topic.clone(),
            consumed.codecs,
            None,
            consumed.name,
        );
        self.graph
            .borrow_mut()
            .key_partitioning(&topic, consumed.partitioning);
        stream
    }

    /// The records of `topic` as a table (Kafka Streams' `KTable`): the latest value of each
    /// key, a record without a value (a tombstone) deleting it. The table is kept in the state
    /// of the stage that reads it, in its changelog.
    ///
    /// # Panics
    /// After [`StreamsBuilder::build`].
    pub fn table<K: Data, V: Data>(&self, topic: impl Into<String>) -> KTable<K, V> {
        self.table_with(topic, Consumed::default())
    }

    /// [`StreamsBuilder::table`] read with `consumed`'s codecs, name
    /// ([`Consumed::named`]) and key partitioning ([`Consumed::key_partitioning`]).
    ///
    /// # Panics
    /// After [`StreamsBuilder::build`].
    pub fn table_with<K: Data, V: Data>(
        &self,
        topic: impl Into<String>,
        consumed: Consumed<K, V>,
    ) -> KTable<K, V> {
        let topic = topic.into();
        let mut g = self.graph.borrow_mut();
        let name = g.name("table", consumed.name);
        let what = match consumed.versioned {
            Some(retention) => format!("versioned table {topic} ({retention} ms of history)"),
            None => format!("table {topic}"),
        };
        let node = g.add(name.clone(), what, &[], true, false);
        g.materialised(node);
        let (out, freeze) = Outlet::<K, Change<V>>::new();
        g.on_freeze(freeze);
        let children = out.children();
        let (codecs, partitioning) = (consumed.codecs, consumed.partitioning);
        let slot = name;
        if consumed.versioned.is_none() {
            g.queryable(
                node,
                StoreSpec::new::<K, V>(slot.clone(), codecs.key.clone(), slot_reader(slot.clone())),
            );
        }
        if let Some(retention) = consumed.versioned {
            g.versioned(node, retention);
            let root = crate::stream_table::source_root(codecs, slot, retention, children);
            g.add_source(topic.clone(), node, root, None);
            g.key_partitioning(&topic, partitioning);
            return KTable::new(self.graph.clone(), node, out);
        }
        let root: Root = Arc::new(move |ctx: &mut Ctx<'_>, key, value| {
            let key = ctx.decode_key(&codecs, key)?;
            let new = match value {
                Value::Borrowed(Some(v)) => Some(codecs.value.decode(v)),
                Value::Owned(Some(v)) => Some(codecs.value.decode_owned(v)),
                Value::Borrowed(None) | Value::Owned(None) => None,
            }
            .transpose()
            .map_err(|e| ctx.decode_error(Part::Value, e))?;
            let old: Option<V> = ctx.load(&slot)?;
            if old.is_none() && new.is_none() {
                return Ok(());
            }
            ctx.store(&slot, new.as_ref())?;
            forward(&children, ctx, key, Change { old, new })
        });
        g.add_source(topic.clone(), node, root, None);
        g.key_partitioning(&topic, partitioning);
        KTable::new(self.graph.clone(), node, out)
    }

    /// The records of `topic` as a global table (Kafka Streams' `GlobalKTable`): the latest
    /// value of each key, read whole — every partition — by every task of each stage that
    /// joins it ([`KStream::join_global`]), kept in that stage's state. Its topic may have
    /// any partition count and any partitioner: nothing is co-partitioned with it.
    ///
    /// A stage that joins a global table does not order by event time (no windowed operator
    /// in it: repartition between them); [`StreamsBuilder::build`] says so.
    ///
    /// # Panics
    /// After [`StreamsBuilder::build`].
    pub fn global_table<K: Data, V: Data>(&self, topic: impl Into<String>) -> GlobalKTable<K, V> {
        self.global_table_with(topic, Consumed::default())
    }

    /// [`StreamsBuilder::global_table`] read with `consumed`'s codecs and name
    /// ([`Consumed::named`]; its key partitioning is not used).
    ///
    /// # Panics
    /// After [`StreamsBuilder::build`].
    pub fn global_table_with<K: Data, V: Data>(
        &self,
        topic: impl Into<String>,
        consumed: Consumed<K, V>,
    ) -> GlobalKTable<K, V> {
        GlobalKTable::source(&self.graph, topic.into(), consumed)
    }

    /// Compiles the pipeline into a validated [`Topology`] of stages, repartition topics
    /// declared as internal topics. Print [`Topology::describe`] to see what it became.
    ///
    /// # Errors
    /// [`Error::InvalidTopology`] listing every problem: an operator name used twice, a topic
    /// read by two operators, no source, and the topology's own checks (names).
    ///
    /// # Panics
    /// When called twice.
    pub fn build(self) -> Result<Topology, Error> {
        self.graph.borrow_mut().build()
    }
}
