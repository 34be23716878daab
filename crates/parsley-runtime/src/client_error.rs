//! librdkafka's errors as the task layer's [`ClientError`]: its code and name, and the flags
//! of a transactional API error, with the library's error kept as the source.

use parsley_task::error;
use parsley_task::error::{ClientError, Error, KafkaCode, Operation, TransactionFlags};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// librdkafka's `code` as a [`KafkaCode`].
pub(crate) fn code(code: RDKafkaErrorCode) -> KafkaCode {
    KafkaCode::new(code as i32, format!("{code:?}"))
}

/// `e` as a [`ClientError`]: its code when it has one, the flags of a transactional API error,
/// and `e` itself as the source.
pub(crate) fn client_error(e: KafkaError) -> ClientError {
    let flags = match &e {
        KafkaError::Transaction(t) => Some(TransactionFlags {
            fatal: t.is_fatal(),
            retriable: t.is_retriable(),
            requires_abort: t.txn_requires_abort(),
        }),
        _ => None,
    };
    let error = ClientError::new(e.rdkafka_error_code().map(code), e.to_string());
    let error = match flags {
        Some(f) => error.transactional(f),
        None => error,
    };
    error.with_source(e)
}

/// A [`KafkaError::Client`](parsley_task::error::KafkaError::Client): `operation` failed with
/// librdkafka's error `source`.
pub(crate) fn kafka(operation: Operation, source: KafkaError) -> Error {
    Error::kafka(operation, client_error(source))
}

/// The same as [`kafka`], as the kind, to name what the call was about
/// ([`with_topic`](parsley_task::error::KafkaError::with_topic), …).
pub(crate) fn client(operation: Operation, source: KafkaError) -> error::KafkaError {
    error::KafkaError::client(operation, client_error(source))
}

/// The librdkafka error an [`KafkaError::Client`](parsley_task::error::KafkaError::Client) or
/// [`KafkaError::Send`](parsley_task::error::KafkaError::Send) was made from, when it was.
pub(crate) fn library_error(e: &Error) -> Option<&KafkaError> {
    match e {
        Error::Kafka(error::KafkaError::Client { source, .. })
        | Error::Kafka(error::KafkaError::Send { source, .. }) => {
            source.library_error()?.downcast_ref::<KafkaError>()
        }
        _ => None,
    }
}

/// Whether librdkafka's error `e` reports a connection state, not a lost record
/// ([`KafkaCode::is_transient`]): librdkafka recovers from it on its own.
pub(crate) fn transient(e: &KafkaError) -> bool {
    e.rdkafka_error_code()
        .is_some_and(|c| code(c).is_transient())
}

