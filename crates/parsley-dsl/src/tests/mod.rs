//! The DSL's operators through the topology test driver: each compiled topology runs in
//! memory through the runtime's own tasks (gate, stamping, fold state, changelog), one
//! partition per topic unless a test says otherwise. The causal join is also tested on the
//! broker (`tests/dsl_on_broker.rs`) and the driver's own tests cover the gate in detail.

mod causal;
mod cogroup;
mod foreign_key;
mod global;
mod grouped_table;
mod headers;
mod operators;
mod partitioning;
mod punctuation;
mod reference;
mod sliding;
mod stream_joins;
mod stream_ops;
mod suppress;
mod tables;
mod versioned;
mod windows;

use parsley_runtime::driver::{RawInput, TopologyTestDriver};
use parsley_stage::{Error, RawRecord, StateChange, Topology};

/// A driver over a compiled topology, read back as text.
pub(crate) struct Harness {
    driver: TopologyTestDriver,
}

impl Harness {
    pub(crate) fn new(topology: Topology) -> Self {
        Harness {
            driver: TopologyTestDriver::builder(topology).build().unwrap(),
        }
    }

    /// Writes a record to `topic` (UTF-8 key and value; `None` for an absent part) and runs the
    /// topology until nothing more can be delivered.
    ///
    /// # Errors
    /// As [`TopologyTestDriver::run`]: a stage stopped by a bad record or a failing handler.
    pub(crate) fn pipe(
        &self,
        topic: &str,
        key: Option<&str>,
        value: Option<&str>,
    ) -> Result<(), parsley_runtime::Error> {
        self.driver
            .pipe_raw(
                topic,
                RawInput::new(key.map(str::as_bytes), value.map(str::as_bytes)),
            )
            .map(|_| ())
    }

    /// Writes a record with timestamp `ts` (ms) to `topic`, as [`Harness::pipe`].
    ///
    /// # Errors
    /// As [`Harness::pipe`].
    pub(crate) fn pipe_at(
        &self,
        topic: &str,
        key: Option<&str>,
        value: Option<&str>,
        ts: i64,
    ) -> Result<(), parsley_runtime::Error> {
        self.driver
            .pipe_raw(
                topic,
                RawInput::new(key.map(str::as_bytes), value.map(str::as_bytes)).timestamp(ts),
            )
            .map(|_| ())
    }

    /// Every record of `topic` from its start, as `key=value@timestamp` text (`-` for an
    /// absent part).
    pub(crate) fn records(&self, topic: &str) -> Vec<String> {
        let text = |b: Option<Vec<u8>>| {
            b.map_or_else(
                || "-".to_string(),
                |b| String::from_utf8_lossy(&b).into_owned(),
            )
        };
        let mut out = self
            .driver
            .output_topic(topic, parsley_stage::Bytes, parsley_stage::Bytes)
            .unwrap();
        std::iter::from_fn(|| out.read_raw_record())
            .map(|r| format!("{}={}@{}", text(r.key), text(r.value), r.timestamp))
            .collect()
    }

    /// Every record of `topic` from its start, as `key=value` text (`-` for an absent part).
    pub(crate) fn lines(&self, topic: &str) -> Vec<String> {
        let text = |b: Option<Vec<u8>>| {
            b.map_or_else(
                || "-".to_string(),
                |b| String::from_utf8_lossy(&b).into_owned(),
            )
        };
        let mut out = self
            .driver
            .output_topic(topic, parsley_stage::Bytes, parsley_stage::Bytes)
            .unwrap();
        std::iter::from_fn(|| out.read_raw_record())
            .map(|r| format!("{}={}", text(r.key), text(r.value)))
            .collect()
    }

    /// The stored state of `key` in stage `stage`.
    pub(crate) fn state(&self, stage: &str, key: &str) -> Option<Vec<u8>> {
        self.driver.raw_state(stage, key.as_bytes()).unwrap()
    }
}

/// Calls the compiled processor of `topology`'s stage `stage` on one record directly, with
/// `state` as the key's stored state: for the decoding errors of bad records and bad state,
/// which the driver would turn into a stopped stage.
pub(crate) fn process_once(
    topology: &Topology,
    stage: &str,
    (topic, offset): (&str, i64),
    (key, value): (Option<&str>, Option<&str>),
    state: Option<&[u8]>,
) -> Result<StateChange<Vec<u8>>, Error> {
    let spec = topology
        .stages()
        .iter()
        .find(|s| s.name() == stage)
        .unwrap();
    spec.processor()
        .process(
            RawRecord {
                topic,
                partition: 0,
                offset,
                timestamp: 1_000,
                key: key.map(str::as_bytes),
                value: value.map(str::as_bytes),
                watermark: None,
                headers: &[],
                task_state: None,
            },
            state,
        )
        .map(|step| step.state)
}
