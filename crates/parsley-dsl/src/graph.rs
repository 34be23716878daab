//! The untyped shape of a DSL topology: operators, the edges between them, sources, sinks and
//! repartition topics — and its compilation into stages.
//!
//! Operators joined by an edge that is not a repartition are **fused** into one stage: one
//! consumer group, one handler call per delivered record running every operator the record
//! reaches, no topic in between. A stage is a connected component of fused edges (Kafka
//! Streams' sub-topology). A repartition edge is a sink in the writing stage and a source in
//! the reading one, through an internal topic `{application}-{operator}-repartition`.
//!
//! Invariants:
//! - Operator names are unique in a topology; a stateful operator's state slot is its name.
//! - A topic is the source of at most one operator.
//! - Nothing is attached after `build`: every outlet is frozen exactly once, by `build`.
//!
//! Above `processor`, `late` and `data`; below the typed operators (`stream`, `table`, …) that
//! add nodes to it: it knows operators only as untyped nodes and imports nothing of theirs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parsley_stage::store::StoreSpec;
use parsley_stage::{
    BadRecordPolicy, Error, EventTimeOrder, ImpossiblePolicy, InternalTopic, KeyPartitioning,
    Schedule, StageSettings, Topology,
};

use crate::data::Data;
use crate::late::{LatePolicy, LateRoute};
use crate::processor::{DslProcessor, OnPunctuation, OnTimer, Root};

/// One operator.
pub(crate) struct Node {
    pub(crate) name: String,
    /// What it does, for `describe`.
    pub(crate) what: String,
    pub(crate) preds: Vec<usize>,
    /// Whether it keeps state by key.
    pub(crate) stateful: bool,
    /// Whether its state slot holds a table's value per key (a source table, an aggregation).
    pub(crate) materialised: bool,
    /// A versioned source table's history retention, ms (module `stream_table`).
    pub(crate) versioned: Option<i64>,
}

/// A source topic and the operator that reads it.
struct Source {
    topic: String,
    node: usize,
    root: Root,
    /// For an internal topic: the name of the operator it repartitions for.
    internal: Option<String>,
    /// How its writers partition it by key.
    partitioning: KeyPartitioning,
    /// For a global table: the operators that join it, whose stages read it whole.
    global: Option<Vec<usize>>,
}

/// An internal topic: written by one operator, read by another.
struct Internal {
    topic: String,
    writer: usize,
    reader: usize,
}

/// The topology under construction.
pub(crate) struct Graph {
    app: String,
    nodes: Vec<Node>,
    /// Union-find over fused edges.
    parent: Vec<usize>,
    sources: Vec<Source>,
    sinks: Vec<(String, usize)>,
    internal: Vec<Internal>,
    freezers: Vec<Box<dyn FnOnce()>>,
    problems: Vec<String>,
    bad_records: BadRecordPolicy,
    impossible: ImpossiblePolicy,
    /// The timers of windowed operators, by operator.
    timers: Vec<(usize, OnTimer)>,
    /// The punctuation schedules of `process` operators, by operator, in the order added.
    punctuations: Vec<(usize, Schedule, OnPunctuation)>,
    /// The event-time order of stages with a windowed operator.
    event_time: EventTimeOrder,
    late: LatePolicy,
    built: bool,
    /// The queryable stores, by the operator whose slot they read.
    stores: Vec<(usize, StoreSpec)>,
}

impl Graph {
    pub(crate) fn new(app: String) -> Self {
        Graph {
            app,
            nodes: Vec::new(),
            parent: Vec::new(),
            sources: Vec::new(),
            sinks: Vec::new(),
            internal: Vec::new(),
            freezers: Vec::new(),
            problems: Vec::new(),
            bad_records: BadRecordPolicy::Fail,
            impossible: ImpossiblePolicy::Fail,
            timers: Vec::new(),
            punctuations: Vec::new(),
            event_time: EventTimeOrder::new(),
            late: LatePolicy::Count,
            built: false,
            stores: Vec::new(),
        }
    }

    /// Makes operator `id`'s state slot queryable as `store` (interactive queries).
    pub(crate) fn queryable(&mut self, id: usize, store: StoreSpec) {
        self.stores.push((id, store));
    }

    pub(crate) fn app(&self) -> &str {
        &self.app
    }

    pub(crate) fn set_bad_records(&mut self, policy: BadRecordPolicy) {
        self.bad_records = policy;
    }

    pub(crate) fn set_impossible(&mut self, policy: ImpossiblePolicy) {
        self.impossible = policy;
    }

    pub(crate) fn set_event_time(&mut self, order: EventTimeOrder) {
        self.event_time = order;
    }

    pub(crate) fn set_late(&mut self, policy: LatePolicy) {
        self.late = policy;
    }

