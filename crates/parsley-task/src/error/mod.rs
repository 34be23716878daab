//! The error of Parsley's task layer and of the Kafka runtime built on it: one public type,
//! [`Error`], whose classification ([`Error::is_retriable`], [`Error::is_transient`],
//! [`Error::is_fatal`], [`Error::is_fenced`]) holds for every layer.
//!
//! # Kinds
//! An [`Error`] is one of four kinds, each an enum in its own module, plus the wrapper of a
//! stage's error:
//!
//! | Variant | Kind | The question it answers |
//! |---|---|---|
//! | [`Error::Kafka`] | [`KafkaError`] (`kafka.rs`) | Is my cluster, or the connection to it, wrong? |
//! | [`Error::Setup`] | [`SetupError`] (`setup.rs`) | Is my configuration, topology or topic layout wrong? |
//! | [`Error::Record`] | [`RecordError`] (`record.rs`) | Is my data wrong? |
//! | [`Error::Processing`] | [`ProcessingError`] (`processing.rs`) | Is my code, or the stage's own state, wrong? |
//! | [`Error::StageFailed`] | — | Which stage ended, with which of the above? |
//!
//! The rule that puts a variant in its kind is the first of these questions whose answer is
//! "yes" for every value of it, asked of the thing a user would change to make the error go
//! away:
//! - the cluster, the network, credentials or another process on the cluster (a client call,
//!   a transaction, an admin request, a send, a fence, a call that did not return in time):
//!   **Kafka**;
//! - the configuration, the topology or how the topics were created (an unknown topic or
//!   stage, partition counts, the group protocol, a port or thread the process cannot have):
//!   **Setup**, found before any record is processed or when the setup changes;
//! - the records themselves, as written or as kept by the cluster (a stamp no truthful sender
//!   writes, a missing key or timestamp, a record the broker refuses for good, records deleted
//!   or a topic changed under the stage): **Record**, naming the record
//!   (`topic/partition@offset`) or the topic;
//! - the stage's processor, its causal gate, its clock or its state (store, changelog,
//!   restore, event time), and a panic of its stream thread: **Processing**.
//!
//! Only the Kafka kind holds errors that are [retriable](Error::is_retriable) or
//! [transient](Error::is_transient); every error of the three others is fatal.
//!
//! [`Error::StageFailed`] is a fifth variant, not a kind: it wraps the error a stage ended
//! with, which is of any kind (a stage ends on a Kafka error as well as on a record's), so
//! it belongs to none; it adds only the stage's name, and the classification looks through
//! it ([`Error::stage_error`]). A stage whose stream thread panicked has no error of its own
//! to wrap: that is [`ProcessingError::StagePanicked`].
//!
//! # Migrating a match
//! A variant of the flat error of earlier versions is now a variant of its kind:
//! `Error::RecordsLost { .. }` is `Error::Record(RecordError::RecordsLost { .. })`, and
//! `Error::Kafka { operation, source }` is `Error::Kafka(KafkaError::Client { operation,
//! source, .. })`, whose `operation` is an [`Operation`].

use std::sync::Arc;

mod acl;
mod kafka;
mod processing;
mod record;
mod setup;

