//! The Kafka kind of [`Error`](super::Error): what went wrong talking to the cluster — the
//! answer to "is my cluster, or the connection to it, wrong?" ([`KafkaError`]): a client call,
//! a transactional call, an admin request, a send, authentication, a fence by another
//! producer, a call that did not return in time. The operation that failed is an
//! [`Operation`], with the topic, partition, offset or group it was about as fields of its
//! variant.
//!
//! A client's own error is a [`ClientError`], without the client library's types, so that the
//! task layer and the test driver build with no Kafka client at all.
//!
//! The runtime makes a [`ClientError`] from each librdkafka error it meets (keeping that error
//! as the [`source`](std::error::Error::source)), with librdkafka's code and, for a
//! transactional API error, librdkafka's flags; the classification of
//! [`Error`](super::Error) reads only these.

use std::fmt;

use parsley_clock::Channel;

/// librdkafka's error code (`rd_kafka_resp_err_t`): negative for librdkafka's own codes
/// (`_TRANSPORT`, `_FENCED`, …), positive for the broker's (Kafka protocol error codes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KafkaCode {
    /// The numeric code.
    pub value: i32,
    /// Its name in rust-rdkafka's `RDKafkaErrorCode` (`ProducerFenced`, `BrokerTransportFailure`,
    /// …).
    pub name: Box<str>,
}

impl KafkaCode {
    /// librdkafka's `_FENCED`: this producer was fenced (a newer epoch exists).
    pub const FENCED: i32 = -144;
    /// The broker's `PRODUCER_FENCED`.
    pub const PRODUCER_FENCED: i32 = 90;
    /// The broker's `INVALID_PRODUCER_EPOCH`.
    pub const INVALID_PRODUCER_EPOCH: i32 = 47;
    /// The broker's `INVALID_TXN_STATE`: the transaction's state on its coordinator does not
    /// allow the call (librdkafka makes it fatal for the producer).
    pub const INVALID_TXN_STATE: i32 = 48;
    /// librdkafka's `_ALL_BROKERS_DOWN`.
    pub const ALL_BROKERS_DOWN: i32 = -187;
    /// librdkafka's `_TRANSPORT`.
    pub const TRANSPORT: i32 = -195;
    /// librdkafka's `_TIMED_OUT`.
    pub const TIMED_OUT: i32 = -185;
    /// The broker's `REQUEST_TIMED_OUT`.
    pub const REQUEST_TIMED_OUT: i32 = 7;
    /// The broker's `NETWORK_EXCEPTION`.
    pub const NETWORK_EXCEPTION: i32 = 13;

    /// A code with its name.
    pub fn new(value: i32, name: impl Into<Box<str>>) -> Self {
        KafkaCode {
            value,
            name: name.into(),
        }
    }

    /// Whether the code says a newer epoch of the producer's transactional id exists:
    /// librdkafka's `_FENCED`, or the broker's `PRODUCER_FENCED` / `INVALID_PRODUCER_EPOCH`.
    pub fn is_fencing(&self) -> bool {
        matches!(
            self.value,
            Self::FENCED | Self::PRODUCER_FENCED | Self::INVALID_PRODUCER_EPOCH
        )
    }

    /// Whether a new producer for the same transactional id gets past the code: a fence
    /// ([`KafkaCode::is_fencing`]), or the broker's `INVALID_TXN_STATE` — the old producer
    /// cannot end its transaction, and initialising a new one aborts it (case C27).
    pub fn is_cleared_by_new_producer(&self) -> bool {
        self.is_fencing() || self.value == Self::INVALID_TXN_STATE
    }

    /// The resource type the code says access was refused on, when it is an authorization
    /// refusal (`TOPIC_AUTHORIZATION_FAILED`, `GROUP_AUTHORIZATION_FAILED`,
    /// `CLUSTER_AUTHORIZATION_FAILED`, `TRANSACTIONAL_ID_AUTHORIZATION_FAILED`); else `None`.
    pub fn refused_resource_type(&self) -> Option<super::ResourceType> {
        super::ResourceType::of_code(self.value)
    }

    /// Whether the code reports a connection state, not a lost record or a refused request:
    /// librdkafka's `_ALL_BROKERS_DOWN`, `_TRANSPORT`, `_TIMED_OUT`, and the broker's
    /// `REQUEST_TIMED_OUT` and `NETWORK_EXCEPTION`. librdkafka recovers from them on its own.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.value,
            Self::ALL_BROKERS_DOWN
                | Self::TRANSPORT
                | Self::TIMED_OUT
                | Self::REQUEST_TIMED_OUT
                | Self::NETWORK_EXCEPTION
        )
    }
}

