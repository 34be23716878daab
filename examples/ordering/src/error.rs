//! The crate's error type.

use std::sync::Arc;
use std::time::Duration;

/// What can go wrong generating the workload or running a strategy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A workload or strategy setting that cannot work; names the setting.
    #[error("invalid setting {setting}: {why}")]
    Config {
        /// The flag or field.
        setting: &'static str,
        /// Why it is refused.
        why: String,
    },
    /// A Kafka client call failed.
    #[error("{context}: {source}")]
    Kafka {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// A Parsley runtime call failed (admin, start, stop, a failed stage).
    #[error("{context}: {source}")]
    Runtime {
        /// What was being done.
        context: String,
        /// The runtime's error.
        #[source]
        source: Box<parsley_runtime::Error>,
    },
    /// A stage of the offset-completeness run failed while it ran.
    #[error("stage {stage} failed: {source}")]
    StageFailed {
        /// The stage.
        stage: String,
        /// The stage's own error, as its `Progress::Failed` event carried it (shared with the
        /// runtime, which returns it from `Running::stop` too).
        #[source]
        source: Arc<parsley_runtime::Error>,
    },
    /// The broker refused or lost records the generator sent.
    #[error("{failed} records of {what} were not acknowledged; first error: {first}")]
    Delivery {
        /// Which writer.
        what: &'static str,
        /// How many.
        failed: u64,
        /// The first delivery error, rendered.
        first: String,
    },
    /// A record that the workload did not write (malformed key or value) reached a strategy.
    #[error("foreign record on {topic}/{partition} at offset {offset}: {why}")]
    Foreign {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// What does not parse.
        why: String,
    },
    /// A wait on evidence (end offsets reached, records released) did not finish in time.
    #[error("{what} not reached within {deadline:?}")]
    Deadline {
        /// What was awaited.
        what: String,
        /// The deadline.
        deadline: Duration,
    },
    /// A worker thread ended unexpectedly (panicked or could not be spawned).
    #[error("worker thread {0} ended unexpectedly")]
    Worker(String),
    /// Writing the table or the chart failed.
    #[error("writing {path}: {why}")]
    Output {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
}

impl Error {
    pub(crate) fn kafka(context: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
        Error::Kafka {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn runtime(context: impl Into<String>, source: parsley_runtime::Error) -> Self {
        Error::Runtime {
            context: context.into(),
            source: Box::new(source),
        }
    }

    pub(crate) fn config(setting: &'static str, why: impl Into<String>) -> Self {
        Error::Config {
            setting,
            why: why.into(),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