pub use acl::{AclOperation, AclResource, ResourceType};
pub use kafka::{
    Awaited, ClientError, Coordinator, CoordinatorRole, KafkaCode, KafkaError, Operation,
    TransactionFlags,
};
pub use processing::ProcessingError;
pub use record::{
    InputRecord, PRODUCER_SIZE_LIMIT, RecordError, RecordProblem, Refusal, TIMESTAMP_AFTER_LIMIT,
    TIMESTAMP_BEFORE_LIMIT, TOPIC_SIZE_LIMIT, render_key,
};
pub use setup::SetupError;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong while talking to Kafka or running a stage: one of the four kinds (see the
/// [module docs](self) for which error is of which kind), or a stage's error with the stage's
/// name.
///
/// # Classification
/// As librdkafka's error flags do for a client call, three public methods say what an error
/// means for a stage:
/// - [`Error::is_retriable`]: a failed transaction; the runtime aborts it, returns every task
///   to its last commit and carries on (a bounded number of times in a row);
/// - [`Error::is_transient`]: a client error reporting a connection state, which librdkafka
///   recovers from on its own;
/// - [`Error::is_fatal`]: neither; the stage ends on it.
///
/// Fatal excludes the other two; retriable and transient overlap only for a
/// [`KafkaError::Client`] holding a transactional API error that requires an abort and carries
/// a connection-state code. [`Error::is_fenced`] says, besides, whether a newer epoch of the
/// producer's transactional id exists. Every method looks through [`Error::StageFailed`] at
/// the stage's own error ([`Error::stage_error`]); each kind answers for its own variants
/// ([`KafkaError::is_retriable`], [`SetupError::is_retriable`], …).
///
/// ```
/// use parsley_task::Error;
/// use parsley_task::error::{KafkaError, RecordError};
///
/// fn after_stop(e: &Error) -> &'static str {
///     match e.stage_error() {
///         Error::Record(RecordError::RecordsLost { .. }) => {
///             "records were deleted before delivery: decide"
///         }
///         Error::Kafka(KafkaError::Fenced { .. }) => "another process runs with this instance id",
///         _ if e.is_transient() => "the cluster was unreachable: restart later",
///         _ => "look at the error",
///     }
/// }
/// let lost = Error::from(RecordError::RecordsLost {
///     topic: "in".into(),
///     partition: 0,
///     from: 5,
///     log_start: 50,
/// });
/// assert!(lost.is_fatal() && !lost.is_retriable());
/// assert_eq!(after_stop(&lost), "records were deleted before delivery: decide");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Talking to the Kafka cluster failed: a client call, a transaction, an admin request, a
    /// send, authentication, a fence, a call that did not return in time.
    #[error(transparent)]
    Kafka(KafkaError),
    /// The configuration, the topology or the topics do not let a stage run.
    #[error(transparent)]
    Setup(SetupError),
    /// A record, or a source topic's records, cannot be handled as they are.
    #[error(transparent)]
    Record(RecordError),
    /// A stage's processing failed: its processor, gate, clock, state, or its stream thread.
    #[error(transparent)]
    Processing(ProcessingError),
    /// A stage run by `Runtime::start` or
    /// `Runtime::start_stages` ended with an error: what
    /// `Running::stop` returns for it. `source` is the stage's own
    /// typed error (match on `*source`, or use [`Error::stage_error`]); the classification
    /// methods ([`Error::is_retriable`], [`Error::is_fenced`], [`Error::is_transient`],
    /// [`Error::is_fatal`]) see through this wrapper.
    ///
    /// The error is shared (`Arc`) because the same error also reached the stage's observer as
    /// [`Progress::Failed`](crate::metrics::Progress::Failed), and [`Error`] is not `Clone` (it holds
    /// librdkafka's and the processor's errors).
    #[error("stage {stage} failed: {source}")]
    StageFailed {
        /// The stage.
        stage: String,
        /// The error the stage ended with.
        #[source]
        source: Arc<Error>,
    },
}

impl From<KafkaError> for Error {
    fn from(e: KafkaError) -> Self {
        Error::Kafka(e)
    }
}

impl From<SetupError> for Error {
    fn from(e: SetupError) -> Self {
        Error::Setup(e)
    }
}

impl From<RecordError> for Error {
    fn from(e: RecordError) -> Self {
        Error::Record(e)
    }
}

impl From<ProcessingError> for Error {
    fn from(e: ProcessingError) -> Self {
        Error::Processing(e)
    }
}

/// The processor's error is a [`ProcessingError::Stage`].
impl From<parsley_stage::Error> for Error {
    fn from(e: parsley_stage::Error) -> Self {
        Error::Processing(ProcessingError::Stage(e))
    }
}

/// A clock's error is a [`ProcessingError::Clock`].
impl From<parsley_clock::Error> for Error {
    fn from(e: parsley_clock::Error) -> Self {
        Error::Processing(ProcessingError::Clock(Box::new(e)))
    }
}

impl Error {
    /// A [`KafkaError::Client`]: `operation` failed with the client's error `source` (naming
    /// nothing more; build the [`KafkaError`] with [`KafkaError::client`] to name a topic,
    /// partition, offset or group).
    pub fn kafka(operation: Operation, source: ClientError) -> Self {
        Error::Kafka(KafkaError::client(operation, source))
    }

    /// A [`KafkaError::Admin`]: the admin request `operation` failed with `message` (naming
    /// nothing more; build the [`KafkaError`] with [`KafkaError::admin`] to name topics, a
    /// partition, an offset or a group).
    pub fn admin(operation: Operation, message: String) -> Self {
        Error::Kafka(KafkaError::admin(operation, message))
    }

    /// Names the stage, and the input record when known, in a [`RecordError::OutputRefused`]
    /// made where they are not known (the producer's side: its `stage` is empty); any other
    /// error is returned unchanged.
    pub fn refused_in(self, stage: &str, input: Option<InputRecord>, dead_letter: bool) -> Error {
        match self {
            Error::Record(e) => Error::Record(e.refused_in(stage, input, dead_letter)),
            other => other,
        }
    }

    /// The error a stage itself ended with: the `source` of an [`Error::StageFailed`] (through
    /// any nesting), or `self` for every other error. The classification methods below look
    /// at this error.
    pub fn stage_error(&self) -> &Error {
        let mut e = self;
        while let Error::StageFailed { source, .. } = e {
            e = source;
        }
        e
    }

