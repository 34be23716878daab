//! [`KStream::split`]: a stream split into branches by predicates (Kafka Streams' `split`,
//! `BranchedKStream` and `Branched`), the branches as a list in order or as a map by name.
//!
//! A split and its branches are stateless: they are fused into the stage of the stream they
//! split, with no topic in between. Each record goes to the first branch whose predicate holds,
//! or to the default branch, or nowhere.
//!
//! Above `stream` (it adds `split` to [`KStream`]); imports nothing that turns a stream into
//! something else.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::data::Data;
use crate::flow::{Outlet, forward};
use crate::stream::KStream;

/// A predicate on a record.
type Predicate<K, V> = Arc<dyn Fn(&K, &V) -> bool + Send + Sync>;

/// What becomes of a branch's stream: the stream of the map, or `None` (a consumer took it).
type Chain<K, V> = Box<dyn FnOnce(KStream<K, V>) -> Option<KStream<K, V>>>;

impl<K: Data, V: Data> KStream<K, V> {
    /// Splits the stream by predicates (Kafka Streams' `split`): each record goes to the first
    /// branch whose predicate holds. Name the split with [`named`](KStream::named) (Kafka
    /// Streams' `split(Named.as(prefix))`): the name is the prefix of its branches' names.
    ///
    /// `KStream<K, V>` → [`Split<K, V>`] → `Vec<KStream<K, V>>` (the branches in order:
    /// [`Split::default_branch`], [`Split::no_default_branch`]) or
    /// `BTreeMap<String, KStream<K, V>>` (the branches by name: [`Split::default_branch_with`],
    /// [`Split::default_branch_map`], [`Split::no_default_branch_map`]).
    pub fn split(&self) -> Split<K, V> {
        Split {
            stream: self.clone(),
            branches: Vec::new(),
        }
    }
}

/// A stream being split into branches ([`KStream::split`]; Kafka Streams' `BranchedKStream`).
pub struct Split<K, V> {
    stream: KStream<K, V>,
    branches: Vec<(Predicate<K, V>, Branched<K, V>)>,
}

/// How a branch of a [`Split`] is named and what becomes of its stream (Kafka Streams'
/// `Branched`).
///
/// A branch's name is the split's name (its prefix, given with [`KStream::named`]; else
/// `{generated operator name}-`) followed by the branch's own name, or, for a branch without
/// one, by its position: `1` for the first [`Split::branch`], `2` for the second, …, `0` for
/// the default branch — as in Kafka Streams. The name keys the branch in the map the split
/// returns, and names the branch's operator in `describe`; two branches of one split with the
/// same name make the topology invalid (`build` says so).
///
/// A chain ([`with_function`](Branched::with_function),
/// [`with_consumer`](Branched::with_consumer)) is applied to the branch's stream when the split
/// is finished: a function's stream takes the branch's place in the map, a consumer's branch is
/// left out of it.
pub struct Branched<K, V> {
    name: Option<String>,
    chain: Option<Chain<K, V>>,
}

impl<K: Data, V: Data> Branched<K, V> {
    /// A branch named `name` (Kafka Streams' `Branched.as`; `as` is a Rust keyword).
    pub fn as_(name: impl Into<String>) -> Self {
        Branched {
            name: Some(name.into()),
            chain: None,
        }
    }

    /// A branch whose stream goes through `chain`; the stream `chain` returns is the branch's
    /// in the map (Kafka Streams' `Branched.withFunction`).
    pub fn with_function(chain: impl FnOnce(KStream<K, V>) -> KStream<K, V> + 'static) -> Self {
        Branched {
            name: None,
            chain: Some(Box::new(move |s| Some(chain(s)))),
        }
    }

    /// A branch whose stream `chain` takes; the branch is left out of the map (Kafka Streams'
    /// `Branched.withConsumer`).
    pub fn with_consumer(chain: impl FnOnce(KStream<K, V>) + 'static) -> Self {
        Branched {
            name: None,
            chain: Some(Box::new(move |s| {
                chain(s);
                None
            })),
        }
    }

    /// This branch named `name` (Kafka Streams' `withFunction(chain, name)` and
    /// `withConsumer(chain, name)`).
    pub fn named(self, name: impl Into<String>) -> Self {
        Branched {
            name: Some(name.into()),
            ..self
        }
    }

    /// A branch without a name or a chain: named by its position.
    fn unnamed() -> Self {
        Branched {
            name: None,
            chain: None,
        }
    }
}

/// A branch made: its name, its stream, and the stream of the map (after its chain).
struct Made<K, V> {
    name: String,
    stream: KStream<K, V>,
    mapped: Option<KStream<K, V>>,
}

impl<K: Data, V: Data> Split<K, V> {
    /// Adds a branch taking the records for which `predicate` holds and no earlier one did.
    pub fn branch(self, predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static) -> Self {
        self.branch_with(predicate, Branched::unnamed())
    }

