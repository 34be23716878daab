//! The DSL's operators in memory, through a minimal stage runner: each stage's compiled
//! processor called per record, its per-key state kept in a map, emissions handed to the
//! stages that read their topic in order. No gate and one partition: the causal behaviour of
//! compiled stages is tested through the runtime and the topology test driver.

mod operators;
mod tables;

use std::collections::{BTreeMap, HashMap, VecDeque};

use parsley_stage::{Error, RawRecord, StateChange, Topology};

/// A record as bytes: key, value.
pub(crate) type Bytes = (Option<Vec<u8>>, Option<Vec<u8>>);

/// Runs a topology's stages in memory (module docs).
pub(crate) struct Harness {
    topology: Topology,
    /// Per stage, per key: the stage's state.
    state: HashMap<(String, Vec<u8>), Vec<u8>>,
    /// Every record written to each topic, in order.
    topics: BTreeMap<String, Vec<Bytes>>,
}

impl Harness {
    pub(crate) fn new(topology: Topology) -> Self {
        Harness {
            topology,
            state: HashMap::new(),
            topics: BTreeMap::new(),
        }
    }

    /// Writes a record to `topic` and runs every stage until nothing is left to handle.
    pub(crate) fn pipe(
        &mut self,
        topic: &str,
        key: Option<&str>,
        value: Option<&str>,
    ) -> Result<(), Error> {
        let mut queue = VecDeque::from([(
            topic.to_string(),
            key.map(|k| k.as_bytes().to_vec()),
            value.map(|v| v.as_bytes().to_vec()),
        )]);
        while let Some((topic, key, value)) = queue.pop_front() {
            let log = self.topics.entry(topic.clone()).or_default();
            let offset = log.len() as i64;
            log.push((key.clone(), value.clone()));
            for stage in self.topology.stages() {
                if !stage.sources().contains(&topic) {
                    continue;
                }
                let at = (stage.name().to_string(), key.clone().unwrap_or_default());
                let step = stage.processor().process(
                    RawRecord {
                        topic: &topic,
                        partition: 0,
                        offset,
                        timestamp: 1_000 + offset,
                        key: key.as_deref(),
                        value: value.as_deref(),
                    },
                    self.state.get(&at).map(Vec::as_slice),
                )?;
                match step.state {
                    StateChange::Keep => {}
                    StateChange::Set(s) => {
                        self.state.insert(at, s);
                    }
                    StateChange::Delete => {
                        self.state.remove(&at);
                    }
                }
                for e in step.emit {
                    queue.push_back((e.topic.to_string(), e.key, e.value));
                }
            }
        }
        Ok(())
    }

    /// The records written to `topic`, as text (`None` for an absent part).
    pub(crate) fn read(&self, topic: &str) -> Vec<(Option<String>, Option<String>)> {
        let text =
            |b: &Option<Vec<u8>>| b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
        self.topics
            .get(topic)
            .map(|log| log.iter().map(|(k, v)| (text(k), text(v))).collect())
            .unwrap_or_default()
    }

    /// The records written to `topic`, as `key=value` text (`-` for an absent part).
    pub(crate) fn lines(&self, topic: &str) -> Vec<String> {
        self.read(topic)
            .into_iter()
            .map(|(k, v)| {
                format!(
                    "{}={}",
                    k.as_deref().unwrap_or("-"),
                    v.as_deref().unwrap_or("-")
                )
            })
            .collect()
    }

    /// The stored state of `key` in stage `stage`.
    pub(crate) fn state(&self, stage: &str, key: &str) -> Option<&[u8]> {
        self.state
            .get(&(stage.to_string(), key.as_bytes().to_vec()))
            .map(Vec::as_slice)
    }

    /// Overwrites the stored state of `key` in stage `stage`.
    pub(crate) fn corrupt_state(&mut self, stage: &str, key: &str, bytes: Vec<u8>) {
        self.state
            .insert((stage.to_string(), key.as_bytes().to_vec()), bytes);
    }

    pub(crate) fn topology(&self) -> &Topology {
        &self.topology
    }
}