impl fmt::Display for KafkaCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// librdkafka's flags of a transactional API error (`rd_kafka_error_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransactionFlags {
    /// The producer cannot be used any more.
    pub fatal: bool,
    /// The call may be retried.
    pub retriable: bool,
    /// The transaction cannot commit and must be aborted.
    pub requires_abort: bool,
}

/// A Kafka client's error: what [`KafkaError::Client`] and [`KafkaError::Send`] hold.
#[derive(Debug)]
pub struct ClientError {
    /// librdkafka's code, when the error carries one.
    pub code: Option<KafkaCode>,
    /// The flags of a transactional API error; `None` for every other error.
    pub transaction: Option<TransactionFlags>,
    /// The client's description of the error.
    pub message: String,
    /// The client library's own error.
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl ClientError {
    /// An error described by `message`, with librdkafka's `code` when it has one.
    pub fn new(code: Option<KafkaCode>, message: impl Into<String>) -> Self {
        ClientError {
            code,
            transaction: None,
            message: message.into(),
            source: None,
        }
    }

    /// The same error, a transactional API error with `flags`.
    pub fn transactional(mut self, flags: TransactionFlags) -> Self {
        self.transaction = Some(flags);
        self
    }

    /// The same error, keeping the client library's error as its source.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The client library's error, when kept ([`ClientError::with_source`]): downcast it to
    /// the library's type to read what this type does not carry.
    pub fn library_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }

    /// Whether the code is a fence ([`KafkaCode::is_fencing`]).
    pub fn is_fencing(&self) -> bool {
        self.code.as_ref().is_some_and(KafkaCode::is_fencing)
    }

    /// Whether the code reports a connection state ([`KafkaCode::is_transient`]).
    pub fn is_transient(&self) -> bool {
        self.code.as_ref().is_some_and(KafkaCode::is_transient)
    }

