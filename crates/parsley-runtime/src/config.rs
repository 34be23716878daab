//! Runtime configuration.

use std::time::Duration;

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
            consumer_properties: Vec::new(),
            producer_properties: Vec::new(),
        }
    }

    /// Sets the commit interval.
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
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
