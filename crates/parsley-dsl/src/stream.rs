//! [`KStream`]: a stream of keyed records and its operators, named as in Kafka Streams.
//!
//! Stateless operators (`filter`, `map_values`, `flat_map`, …) are fused into the stage of
//! the operator before them: they run in the same handler call, with no topic in between.
//! An operator that changes the key (`map`, `select_key`, `flat_map`, `process`) marks the
//! stream as re-keyed; a stateful operator after it (`group_by_key` then an aggregation, a
//! join, `process`) first sends the stream through a repartition topic, so that each key's
//! records meet in one task, as Kafka Streams does. Records crossing a repartition topic are
//! stamped like every output, so causal order survives the hop.
//!
//! The lowest of the typed operators: above `graph`, `processor`, `flow` and `data`, below
//! every module that turns a stream into something else, which adds its operators to
//! [`KStream`] itself: `split` (branches), `table` (stream–table joins), `grouped` (`group_by`,
//! `group_by_key`), `stream_join` (windowed joins). It imports none of those.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use parsley_stage::{Auto, KeyPartitioning, Part};

use crate::data::{Codecs, Data, Produced};
use crate::flow::{Children, Ctx, Outlet, Push, forward};
use crate::graph::Graph;
use crate::processor::{Root, Value};

/// A stream of keyed records (Kafka Streams' `KStream`). Operators take `&self`: a stream
/// may feed several operators, each record reaching all of them in the order they were
/// attached.
pub struct KStream<K, V> {
    pub(crate) graph: Rc<RefCell<Graph>>,
    pub(crate) node: usize,
    pub(crate) out: Outlet<K, V>,
    /// Whether an operator changed the key since the last source or repartition.
    pub(crate) rekeyed: bool,
    /// The name the next operator takes ([`KStream::named`]).
    pub(crate) next_name: Option<String>,
}

impl<K, V> Clone for KStream<K, V> {
    fn clone(&self) -> Self {
        KStream {
            graph: self.graph.clone(),
            node: self.node,
            out: self.out.clone(),
            rekeyed: self.rekeyed,
            next_name: self.next_name.clone(),
        }
    }
}

impl<K: Data, V: Data> KStream<K, V> {
    pub(crate) fn new(
        graph: Rc<RefCell<Graph>>,
        node: usize,
        out: Outlet<K, V>,
        rekeyed: bool,
    ) -> Self {
        KStream {
            graph,
            node,
            out,
            rekeyed,
            next_name: None,
        }
    }