    /// Adds a branch taking the records for which `predicate` holds and no earlier one did,
    /// named and chained as `branched` says (Kafka Streams' `branch(predicate, Branched)`).
    pub fn branch_with(
        mut self,
        predicate: impl Fn(&K, &V) -> bool + Send + Sync + 'static,
        branched: Branched<K, V>,
    ) -> Self {
        self.branches.push((Arc::new(predicate), branched));
        self
    }

    /// The branches, in order, then one with the records no predicate took. The streams are
    /// the branches' own, before any chain of a [`Branched`] (which still runs).
    pub fn default_branch(self) -> Vec<KStream<K, V>> {
        self.finish(Some(Branched::unnamed()))
            .into_iter()
            .map(|b| b.stream)
            .collect()
    }

    /// The branches, in order; records no predicate took are dropped. The streams are the
    /// branches' own, before any chain of a [`Branched`] (which still runs).
    pub fn no_default_branch(self) -> Vec<KStream<K, V>> {
        self.finish(None).into_iter().map(|b| b.stream).collect()
    }

    /// The branches by name, with a default branch named and chained as `branched` says,
    /// taking the records no predicate took (Kafka Streams' `defaultBranch(Branched)`).
    /// Branches whose chain is a consumer are left out.
    ///
    /// ```
    /// use parsley_dsl::{Branched, StreamsBuilder};
    ///
    /// let builder = StreamsBuilder::new("app");
    /// let branches = builder
    ///     .stream::<String, i64>("readings")
    ///     .named("temp-")
    ///     .split()
    ///     .branch_with(|_, c| *c < 0, Branched::as_("frost"))
    ///     .branch(|_, c| *c > 40) // no name: "temp-2"
    ///     .branch_with(
    ///         |_, c| *c > 30,
    ///         Branched::with_consumer(|hot| hot.to("hot")).named("hot"),
    ///     )
    ///     .default_branch_with(Branched::as_("normal"));
    /// let names: Vec<&str> = branches.keys().map(String::as_str).collect();
    /// assert_eq!(names, ["temp-2", "temp-frost", "temp-normal"]);
    /// branches["temp-frost"].to("frost");
    /// # builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn default_branch_with(self, branched: Branched<K, V>) -> BTreeMap<String, KStream<K, V>> {
        Self::by_name(self.finish(Some(branched)))
    }

    /// The branches by name, with a default branch (named `{prefix}0`) taking the records no
    /// predicate took (Kafka Streams' `defaultBranch()`).
    pub fn default_branch_map(self) -> BTreeMap<String, KStream<K, V>> {
        self.default_branch_with(Branched::unnamed())
    }

    /// The branches by name; records no predicate took are dropped (Kafka Streams'
    /// `noDefaultBranch()`).
    pub fn no_default_branch_map(self) -> BTreeMap<String, KStream<K, V>> {
        Self::by_name(self.finish(None))
    }

    fn by_name(made: Vec<Made<K, V>>) -> BTreeMap<String, KStream<K, V>> {
        made.into_iter()
            .filter_map(|b| b.mapped.map(|s| (b.name, s)))
            .collect()
    }

    /// Adds the split, its branches (and `default`, taking every record no predicate took) to
    /// the graph, then applies the branches' chains.
    fn finish(self, default: Option<Branched<K, V>>) -> Vec<Made<K, V>> {
        let Split {
            stream,
            mut branches,
        } = self;
        let with_default = default.is_some();
        if let Some(d) = default {
            branches.push((Arc::new(|_, _| true), d));
        }
        let count = branches.len();
        let mut g = stream.graph.borrow_mut();
        let (name, prefix) = match stream.next_name.clone() {
            Some(given) => (given.clone(), given),
            None => {
                let name = g.name("split", None);
                let prefix = format!("{name}-");
                (name, prefix)
            }
        };
        let split = g.add(name, "split".into(), &[stream.node], false, true);
        let mut predicates = Vec::with_capacity(count);
        let mut outs = Vec::with_capacity(count);
        let mut made = Vec::with_capacity(count);
        for (i, (predicate, branched)) in branches.into_iter().enumerate() {
            let position = if with_default && i + 1 == count {
                0
            } else {
                i + 1
            };
            let name = match branched.name {
                Some(own) => format!("{prefix}{own}"),
                None => format!("{prefix}{position}"),
            };
            // Two branches of one name: `add` records the problem, `build` reports it.
            let node = g.add(name.clone(), "branch".into(), &[split], false, true);
            let (out, freeze) = Outlet::<K, V>::new();
            g.on_freeze(freeze);
            predicates.push(predicate);
            outs.push(out.children());
            let branch = KStream::new(stream.graph.clone(), node, out, stream.rekeyed);
            made.push((name, branch, branched.chain));
        }
        drop(g);
        stream.out.attach(Arc::new(move |ctx, k, v| {
            match predicates.iter().position(|p| p(&k, &v)) {
                Some(i) => forward(&outs[i], ctx, k, v),
                None => Ok(()),
            }
        }));
        made.into_iter()
            .map(|(name, stream, chain)| {
                let mapped = match chain {
                    Some(chain) => chain(stream.clone()),
                    None => Some(stream.clone()),
                };
                Made {
                    name,
                    stream,
                    mapped,
                }
            })
            .collect()
    }
}