    /// The route of windowed operator `node` named `operator` for its records too late, under
    /// the late policy of operators added now: its topic, if any, becomes a sink of the
    /// operator's stage.
    pub(crate) fn late_route<K: Data, V: Data>(
        &mut self,
        node: usize,
        operator: String,
    ) -> LateRoute<K, V> {
        let route = LateRoute::new(&self.late, operator);
        if let Some(topic) = route.topic() {
            self.add_sink(topic.to_string(), node);
        }
        route
    }

    /// Registers the timer of windowed operator `node`: its stage orders by event time.
    pub(crate) fn add_timer(&mut self, node: usize, on_timer: OnTimer) {
        self.timers.push((node, on_timer));
    }

    /// Registers a punctuation schedule of `process` operator `node`: its stage orders by event
    /// time (a wall-clock schedule needs the builder's event-time order to have the built-in
    /// clock; the topology's build says so otherwise).
    pub(crate) fn add_punctuation(
        &mut self,
        node: usize,
        schedule: Schedule,
        on_punctuation: OnPunctuation,
    ) {
        self.punctuations.push((node, schedule, on_punctuation));
    }

    /// # Panics
    /// When the topology was built already: an operator added after `build` would never run.
    fn check_open(&self) {
        assert!(
            !self.built,
            "an operator was added to a DSL topology after StreamsBuilder::build"
        );
    }

    /// The name of a new operator: `given`, or `{kind}-{index}` (index: the operator count so
    /// far, four digits).
    pub(crate) fn name(&self, kind: &str, given: Option<String>) -> String {
        given.unwrap_or_else(|| format!("{kind}-{:04}", self.nodes.len()))
    }

    /// Adds an operator after `preds`, fused with them into their stage unless `fused` is
    /// false (a source).
    pub(crate) fn add(
        &mut self,
        name: String,
        what: String,
        preds: &[usize],
        stateful: bool,
        fused: bool,
    ) -> usize {
        self.check_open();
        if self.nodes.iter().any(|n| n.name == name) {
            self.problems
                .push(format!("operator name {name:?} is used twice"));
        }
        let id = self.nodes.len();
        self.nodes.push(Node {
            name,
            what,
            preds: preds.to_vec(),
            stateful,
            materialised: false,
            versioned: None,
        });
        self.parent.push(id);
        if fused {
            for &p in preds {
                self.union(p, id);
            }
        }
        id
    }

    pub(crate) fn node(&self, id: usize) -> &Node {
        &self.nodes[id]
    }

    /// Marks operator `id` as holding a table's value per key in its slot.
    pub(crate) fn materialised(&mut self, id: usize) {
        self.nodes[id].materialised = true;
    }

    /// Marks operator `id` as a versioned table keeping `retention` ms of history.
    pub(crate) fn versioned(&mut self, id: usize, retention: i64) {
        self.nodes[id].versioned = Some(retention);
    }

    /// Records a problem `build` reports.
    pub(crate) fn problem(&mut self, problem: String) {
        self.problems.push(problem);
    }

    pub(crate) fn on_freeze(&mut self, freeze: Box<dyn FnOnce()>) {
        self.freezers.push(freeze);
    }

    pub(crate) fn add_source(
        &mut self,
        topic: String,
        node: usize,
        root: Root,
        internal: Option<String>,
    ) {
        if self.sources.iter().any(|s| s.topic == topic) {
            self.problems
                .push(format!("topic {topic:?} is the source of two operators"));
        }
        self.sources.push(Source {
            topic,
            node,
            root,
            internal,
            partitioning: KeyPartitioning::Murmur2,
            global: None,
        });
    }

    /// Adds global table `node`'s topic: a source of no stage of its own, read whole by the
    /// stage of each operator that joins it ([`Graph::read_global`]).
    pub(crate) fn add_global_source(&mut self, topic: String, node: usize, root: Root) {
        self.add_source(topic, node, root, None);
        if let Some(s) = self.sources.last_mut() {
            s.partitioning = KeyPartitioning::Unchecked;
            s.global = Some(Vec::new());
        }
    }

    /// Records that operator `reader` joins global table `global`.
    pub(crate) fn read_global(&mut self, global: usize, reader: usize) {
        if let Some(readers) = self
            .sources
            .iter_mut()
            .find(|s| s.node == global)
            .and_then(|s| s.global.as_mut())
        {
            readers.push(reader);
            self.nodes[reader].preds.push(global);
        }
    }