    /// A stream read from `topic` (an internal topic when `internal` names the operator it
    /// repartitions for), its operator named `given` or a generated name.
    pub(crate) fn source(
        graph: &Rc<RefCell<Graph>>,
        topic: String,
        codecs: Codecs<K, V>,
        internal: Option<String>,
        given: Option<String>,
    ) -> KStream<K, V> {
        let mut g = graph.borrow_mut();
        let name = g.name("source", given);
        let what = match &internal {
            Some(_) => format!("source {topic} (internal)"),
            None => format!("source {topic}"),
        };
        let node = g.add(name, what, &[], false, false);
        let (out, freeze) = Outlet::<K, V>::new();
        g.on_freeze(freeze);
        let children = out.children();
        let root: Root = Arc::new(move |ctx: &mut Ctx<'_>, key, value| {
            let key = ctx.decode_key(&codecs, key)?;
            let value = match value {
                Value::Borrowed(Some(v)) => codecs.value.decode(v),
                Value::Owned(Some(v)) => codecs.value.decode_owned(v),
                Value::Borrowed(None) | Value::Owned(None) => codecs.value.decode_absent(),
            }
            .map_err(|e| ctx.decode_error(Part::Value, e))?;
            forward(&children, ctx, key, value)
        });
        g.add_source(topic, node, root, internal);
        drop(g);
        KStream::new(graph.clone(), node, out, false)
    }

    /// Names the next operator applied to the returned stream (Kafka Streams' `Named`). The
    /// name appears in `describe`, names the operator's repartition topic
    /// (`{application}-{name}-repartition`) and, for a stateful operator, its state: name
    /// stateful operators to keep their state when the pipeline changes around them. Without
    /// a name an operator is called `{kind}-{n}`, `n` its position in the pipeline.
    pub fn named(&self, name: impl Into<String>) -> KStream<K, V> {
        KStream {
            next_name: Some(name.into()),
            ..self.clone()
        }
    }

    /// Adds an operator after this stream's; `make` builds its push function from its
    /// children and its name.
    pub(crate) fn then<K2: Data, V2: Data>(
        &self,
        kind: &str,
        what: String,
        stateful: bool,
        rekeyed: bool,
        make: impl FnOnce(Children<K2, V2>, String) -> Push<K, V>,
    ) -> KStream<K2, V2> {
        let mut g = self.graph.borrow_mut();
        let name = g.name(kind, self.next_name.clone());
        let node = g.add(name.clone(), what, &[self.node], stateful, true);
        let (out, freeze) = Outlet::new();
        g.on_freeze(freeze);
        drop(g);
        self.out.attach(make(out.children(), name));
        KStream::new(self.graph.clone(), node, out, rekeyed)
    }

    /// The records for which `predicate` holds.
    pub fn filter(
        &self,
        predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static,
    ) -> KStream<K, V> {
        self.then("filter", "filter".into(), false, self.rekeyed, |out, _| {
            Arc::new(move |ctx, k, v| {
                if predicate(&k, &v) {
                    forward(&out, ctx, k, v)
                } else {
                    Ok(())
                }
            })
        })
    }

    /// The records for which `predicate` does not hold.
    pub fn filter_not(
        &self,
        predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static,
    ) -> KStream<K, V> {
        self.filter(move |k, v| !predicate(k, v))
    }

    /// Each value replaced by `mapper`'s; keys unchanged (no repartition needed after it).
    pub fn map_values<V2: Data>(
        &self,
        mapper: impl Fn(V) -> V2 + Send + Sync + 'static,
    ) -> KStream<K, V2> {
        self.then(
            "map-values",
            "map values".into(),
            false,
            self.rekeyed,
            |out, _| Arc::new(move |ctx, k, v| forward(&out, ctx, k, mapper(v))),
        )
    }

    /// Each value replaced by `mapper`'s, which sees the key too (Kafka Streams'
    /// `mapValues(ValueMapperWithKey)`); keys unchanged (no repartition needed after it).
    ///
    /// `KStream<K, V>` → `KStream<K, V2>`; the record's timestamp is kept.
    ///
    /// ```
    /// # use parsley_dsl::StreamsBuilder;
    /// let builder = StreamsBuilder::new("app");
    /// builder
    ///     .stream::<String, i64>("readings")
    ///     .map_values_with_key(|sensor, celsius| format!("{sensor}: {celsius} °C"))
    ///     .to("labelled");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn map_values_with_key<V2: Data>(
        &self,
        mapper: impl Fn(&K, V) -> V2 + Send + Sync + 'static,
    ) -> KStream<K, V2> {
        self.then(
            "map-values",
            "map values (with key)".into(),
            false,
            self.rekeyed,
            |out, _| {
                Arc::new(move |ctx, k, v| {
                    let v = mapper(&k, v);
                    forward(&out, ctx, k, v)
                })
            },
        )
    }

    /// Each record replaced by `mapper`'s key and value (a new key: a stateful operator after
    /// it repartitions).
    pub fn map<K2: Data, V2: Data>(
        &self,
        mapper: impl Fn(K, V) -> (K2, V2) + Send + Sync + 'static,
    ) -> KStream<K2, V2> {
        self.then("map", "map (new key)".into(), false, true, |out, _| {
            Arc::new(move |ctx, k, v| {
                let (k, v) = mapper(k, v);
                forward(&out, ctx, k, v)
            })
        })
    }

    /// Each record with the key `selector` gives (a new key: a stateful operator after it
    /// repartitions).
    pub fn select_key<K2: Data>(
        &self,
        selector: impl Fn(&K, &V) -> K2 + Send + Sync + 'static,
    ) -> KStream<K2, V> {
        self.then("select-key", "select key".into(), false, true, |out, _| {
            Arc::new(move |ctx, k, v| {
                let k = selector(&k, &v);
                forward(&out, ctx, k, v)
            })
        })
    }

    /// Each record replaced by the records `mapper` returns, in order (new keys).
    pub fn flat_map<K2: Data, V2: Data, I>(
        &self,
        mapper: impl Fn(K, V) -> I + Send + Sync + 'static,
    ) -> KStream<K2, V2>
    where
        I: IntoIterator<Item = (K2, V2)>,
    {
        self.then(
            "flat-map",
            "flat map (new keys)".into(),
            false,
            true,
            |out, _| {
                Arc::new(move |ctx, k, v| {
                    for (k, v) in mapper(k, v) {
                        forward(&out, ctx, k, v)?;
                    }
                    Ok(())
                })
            },
        )
    }

    /// Each record replaced by one record per value `mapper` returns, with its key.
    pub fn flat_map_values<V2: Data, I>(
        &self,
        mapper: impl Fn(V) -> I + Send + Sync + 'static,
    ) -> KStream<K, V2>
    where
        I: IntoIterator<Item = V2>,
    {
        self.then(
            "flat-map-values",
            "flat map values".into(),
            false,
            self.rekeyed,
            |out, _| {
                Arc::new(move |ctx, k, v| {
                    for v in mapper(v) {
                        forward(&out, ctx, k.clone(), v)?;
                    }
                    Ok(())
                })
            },
        )
    }

    /// Each record replaced by one record per value `mapper` returns, in order, with its key;
    /// `mapper` sees the key too (Kafka Streams' `flatMapValues(ValueMapperWithKey)`). Keys
    /// unchanged (no repartition needed after it).
    ///
    /// `KStream<K, V>` → `KStream<K, V2>`; every record it gives keeps the timestamp of the
    /// record it came from.
    ///
    /// ```
    /// # use parsley_dsl::StreamsBuilder;
    /// let builder = StreamsBuilder::new("app");
    /// builder
    ///     .stream::<String, String>("sentences")
    ///     .flat_map_values_with_key(|author, line| {
    ///         line.split_whitespace()
    ///             .map(|word| format!("{author}:{word}"))
    ///             .collect::<Vec<_>>()
    ///     })
    ///     .to("words");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn flat_map_values_with_key<V2: Data, I>(
        &self,
        mapper: impl Fn(&K, V) -> I + Send + Sync + 'static,
    ) -> KStream<K, V2>
    where
        I: IntoIterator<Item = V2>,
    {
        self.then(
            "flat-map-values",
            "flat map values (with key)".into(),
            false,
            self.rekeyed,
            |out, _| {
                Arc::new(move |ctx, k, v| {
                    for v in mapper(&k, v) {
                        forward(&out, ctx, k.clone(), v)?;
                    }
                    Ok(())
                })
            },
        )
    }

    /// The same records, `action` called on each first (logging, metrics). Its effects are
    /// outside the causal model: a record handled again after an abort calls it again.
    pub fn peek(&self, action: impl Fn(&K, &V) + Send + Sync + 'static) -> KStream<K, V> {
        self.then("peek", "peek".into(), false, self.rekeyed, |out, _| {
            Arc::new(move |ctx, k, v| {
                action(&k, &v);
                forward(&out, ctx, k, v)
            })
        })
    }

    /// Calls `action` on each record and ends the stream there (Kafka Streams' `foreach`): a
    /// terminal operation, like [`to`](KStream::to), that writes nothing. As for
    /// [`peek`](KStream::peek), its effects are outside the causal model: a record handled
    /// again after an aborted transaction calls it again, and nothing it does is committed
    /// with the stage's transaction.
    ///
    /// `KStream<K, V>` → `()`.
    ///
    /// ```
    /// # use parsley_dsl::StreamsBuilder;
    /// let builder = StreamsBuilder::new("app");
    /// builder
    ///     .stream::<String, i64>("readings")
    ///     .filter(|_, celsius| *celsius > 100)
    ///     .foreach(|sensor, celsius| eprintln!("alarm: {sensor} at {celsius} °C"));
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn foreach(&self, action: impl Fn(&K, &V) + Send + Sync + 'static) {
        let mut g = self.graph.borrow_mut();
        let name = g.name("foreach", self.next_name.clone());
        g.add(name, "foreach".into(), &[self.node], false, true);
        drop(g);
        self.out.attach(Arc::new(move |_ctx, k, v| {
            action(&k, &v);
            Ok(())
        }));
    }

    /// The records of this stream and `other`, in the order they are handled. Both end up in
    /// one stage, so their topics must be co-partitioned (checked when the stage starts).
    pub fn merge(&self, other: &KStream<K, V>) -> KStream<K, V> {
        let mut g = self.graph.borrow_mut();
        let name = g.name("merge", self.next_name.clone());
        let node = g.add(name, "merge".into(), &[self.node, other.node], false, true);
        let (out, freeze) = Outlet::<K, V>::new();
        g.on_freeze(freeze);
        drop(g);
        for input in [&self.out, &other.out] {
            let children = out.children();
            input.attach(Arc::new(move |ctx, k, v| forward(&children, ctx, k, v)));
        }
        KStream::new(self.graph.clone(), node, out, self.rekeyed || other.rekeyed)
    }

    /// Writes every record to `topic` with [`Auto`] codecs.
    pub fn to(&self, topic: impl Into<String>) {
        self.to_with(topic, Produced::default());
    }

    /// Writes every record to `topic` with `produced`'s codecs.
    pub fn to_with(&self, topic: impl Into<String>, produced: Produced<K, V>) {
        self.sink(topic.into(), produced.codecs, "to", false);
    }

    /// Adds a sink operator writing to `topic`; returns its node. A repartition's sink
    /// (`keyed`) takes only records with a key: one without is a bad record (`MissingKey`),
    /// where Kafka Streams drops it.
    fn sink(&self, topic: String, codecs: Codecs<K, V>, kind: &str, keyed: bool) -> usize {
        let mut g = self.graph.borrow_mut();
        let name = g.name(kind, self.next_name.clone());
        let node = g.add(name, format!("to {topic}"), &[self.node], false, true);
        g.add_sink(topic.clone(), node);
        drop(g);
        let topic: Arc<str> = topic.into();
        self.out.attach(Arc::new(move |ctx, k, v| {
            if keyed {
                ctx.send_keyed(&topic, &codecs, k, v)
            } else {
                ctx.send(&topic, &codecs, k, v)
            }
        }));
        node
    }

    /// The stream sent through a repartition topic (Kafka Streams' `repartition`), with
    /// [`Auto`] codecs: after it, each key's records are in the task of the partition its key
    /// hashes to. A record without a key has no partition to go to: it is a bad record
    /// (`BadRecordKind::MissingKey`, skipped under `BadRecordPolicy::Skip`, where Kafka Streams
    /// drops it), as it is at every repartition.
    pub fn repartition(&self) -> KStream<K, V> {
        let name = self
            .graph
            .borrow()
            .name("repartition", self.next_name.clone());
        self.through(
            name,
            Codecs {
                key: Arc::new(Auto),
                value: Arc::new(Auto),
            },
        )
    }

    /// The stream sent through the repartition topic `{application}-{name}-repartition`.
    pub(crate) fn through(&self, name: String, codecs: Codecs<K, V>) -> KStream<K, V> {
        let topic = format!("{}-{name}-repartition", self.graph.borrow().app());
        let writer = KStream {
            next_name: Some(format!("{name}-sink")),
            ..self.clone()
        }
        .sink(topic.clone(), codecs.clone(), "repartition-sink", true);
        let read = KStream::source(&self.graph, topic.clone(), codecs, Some(name), None);
        self.graph
            .borrow_mut()
            .add_internal(topic, writer, read.node);
        read
    }

    /// This stream keyed as its records' partitions are: repartitioned when an operator
    /// changed the key, or when its records come from sources partitioned by different
    /// partitioners (murmur2 and CRC32), else itself. `name` names the repartition.
    pub(crate) fn keyed(&self, name: &str, codecs: Codecs<K, V>) -> KStream<K, V> {
        self.keyed_beside(name, codecs, &[])
    }

    /// [`KStream::keyed`] for an operator whose other inputs are the operators `beside`: also
    /// repartitioned (to murmur2) when the stream is partitioned by CRC32 and one of them by
    /// murmur2, so the operator's stage reads co-partitioned sources.
    pub(crate) fn keyed_beside(
        &self,
        name: &str,
        codecs: Codecs<K, V>,
        beside: &[usize],
    ) -> KStream<K, V> {
        let g = self.graph.borrow();
        let own = g.partitioning_of(self.node);
        let murmur2_beside = beside
            .iter()
            .any(|n| g.partitioning_of(*n) == Some(KeyPartitioning::Murmur2));
        drop(g);
        let crc32_among_murmur2 = own == Some(KeyPartitioning::Crc32) && murmur2_beside;
        if self.rekeyed || own.is_none() || crc32_among_murmur2 {
            self.through(name.to_string(), codecs)
        } else {
            self.clone()
        }
    }
}
