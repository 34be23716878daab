//! Parsley: Kafka stream processing in which nothing is released on silence.
//!
//! Stream processors usually guess when their inputs are complete from time — windows, idle
//! timeouts, reconciliation jobs — and those guesses let records out of order at startup and
//! on replay. Parsley decides from Kafka's own evidence instead. Every record a stage writes
//! is stamped with a vector clock over `(topic id, partition) → offset`; a gate per task
//! delivers a record only after the records it claims as causes; event time is ordered by a
//! timer queue whose completeness comes from end offsets, not timeouts; and outputs, state,
//! clocks and input offsets commit in one Kafka transaction (exactly-once, EOS v2).
//!
//! This crate is the one to depend on. Its root has what a Kafka Streams user reaches for first:
//! - the DSL ([`StreamsBuilder`], [`KStream`], [`KTable`], [`KGroupedStream`], [`Consumed`],
//!   [`Produced`], [`TimeWindows`], [`SlidingWindows`], [`SessionWindows`], [`JoinWindows`],
//!   [`Windowed`], [`Suppressed`]), named as in Kafka Streams, which compiles a pipeline into stages;
//! - the processor API ([`Handler`], [`Topology`]) for stages written by hand;
//! - the test driver ([`TopologyTestDriver`]) and the one error type ([`Error`], [`Result`]);
//! - the runtime ([`Runtime`], [`RuntimeConfig`], [`Running`]) that runs a topology against a
//!   broker, the causal producer ([`CausalProducer`], [`CausalProducerConfig`],
//!   [`OutgoingRecord`]) that stamps the records of plain producers feeding it, and the admin
//!   client that creates topics ([`Admin`], [`TopicSpec`]).
//!
//! Everything else is in named modules: [`codec`] (`Auto`, `Json`, `Bincode`, `Utf8`, `Bytes`,
//! `Nullable`), [`clock`] (stamps, channels, coordinates), [`stage`] (the processor API in
//! full: records, steps, policies, event-time order), [`dsl`], [`driver`], [`task`] and
//! [`runtime`].
//!
//! # Features
//! - `kafka` (default): the runtime, the causal producer and the admin client, on librdkafka
//!   (built from C, with OpenSSL). A crate whose tests use only the DSL and the test driver
//!   depends on this crate with `default-features = false` and builds no C at all.
//! - `jemalloc` (default): the process's allocator (below).
//!
//! [`prelude`] has what a service's `main.rs` needs. A whole service:
//!
//! ```no_run
//! use parsley::prelude::*;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Clone, Serialize, Deserialize)]
//! struct Order { customer: String, amount_cents: i64 }
//! #[derive(Clone, Serialize, Deserialize)]
//! struct Payment { amount_cents: i64 }
//!
//! fn main() -> Result<(), parsley::Error> {
//!     let builder = StreamsBuilder::new("shop");
//!     let orders = builder.table::<String, Order>("orders");
//!     builder
//!         .stream::<String, Payment>("payments")
//!         .join(&orders, |_payment, order| order.clone())
//!         .select_key(|_order_id, order| order.customer.clone())
//!         .group_by_key()
//!         .named("revenue")
//!         .aggregate(|| 0i64, |_customer, order, total| total + order.amount_cents)
//!         .to_stream()
//!         .to("revenue");
//!     let topology = builder.build()?;
//!     println!("{}", topology.describe());
//!     Runtime::new(topology, RuntimeConfig::new("127.0.0.1:9092")).run_until_signal()?;
//!     Ok(())
//! }
//! ```
//!
//! A topology is tested without a broker by [`TopologyTestDriver`] (Kafka Streams'
//! `TopologyTestDriver`): records piped in, outputs and state read back, through the same
//! gate, stamping and state code the runtime runs.
//!
//! ```
//! use parsley::prelude::*;
//! use parsley::TopologyTestDriver;
//!
//! let builder = StreamsBuilder::new("wordcount");
//! builder
//!     .stream::<(), String>("lines")
//!     .flat_map_values(|line| line.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>())
//!     .group_by(|_, word| word.clone())
//!     .count()
//!     .to_stream()
//!     .to("counts");
//! let driver = TopologyTestDriver::builder(builder.build()?).build()?;
//! driver.input_topic("lines", Auto, Utf8)?.pipe((), "the cat and the hat".into())?;
//! let counts = driver.output_topic("counts", Utf8, Json)?.read_key_values_to_map();
//! assert_eq!(counts.get("the"), Some(&2i64));
//! # Ok::<(), parsley::Error>(())
//! ```
//!
//! # Where to start
//! - **Writing a pipeline**: [`StreamsBuilder`] (its operators are on [`KStream`], [`KTable`]
//!   and [`KGroupedStream`]), then [`TopologyTestDriver`] to test it and [`Runtime`] to run it.
//!   The book's tutorial (`book/src/tutorial.md` in the repository, rendered with
//!   `mdbook serve book`) builds the word count above step by step against a local broker.
//! - **A stage by hand**: [`Handler`] and [`Topology::builder`], when an operator of the DSL
//!   does not fit.
//! - **Feeding a topology from a plain producer**: [`CausalProducer`], which stamps what it
//!   sends with what it has read.
//! - **What the guarantee is and what it needs**: the book's concepts part and its
//!   specification chapter; the rules are implemented in the crates below.
//!
//! # The crates behind it
//! Each is re-exported as a module here, for what the root does not re-export:
//!
//! | Module | Crate | What it holds |
//! |---|---|---|
//! | [`clock`] | [`parsley-clock`](https://docs.rs/parsley-clock) | channels, offset vector clocks, stamps and the stamp header's encoding (pure) |
//! | [`stage`] | [`parsley-stage`](https://docs.rs/parsley-stage) | the `Handler` trait, codecs, the topology builder and its validation, the changelog's record format |
//! | [`dsl`] | [`parsley-dsl`](https://docs.rs/parsley-dsl) | the Kafka-Streams-style DSL, compiled into stages |
//! | [`task`], [`driver`] | [`parsley-task`](https://docs.rs/parsley-task) | the task without Kafka: gate, handler call, stamping, fold state, event time; the in-memory test driver; the error type |
//! | [`runtime`] | [`parsley-runtime`](https://docs.rs/parsley-runtime) | stream threads, transactions, the causal producer, the admin client (feature `kafka`) |
//! | — | [`parsley-gate`](https://docs.rs/parsley-gate) | the delivery gate and the event-time sort: pure decision logic the runtime drives, not re-exported (a service never calls it) |
//!
//! # Memory allocator
//! With its default feature `jemalloc`, on Linux, this crate makes jemalloc the process's
//! allocator: the `#[global_allocator]` of Rust code, and the `malloc` and `free` of C code in
//! the process, librdkafka's included. A stage allocates and frees several small buffers per
//! record, many on another thread than the one that allocated them (librdkafka's delivery
//! reports free what the stream thread produced); with the C library's allocator a counting
//! stage spent about a third of its thread's time in `malloc` and `free`, and ran 1.2 to 2.1
//! times slower (the book's benchmarks chapter has the figures).
//!
//! A service that sets its own `#[global_allocator]` depends on this crate with
//! `default-features = false, features = ["kafka"]` (two global allocators do not link).
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