    /// How the records reaching operator `node` are partitioned by key: the partitioner of the
    /// sources upstream of it (a repartition topic's is murmur2, Parsley writes it; unchecked
    /// sources count for none). `None` when they differ: its keys are not co-partitioned.
    pub(crate) fn partitioning_of(&self, node: usize) -> Option<KeyPartitioning> {
        let mut found = BTreeSet::new();
        let mut todo = vec![node];
        let mut seen = BTreeSet::new();
        while let Some(n) = todo.pop() {
            if !seen.insert(n) {
                continue;
            }
            match self.sources.iter().find(|s| s.node == n) {
                Some(s) if s.internal.is_some() => {
                    found.insert(KeyPartitioning::Murmur2 as u8);
                }
                Some(s) if s.partitioning != KeyPartitioning::Unchecked => {
                    found.insert(s.partitioning as u8);
                }
                Some(_) => {}
                None => todo.extend(&self.nodes[n].preds),
            }
        }
        match found.len() {
            0 => Some(KeyPartitioning::Unchecked),
            1 if found.contains(&(KeyPartitioning::Crc32 as u8)) => Some(KeyPartitioning::Crc32),
            1 => Some(KeyPartitioning::Murmur2),
            _ => None,
        }
    }

    /// Declares how the writers of source `topic` partition it by key.
    pub(crate) fn key_partitioning(&mut self, topic: &str, partitioning: KeyPartitioning) {
        if let Some(s) = self.sources.iter_mut().find(|s| s.topic == topic) {
            s.partitioning = partitioning;
        }
    }

    pub(crate) fn add_sink(&mut self, topic: String, node: usize) {
        self.sinks.push((topic, node));
    }

    pub(crate) fn add_internal(&mut self, topic: String, writer: usize, reader: usize) {
        self.internal.push(Internal {
            topic,
            writer,
            reader,
        });
    }

