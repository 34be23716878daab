//! Kafka I/O for Parsley: stream threads, transactions, stamps on every output.
//!
//! A [`Runtime`] runs the stages of a [`Topology`](parsley_stage::Topology). Each stage is one
//! consumer group (`read_committed`, range assignment over co-partitioned sources); each of its
//! tasks (partition `p` of every source) delivers records through a
//! [`Gate`](parsley_gate::Gate), hands them to the stage's handler, stamps every emission with
//! the task's node clock and commits outputs and input offsets in one Kafka transaction per
//! commit interval (EOS v2). [`CausalProducer`] stamps the records of plain producers that
//! feed a topology. [`Admin`] resolves topic names to topic UUIDs (KIP-516) and creates and
//! deletes topics, waiting for the cluster to show the result, and manages ACLs ([`Acl`]).
//!
//! On a cluster with an authorizer, a request refused for want of an ACL ends a stage (or a
//! `CausalProducer` call) with [`KafkaError::Authorization`] naming the topic, group,
//! transactional id or the cluster ([`AclResource`]); it is never retried. The book's operations
//! chapter lists the ACLs each part needs.
//!
//! ```no_run
//! use parsley_runtime::{Runtime, RuntimeConfig};
//! # fn topology() -> parsley_stage::Topology { unimplemented!() }
//! let running = Runtime::new(topology(), RuntimeConfig::new("127.0.0.1:9092")).start()?;
//! // … wait for progress events …
//! for (stage, metrics) in running.stop()? {
//!     println!("{stage}: {} delivered", metrics.committed_deliveries);
//! }
//! # Ok::<(), parsley_runtime::Error>(())
//! ```
//!
//! A service that runs until it is told to stop makes one call:
//! [`Runtime::run_until_signal`] starts every stage and returns when SIGINT or SIGTERM arrives
//! (after stopping every stage cleanly: each commits first) or when a stage fails (after
//! stopping the others, with that stage's error). [`Running::wait_for_signal`] does the same
//! for stages already started. Neither touches a signal's disposition before it is called; what
//! they do to SIGINT and SIGTERM is described at [`Running::wait_for_signal`].
//!
//! ```no_run
//! use parsley_runtime::{Runtime, RuntimeConfig};
//! # fn topology() -> parsley_stage::Topology { unimplemented!() }
//! let stopped = Runtime::new(topology(), RuntimeConfig::new("127.0.0.1:9092")).run_until_signal()?;
//! for (stage, metrics) in stopped {
//!     println!("{stage}: {} delivered", metrics.committed_deliveries);
//! }
//! # Ok::<(), parsley_runtime::Error>(())
//! ```
//!
//! The causal vocabulary a caller meets in these signatures — [`Channel`], [`Coordinate`],
//! [`Stamp`], [`Clock`], [`SenderId`], … — is re-exported from `parsley-clock`, and the Kafka
//! client from [`rdkafka`] (the version whose messages [`CausalProducer::observe_message`]
//! takes), so a service needs no other dependency for them.
//!
//! Each stage keeps its tasks' fold state and Parsley's own state (clock, sender sequence,
//! gate snapshot) in a compacted changelog topic, `{application}.{stage}.changelog`, written
//! in the same transaction and restored exactly on assignment. A transaction that cannot commit
//! is aborted and the stage's tasks return to their last commit in place; any other error stops
//! the stage and reaches the caller typed ([`Error`], with its classification).
//!
//! Stages that order by event time ([`EventTimeOrder`](parsley_stage::EventTimeOrder)) are
//! driven here too: end offsets read at task start, the live-head evidence of each fetch, the
//! timer queue changelogged with the task's state, and the built-in clock, whose ticks the
//! runtime writes inside its own transactions. All of it runs under injected faults — `kill -9`,
//! a crash between a changelog write and its commit, instances joining and leaving, broker
//! restarts — in the repository's fault-injection suite (`cargo xtask chaos`).
//!
//! With [`RuntimeConfig::metrics_address`] set, the stages started serve their metrics in the
//! Prometheus text format (`/metrics`) and health probes (`/health/live`, `/health/ready`) over
//! HTTP until they are stopped ([`Running::metrics_address`] says where).
//!
//! [`Running::store`] reads a running stage's state from outside it — a store's value of a
//! key, a range, all — and [`ReadOnlyStore::get_at_least`] reads it once the key's task has
//! delivered what a causal stamp claims (module [`query`]).
//!
//! A [`TopologyTestDriver`] runs a topology in memory, with no broker, through the same tasks
//! (gate, stamping, fold state, event-time order, changelog and restore): module [`driver`].
//! Every output is stamped with what its task had delivered, the record it was handed included:
//!
//! ```
//! use parsley_runtime::TopologyTestDriver;
//! use parsley_stage::{Handler, HandlerResult, Record, Step, Topology, Utf8};
//!
//! /// Writes one invoice per order.
//! struct Invoice;
//! impl Handler for Invoice {
//!     type Key = String;
//!     type Value = String;
//!     type Output = String;
//!     type State = ();
//!     fn handle(&self, r: Record<'_, String, String>, _: Option<()>)
//!         -> HandlerResult<String, String, ()>
//!     {
//!         Ok(Step::none().emit("invoices", r.key, format!("invoice for {}", r.value)))
//!     }
//! }
//!
//! let topology = Topology::builder("shop")
//!     .stage("invoice", Invoice, |s| {
//!         s.source("orders").sink("invoices")
//!             .key_codec(Utf8).value_codec(Utf8).output_codec(Utf8)
//!     })
//!     .build()?;
//! let driver = TopologyTestDriver::builder(topology).build()?;
//! let order = driver.input_topic("orders", Utf8, Utf8)?.pipe("alice".into(), "2 kg".into())?;
//!
//! let invoice = driver.output_topic("invoices", Utf8, Utf8)?.read_record().unwrap();
//! assert_eq!(invoice.value, "invoice for 2 kg");
//! assert!(invoice.stamp.unwrap().clock.covers(order)); // the invoice claims its order
//! # Ok::<(), parsley_runtime::Error>(())
//! ```
//!
//! # Features
//! - `fault-injection`: crash points and producer faults for fault-injection tests
//!   (`CrashPoint`, `RuntimeConfig::crash_at`; `ProducerFault`, `RuntimeConfig::inject`). Off
//!   by default: a default build has no crash point and no fault.
//!
//! # `unsafe` in one place
//! Every call into librdkafka that `rdkafka` does not make for us is in module [`librdkafka`],
//! behind safe wrappers: the only module with `unsafe` code (the crate denies it everywhere
//! else). Its docs state the invariant that makes each wrapper safe to call.
#![deny(unsafe_code)]

