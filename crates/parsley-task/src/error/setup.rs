//! The setup kind of [`Error`](super::Error): what Parsley finds wrong with the configuration,
//! the topology or the topics a stage is asked to run on, before (or while) it starts — the
//! answer to "is my configuration wrong?". Nothing was processed when one of these is
//! returned; none is retried, because starting again meets the same setup.

use super::describe_counts;

/// A configuration, topology or topic layout that a stage cannot run with
/// ([`Error::Setup`](super::Error::Setup)). Fatal every time: none is
/// [retriable](SetupError::is_retriable) nor [transient](SetupError::is_transient).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A topic the topology or the caller names does not exist.
    #[error("topic {topic} does not exist (topics are not created automatically)")]
    UnknownTopic {
        /// The topic name.
        topic: String,
    },
    /// A stage with this name is not in the topology.
    #[error("no stage named {0} in the topology")]
    UnknownStage(String),
    /// The stages' consumer is configured for a consumer group protocol other than the classic
    /// one (`group.protocol`, KIP-848's `consumer` protocol): refused at start, before any
    /// client is made. Under that protocol the group coordinator computes the assignment on
    /// the broker and hands partitions over one by one, so a stage could not ask for its
    /// co-partitioned assignment (every source's partition `p` in one member) nor commit a
    /// task's work before any of its partitions moves.
    #[error(
        "consumer property group.protocol={protocol}: Parsley stages need the classic group \
         protocol (KIP-848's consumer protocol assigns partitions on the broker and moves them \
         one by one, so a stage can neither keep a task's co-partitioned sources together nor \
         commit the task before a partition of it moves); remove the property or set it to \
         classic"
    )]
    UnsupportedGroupProtocol {
        /// The value given.
        protocol: String,
    },
    /// The sources of a stage do not have the same partition count, so its tasks cannot be
    /// co-partitioned.
    #[error(
        "stage {stage}: source topics are not co-partitioned: {}",
        describe_counts(partitions)
    )]
    NotCoPartitioned {
        /// The stage.
        stage: String,
        /// Each source topic with its partition count.
        partitions: Vec<(String, i32)>,
    },
    /// The changelog topic of a stage exists with another partition count than its sources.
    #[error(
        "changelog topic {topic} has {partitions} partitions, the stage's sources have {expected}"
    )]
    ChangelogPartitions {
        /// The changelog topic.
        topic: String,
        /// Its partition count.
        partitions: i32,
        /// The sources' partition count.
        expected: i32,
    },
    /// An internal topic of the topology (a repartition topic) exists with another partition
    /// count than the topics it takes its count from
    /// ([`InternalTopic::partitions_of`](parsley_stage::InternalTopic::partitions_of)): created
    /// by hand, or left from an earlier topology whose sources had another count.
    #[error(
        "internal topic {topic} has {partitions} partitions, the topics it is co-partitioned with have {expected}"
    )]
    InternalTopicPartitions {
        /// The internal topic.
        topic: String,
        /// Its partition count.
        partitions: i32,
        /// The largest partition count of the topics it takes its count from.
        expected: i32,
    },
    /// The stream thread of a stage could not be spawned (the stage never ran).
    #[error("stage {stage}: cannot spawn its stream thread: {source}")]
    ThreadSpawn {
        /// The stage.
        stage: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The metrics endpoint
    /// (`RuntimeConfig::metrics_address`) cannot listen at
    /// `address` (in use, not an address of this host, a privileged port, …) or cannot start its
    /// thread; no stage was started.
    #[error("cannot serve metrics at {address}: {source}")]
    MetricsListener {
        /// The address asked for.
        address: std::net::SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The handlers of SIGINT and SIGTERM could not be installed
    /// (`Runtime::run_until_signal`,
    /// `Running::wait_for_signal`); nothing was started or
    /// stopped.
    #[error("cannot install the handlers of SIGINT and SIGTERM: {source}")]
    Signals {
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl SetupError {
    /// Always `false`: a setup error is met again on every try
    /// ([`Error::is_retriable`](super::Error::is_retriable)).
    pub fn is_retriable(&self) -> bool {
        match self {
            SetupError::UnknownTopic { .. }
            | SetupError::UnknownStage(_)
            | SetupError::UnsupportedGroupProtocol { .. }
            | SetupError::NotCoPartitioned { .. }
            | SetupError::ChangelogPartitions { .. }
            | SetupError::InternalTopicPartitions { .. }
            | SetupError::ThreadSpawn { .. }
            | SetupError::MetricsListener { .. }
            | SetupError::Signals { .. } => false,
        }
    }

    /// Always `false`: no setup error reports a connection state
    /// ([`Error::is_transient`](super::Error::is_transient)).
    pub fn is_transient(&self) -> bool {
        false
    }

    /// Always `false` ([`Error::is_fenced`](super::Error::is_fenced)).
    pub fn is_fenced(&self) -> bool {
        false
    }
}
