//! The Kafka layer's part of [`Error`](super::Error): a client's error as the runtime reports it,
//! without the client library's types, so that the task layer and the test driver build with no
//! Kafka client at all.
//!
//! The runtime makes a [`ClientError`] from each librdkafka error it meets (keeping that error
//! as the [`source`](std::error::Error::source)), with librdkafka's code and, for a
//! transactional API error, librdkafka's flags; the classification of
//! [`Error`](super::Error) reads only these.

use std::fmt;

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

/// A Kafka client's error: what [`Error::Kafka`](super::Error::Kafka) and
/// [`Error::Send`](super::Error::Send) hold.
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
