//! One value of every variant of [`Error`]: its classification (retriable, transient, fatal,
//! fenced), bare and wrapped in `StageFailed`, and its message. The table pins both, so a
//! change to the error type's shape cannot change what an error means or says.

use std::sync::Arc;
use std::time::Duration;

use parsley_clock::{Channel, Coordinate, SenderId, SenderTag, TopicId};
use parsley_stage::KeyPartitioning;
use parsley_task::Error;
use parsley_task::error::{
    ClientError, InputRecord, KafkaCode, PRODUCER_SIZE_LIMIT, RecordProblem, Refusal,
    TransactionFlags,
};
use parsley_task::error::{
    Coordinator, CoordinatorRole, KafkaError, Operation, ProcessingError, RecordError, SetupError,
};

/// Which of retriable, transient and fatal holds, and whether the error is a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Retriable,
    Transient,
    Fatal,
    /// Retriable and a fence.
    RetriableFenced,
    /// Fatal and a fence.
    FatalFenced,
}
use Class::{Fatal, FatalFenced, Retriable, RetriableFenced, Transient};

fn channel() -> Channel {
    Channel::new(TopicId::from_halves(1, 2), 3)
}

fn client(code: i32, name: &str) -> ClientError {
    ClientError::new(
        Some(KafkaCode::new(code, name)),
        format!("{name} (message)"),
    )
}

fn transactional(code: i32, name: &str, flags: TransactionFlags) -> ClientError {
    client(code, name).transactional(flags)
}

fn io() -> std::io::Error {
    std::io::Error::other("os error")
}

fn input() -> InputRecord {
    InputRecord {
        topic: "in".into(),
        partition: 0,
        offset: 7,
    }
}