mod acl;
mod admin;
mod authorization;
mod caught_up;
mod causal_producer;
mod changelog;
mod client_error;
mod client_log;
mod clients;
mod config;
mod endpoint;
#[cfg(feature = "fault-injection")]
mod fault;
#[allow(unsafe_code)]
pub mod librdkafka;
mod open_transaction;
mod outbox;
pub mod query;
mod refusal;
mod runtime;
mod security;
mod shutdown;
mod signals;
mod stage;
mod threads;

pub use acl::{Acl, PatternType};
pub use admin::{Admin, TopicSpec};
pub use causal_producer::{CausalProducer, CausalProducerConfig};
pub use changelog::{CHANGELOG_DEFAULTS, changelog_topic};
pub use clients::{ClientRole, ClientSettings, RUNTIME_DEFAULTS};
pub use config::{RuntimeConfig, StatisticsSink};
#[cfg(feature = "fault-injection")]
pub use fault::{CrashPoint, ProducerFault};
/// The causal vocabulary of `parsley-clock` that the runtime's signatures use: channels,
/// coordinates, clocks, stamps and senders, the stamp header's name, and the clock's error
/// (`ClockError`, inside [`ProcessingError::Clock`] and [`RecordError::MalformedStamp`]).
pub use parsley_clock::{
    Channel, Clock, Coordinate, DecodeErrorKind, Error as ClockError, InFlight, STAMP_HEADER,
    SenderId, SenderTag, Stamp, TopicId, is_stamp_header,
};
/// The task layer: the in-memory test driver, and the types the runtime's signatures share
/// with it.
pub use parsley_task::driver;
/// The error type and its kinds (`parsley_task::error`).
pub use parsley_task::error::{
    AclOperation, AclResource, Awaited, ClientError, Error, InputRecord, KafkaCode, KafkaError,
    Operation, PRODUCER_SIZE_LIMIT, ProcessingError, RecordError, RecordProblem, Refusal,
    ResourceType, Result, SetupError, TIMESTAMP_AFTER_LIMIT, TIMESTAMP_BEFORE_LIMIT,
    TOPIC_SIZE_LIMIT, TransactionFlags,
};
pub use parsley_task::explain::{
    ANSWER_WITHIN, AheadChannel, BlockedRecord, ChannelName, Explanation, MAX_BLOCKED_LISTED,
    PausedChannel, RestoreWait, StageExplanation, TaskExplanation, WaitsFor, WatermarkExplanation,
    WatermarkHolder,
};
pub use parsley_task::memory::{Holder, MemoryUse};
pub use parsley_task::metrics::{
    BadRecordCounts, LateKey, MetricsSnapshot, Ownership, Progress, StageMetrics, StandbyMetrics,
    TaskMetrics, TaskPhase, progress_summary,
};
pub use parsley_task::outgoing::{Acked, OutgoingRecord};
pub use parsley_task::topic::{TopicInfo, crc32_partition_for, partition_for};
pub use parsley_task::{GateMode, TopologyTestDriver};
pub use query::{
    KeyOwner, QueryError, Read, ReadOnlyStore, ShortChannel, Source, StaleEntries, StaleStore,
};
/// The Kafka client the runtime is built on: [`CausalProducer::observe_message`] takes its
/// messages, so a service that consumes with it uses this version.
pub use rdkafka;
pub use runtime::{Running, Runtime};
pub use shutdown::Shutdown;
pub use stage::{
    DELIVERY_TARGET, DLQ_KIND_HEADER, DLQ_OFFSET_HEADER, DLQ_PARTITION_HEADER, DLQ_REASON_HEADER,
    DLQ_SOURCE_HEADER, DLQ_STAGE_HEADER, DLQ_STAMP_HEADER, DLQ_TOPIC_HEADER, NO_TIMESTAMP,
};