    /// Whether the code is `value`.
    pub fn has_code(&self, value: i32) -> bool {
        self.code.as_ref().is_some_and(|c| c.value == value)
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
/// What went wrong talking to the Kafka cluster
/// ([`KafkaError::Client`](super::KafkaError::Client)).
///
/// Its part of the classification: [`KafkaError::is_retriable`], [`KafkaError::is_transient`],
/// [`KafkaError::is_fenced`].
pub enum KafkaError {
    /// A Kafka client call failed: `operation` on the topic, partition, offset or group named,
    /// when the call was about one.
    #[error("{}: {source}", Described { operation: *operation, topic: topic.as_deref(), partition: *partition, offset: *offset, group: group.as_deref(), topics: &[], cause: cause.as_deref() })]
    Client {
        /// What was being done.
        operation: Operation,
        /// The topic the call was about, when one.
        topic: Option<String>,
        /// The partition of `topic` the call was about, when one.
        partition: Option<i32>,
        /// The offset the call was about (a seek's target), when one.
        offset: Option<i64>,
        /// The consumer group the call was about, when one.
        group: Option<String>,
        /// For [`Operation::AbortAfter`]: the message of the error the abort was for.
        cause: Option<Box<str>>,
        /// The client's error (boxed: it is the largest part, and errors are returned often).
        source: Box<ClientError>,
    },
    /// A transactional API call failed.
    #[error("{operation}: {code}: {message}{}", if *fatal { " (fatal)" } else if *requires_abort { " (the transaction must be aborted)" } else { "" })]
    Transaction {
        /// What was being done.
        operation: Operation,
        /// librdkafka's error code.
        code: KafkaCode,
        /// librdkafka's message.
        message: String,
        /// The producer cannot be used any more (fenced, or a fatal idempotence error).
        fatal: bool,
        /// The transaction cannot commit and must be aborted.
        requires_abort: bool,
    },
    /// A client could not authenticate to the cluster or set up TLS with it: wrong
    /// credentials, a certificate the client does not trust, a mechanism the listener does not
    /// enable. Reported as soon as librdkafka reports it (within the configured timeout).
    #[error(
        "the {client} client cannot connect securely to {listener} ({protocol}{}): {code}: {message}",
        mechanism.as_deref().map_or(String::new(), |m| format!(", SASL mechanism {m}"))
    )]
    Security {
        /// The listener: the client's `bootstrap.servers`.
        listener: Box<str>,
        /// Its `security.protocol`.
        protocol: Box<str>,
        /// Its `sasl.mechanisms`, when the protocol uses SASL.
        mechanism: Option<Box<str>>,
        /// The client's role (`consumer`, `producer`, `admin`, `restore`).
        client: &'static str,
        /// librdkafka's code (`_AUTHENTICATION`, `_SSL`, …).
        code: KafkaCode,
        /// librdkafka's message.
        message: Box<str>,
    },
    /// The cluster refused a request because no ACL allows the client's principal the
    /// operation on `resource` (KIP-11): `TOPIC_AUTHORIZATION_FAILED`,
    /// `GROUP_AUTHORIZATION_FAILED`, `TRANSACTIONAL_ID_AUTHORIZATION_FAILED` or
    /// `CLUSTER_AUTHORIZATION_FAILED`. Fatal: the request fails the same way until an ACL is
    /// granted. The book's operations chapter lists the ACLs each part of Parsley needs.
    #[error(
        "{operation}: the {client} client is not authorized on {resource} ({code}: {message}): no ACL allows this principal the operation"
    )]
    Authorization {
        /// What was being done.
        operation: Operation,
        /// The resource access was refused on.
        resource: super::AclResource,
        /// The client's role (`consumer`, `producer`, `admin`, `restore`, …).
        client: &'static str,
        /// The code (`TopicAuthorizationFailed`, …).
        code: KafkaCode,
        /// The broker's or client's message.
        message: Box<str>,
    },
    /// An admin request failed (or its answer was not what was asked for): `operation` on the
    /// topics, partition, offset or group named, when the request was about them.
    #[error("{}: {message}", Described { operation: *operation, topic: None, partition: *partition, offset: *offset, group: group.as_deref(), topics, cause: None })]
    Admin {
        /// What was being done.
        operation: Operation,
        /// The topics the request was about: one for a request about one topic or one of its
        /// partitions ([`Operation::DescribeTopic`], [`Operation::DeleteRecords`], …), several
        /// for [`Operation::CreateTopics`] and [`Operation::DeleteTopics`] when named; empty
        /// when the request names none.
        topics: Box<[String]>,
        /// The partition of `topic` the request was about, when one.
        partition: Option<i32>,
        /// The offset the request was about ([`Operation::DeleteRecords`]: the records below
        /// it), when one.
        offset: Option<i64>,
        /// The consumer group the request was about, when one.
        group: Option<String>,
        /// The broker's or client's message.
        message: String,
    },
    /// A send was not acknowledged, for a reason the next try may not meet (a record refused
    /// for what it is — too large, a timestamp outside the topic's window — is
    /// [`RecordError::OutputRefused`](crate::error::RecordError::OutputRefused) instead).
    #[error("send to {channel} (topic {topic}) failed: {source}")]
    Send {
        /// Topic name.
        topic: String,
        /// The target channel.
        channel: Box<Channel>,
        /// The client's error (boxed, as in [`KafkaError::Client`]).
        source: Box<ClientError>,
    },
    /// Another producer initialised this stage's transactional id while the stage's
    /// transaction had been open for less than `transaction.timeout.ms`, so the transaction
    /// coordinator cannot have fenced it for its age (that fence, case C08, is recovered from
    /// with a new producer): another process runs with this `instance_id`, and this stage is
    /// its zombie. Nothing of the open transaction becomes visible, the group's offsets are
    /// unchanged, and the stage gives up its tasks without taking the id back, which would
    /// fence the live owner in turn (case C09).
    ///
    #[error(
        "transactional id {transactional_id} was taken by another producer while this stage's transaction had been open {open_ms} ms, less than transaction.timeout.ms ({timeout_ms} ms): another process runs with this instance id, so this stage gives up its tasks ({message})"
    )]
    Fenced {
        /// The stage's transactional id.
        transactional_id: String,
        /// How long the fenced transaction had been open when the fence was seen, ms.
        open_ms: u64,
        /// The producer's `transaction.timeout.ms`.
        timeout_ms: u64,
        /// librdkafka's message.
        message: String,
    },
    /// A call of the commit did not return within the stage's timeout or its transaction
    /// timeout, whichever is shorter (plus a second): the
    /// stage gave up on it, replaced its producer (which aborts the open transaction) and
    /// redoes the work from its last commit ([retriable](super::Error::is_retriable)). librdkafka can
    /// wait past its own timeout when the group coordinator leaves the cluster (case C21).
    ///
    /// The call is also given up before its bound once the coordinator it waits on has
    /// moved to another node (`moved`): librdkafka may keep the request parked on the departed
    /// coordinator.
    #[error(
        "{operation} did not return within {}{}: the producer is replaced, which aborts the transaction",
        stalled_for(*timeout, coordinator.as_ref(), *moved),
        waiting_on(coordinator.as_ref())
    )]
    TransactionStalled {
        /// The call.
        operation: Operation,
        /// The bound the call was given: the shorter of the stage's timeout and its transaction
        /// timeout.
        timeout: std::time::Duration,
        /// The coordinator the call waits on, as the cluster's metadata showed it when the call
        /// was given up (`None`: the metadata did not answer).
        coordinator: Option<Coordinator>,
        /// The call was given up before its bound: the coordinator had moved away from the
        /// node the stage last committed through (the call waited this long, ms).
        moved: Option<u64>,
    },
    /// Something did not happen within its deadline.
    #[error("{what} did not complete within {timeout:?}")]
    Timeout {
        /// What was awaited.
        what: Awaited,
        /// The deadline.
        timeout: std::time::Duration,
    },
}

