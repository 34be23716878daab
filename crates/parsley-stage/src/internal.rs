//! Internal topics: topics a topology creates for itself, such as the repartition topics the
//! DSL inserts where a key changes before a stateful operator, and the topic of a stage's
//! built-in clock (`{application}-{stage}-clock`, added by `TopologyBuilder::build`).
//!
//! Kafka Streams' internal topics are the reference: named from the application id, created
//! by the application when it starts, with a partition count taken from the topics they are
//! co-partitioned with. The runtime creates an internal topic, when it is absent, before the
//! first stage that reads or writes it starts; every stage that touches it computes the same
//! partition count, so whichever starts first creates it and the others find it.
//!
//! Invariant (checked by `TopologyBuilder::build`): every internal topic is a source or sink of
//! some stage, is declared once, and takes its partition count from at least one topic that is
//! not internal.
//!
//! At the bottom of the crate: it imports none of its modules.

/// A topic the topology creates for itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalTopic {
    /// The topic's name (for a repartition topic: `{application}-{operator}-repartition`; for
    /// a built-in clock's: `{application}-{stage}-clock`).
    pub name: String,
    /// The topics whose largest partition count it takes; none of them internal. For a
    /// repartition topic: the topics it is co-partitioned with downstream when there are any,
    /// else the sources of the stage that writes it (Kafka Streams' rule).
    pub partitions_of: Vec<String>,
    /// Topic configs it is created with (`cleanup.policy`, `retention.ms`, …).
    pub config: Vec<(String, String)>,
}

impl InternalTopic {
    /// An internal topic `name` with as many partitions as the largest of `partitions_of`.
    pub fn new(name: impl Into<String>, partitions_of: impl IntoIterator<Item = String>) -> Self {
        InternalTopic {
            name: name.into(),
            partitions_of: partitions_of.into_iter().collect(),
            config: Vec::new(),
        }
    }

    /// Adds a topic config.
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }
}