/// Whether librdkafka's `c` is a fence ([`KafkaCode::is_fencing`]).
pub(crate) fn fencing(c: RDKafkaErrorCode) -> bool {
    code(c).is_fencing()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use parsley_clock::{Channel, TopicId};
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode as C;

    use parsley_task::error;
    use parsley_task::error::{ClientError, Error};
    use parsley_task::error::{Operation, ProcessingError, RecordError, SetupError};

    use super::{client_error, code, fencing};

    /// The stage's recovery rule (`recoverable` in `stage.rs`), copied verbatim:
    /// [`Error::is_retriable`] must say the same for every error a stage returns.
    fn recoverable(e: &Error) -> bool {
        // Never a refusal for want of an ACL: redoing the transaction meets it again.
        let refused = |c: Option<&error::KafkaCode>| {
            c.and_then(error::KafkaCode::refused_resource_type)
                .is_some()
        };
        match e {
            Error::Kafka(error::KafkaError::Transaction { code, .. }) if refused(Some(code)) => {
                false
            }
            Error::Kafka(
                error::KafkaError::Client { source, .. } | error::KafkaError::Send { source, .. },
            ) if refused(source.code.as_ref()) => false,
            Error::Kafka(error::KafkaError::Transaction { fatal, code, .. }) => {
                !*fatal || code.is_fencing() || code.value == error::KafkaCode::INVALID_TXN_STATE
            }
            Error::Kafka(error::KafkaError::Send { .. }) => true,
            Error::Kafka(error::KafkaError::Client { source, .. }) => kafka_source(source)
                .is_some_and(|e| match e {
                    KafkaError::Transaction(t) => {
                        (!t.is_fatal() && (t.txn_requires_abort() || t.is_retriable()))
                            || fencing(t.code())
                            || t.code() == C::InvalidTransactionalState
                    }
                    _ => false,
                }),
            Error::Kafka(error::KafkaError::TransactionStalled { .. }) => true,
            _ => false,
        }
    }

    /// The librdkafka error a [`ClientError`] was made from.
    fn kafka_source(e: &ClientError) -> Option<&KafkaError> {
        e.library_error()?.downcast_ref::<KafkaError>()
    }

    fn transaction(c: C, fatal: bool, requires_abort: bool) -> Error {
        Error::Kafka(error::KafkaError::Transaction {
            operation: Operation::Commit,
            code: code(c),
            message: "librdkafka's message".into(),
            fatal,
            requires_abort,
        })
    }

    fn send(code: C) -> Error {
        Error::Kafka(error::KafkaError::Send {
            topic: "out".into(),
            channel: Box::new(Channel::new(TopicId::from_halves(1, 2), 0)),
            source: Box::new(client_error(KafkaError::MessageProduction(code))),
        })
    }

    fn kafka(source: KafkaError) -> Error {
        Error::kafka(Operation::Poll, client_error(source))
    }

    fn input() -> parsley_task::error::InputRecord {
        parsley_task::error::InputRecord {
            topic: "in".into(),
            partition: 0,
            offset: 7,
        }
    }

    fn output_refused(input: Option<parsley_task::error::InputRecord>, dead_letter: bool) -> Error {
        Error::Record(RecordError::OutputRefused {
            stage: "emit".into(),
            input: input.map(Box::new),
            dead_letter,
            topic: "out".into(),
            partition: 0,
            reason: Box::new(parsley_task::error::Refusal::TooLarge {
                size: 100_022,
                limit: Some(100_000),
                setting: parsley_task::error::PRODUCER_SIZE_LIMIT,
            }),
        })
    }

    #[test]
    fn an_output_refused_names_the_stage_its_input_the_record_and_the_limit() {
        assert_eq!(
            output_refused(Some(input()), false).to_string(),
            "stage emit: an output of input record in/0@7 to out/0 refused: 100022 B, its \
             headers included, is over the limit of 100000 B (message.max.bytes of the stage's \
             producer) (not retried)"
        );
        assert!(
            output_refused(Some(input()), true)
                .to_string()
                .starts_with("stage emit: the dead letter of input record in/0@7 to out/0")
        );
        assert!(
            output_refused(None, false)
                .to_string()
                .starts_with("stage emit: a record to out/0 refused")
        );
        // Named below the task (the producer's side), then by the task.
        let unnamed = Error::Record(RecordError::OutputRefused {
            stage: String::new(),
            input: None,
            dead_letter: false,
            topic: "out".into(),
            partition: 0,
            reason: Box::new(parsley_task::error::Refusal::Timestamp {
                timestamp: 1_000,
                skew_ms: -5,
                setting: parsley_task::error::TIMESTAMP_BEFORE_LIMIT,
                max_ms: None,
            }),
        });
        let named = unnamed.refused_in("emit", Some(input()), false);
        assert!(
            matches!(&named, Error::Record(RecordError::OutputRefused { stage, input: Some(i), .. })
                if stage == "emit" && **i == input()),
            "{named:?}"
        );
        assert!(named.to_string().contains(
            "record timestamp 1000 ms is 5 ms behind this host's clock, beyond \
             message.timestamp.before.max.ms of the topic"
        ));
        // Named once: a second naming changes nothing; other errors pass through.
        let again = named.refused_in("other", None, true);
        assert!(
            matches!(&again, Error::Record(RecordError::OutputRefused { stage, dead_letter: false, .. }) if stage == "emit")
        );
        let timeout = Error::Kafka(error::KafkaError::Timeout {
            what: error::Awaited::Flush,
            timeout: Duration::from_secs(1),
        });
        assert!(matches!(
            timeout.refused_in("emit", Some(input()), false),
            Error::Kafka(error::KafkaError::Timeout { .. })
        ));
    }

    fn fenced() -> Error {
        Error::Kafka(error::KafkaError::Fenced {
            transactional_id: "app.stage-0-0".into(),
            open_ms: 1_000,
            timeout_ms: 60_000,
            message: "fenced".into(),
        })
    }

    /// Which of [`Error::is_retriable`], [`Error::is_transient`] and [`Error::is_fatal`] holds
    /// (exactly one for every error below).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Class {
        Retriable,
        Transient,
        Fatal,
    }
    use Class::{Fatal, Retriable, Transient};

    /// [`Error::is_fenced`] holds.
    const FENCED: bool = true;
    const NOT_FENCED: bool = false;

    /// `(what, error, class, fenced)`.
    type Row = (&'static str, Error, Class, bool);

    fn consumer(code: C) -> Error {
        kafka(KafkaError::MessageConsumption(code))
    }

    fn rows() -> Vec<Row> {
        let lost = Error::Record(RecordError::RecordsLost {
            topic: "in".into(),
            partition: 0,
            from: 5,
            log_start: 50,
        });
        let deleted = Error::Record(RecordError::SourceDeleted {
            stage: "s".into(),
            topic: "in".into(),
        });
        let handler = Error::Processing(ProcessingError::Stage(
            parsley_stage::Error::InvalidTopology {
                problems: vec!["p".into()],
            },
        ));
        let mismatch = Error::Processing(ProcessingError::RestoreMismatch {
            stage: "s".into(),
            partition: 0,
            changelog: vec![],
            group: vec![],
        });
        let timeout = Error::Kafka(error::KafkaError::Timeout {
            what: error::Awaited::Flush,
            timeout: Duration::from_secs(1),
        });
        let blocked = Error::Processing(ProcessingError::RestoreBlocked {
            topic: "app.s.changelog".into(),
            partition: 0,
            last_stable_offset: 4,
            high_watermark: 5,
            timeout: Duration::from_secs(30),
            transaction_timeout: Duration::from_secs(60),
            producer: Some("app.s-a-0".into()),
        });
        let admin = Error::admin(Operation::Rebalance, "m".into());
        let panicked = Error::Processing(ProcessingError::StagePanicked {
            stage: "s".into(),
            message: Some("boom".into()),
        });
        let spawn = Error::Setup(SetupError::ThreadSpawn {
            stage: "s".into(),
            source: std::io::Error::other("no threads"),
        });
        let signals = Error::Setup(SetupError::Signals {
            source: std::io::Error::other("no handler"),
        });
        let listener = Error::Setup(SetupError::MetricsListener {
            address: ([127, 0, 0, 1], 9464).into(),
            source: std::io::Error::other("in use"),
        });
        let refused = Error::Record(RecordError::InvalidRecord {
            topic: "out".into(),
            problem: parsley_task::error::RecordProblem::ReservedHeader("ps".into()),
        });
        let too_large = output_refused(None, false);
        let too_large_input = output_refused(Some(input()), false);
        let dead_letter = output_refused(Some(input()), true);
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            // A failed transaction: aborted, every task back to its last commit.
            ("abortable transaction", transaction(C::NotEnoughReplicas, false, true), Retriable, NOT_FENCED),
            // Abortable, but refused for want of an ACL: redoing it meets the refusal again.
            ("refused abortable transaction", transaction(C::TopicAuthorizationFailed, false, true), Fatal, NOT_FENCED),
            ("refused send", send(C::TopicAuthorizationFailed), Fatal, NOT_FENCED),
            ("non-fatal transaction", transaction(C::CoordinatorNotAvailable, false, false), Retriable, NOT_FENCED),
            // A fence at the commit: the recovery tells a timed-out transaction from a zombie.
            ("_FENCED transaction", transaction(C::Fenced, true, false), Retriable, FENCED),
            ("PRODUCER_FENCED transaction", transaction(C::ProducerFenced, true, false), Retriable, FENCED),
            ("INVALID_PRODUCER_EPOCH transaction", transaction(C::InvalidProducerEpoch, true, false), Retriable, FENCED),
            ("fatal transaction", transaction(C::TransactionalIdAuthorizationFailed, true, false), Fatal, NOT_FENCED),
            // A fatal INVALID_TXN_STATE: the recovery's abort meets it and replaces the producer.
            ("INVALID_TXN_STATE transaction", transaction(C::InvalidTransactionalState, true, false), Retriable, NOT_FENCED),
            // A refused send: the abort decides.
            ("refused send", send(C::MessageTimedOut), Retriable, NOT_FENCED),
            ("fenced send", send(C::InvalidProducerEpoch), Retriable, FENCED),
            // A commit call that never returned: the producer is replaced.
            ("stalled commit call", Error::Kafka(error::KafkaError::TransactionStalled { operation: Operation::TxnOffsetCommit, timeout: Duration::from_secs(1), coordinator: None, moved: None }), Retriable, NOT_FENCED),
            // The zombie: another process runs as this instance.
            ("Fenced", fenced(), Fatal, FENCED),
            // The consumer's connection states.
            ("all brokers down", consumer(C::AllBrokersDown), Transient, NOT_FENCED),
            ("transport failure", consumer(C::BrokerTransportFailure), Transient, NOT_FENCED),
            ("operation timed out", consumer(C::OperationTimedOut), Transient, NOT_FENCED),
            ("request timed out", consumer(C::RequestTimedOut), Transient, NOT_FENCED),
            ("network exception", consumer(C::NetworkException), Transient, NOT_FENCED),
            ("metadata timed out", kafka(KafkaError::MetadataFetch(C::OperationTimedOut)), Transient, NOT_FENCED),
            // Other client errors.
            ("unknown topic", consumer(C::UnknownTopicOrPartition), Fatal, NOT_FENCED),
            ("offset out of range", consumer(C::AutoOffsetReset), Fatal, NOT_FENCED),
            ("fenced client call", kafka(KafkaError::MessageProduction(C::ProducerFenced)), Fatal, FENCED),
            ("no code", kafka(KafkaError::Canceled), Fatal, NOT_FENCED),
            // The data, the topics, the topology, the handler.
            ("RecordsLost", lost, Fatal, NOT_FENCED),
            ("SourceDeleted", deleted, Fatal, NOT_FENCED),
            ("Stage", handler, Fatal, NOT_FENCED),
            ("RestoreMismatch", mismatch, Fatal, NOT_FENCED),
            ("Timeout", timeout, Fatal, NOT_FENCED),
            ("RestoreBlocked", blocked, Fatal, NOT_FENCED),
            ("Admin", admin, Fatal, NOT_FENCED),
            // The stream thread itself.
            ("StagePanicked", panicked, Fatal, NOT_FENCED),
            ("ThreadSpawn", spawn, Fatal, NOT_FENCED),
            // The caller's: signal handlers, a refused record.
            ("Signals", signals, Fatal, NOT_FENCED),
            ("MetricsListener", listener, Fatal, NOT_FENCED),
            ("InvalidRecord", refused, Fatal, NOT_FENCED),
            // An output refused for good: never retried (the policy may take its input).
            ("OutputRefused", too_large, Fatal, NOT_FENCED),
            ("OutputRefused with its input", too_large_input, Fatal, NOT_FENCED),
            ("OutputRefused dead letter", dead_letter, Fatal, NOT_FENCED),
        ];
        rows
    }

    /// Checks one row, bare and wrapped once and twice in `StageFailed` (which every method
    /// looks through); the bare error must also follow the stage's recovery rule.
    fn check((what, error, class, fenced): Row) {
        assert_eq!(
            recoverable(&error),
            class == Retriable,
            "{what}: the stage's rule"
        );
        let error = Arc::new(error);
        let once = Arc::new(Error::StageFailed {
            stage: "s".into(),
            source: error.clone(),
        });
        let twice = Error::StageFailed {
            stage: "t".into(),
            source: once.clone(),
        };
        for (how, e) in [
            ("bare", &*error),
            ("wrapped", &*once),
            ("wrapped twice", &twice),
        ] {
            assert_eq!(
                (
                    e.is_retriable(),
                    e.is_transient(),
                    e.is_fatal(),
                    e.is_fenced()
                ),
                (
                    class == Retriable,
                    class == Transient,
                    class == Fatal,
                    fenced
                ),
                "{what} ({how}): (retriable, transient, fatal, fenced) of {e}"
            );
            assert!(std::ptr::eq(e.stage_error(), &*error), "{what} ({how})");
        }
    }

    #[test]
    fn each_error_is_classified_as_documented_through_any_stage_failed_wrapper() {
        for row in rows() {
            check(row);
        }
    }

    /// Transactional API errors (`KafkaError::Transaction`) come only from librdkafka: these
    /// are made by real calls — on a client without a transactional id, and against
    /// librdkafka's in-process mock cluster with injected broker errors.
    #[test]
    fn transactional_api_errors_are_classified_by_their_flags_and_code() {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::mocking::MockCluster;
        use rdkafka::producer::{BaseProducer, Producer};
        use rdkafka::{ClientConfig, Offset, TopicPartitionList};
        use rdkafka_sys::types::{RDKafkaApiKey, RDKafkaRespErr};

        let timeout = Duration::from_secs(10);
        let transactional = |e: &KafkaError| match e {
            KafkaError::Transaction(t) => (t.code(), t.is_fatal(), t.txn_requires_abort()),
            other => panic!("not a transactional API error: {other:?}"),
        };

        // Not transactional: neither fatal nor abortable.
        let plain: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("log_level", "0")
            .create()
            .unwrap();
        let not_configured = plain.begin_transaction().unwrap_err();
        let (_, fatal, abort) = transactional(&not_configured);
        assert!(!fatal && !abort, "{not_configured}");

        let mock = MockCluster::new(1).unwrap();
        mock.create_topic("in", 1, 1).unwrap();
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", mock.bootstrap_servers())
            .set("transactional.id", "parsley-error-classification")
            .set("log_level", "0")
            .create()
            .unwrap();
        producer.init_transactions(timeout).unwrap();
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", mock.bootstrap_servers())
            .set("group.id", "parsley-error-classification")
            .set("log_level", "0")
            .create()
            .unwrap();
        let group = consumer.group_metadata().unwrap();
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset("in", 0, Offset::Offset(1))
            .unwrap();

        // Abortable for librdkafka: the group is not authorised for the offsets' commit (fatal
        // for the stage: a refusal for want of an ACL is never redone).
        producer.begin_transaction().unwrap();
        mock.request_errors(
            RDKafkaApiKey::AddOffsetsToTxn,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED],
        );
        let abortable = producer
            .send_offsets_to_transaction(&offsets, &group, timeout)
            .unwrap_err();
        let (code, fatal, abort) = transactional(&abortable);
        assert!(!fatal && abort && !fencing(code), "{abortable}");
        producer.abort_transaction(timeout).unwrap();

        // Retriable, not abortable: the coordinator answers `AddOffsetsToTxn` with a retriable
        // error past the call's timeout (as a coordinator that moved does).
        producer.begin_transaction().unwrap();
        mock.request_errors(
            RDKafkaApiKey::AddOffsetsToTxn,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS; 200],
        );
        let retriable = producer
            .send_offsets_to_transaction(&offsets, &group, Duration::from_millis(300))
            .unwrap_err();
        let (code, fatal, abort) = transactional(&retriable);
        let may_retry = matches!(&retriable, KafkaError::Transaction(t) if t.is_retriable());
        assert!(
            may_retry && !fatal && !abort && !fencing(code),
            "{retriable}"
        );
        mock.clear_request_errors(RDKafkaApiKey::AddOffsetsToTxn);
        producer.abort_transaction(timeout).unwrap();

        // A commit that timed out while its EndTxn is retried: "retry call to resume"; an abort
        // meanwhile is refused with _CONFLICT (the stage's recovery replaces the producer).
        producer.begin_transaction().unwrap();
        producer
            .send_offsets_to_transaction(&offsets, &group, timeout)
            .unwrap();
        mock.request_errors(
            RDKafkaApiKey::EndTxn,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS; 200],
        );
        let timed_out = producer
            .commit_transaction(Duration::from_millis(300))
            .unwrap_err();
        let (_, fatal, abort) = transactional(&timed_out);
        assert!(!fatal && !abort, "{timed_out}");
        let refused = producer.abort_transaction(timeout).unwrap_err();
        assert!(
            matches!(&refused, KafkaError::Transaction(t) if t.code() == C::Conflict),
            "{refused}"
        );
        mock.clear_request_errors(RDKafkaApiKey::EndTxn);
        producer.commit_transaction(timeout).unwrap();

        // Fenced at the commit: fatal, with a fence code. (An empty transaction's commit sends
        // nothing, so the offsets go in first.)
        producer.begin_transaction().unwrap();
        producer
            .send_offsets_to_transaction(&offsets, &group, timeout)
            .unwrap();
        mock.request_errors(
            RDKafkaApiKey::EndTxn,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED],
        );
        let fenced = producer.commit_transaction(timeout).unwrap_err();
        let (code, fatal, _) = transactional(&fenced);
        assert!(fatal && fencing(code), "{fenced}");

        for row in [
            ("not configured", kafka(not_configured), Fatal, NOT_FENCED),
            ("abortable but refused", kafka(abortable), Fatal, NOT_FENCED),
            ("retriable", kafka(retriable), Retriable, NOT_FENCED),
            ("fenced", kafka(fenced), Retriable, FENCED),
        ] {
            check(row);
        }
    }

    #[test]
    fn a_stage_failure_names_the_stage_and_its_cause() {
        let cause = Arc::new(Error::Record(RecordError::RecordsLost {
            topic: "in".into(),
            partition: 3,
            from: 5,
            log_start: 50,
        }));
        let e = Error::StageFailed {
            stage: "count".into(),
            source: cause.clone(),
        };
        assert_eq!(e.to_string(), format!("stage count failed: {cause}"));
        let source = std::error::Error::source(&e).expect("the stage's error is the source");
        assert_eq!(source.to_string(), cause.to_string());
        assert!(matches!(
            e.stage_error(),
            Error::Record(RecordError::RecordsLost {
                partition: 3,
                from: 5,
                log_start: 50,
                ..
            })
        ));
        let panicked = Error::Processing(ProcessingError::StagePanicked {
            stage: "count".into(),
            message: Some("boom".into()),
        });
        assert_eq!(
            panicked.to_string(),
            "stage count: its stream thread panicked: boom"
        );
        let silent = Error::Processing(ProcessingError::StagePanicked {
            stage: "count".into(),
            message: None,
        });
        assert_eq!(
            silent.to_string(),
            "stage count: its stream thread panicked"
        );
    }
}