impl KafkaError {
    /// A [`KafkaError::Client`]: `operation` failed with the client's error `source`; name
    /// what it was about with [`KafkaError::with_topic`], [`KafkaError::with_partition`],
    /// [`KafkaError::with_offset`], [`KafkaError::with_group`], [`KafkaError::with_cause`].
    pub fn client(operation: Operation, source: ClientError) -> Self {
        KafkaError::Client {
            operation,
            topic: None,
            partition: None,
            offset: None,
            group: None,
            cause: None,
            source: Box::new(source),
        }
    }

    /// A [`KafkaError::Admin`]: the admin request `operation` failed with `message`; name what
    /// it was about with [`KafkaError::with_topic`], [`KafkaError::with_topics`],
    /// [`KafkaError::with_partition`], [`KafkaError::with_offset`], [`KafkaError::with_group`].
    pub fn admin(operation: Operation, message: String) -> Self {
        KafkaError::Admin {
            operation,
            topics: Box::default(),
            partition: None,
            offset: None,
            group: None,
            message,
        }
    }

    /// The same error naming `name` as the topic of its [`KafkaError::Client`] call (the one
    /// topic of a [`KafkaError::Admin`] request); any other variant is returned unchanged (so
    /// are the `with_…` methods below).
    pub fn with_topic(mut self, name: impl fmt::Display) -> Self {
        match &mut self {
            KafkaError::Client { topic, .. } => *topic = Some(name.to_string()),
            KafkaError::Admin { topics, .. } => *topics = Box::new([name.to_string()]),
            _ => {}
        }
        self
    }

    /// A [`KafkaError::Authorization`]: `operation` of the `client` client was refused on
    /// `resource` with `code` (an authorization code: [`super::ResourceType::of_code`]).
    pub fn authorization(
        operation: Operation,
        resource: super::AclResource,
        client: &'static str,
        code: KafkaCode,
        message: impl Into<Box<str>>,
    ) -> Self {
        KafkaError::Authorization {
            operation,
            resource,
            client,
            code,
            message: message.into(),
        }
    }

    /// The resource access was refused on, when this is a [`KafkaError::Authorization`].
    pub fn refused_resource(&self) -> Option<&super::AclResource> {
        match self {
            KafkaError::Authorization { resource, .. } => Some(resource),
            _ => None,
        }
    }

