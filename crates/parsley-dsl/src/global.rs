//! Global tables (Kafka Streams' `GlobalKTable`): a topic every task of a joining stage reads
//! whole, and the stream–global-table joins, with a key mapper, that read it.
//!
//! Invariants:
//! - A global table's rows are kept in the fold state of the stage that joins it, each under
//!   its own key, in the slot named after the table: every task of that stage holds the whole
//!   table (its changelog partition with it).
//! - A global table is a source of every stage that joins it, read through each task's gate:
//!   a stream record whose stamp claims an update of the global topic is joined with that
//!   version or a later one. A task joins nothing before it has read the table to the end
//!   offsets it found when it started (the task's bootstrap).
//! - The stream side is not repartitioned: the key mapper may give any key, every task has
//!   every row.
//!
//! Above `stream`, `flow`, `state` and `graph`; below `builder`, which hands global tables out.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use parsley_stage::Part;

use crate::data::{Codecs, Consumed, Data};
use crate::flow::{Ctx, forward};
use crate::graph::Graph;
use crate::processor::{Root, Value};
use crate::stream::KStream;

/// A table every task of a joining stage reads whole (Kafka Streams' `GlobalKTable`), from
/// [`StreamsBuilder::global_table`](crate::StreamsBuilder::global_table). It can only be
/// joined ([`KStream::join_global`], [`KStream::left_join_global`]).
pub struct GlobalKTable<K, V> {
    graph: Rc<RefCell<Graph>>,
    /// Its operator.
    node: usize,
    /// Its state slot: the operator's name.
    slot: Arc<str>,
    /// Its key codec, which encodes a mapped key to the row's key bytes.
    codecs: Codecs<K, V>,
}

impl<K: Data, V: Data> GlobalKTable<K, V> {
    /// The global table of `topic`, read with `consumed`'s codecs and name.
    pub(crate) fn source(
        graph: &Rc<RefCell<Graph>>,
        topic: String,
        consumed: Consumed<K, V>,
    ) -> Self {
        let mut g = graph.borrow_mut();
        if consumed.versioned.is_some() {
            g.problem(format!(
                "the global table of {topic}: Consumed::versioned is for a table (table_with)"
            ));
        }
        let name = g.name("global-table", consumed.name);
        let node = g.add(
            name.clone(),
            format!("global table {topic}"),
            &[],
            true,
            false,
        );
        g.materialised(node);
        let slot: Arc<str> = name.into();
        let codecs = consumed.codecs;
        let (s, c) = (slot.clone(), codecs.clone());
        let root: Root = Arc::new(move |ctx: &mut Ctx<'_>, key, value| {
            // Decoded to refuse a bad row by the bad-record policy, as a table's.
            ctx.decode_key(&c, key)?;
            let row: Option<V> = match value {
                Value::Borrowed(Some(v)) => Some(c.value.decode(v)),
                Value::Owned(Some(v)) => Some(c.value.decode_owned(v)),
                Value::Borrowed(None) | Value::Owned(None) => None,
            }
            .transpose()
            .map_err(|e| ctx.decode_error(Part::Value, e))?;
            ctx.store(&s, row.as_ref())
        });
        g.add_global_source(topic, node, root);
        drop(g);
        GlobalKTable {
            graph: graph.clone(),
            node,
            slot,
            codecs,
        }
    }
}

// A stream's joins with a global table: here, so that `stream` knows nothing of them.
impl<K: Data, V: Data> KStream<K, V> {
    /// Joins each record with `table`'s row under the key `key_mapper` gives for it (Kafka
    /// Streams' `join(GlobalKTable, KeyValueMapper, ValueJoiner)`; inner join: a record whose
    /// mapper gives no key, or whose key has no row, is dropped). The stream is not
    /// repartitioned: every task reads the whole table.
    ///
    /// The join is **causally consistent**, which Kafka Streams' global join is not: a record
    /// whose stamp claims an update of the table's topic is joined with that version or a
    /// later one, and a task joins nothing before it has read the table up to the end
    /// offsets it found when it started.
    ///
    /// `KStream<K, V>` → `KStream<K, R>`; the record's key and timestamp are kept.
    ///
    /// ```
    /// # use parsley_dsl::StreamsBuilder;
    /// let builder = StreamsBuilder::new("shop");
    /// let customers = builder.global_table::<String, String>("customers");
    /// builder
    ///     .stream::<String, (String, u64)>("orders") // order id → (customer, cents)
    ///     .join_global(&customers, |_, (customer, _)| Some(customer.clone()), |(_, cents), name| {
    ///         format!("{name}: {cents}")
    ///     })
    ///     .to("orders-named");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn join_global<GK: Data, GV: Data, R: Data>(
        &self,
        table: &GlobalKTable<GK, GV>,
        key_mapper: impl Fn(&K, &V) -> Option<GK> + Send + Sync + 'static,
        joiner: impl Fn(V, &GV) -> R + Send + Sync + 'static,
    ) -> KStream<K, R> {
        self.join_global_table(table, "join", key_mapper, move |v, row| {
            row.map(|row| joiner(v, row))
        })
    }

    /// Joins each record with `table`'s row under the key `key_mapper` gives for it, `None`
    /// when the mapper gives no key or the key has no row (left join: every record gives one,
    /// as Kafka Streams' since KIP-962). Causally consistent as [`KStream::join_global`].
    pub fn left_join_global<GK: Data, GV: Data, R: Data>(
        &self,
        table: &GlobalKTable<GK, GV>,
        key_mapper: impl Fn(&K, &V) -> Option<GK> + Send + Sync + 'static,
        joiner: impl Fn(V, Option<&GV>) -> R + Send + Sync + 'static,
    ) -> KStream<K, R> {
        self.join_global_table(table, "left-join", key_mapper, move |v, row| {
            Some(joiner(v, row))
        })
    }

    fn join_global_table<GK: Data, GV: Data, R: Data>(
        &self,
        table: &GlobalKTable<GK, GV>,
        kind: &str,
        key_mapper: impl Fn(&K, &V) -> Option<GK> + Send + Sync + 'static,
        joiner: impl Fn(V, Option<&GV>) -> Option<R> + Send + Sync + 'static,
    ) -> KStream<K, R> {
        let global = table.graph.borrow().node(table.node).name.clone();
        let what = format!("{kind} stream with global table {global}");
        let slot = table.slot.clone();
        let key_codec = table.codecs.key.clone();
        let node = table.node;
        let joined = self.then(kind, what, false, self.rekeyed, move |out, _| {
            Arc::new(move |ctx: &mut Ctx<'_>, k: K, v: V| {
                let row: Option<GV> = match key_mapper(&k, &v) {
                    Some(row_key) => {
                        let row_key = key_codec
                            .encode(&row_key)
                            .map_err(|e| ctx.encode_error("global table key", e))?;
                        ctx.load_of(&row_key, &slot)?
                    }
                    None => None,
                };
                match joiner(v, row.as_ref()) {
                    Some(r) => forward(&out, ctx, k, r),
                    None => Ok(()),
                }
            })
        });
        self.graph.borrow_mut().read_global(node, joined.node);
        joined
    }
}