    /// Puts operators `a` and `b` in one stage: an operator reading an internal topic that
    /// needs the state of another stage's operators (a foreign-key join's answers, read beside
    /// the table that subscribed).
    pub(crate) fn fuse(&mut self, a: usize, b: usize) {
        self.union(a, b);
    }

    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        // The older operator's root stays: stages are ordered by their first operator.
        if ra < rb {
            self.parent[rb] = ra;
        } else if rb < ra {
            self.parent[ra] = rb;
        }
    }

    /// Compiles the graph into a validated [`Topology`] (module docs).
    ///
    /// # Errors
    /// [`Error::InvalidTopology`] listing every problem found: the DSL's own (a name used
    /// twice, a topic read by two operators) and the topology's.
    pub(crate) fn build(&mut self) -> Result<Topology, Error> {
        self.check_open();
        self.built = true;
        for freeze in std::mem::take(&mut self.freezers) {
            freeze();
        }
        let mut problems = std::mem::take(&mut self.problems);
        if self.sources.is_empty() {
            problems.push("the topology reads no topic".to_string());
        }
        // Stages: components, ordered by their first operator.
        let roots: Vec<usize> = (0..self.nodes.len()).map(|n| self.find(n)).collect();
        // A global table is a stage of none: its operator is in the stages that join it.
        let globals: BTreeSet<usize> = self
            .sources
            .iter()
            .filter(|s| s.global.is_some())
            .map(|s| s.node)
            .collect();
        for s in &self.sources {
            if s.global.as_ref().is_some_and(Vec::is_empty) {
                problems.push(format!(
                    "global table {:?} ({}) is joined by no stream",
                    self.nodes[s.node].name, s.topic
                ));
            }
        }
        let components: BTreeSet<usize> = roots
            .iter()
            .copied()
            .filter(|c| !globals.contains(c))
            .collect();
        let mut stage_names = BTreeMap::new();
        for &c in &components {
            let base = self
                .sources
                .iter()
                .find(|s| roots[s.node] == c)
                .map(|s| s.internal.clone().unwrap_or_else(|| s.topic.clone()))
                .unwrap_or_else(|| self.nodes[c].name.clone());
            let mut name = base.clone();
            let mut n = 2;
            while stage_names.values().any(|v| *v == name) {
                name = format!("{base}-{n}");
                n += 1;
            }
            stage_names.insert(c, name);
        }
        let mut builder = Topology::builder(self.app.clone());
        for &c in &components {
            let sources: Vec<&Source> = self
                .sources
                .iter()
                .filter(|s| roots[s.node] == c || self.read_by(s, &roots, c))
                .collect();
            let sinks: Vec<&String> = self
                .sinks
                .iter()
                .filter(|(_, n)| roots[*n] == c)
                .map(|(t, _)| t)
                .collect();
            let mut settings = StageSettings::new()
                .on_bad_record(self.bad_records.clone())
                .on_impossible_stamp(self.impossible.clone())
                .operators(self.describe(&roots, c));
            for (_, store) in self.stores.iter().filter(|(n, _)| roots[*n] == c) {
                settings = settings.store(store.clone());
            }
            for s in &sources {
                settings = if s.global.is_some() {
                    settings.global_source(s.topic.clone())
                } else {
                    settings
                        .source(s.topic.clone())
                        .key_partitioning(s.topic.clone(), s.partitioning)
                };
            }
            for t in sinks {
                if !settings.sinks().contains(t) {
                    settings = settings.sink(t.clone());
                }
            }
            let on_timer: Vec<OnTimer> = self
                .timers
                .iter()
                .filter(|(n, _)| roots[*n] == c)
                .map(|(_, f)| Arc::clone(f))
                .collect();
            let (schedules, on_punctuation): (Vec<Schedule>, Vec<OnPunctuation>) = self
                .punctuations
                .iter()
                .filter(|(n, _, _)| roots[*n] == c)
                .map(|(_, s, f)| (*s, Arc::clone(f)))
                .unzip();
            if !on_timer.is_empty() || !schedules.is_empty() {
                settings = settings.order_by_event_time(self.event_time.clone());
            }
            let stage = stage_names[&c].clone();
            let processor = DslProcessor {
                on_timer,
                schedules,
                on_punctuation,
                stage: stage.clone(),
                roots: sources
                    .iter()
                    .map(|s| (s.topic.clone(), Arc::clone(&s.root)))
                    .collect(),
                // Whether a record needs a key: a global table's rows are kept under their own
                // keys, and a stream joining it reads them by the key its mapper gives.
                stateful: (0..self.nodes.len()).any(|n| roots[n] == c && self.nodes[n].stateful),
            };
            builder = builder.processor_stage(stage, Arc::new(processor), settings);
        }
        for t in &self.internal {
            let of = self.external_sources(&roots, roots[t.reader], &mut BTreeSet::new());
            let of = if of.is_empty() {
                self.external_sources(&roots, roots[t.writer], &mut BTreeSet::new())
            } else {
                of
            };
            builder = builder.internal_topic(InternalTopic::new(t.topic.clone(), of));
        }
        match builder.build() {
            Ok(topology) if problems.is_empty() => Ok(topology),
            Ok(_) => Err(Error::InvalidTopology { problems }),
            Err(Error::InvalidTopology { problems: more }) => {
                problems.extend(more);
                Err(Error::InvalidTopology { problems })
            }
            Err(e) => Err(e),
        }
    }

    /// The topics that are not internal among the sources of stage `c`, or, when it has none,
    /// of the stages that write its internal sources (the topics a repartition topic takes its
    /// partition count from).
    fn external_sources(
        &self,
        roots: &[usize],
        c: usize,
        seen: &mut BTreeSet<usize>,
    ) -> Vec<String> {
        if !seen.insert(c) {
            return Vec::new();
        }
        let mut out: Vec<String> = self
            .sources
            .iter()
            .filter(|s| roots[s.node] == c && s.internal.is_none())
            .map(|s| s.topic.clone())
            .collect();
        if out.is_empty() {
            for t in self.internal.iter().filter(|t| roots[t.reader] == c) {
                for topic in self.external_sources(roots, roots[t.writer], seen) {
                    if !out.contains(&topic) {
                        out.push(topic);
                    }
                }
            }
        }
        out
    }

    /// Whether source `s` is a global table joined by an operator of stage `c`.
    fn read_by(&self, s: &Source, roots: &[usize], c: usize) -> bool {
        s.global
            .as_ref()
            .is_some_and(|readers| readers.iter().any(|&r| roots[r] == c))
    }

    /// One line per operator of stage `c`, the global tables it joins first: `name: what -->
    /// successors`.
    fn describe(&self, roots: &[usize], c: usize) -> Vec<String> {
        let globals: Vec<usize> = self
            .sources
            .iter()
            .filter(|s| self.read_by(s, roots, c))
            .map(|s| s.node)
            .collect();
        globals
            .into_iter()
            .chain((0..self.nodes.len()).filter(|&n| roots[n] == c))
            .map(|n| {
                let next: Vec<&str> = (0..self.nodes.len())
                    .filter(|&m| roots[m] == c && self.nodes[m].preds.contains(&n))
                    .map(|m| self.nodes[m].name.as_str())
                    .collect();
                let node = &self.nodes[n];
                // A stateful operator's store: the state slot named after it.
                let store = if node.stateful {
                    format!(" (store {})", node.name)
                } else {
                    String::new()
                };
                if next.is_empty() {
                    format!("{}: {}{store}", node.name, node.what)
                } else {
                    format!(
                        "{}: {}{store} --> {}",
                        node.name,
                        node.what,
                        next.join(", ")
                    )
                }
            })
            .collect()
    }
}