    /// The same error naming `names` as the topics of its [`KafkaError::Admin`] request.
    pub fn with_topics<S: ToString>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        if let KafkaError::Admin { topics, .. } = &mut self {
            *topics = names.into_iter().map(|n| n.to_string()).collect();
        }
        self
    }

    /// The same error naming `topic`/`p` as the partition of its call.
    pub fn with_partition(self, topic: impl fmt::Display, p: i32) -> Self {
        let mut e = self.with_topic(topic);
        if let KafkaError::Client { partition, .. } | KafkaError::Admin { partition, .. } = &mut e {
            *partition = Some(p);
        }
        e
    }

    /// The same error naming offset `o` as the offset of its call.
    pub fn with_offset(mut self, o: i64) -> Self {
        if let KafkaError::Client { offset, .. } | KafkaError::Admin { offset, .. } = &mut self {
            *offset = Some(o);
        }
        self
    }

    /// The same error naming consumer group `name` as the group of its call.
    pub fn with_group(mut self, name: impl fmt::Display) -> Self {
        match &mut self {
            KafkaError::Client { group, .. } | KafkaError::Admin { group, .. } => {
                *group = Some(name.to_string())
            }
            _ => {}
        }
        self
    }

    /// The same error naming, in a [`KafkaError::Client`], the error its call was made for
    /// (an abort's cause, [`Operation::AbortAfter`]), by its message.
    pub fn with_cause(mut self, error: &impl fmt::Display) -> Self {
        if let KafkaError::Client { cause, .. } = &mut self {
            *cause = Some(error.to_string().into());
        }
        self
    }

    /// The Kafka kind's part of [`Error::is_retriable`](super::Error::is_retriable): a failed
    /// transaction, which the runtime aborts and redoes —
    /// - [`KafkaError::Transaction`] that is not fatal, or whose code is a fence;
    /// - [`KafkaError::Send`] (the abort decides: a fenced producer cannot abort);
    /// - [`KafkaError::TransactionStalled`] (the producer is replaced);
    /// - [`KafkaError::Client`] holding a transactional API error
    ///   ([`ClientError::transaction`]) that is not fatal and requires an abort or may be
    ///   retried, or whose code is a fence;
    ///
    /// but never one whose code is an authorization refusal
    /// ([`KafkaCode::refused_resource_type`]), even an abortable one: the same request is
    /// refused again until an ACL allows it, so redoing the transaction cannot help.
    pub fn is_retriable(&self) -> bool {
        let refused = match self {
            KafkaError::Transaction { code, .. } => Some(code),
            KafkaError::Client { source, .. } | KafkaError::Send { source, .. } => {
                source.code.as_ref()
            }
            _ => None,
        };
        if refused.is_some_and(|c| c.refused_resource_type().is_some()) {
            return false;
        }
        match self {
            // A fence seen at the commit goes to the recovery too, which tells a timed-out
            // transaction (redone) from a zombie (ends the stage: `KafkaError::Fenced`).
            // So does a fatal `INVALID_TXN_STATE`: the recovery's abort meets it again and
            // replaces the producer (case C27).
            KafkaError::Transaction { fatal, code, .. } => {
                !*fatal || code.is_cleared_by_new_producer()
            }
            // The abort decides: a fenced producer cannot abort, and the stage ends then.
            KafkaError::Send { .. } => true,
            // A call that never returned: the producer is replaced.
            KafkaError::TransactionStalled { .. } => true,
            KafkaError::Client { source, .. } => match source.transaction {
                Some(t) => {
                    (!t.fatal && (t.requires_abort || t.retriable))
                        || source
                            .code
                            .as_ref()
                            .is_some_and(KafkaCode::is_cleared_by_new_producer)
                }
                None => false,
            },
            KafkaError::Security { .. }
            | KafkaError::Authorization { .. }
            | KafkaError::Admin { .. }
            | KafkaError::Fenced { .. }
            | KafkaError::Timeout { .. } => false,
        }
    }

    /// The Kafka kind's part of [`Error::is_fenced`](super::Error::is_fenced):
    /// [`KafkaError::Fenced`], or a fence code in a [`KafkaError::Transaction`], or in the
    /// client error of a [`KafkaError::Client`] or [`KafkaError::Send`].
    pub fn is_fenced(&self) -> bool {
        match self {
            KafkaError::Fenced { .. } => true,
            KafkaError::Transaction { code, .. } => code.is_fencing(),
            KafkaError::Client { source, .. } | KafkaError::Send { source, .. } => {
                source.is_fencing()
            }
            _ => false,
        }
    }

    /// The Kafka kind's part of [`Error::is_transient`](super::Error::is_transient): a
    /// [`KafkaError::Client`] whose code reports a connection state
    /// ([`KafkaCode::is_transient`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, KafkaError::Client { source, .. } if source.is_transient())
    }
}