/// `(what, error, class, message)`.
#[allow(clippy::too_many_lines)]
fn rows() -> Vec<(&'static str, Error, Class, &'static str)> {
    let abort = TransactionFlags {
        fatal: false,
        retriable: false,
        requires_abort: true,
    };
    let fatal = TransactionFlags {
        fatal: true,
        retriable: false,
        requires_abort: false,
    };
    vec![
        (
            "Kafka, transient",
            Error::kafka(
                Operation::Poll,
                client(KafkaCode::TRANSPORT, "BrokerTransportFailure"),
            ),
            Transient,
            "polling: BrokerTransportFailure (message)",
        ),
        (
            "Kafka, plain",
            Error::kafka(Operation::Subscribe, ClientError::new(None, "no code")),
            Fatal,
            "subscribing: no code",
        ),
        (
            "Kafka, fenced client call",
            Error::kafka(
                Operation::CreateProducer,
                client(KafkaCode::PRODUCER_FENCED, "ProducerFenced"),
            ),
            FatalFenced,
            "creating the producer: ProducerFenced (message)",
        ),
        (
            "Kafka, abortable transactional call",
            Error::kafka(
                Operation::SendOffsetsToTransaction,
                transactional(49, "InvalidTxnState", abort),
            ),
            Retriable,
            "sending offsets to the transaction: InvalidTxnState (message)",
        ),
        (
            "Kafka, fenced transactional call",
            Error::kafka(
                Operation::BeginTransaction,
                transactional(KafkaCode::FENCED, "Fenced", fatal),
            ),
            RetriableFenced,
            "beginning a transaction: Fenced (message)",
        ),
        (
            "Kafka, fatal transactional call",
            Error::kafka(
                Operation::InitTransactions,
                transactional(53, "TransactionalIdAuthorizationFailed", fatal),
            ),
            Fatal,
            "initialising transactions: TransactionalIdAuthorizationFailed (message)",
        ),
        (
            "Transaction, abortable",
            Error::Kafka(KafkaError::Transaction {
                operation: Operation::CommitTransaction,
                code: KafkaCode::new(49, "InvalidTxnState"),
                message: "m".into(),
                fatal: false,
                requires_abort: true,
            }),
            Retriable,
            "committing the transaction: InvalidTxnState: m (the transaction must be aborted)",
        ),
        (
            "Transaction, fenced",
            Error::Kafka(KafkaError::Transaction {
                operation: Operation::CommitTransaction,
                code: KafkaCode::new(KafkaCode::PRODUCER_FENCED, "ProducerFenced"),
                message: "m".into(),
                fatal: true,
                requires_abort: false,
            }),
            RetriableFenced,
            "committing the transaction: ProducerFenced: m (fatal)",
        ),
        (
            "Transaction, fatal",
            Error::Kafka(KafkaError::Transaction {
                operation: Operation::CommitTransaction,
                code: KafkaCode::new(53, "TransactionalIdAuthorizationFailed"),
                message: "m".into(),
                fatal: true,
                requires_abort: false,
            }),
            Fatal,
            "committing the transaction: TransactionalIdAuthorizationFailed: m (fatal)",
        ),
        (
            "Transaction, abortable but refused for want of an ACL",
            Error::Kafka(KafkaError::Transaction {
                operation: Operation::SendOffsetsToTransaction,
                code: KafkaCode::new(30, "GroupAuthorizationFailed"),
                message: "m".into(),
                fatal: false,
                requires_abort: true,
            }),
            Fatal,
            "sending offsets to the transaction: GroupAuthorizationFailed: m (the transaction must be aborted)",
        ),
        (
            "Security",
            Error::Kafka(KafkaError::Security {
                listener: "localhost:9093".into(),
                protocol: "SASL_SSL".into(),
                mechanism: Some("SCRAM-SHA-512".into()),
                client: "consumer",
                code: KafkaCode::new(-169, "Authentication"),
                message: "bad password".into(),
            }),
            Fatal,
            "the consumer client cannot connect securely to localhost:9093 (SASL_SSL, SASL mechanism SCRAM-SHA-512): Authentication: bad password",
        ),
        (
            "Authorization",
            Error::Kafka(KafkaError::authorization(
                Operation::InitTransactions,
                parsley_task::error::AclResource::named(
                    parsley_task::error::ResourceType::TransactionalId,
                    "app.s-a-0",
                ),
                "producer",
                KafkaCode::new(53, "TransactionalIdAuthorizationFailed"),
                "Transactional Id authorization failed",
            )),
            Fatal,
            "initialising transactions: the producer client is not authorized on TransactionalId app.s-a-0 (TransactionalIdAuthorizationFailed: Transactional Id authorization failed): no ACL allows this principal the operation",
        ),
        (
            "Admin",
            Error::admin(Operation::Rebalance, "m".into()),
            Fatal,
            "rebalancing: m",
        ),
        (
            "Send",
            Error::Kafka(KafkaError::Send {
                topic: "out".into(),
                channel: Box::new(channel()),
                source: Box::new(client(-192, "MessageTimedOut")),
            }),
            Retriable,
            "send to 00000000-0000-0001-0000-000000000002/3 (topic out) failed: MessageTimedOut (message)",
        ),
        (
            "Send, fenced",
            Error::Kafka(KafkaError::Send {
                topic: "out".into(),
                channel: Box::new(channel()),
                source: Box::new(client(
                    KafkaCode::INVALID_PRODUCER_EPOCH,
                    "InvalidProducerEpoch",
                )),
            }),
            RetriableFenced,
            "send to 00000000-0000-0001-0000-000000000002/3 (topic out) failed: InvalidProducerEpoch (message)",
        ),
        (
            "Fenced",
            Error::Kafka(KafkaError::Fenced {
                transactional_id: "app.s-0".into(),
                open_ms: 1_000,
                timeout_ms: 60_000,
                message: "fenced".into(),
            }),
            FatalFenced,
            "transactional id app.s-0 was taken by another producer while this stage's transaction had been open 1000 ms, less than transaction.timeout.ms (60000 ms): another process runs with this instance id, so this stage gives up its tasks (fenced)",
        ),
        (
            "TransactionStalled",
            Error::Kafka(KafkaError::TransactionStalled {
                operation: Operation::EndTxn,
                timeout: Duration::from_secs(1),
                coordinator: None,
                moved: None,
            }),
            Retriable,
            "committing the transaction (EndTxn to the transaction coordinator) did not return within 1s: the producer is replaced, which aborts the transaction",
        ),
        (
            "TransactionStalled",
            Error::Kafka(KafkaError::TransactionStalled {
                operation: Operation::TxnOffsetCommit,
                timeout: Duration::from_secs(10),
                coordinator: Some(Coordinator {
                    role: CoordinatorRole::Group,
                    key: "app.s".into(),
                    partition: 3,
                    node: None,
                }),
                moved: None,
            }),
            Retriable,
            "sending the input offsets to the transaction (TxnOffsetCommit to the group coordinator) did not return within 10s, waiting on the group coordinator of group app.s (__consumer_offsets partition 3, no leader: unavailable): the producer is replaced, which aborts the transaction",
        ),
        (
            "TransactionStalled",
            Error::Kafka(KafkaError::TransactionStalled {
                operation: Operation::EndTxn,
                timeout: Duration::from_secs(10),
                coordinator: Some(Coordinator {
                    role: CoordinatorRole::Transaction,
                    key: "app.s-i-0".into(),
                    partition: 5,
                    node: Some(2),
                }),
                moved: Some(2_500),
            }),
            Retriable,
            "committing the transaction (EndTxn to the transaction coordinator) did not return within 10s (given up after 2500 ms: the coordinator moved to node 2), waiting on the transaction coordinator of transactional id app.s-i-0 (__transaction_state partition 5, node 2): the producer is replaced, which aborts the transaction",
        ),
        (
            "Timeout",
            Error::Kafka(KafkaError::Timeout {
                what: parsley_task::error::Awaited::Flush,
                timeout: Duration::from_secs(2),
            }),
            Fatal,
            "flushing the producer did not complete within 2s",
        ),
        (
            "UnknownTopic",
            Error::Setup(SetupError::UnknownTopic { topic: "in".into() }),
            Fatal,
            "topic in does not exist (topics are not created automatically)",
        ),
        (
            "UnknownStage",
            Error::Setup(SetupError::UnknownStage("s".into())),
            Fatal,
            "no stage named s in the topology",
        ),
        (
            "UnsupportedGroupProtocol",
            Error::Setup(SetupError::UnsupportedGroupProtocol {
                protocol: "consumer".into(),
            }),
            Fatal,
            "consumer property group.protocol=consumer: Parsley stages need the classic group protocol (KIP-848's consumer protocol assigns partitions on the broker and moves them one by one, so a stage can neither keep a task's co-partitioned sources together nor commit the task before a partition of it moves); remove the property or set it to classic",
        ),
        (
            "NotCoPartitioned",
            Error::Setup(SetupError::NotCoPartitioned {
                stage: "s".into(),
                partitions: vec![("a".into(), 2), ("b".into(), 3)],
            }),
            Fatal,
            "stage s: source topics are not co-partitioned: a has 2, b has 3",
        ),
        (
            "ChangelogPartitions",
            Error::Setup(SetupError::ChangelogPartitions {
                topic: "app.s.changelog".into(),
                partitions: 2,
                expected: 3,
            }),
            Fatal,
            "changelog topic app.s.changelog has 2 partitions, the stage's sources have 3",
        ),
        (
            "InternalTopicPartitions",
            Error::Setup(SetupError::InternalTopicPartitions {
                topic: "app.r".into(),
                partitions: 2,
                expected: 3,
            }),
            Fatal,
            "internal topic app.r has 2 partitions, the topics it is co-partitioned with have 3",
        ),
        (
            "ThreadSpawn",
            Error::Setup(SetupError::ThreadSpawn {
                stage: "s".into(),
                source: io(),
            }),
            Fatal,
            "stage s: cannot spawn its stream thread: os error",
        ),
        (
            "MetricsListener",
            Error::Setup(SetupError::MetricsListener {
                address: ([127, 0, 0, 1], 9464).into(),
                source: io(),
            }),
            Fatal,
            "cannot serve metrics at 127.0.0.1:9464: os error",
        ),
        (
            "Signals",
            Error::Setup(SetupError::Signals { source: io() }),
            Fatal,
            "cannot install the handlers of SIGINT and SIGTERM: os error",
        ),
        (
            "MalformedStamp",
            Error::Record(RecordError::MalformedStamp {
                topic: "in".into(),
                partition: 3,
                offset: 7,
                record: Coordinate {
                    channel: channel(),
                    offset: 7,
                },
                source: Box::new(parsley_clock::Error::NegativeOffset {
                    channel: channel(),
                    offset: -1,
                }),
            }),
            Fatal,
            "impossible stamp on record in/3@7 (channel 00000000-0000-0001-0000-000000000002/3): offset -1 on channel 00000000-0000-0001-0000-000000000002/3 is negative; a clock entry claims offsets >= 0",
        ),
        (
            "ImpossibleStamp",
            Error::Record(RecordError::ImpossibleStamp {
                stage: "s".into(),
                topic: "in".into(),
                stamp: Box::new(parsley_gate::ImpossibleStamp {
                    record: Coordinate {
                        channel: channel(),
                        offset: 7,
                    },
                    sender: Some(SenderTag {
                        sender: SenderId::from_bytes([1; 16]),
                        seq: 4,
                    }),
                    claim: Coordinate {
                        channel: channel(),
                        offset: 9,
                    },
                    reason: parsley_gate::ImpossibleReason::SelfClaim,
                }),
            }),
            Fatal,
            "stage s: impossible stamp on record in/3@7 (channel 00000000-0000-0001-0000-000000000002/3@7) from sender 01010101-0101-0101-0101-010101010101#4: claims 00000000-0000-0001-0000-000000000002/3@9 (a claim on its own channel at or beyond its own offset)",
        ),
        (
            "InvalidRecord",
            Error::Record(RecordError::InvalidRecord {
                topic: "out".into(),
                problem: RecordProblem::Timestamp(0),
            }),
            Fatal,
            "record for topic out refused: timestamp 0 ms is not after the epoch",
        ),
        (
            "OutputRefused",
            Error::Record(RecordError::OutputRefused {
                stage: "s".into(),
                input: Some(Box::new(input())),
                dead_letter: false,
                topic: "out".into(),
                partition: 0,
                reason: Box::new(Refusal::TooLarge {
                    size: 100_022,
                    limit: Some(100_000),
                    setting: PRODUCER_SIZE_LIMIT,
                }),
            }),
            Fatal,
            "stage s: an output of input record in/0@7 to out/0 refused: 100022 B, its headers included, is over the limit of 100000 B (message.max.bytes of the stage's producer) (not retried)",
        ),
        (
            "RecordsLost",
            Error::Record(RecordError::RecordsLost {
                topic: "in".into(),
                partition: 0,
                from: 5,
                log_start: 50,
            }),
            Fatal,
            "in/0: records [5, 50) were deleted before this stage delivered them (it needed offset 5 next; the log now starts at 50)",
        ),
        (
            "SourceChanged",
            Error::Record(RecordError::SourceChanged {
                stage: "s".into(),
                topic: "in".into(),
                partitions: (2, 3),
                recreated: true,
                ids: (TopicId::from_halves(1, 2), TopicId::from_halves(3, 4)),
            }),
            Fatal,
            "stage s: source topic in changed while the stage runs: partitions 2 -> 3, and it was recreated (topic id 00000000-0000-0001-0000-000000000002 -> 00000000-0000-0003-0000-000000000004)",
        ),
        (
            "SourceDeleted",
            Error::Record(RecordError::SourceDeleted {
                stage: "s".into(),
                topic: "in".into(),
            }),
            Fatal,
            "stage s: source topic in was deleted while the stage runs (a topic created again under that name is a new channel, read from its log start when the stage starts again)",
        ),
        (
            "KeyPartitionMismatch",
            Error::Record(RecordError::KeyPartitionMismatch {
                stage: "s".into(),
                topic: "in".into(),
                partition: 0,
                offset: 7,
                key: "\"k\"".into(),
                partitioner: KeyPartitioning::Murmur2,
                expected: 1,
                partitions: 2,
                matches: Some(KeyPartitioning::Crc32),
            }),
            Fatal,
            "stage s: record in/0@7 has key \"k\", which murmur2 puts on partition 1 of 2; it is where CRC32 puts it: its writer uses librdkafka's default partitioner (consistent_random, as clients built on librdkafka do: C, Python, Go, .NET, Rust's rdkafka); declare it on the stage with .key_partitioning(\"in\", KeyPartitioning::Crc32), or in the DSL read it with Consumed::default().key_partitioning(KeyPartitioning::Crc32)",
        ),
        (
            "KeylessRecord",
            Error::Record(RecordError::KeylessRecord {
                stage: "s".into(),
                topic: "in".into(),
                partition: 0,
                offset: 7,
            }),
            Fatal,
            "stage s: record in/0@7 has no key, and the stage keeps fold state by key (a stage whose handler's State is () takes records without a key)",
        ),
        (
            "NoEventTime",
            Error::Record(RecordError::NoEventTime {
                stage: "s".into(),
                topic: "in".into(),
                partition: 0,
                offset: 7,
            }),
            Fatal,
            "stage s: record in/0@7 has no timestamp, so no event time",
        ),
        (
            "Stage",
            Error::Processing(ProcessingError::Stage(
                parsley_stage::Error::InvalidTopology {
                    problems: vec!["p".into()],
                },
            )),
            Fatal,
            "invalid topology: p",
        ),
        (
            "Gate",
            Error::Processing(ProcessingError::Gate {
                stage: "s".into(),
                partition: 3,
                source: Box::new(parsley_gate::GateError::NotSeeded { channel: channel() }),
            }),
            Fatal,
            "stage s, task 3: channel 00000000-0000-0001-0000-000000000002/3 is not seeded",
        ),
        (
            "Clock",
            Error::from(parsley_clock::Error::NegativeOffset {
                channel: channel(),
                offset: -1,
            }),
            Fatal,
            "clock: offset -1 on channel 00000000-0000-0001-0000-000000000002/3 is negative; a clock entry claims offsets >= 0",
        ),
        (
            "StateStore",
            Error::Processing(ProcessingError::StateStore {
                path: "/tmp/state".into(),
                message: "locked".into(),
            }),
            Fatal,
            "state store /tmp/state: locked",
        ),
        (
            "Changelog",
            Error::Processing(ProcessingError::Changelog {
                topic: "app.s.changelog".into(),
                partition: 0,
                offset: 7,
                message: "bad".into(),
            }),
            Fatal,
            "changelog app.s.changelog/0@7: bad",
        ),
        (
            "RestoreMismatch",
            Error::Processing(ProcessingError::RestoreMismatch {
                stage: "s".into(),
                partition: 0,
                changelog: vec!["in/0@5".into()],
                group: vec!["in/0@6".into()],
            }),
            Fatal,
            "stage s, task 0: the changelog's snapshot was committed with input offsets [\"in/0@5\"], the group's committed offsets are [\"in/0@6\"]",
        ),
        (
            "RestoreBlocked",
            Error::Processing(ProcessingError::RestoreBlocked {
                topic: "app.s.changelog".into(),
                partition: 0,
                last_stable_offset: 4,
                high_watermark: 5,
                timeout: Duration::from_secs(30),
                transaction_timeout: Duration::from_secs(60),
                producer: Some("app.s-a-0".into()),
            }),
            Fatal,
            "restoring app.s.changelog/0: the read stopped at the last stable offset 4, below the high watermark 5: a transaction open on the partition since offset 4, by the producer with transactional id app.s-a-0, did not end within 30s; it ends when its producer commits or aborts it, or when the coordinator aborts it after that producer's transaction.timeout.ms (this stage's producers: 60s)",
        ),
        (
            "EventTime",
            Error::Processing(ProcessingError::EventTime {
                stage: "s".into(),
                partition: 0,
                message: "bad".into(),
            }),
            Fatal,
            "stage s, task 0: event-time state: bad",
        ),
        (
            "StagePanicked",
            Error::Processing(ProcessingError::StagePanicked {
                stage: "s".into(),
                message: Some("boom".into()),
            }),
            Fatal,
            "stage s: its stream thread panicked: boom",
        ),
    ]
}

