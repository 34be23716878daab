//! Runtime configuration.

use std::time::Duration;

/// Whether the delivery gate enforces stamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GateMode {
    /// Records are delivered only when their claims are satisfied (the default).
    #[default]
    Causal,
    /// **Negative control.** Claims are not checked: each channel is delivered in arrival
    /// order, as a plain consumer would. Stamps are still decoded, merged into the node clock
    /// and carried forward. This exists to show, in tests and in the demo, what the gate
    /// prevents; never use it for real work.
    Off,
}

/// How a [`Runtime`](crate::Runtime) talks to Kafka and paces its transactions.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// `host:port[,…]` of the cluster.
    pub bootstrap: String,
    /// How often a stream thread commits its transaction (outputs, state, input offsets).
    /// Also bounds the end-to-end latency of a record. Default 100 ms.
    pub commit_interval: Duration,
    /// Fetched-but-undelivered records per channel before its partition is paused.
    /// Default 10,000.
    pub max_queued_per_channel: usize,
    /// Deadline of each blocking Kafka call (commit, metadata, acks). Default 30 s.
    pub timeout: Duration,
    /// Distinguishes this process's transactional ids from other instances'. Default: random.
    pub instance_id: String,
    /// Whether the gate enforces stamps. Default [`GateMode::Causal`].
    pub gate: GateMode,
    /// Extra librdkafka consumer properties.
    pub consumer_properties: Vec<(String, String)>,
    /// Extra librdkafka producer properties.
    pub producer_properties: Vec<(String, String)>,
}

impl RuntimeConfig {
    /// Defaults for the cluster at `bootstrap`.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        RuntimeConfig {
            bootstrap: bootstrap.into(),
            commit_interval: Duration::from_millis(100),
            max_queued_per_channel: 10_000,
            timeout: Duration::from_secs(30),
            instance_id: uuid_like(),
            gate: GateMode::Causal,
            consumer_properties: Vec::new(),
            producer_properties: Vec::new(),
        }
    }

    /// Sets the commit interval.
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// Sets the gate mode; see [`GateMode::Off`] before using it.
    pub fn gate(mut self, mode: GateMode) -> Self {
        self.gate = mode;
        self
    }

    /// Sets a librdkafka consumer property.
    pub fn consumer_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.consumer_properties.push((key.into(), value.into()));
        self
    }

    /// Sets a librdkafka producer property.
    pub fn producer_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.producer_properties.push((key.into(), value.into()));
        self
    }
}

fn uuid_like() -> String {
    parsley_clock::SenderId::random().to_string()
}