/// What a Kafka call was doing when it failed: the `operation` of [`KafkaError::Client`],
/// [`KafkaError::Admin`], [`KafkaError::Transaction`] and [`KafkaError::TransactionStalled`].
/// Its `Display` is the text the error's message starts with; the variant's topic, partition,
/// offset or group follow where the operation names them (`seeking in/0 to 5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Creating a stage's consumer (with its `group`). Writes `creating the consumer`.
    CreateConsumer,
    /// Subscribing a stage's consumer to its sources. Writes `subscribing`.
    Subscribe,
    /// Polling a stage's consumer. Writes `polling`.
    Poll,
    /// Seeking a source partition (`topic`, `partition`) to `offset`. Writes `seeking`.
    Seek,
    /// Reading a stage's consumer's assignment. Writes `reading the assignment`.
    ReadAssignment,
    /// Assigning partitions to a stage's consumer in a rebalance. Writes `assigning`.
    Assign,
    /// Unassigning revoked partitions from a stage's consumer. Writes `unassigning after revocation`.
    UnassignAfterRevocation,
    /// Pausing or resuming a partition of a stage's consumer. Writes `pausing or resuming a partition`.
    PauseResume,
    /// Reading the group's committed offsets in a rebalance. Writes `reading committed offsets`.
    ReadCommittedOffsets,
    /// Reading a consumer's positions. Writes `reading positions`.
    ReadPositions,
    /// A rebalance of a stage's group. Writes `rebalancing`.
    Rebalance,
    /// Reading the group metadata a commit sends with its offsets. Writes `committing`.
    Commit,
    /// Creating a producer. Writes `creating the producer`.
    CreateProducer,
    /// Initialising a transactional producer's transactions. Writes `initialising transactions`.
    InitTransactions,
    /// Beginning a transaction. Writes `beginning a transaction`.
    BeginTransaction,
    /// Building the list of input offsets a transaction commits. Writes `building the offsets to commit`.
    BuildOffsetsToCommit,
    /// Sending the input offsets to the open transaction. Writes `sending offsets to the transaction`.
    SendOffsetsToTransaction,
    /// Committing the open transaction. Writes `committing the transaction`.
    CommitTransaction,
    /// Aborting a transaction. Writes `aborting a transaction`.
    AbortTransaction,
    /// Aborting the open transaction after an error (its message is the variant's `cause`). Writes `aborting after`.
    AbortAfter,
    /// The commit's call that sends the input offsets to the group coordinator (a stalled call). Writes `sending the input offsets to the transaction (TxnOffsetCommit to the group coordinator)`.
    TxnOffsetCommit,
    /// The commit's call that ends the transaction at the transaction coordinator (a stalled call). Writes `committing the transaction (EndTxn to the transaction coordinator)`.
    EndTxn,
    /// The thread that makes the commit's calls ended without a result. Writes `the commit's helper thread ended without a result`.
    CommitHelperEnded,
    /// Creating the consumer that restores a task from its changelog. Writes `creating the restore consumer`.
    CreateRestoreConsumer,
    /// Building the changelog partition a restore reads. Writes `building the restore assignment`.
    BuildRestoreAssignment,
    /// Assigning the changelog partition to the restore consumer. Writes `assigning the changelog partition`.
    AssignChangelogPartition,
    /// Reading the restore consumer's position. Writes `reading the restore position`.
    ReadRestorePosition,
    /// Reading a changelog partition. Writes `reading the changelog`.
    ReadChangelog,
    /// Creating the consumer that reads a group's progress (with its `group`). Writes `create a progress reader`.
    CreateProgressReader,
    /// Reading a group's committed offsets for its progress. Writes `read committed offsets`.
    ReadProgressOffsets,
    /// Building the partitions a progress reader reads. Writes `build the partitions to read`.
    BuildProgressPartitions,
    /// Assigning its partitions to a progress reader. Writes `assign the partitions to read`.
    AssignProgressPartitions,
    /// Unassigning a progress reader's partitions. Writes `unassign the partitions read`.
    UnassignProgressPartitions,
    /// Creating the admin client. Writes `creating the admin client`.
    CreateAdminClient,
    /// Listing the cluster's topics. Writes `listing topics`.
    ListTopics,
    /// Describing one topic (`topic`). Writes `describing topic`.
    DescribeTopic,
    /// Describing topics (`DescribeTopics`). Writes `describing topics`.
    DescribeTopics,
    /// Creating one topic (`topic`). Writes `creating topic`.
    CreateTopic,
    /// Creating topics (`topics`, when named). Writes `creating topics`.
    CreateTopics,
    /// Adding partitions to a topic (`topic`). Writes `adding partitions to`.
    AddPartitions,
    /// Building the partition list of a `DeleteRecords` request. Writes `building the records to delete`.
    BuildRecordsToDelete,
    /// Deleting the records of a partition (`topic`, `partition`) below `offset`. Writes `deleting records of`.
    DeleteRecords,
    /// Describing a topic's configuration (`topic`). Writes `describing the configuration of`.
    DescribeConfig,
    /// Deleting one topic (`topic`). Writes `deleting topic`.
    DeleteTopic,
    /// Deleting topics (`topics`, when named). Writes `deleting topics`.
    DeleteTopics,
    /// Listing partitions' offsets (`ListOffsets`). Writes `listing offsets`.
    ListOffsets,
    /// Listing the offsets of one partition (`topic`, `partition`). Writes `listing the offsets of`.
    ListPartitionOffsets,
    /// Describing a consumer group (`group`). Writes `describing group`.
    DescribeGroup,
    /// Creating ACLs. Writes `creating ACLs`.
    CreateAcls,
    /// Deleting ACLs. Writes `deleting ACLs`.
    DeleteAcls,
    /// Describing ACLs. Writes `describing ACLs`.
    DescribeAcls,
    /// Sending a record (its delivery report). Writes `sending`.
    Send,
}