#[test]
fn every_variant_keeps_its_classification_and_its_message() {
    for (what, error, class, message) in rows() {
        let expected = (
            matches!(class, Retriable | RetriableFenced),
            class == Transient,
            matches!(class, Fatal | FatalFenced),
            matches!(class, RetriableFenced | FatalFenced),
        );
        if !message.is_empty() {
            assert_eq!(error.to_string(), message, "{what}: message");
        }
        let text = error.to_string();
        let error = Arc::new(error);
        let once = Arc::new(Error::StageFailed {
            stage: "s".into(),
            source: error.clone(),
        });
        let twice = Error::StageFailed {
            stage: "t".into(),
            source: once.clone(),
        };
        assert_eq!(
            once.to_string(),
            format!("stage s failed: {text}"),
            "{what}"
        );
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
                expected,
                "{what} ({how}): (retriable, transient, fatal, fenced)"
            );
            assert!(std::ptr::eq(e.stage_error(), &*error), "{what} ({how})");
        }
    }
}

#[test]
fn the_table_has_a_row_for_every_variant() {
    let mut names: Vec<&str> = rows()
        .into_iter()
        .map(|(what, ..)| what.split(',').next().unwrap())
        .collect();
    names.dedup();
    // Every variant of the error type but `StageFailed`, which every row is wrapped in.
    assert_eq!(names.len(), 37, "{names:?}");
}