    /// `true` when the runtime recovers from this error in place: met inside a stage's
    /// transaction, it aborts the open transaction, returns every task to its last commit
    /// (with a new producer if this one is fenced or failed) and carries on — at most five
    /// times in a row without a commit in between. These are the transaction's own failures,
    /// not the data's or the handler's, all of the Kafka kind ([`KafkaError::is_retriable`]):
    /// - [`KafkaError::Transaction`] that is not fatal, or whose code is a fence (see
    ///   [`Error::is_fenced`]: the recovery tells a transaction the coordinator aborted for
    ///   its age, which is redone, from another process running as this instance, which ends
    ///   the stage with [`KafkaError::Fenced`]);
    /// - [`KafkaError::Send`]: a send that failed (the abort decides: a fenced producer cannot
    ///   abort, and the stage ends then) — not [`RecordError::OutputRefused`], a record refused
    ///   for good, which is never retried as it was (the stage's bad-record policy may take its
    ///   input record out of the redo);
    /// - [`KafkaError::Client`] holding a transactional API error ([`ClientError::transaction`])
    ///   that is not fatal and requires an abort or may be retried (a coordinator that moved
    ///   mid-call: `AddOffsetsToTxn` meeting `_TRANSPORT`, seen when the transaction
    ///   coordinator's broker was killed), or whose code is a fence;
    /// - [`KafkaError::TransactionStalled`]: a commit call that did not return in time (the
    ///   recovery replaces the producer instead of aborting with it).
    ///
    /// Every other error is not retriable, [`KafkaError::Fenced`] included. Apart from looking
    /// through [`Error::StageFailed`] (which a stage never returns itself), this is exactly the
    /// rule the stream loop applies to the errors of its batches. A retriable error that reaches
    /// the caller (from `Running::stop` or [`Progress::Failed`](crate::metrics::Progress::Failed))
    /// ended its stage anyway: the recoveries in a row ran out, or it came before the stage's first
    /// transaction (at startup); restarting the stage restores every task from its last commit.
    pub fn is_retriable(&self) -> bool {
        match self.stage_error() {
            Error::Kafka(e) => e.is_retriable(),
            Error::Setup(e) => e.is_retriable(),
            Error::Record(e) => e.is_retriable(),
            Error::Processing(e) => e.is_retriable(),
            Error::StageFailed { .. } => false,
        }
    }

    /// `true` when the producer was fenced: a newer epoch of its transactional id exists
    /// (another producer initialised it, or the coordinator aborted a timed-out transaction),
    /// or the stage gave up its tasks for that reason ([`KafkaError::Fenced`]). Fence codes are
    /// librdkafka's `_FENCED` and the broker's `PRODUCER_FENCED` and `INVALID_PRODUCER_EPOCH`,
    /// in a [`KafkaError::Transaction`], or in the client error of a [`KafkaError::Client`] or
    /// [`KafkaError::Send`] ([`KafkaError::is_fenced`]). Only [`KafkaError::Fenced`] says
    /// another process runs with this instance id; a fence code in a
    /// [`KafkaError::Transaction`], a [`KafkaError::Send`] or a transactional API error is
    /// [retriable](Error::is_retriable) (the recovery tells the two causes apart).
    pub fn is_fenced(&self) -> bool {
        match self.stage_error() {
            Error::Kafka(e) => e.is_fenced(),
            Error::Setup(e) => e.is_fenced(),
            Error::Record(e) => e.is_fenced(),
            Error::Processing(e) => e.is_fenced(),
            Error::StageFailed { .. } => false,
        }
    }

    /// `true` for a client error ([`KafkaError::Client`]) that reports a connection state, not
    /// a lost record or a refused request: librdkafka's `_ALL_BROKERS_DOWN`, `_TRANSPORT`,
    /// `_TIMED_OUT`, and the broker's `REQUEST_TIMED_OUT` and `NETWORK_EXCEPTION`
    /// ([`KafkaError::is_transient`]). librdkafka recovers from them on its own: a stage's
    /// consumer carries on after them (polling, and reading a changelog), so a stage ends with
    /// one only when another call met it (reading metadata or offsets, initialising
    /// transactions, …); restarting the stage once the cluster is reachable again is expected
    /// to work.
    pub fn is_transient(&self) -> bool {
        match self.stage_error() {
            Error::Kafka(e) => e.is_transient(),
            Error::Setup(e) => e.is_transient(),
            Error::Record(e) => e.is_transient(),
            Error::Processing(e) => e.is_transient(),
            Error::StageFailed { .. } => false,
        }
    }

    /// `true` when the error is neither [retriable](Error::is_retriable) nor
    /// [transient](Error::is_transient): nothing in the runtime recovers from it in place, so
    /// a stage that ends with it stays stopped; look at its cause before restarting the stage.
    /// This covers every error of the setup, record and processing kinds — about the
    /// configuration, the topics, the topology, the data, the handler or the stage's state —
    /// and, of the Kafka kind, [`KafkaError::Fenced`] (another process), a fatal
    /// [`KafkaError::Transaction`] whose code is not a fence (the producer cannot be used any
    /// more), [`KafkaError::Admin`], [`KafkaError::Security`], [`KafkaError::Authorization`],
    /// [`KafkaError::Timeout`], and a
    /// [`KafkaError::Client`] that is neither retriable nor transient.
    pub fn is_fatal(&self) -> bool {
        !self.is_retriable() && !self.is_transient()
    }
}

/// `topic has n, …` for [`SetupError::NotCoPartitioned`].
fn describe_counts(partitions: &[(String, i32)]) -> String {
    partitions
        .iter()
        .map(|(t, n)| format!("{t} has {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