impl Operation {
    /// The text the error's message starts with (what `Display` writes).
    pub const fn as_str(self) -> &'static str {
        match self {
            Operation::CreateConsumer => "creating the consumer",
            Operation::Subscribe => "subscribing",
            Operation::Poll => "polling",
            Operation::Seek => "seeking",
            Operation::ReadAssignment => "reading the assignment",
            Operation::Assign => "assigning",
            Operation::UnassignAfterRevocation => "unassigning after revocation",
            Operation::PauseResume => "pausing or resuming a partition",
            Operation::ReadCommittedOffsets => "reading committed offsets",
            Operation::ReadPositions => "reading positions",
            Operation::Rebalance => "rebalancing",
            Operation::Commit => "committing",
            Operation::CreateProducer => "creating the producer",
            Operation::InitTransactions => "initialising transactions",
            Operation::BeginTransaction => "beginning a transaction",
            Operation::BuildOffsetsToCommit => "building the offsets to commit",
            Operation::SendOffsetsToTransaction => "sending offsets to the transaction",
            Operation::CommitTransaction => "committing the transaction",
            Operation::AbortTransaction => "aborting a transaction",
            Operation::AbortAfter => "aborting after",
            Operation::TxnOffsetCommit => {
                "sending the input offsets to the transaction (TxnOffsetCommit to the group coordinator)"
            }
            Operation::EndTxn => {
                "committing the transaction (EndTxn to the transaction coordinator)"
            }
            Operation::CommitHelperEnded => "the commit's helper thread ended without a result",
            Operation::CreateRestoreConsumer => "creating the restore consumer",
            Operation::BuildRestoreAssignment => "building the restore assignment",
            Operation::AssignChangelogPartition => "assigning the changelog partition",
            Operation::ReadRestorePosition => "reading the restore position",
            Operation::ReadChangelog => "reading the changelog",
            Operation::CreateProgressReader => "create a progress reader",
            Operation::ReadProgressOffsets => "read committed offsets",
            Operation::BuildProgressPartitions => "build the partitions to read",
            Operation::AssignProgressPartitions => "assign the partitions to read",
            Operation::UnassignProgressPartitions => "unassign the partitions read",
            Operation::CreateAdminClient => "creating the admin client",
            Operation::ListTopics => "listing topics",
            Operation::DescribeTopic => "describing topic",
            Operation::DescribeTopics => "describing topics",
            Operation::CreateTopic => "creating topic",
            Operation::CreateTopics => "creating topics",
            Operation::AddPartitions => "adding partitions to",
            Operation::BuildRecordsToDelete => "building the records to delete",
            Operation::DeleteRecords => "deleting records of",
            Operation::DescribeConfig => "describing the configuration of",
            Operation::DeleteTopic => "deleting topic",
            Operation::DeleteTopics => "deleting topics",
            Operation::ListOffsets => "listing offsets",
            Operation::ListPartitionOffsets => "listing the offsets of",
            Operation::DescribeGroup => "describing group",
            Operation::CreateAcls => "creating ACLs",
            Operation::DeleteAcls => "deleting ACLs",
            Operation::DescribeAcls => "describing ACLs",
            Operation::Send => "sending",
        }
    }
}

/// An operation equals its text (`Operation::Poll == "polling"`).
impl PartialEq<str> for Operation {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

/// An operation equals its text (`Operation::Poll == "polling"`).
impl PartialEq<&str> for Operation {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation with what it was about, as a message writes it.
struct Described<'a> {
    operation: Operation,
    topic: Option<&'a str>,
    partition: Option<i32>,
    offset: Option<i64>,
    group: Option<&'a str>,
    topics: &'a [String],
    cause: Option<&'a str>,
}

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Operation as O;
        write!(f, "{}", self.operation)?;
        // An admin request's one topic.
        let topic = match self.topics {
            [one] if self.topic.is_none() => Some(one.as_str()),
            _ => self.topic,
        };
        let at = |f: &mut fmt::Formatter<'_>| -> fmt::Result {
            match (topic, self.partition) {
                (Some(t), Some(p)) => write!(f, " {t}/{p}"),
                (Some(t), None) => write!(f, " {t}"),
                _ => Ok(()),
            }
        };
        match self.operation {
            O::CreateConsumer | O::CreateProgressReader => {
                if let Some(g) = self.group {
                    write!(f, " of group {g}")?;
                }
            }
            O::DescribeGroup => {
                if let Some(g) = self.group {
                    write!(f, " {g}")?;
                }
            }
            O::Seek => {
                at(f)?;
                if let Some(o) = self.offset {
                    write!(f, " to {o}")?;
                }
            }
            O::DeleteRecords => {
                at(f)?;
                if let Some(o) = self.offset {
                    write!(f, " below {o}")?;
                }
            }
            O::CreateTopics | O::DeleteTopics => {
                if !self.topics.is_empty() {
                    write!(f, " {:?}", self.topics)?;
                }
            }
            O::AbortAfter => {
                if let Some(c) = self.cause {
                    write!(f, ": {c}")?;
                }
            }
            _ => at(f)?,
        }
        Ok(())
    }
}