#[test]
fn the_error_stays_small() {
    // Below clippy's `result_large_err` bound (128 bytes): every `Result` of the crates
    // carries one.
    assert!(
        std::mem::size_of::<Error>() < 128,
        "{}",
        std::mem::size_of::<Error>()
    );
}

/// A Kafka error names what its call was about in the words the free-text operation had.
#[test]
fn an_operation_names_its_topic_partition_offset_or_group_as_before() {
    use parsley_task::error::{KafkaError, Operation};
    let client = |op| KafkaError::client(op, ClientError::new(None, "m"));
    let admin = |op| KafkaError::admin(op, "m".into());
    let cases = [
        (
            client(Operation::CreateConsumer).with_group("app"),
            "creating the consumer of group app: m",
        ),
        (
            client(Operation::Seek)
                .with_partition("in", 3)
                .with_offset(7),
            "seeking in/3 to 7: m",
        ),
        (
            client(Operation::AbortAfter).with_cause(&"the cause"),
            "aborting after: the cause: m",
        ),
        (
            client(Operation::DeleteRecords).with_partition("in", 0),
            "deleting records of in/0: m",
        ),
        (
            admin(Operation::DeleteRecords)
                .with_partition("in", 0)
                .with_offset(5),
            "deleting records of in/0 below 5: m",
        ),
        (
            admin(Operation::DescribeTopic).with_topic("in"),
            "describing topic in: m",
        ),
        (
            admin(Operation::CreateTopics).with_topics(["a", "b"]),
            "creating topics [\"a\", \"b\"]: m",
        ),
        (admin(Operation::CreateTopics), "creating topics: m"),
        (
            admin(Operation::ListPartitionOffsets).with_partition("in", 2),
            "listing the offsets of in/2: m",
        ),
        (
            admin(Operation::DescribeGroup).with_group("app"),
            "describing group app: m",
        ),
        (
            admin(Operation::DescribeConfig).with_topic("out"),
            "describing the configuration of out: m",
        ),
    ];
    for (e, text) in cases {
        assert_eq!(e.to_string(), text);
        assert_eq!(Error::from(e).to_string(), text);
    }
    assert_eq!(Operation::Poll, "polling");
    assert_eq!(Operation::Poll.to_string(), "polling");
}