// The root: about twenty names, what a Kafka Streams user reaches for first. Everything else is
// in the named modules below.
pub use parsley_dsl::{
    Consumed, JoinWindows, KGroupedStream, KStream, KTable, Produced, SessionWindows,
    SlidingWindows, StreamsBuilder, Suppressed, TimeWindows, Windowed,
};
#[cfg(feature = "kafka")]
pub use parsley_runtime::{
    Admin, CausalProducer, CausalProducerConfig, OutgoingRecord, Running, Runtime, RuntimeConfig,
    TopicSpec,
};
pub use parsley_stage::{Handler, Topology};
pub use parsley_task::{Error, Result, TopologyTestDriver};

/// The process's allocator (see the crate docs' "Memory allocator").
#[cfg(all(feature = "jemalloc", target_os = "linux"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Clocks, stamps, channels and the stamp header's encoding (`parsley-clock`).
pub mod clock {
    pub use parsley_clock::*;
}

/// Handlers, codecs and the topology builder (`parsley-stage`).
pub mod stage {
    pub use parsley_stage::*;
}

/// The Kafka-Streams-style DSL (`parsley-dsl`).
pub mod dsl {
    pub use parsley_dsl::*;
}

/// Codecs: how keys and values become bytes and back (`parsley-stage`).
pub mod codec {
    pub use parsley_stage::{Auto, Bincode, Bytes, Codec, CodecError, Json, Nullable, Utf8};
}

/// The error type, [`Error`], and its kinds: [`error::KafkaError`], [`error::SetupError`],
/// [`error::RecordError`], [`error::ProcessingError`], with the [`error::Operation`] a Kafka
/// error names (`parsley_task::error`).
pub mod error {
    pub use parsley_task::error::*;
}

/// The task without Kafka: gate, handler call, stamping, fold state, event time, metrics types
/// (`parsley-task`).
pub mod task {
    pub use parsley_task::*;
}

/// The runtime: stream threads, transactions, the causal producer, the admin client
/// (`parsley-runtime`; feature `kafka`, on by default).
#[cfg(feature = "kafka")]
pub mod runtime {
    pub use parsley_runtime::*;
}

/// The topology test driver: a topology run in memory, with no broker, through the runtime's
/// own tasks (`parsley_task::driver`).
pub mod driver {
    pub use parsley_task::driver::*;
}

/// What a service's `main.rs` needs: the DSL, the processor API, the runtime, the causal
/// producer, the common codecs and policies.
pub mod prelude {
    pub use crate::codec::{Auto, Bincode, Json, Utf8};
    #[cfg(feature = "kafka")]
    pub use crate::{CausalProducer, CausalProducerConfig, Runtime, RuntimeConfig};
    pub use crate::{
        Consumed, Handler, JoinWindows, KGroupedStream, KStream, KTable, Produced, SessionWindows,
        SlidingWindows, StreamsBuilder, Suppressed, TimeWindows, Topology, Windowed,
    };
    pub use parsley_dsl::LatePolicy;
    pub use parsley_stage::{
        BadRecordPolicy, EventTimeOrder, FoldStates, HandlerError, Punctuated, Punctuation,
        PunctuationType, Record, Step,
    };
}