/// What a [`KafkaError::Timeout`] waited for: a typed value whose `Display` is the text the
/// error's message gives.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Awaited {
    /// The stages to catch up with their sources (`Running::wait_caught_up`).
    CaughtUp,
    /// A restore's read of changelog partition `topic`/`partition` to its high watermark:
    /// the read stood at offset `position` (i64) of high watermark `high_watermark` (i64),
    /// after `replaced` restore consumers were replaced for reading nothing for `stall`.
    Restore {
        /// The changelog topic.
        topic: String,
        /// Its partition: the task's.
        partition: i32,
        /// The restore consumer's position, an offset.
        position: i64,
        /// The partition's high watermark, an offset.
        high_watermark: i64,
        /// Restore consumers replaced after reading nothing for `stall`.
        replaced: u64,
        /// How long a restore consumer may read nothing before it is replaced.
        stall: std::time::Duration,
    },
    /// Room in the producer's queue for a send to `topic`.
    QueueRoom {
        /// The topic of the send that waited.
        topic: String,
    },
    /// A flush of the producer: every queued send handed to its broker.
    Flush,
    /// The delivery reports of the sends still outstanding.
    Acknowledgements {
        /// Sends without a delivery report when the wait ended.
        outstanding: u64,
    },
}

impl fmt::Display for Awaited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Awaited::CaughtUp => f.write_str("the stages to catch up with their sources"),
            Awaited::Restore {
                topic,
                partition,
                position,
                high_watermark,
                replaced,
                stall,
            } => write!(
                f,
                "restoring {topic}/{partition}: position {position} of high watermark \
                 {high_watermark} ({replaced} consumer(s) replaced after reading nothing for {}s)",
                stall.as_secs()
            ),
            Awaited::QueueRoom { topic } => write!(f, "room in the producer queue for {topic}"),
            Awaited::Flush => f.write_str("flushing the producer"),
            Awaited::Acknowledgements { outstanding } => {
                write!(f, "acknowledgement of {outstanding} send(s)")
            }
        }
    }
}

/// Which coordinator a [`Coordinator`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CoordinatorRole {
    /// The group coordinator of the stage's consumer group: the leader of the group's
    /// `__consumer_offsets` partition. `TxnOffsetCommit` (the input offsets) waits on it.
    Group,
    /// The transaction coordinator of the stage's transactional id: the leader of the id's
    /// `__transaction_state` partition. `AddOffsetsToTxn` and `EndTxn` wait on it.
    Transaction,
}

impl CoordinatorRole {
    /// The internal topic whose partition leaders are coordinators of this role.
    pub fn topic(self) -> &'static str {
        match self {
            CoordinatorRole::Group => "__consumer_offsets",
            CoordinatorRole::Transaction => "__transaction_state",
        }
    }
}

/// A coordinator as the cluster's metadata shows it: the partition of its internal topic that
/// holds `key` (Kafka's `abs(key.hashCode()) % partitions`) and that partition's leader, the
/// coordinator's node (`None`: no leader, the coordinator is unavailable).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Coordinator {
    /// Group or transaction coordinator.
    pub role: CoordinatorRole,
    /// The group id or the transactional id.
    pub key: String,
    /// The partition of [`CoordinatorRole::topic`] that holds `key`.
    pub partition: i32,
    /// The partition's leader: the coordinator's broker (node) id.
    pub node: Option<i32>,
}

impl fmt::Display for Coordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (role, key) = match self.role {
            CoordinatorRole::Group => ("group coordinator of group", &self.key),
            CoordinatorRole::Transaction => {
                ("transaction coordinator of transactional id", &self.key)
            }
        };
        write!(
            f,
            "the {role} {key} ({} partition {}, ",
            self.role.topic(),
            self.partition
        )?;
        match self.node {
            Some(node) => write!(f, "node {node})"),
            None => write!(f, "no leader: unavailable)"),
        }
    }
}

/// `"1s"`, or `"1s (given up after 2500 ms: the coordinator moved)"`.
fn stalled_for(
    timeout: std::time::Duration,
    coordinator: Option<&Coordinator>,
    moved: Option<u64>,
) -> String {
    match (moved, coordinator.and_then(|c| c.node)) {
        (Some(waited), Some(node)) => {
            format!(
                "{timeout:?} (given up after {waited} ms: the coordinator moved to node {node})"
            )
        }
        (Some(waited), None) => {
            format!("{timeout:?} (given up after {waited} ms: the coordinator moved)")
        }
        (None, _) => format!("{timeout:?}"),
    }
}

/// `", waiting on the group coordinator of group g (…)"`, or nothing when not known.
fn waiting_on(coordinator: Option<&Coordinator>) -> String {
    coordinator.map_or_else(String::new, |c| format!(", waiting on {c}"))
}
