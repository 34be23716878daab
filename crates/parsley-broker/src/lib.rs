//! This checkout's local Apache Kafka, with no C build: the launcher of the single broker and
//! of the three-node cluster, and a reader of topics, for Parsley's tests, examples and the
//! command `cargo kafka up|down|status|read` (the binary `parsley-kafka`).
//!
//! **Internal: not published.** The broker runs on the machine's Java 17 from Maven Central
//! jars; this crate starts and stops it, and speaks to it through the few requests of Kafka's
//! wire protocol it needs over plain TCP ([`wire`]) — no Kafka client library, no OpenSSL, so
//! the first `cargo kafka up` compiles in seconds where a crate with librdkafka takes minutes.
//! The secure listener's TLS and SCRAM are checked with Kafka's own Java client from the same
//! jars. `parsley-testkit` re-exports [`broker`] and [`cluster`] under the same names.
//!
//! - [`apicurio`]: a real schema registry for the tests, Apicurio Registry built from Maven
//!   Central;
//! - [`broker`]: the single-node broker (KRaft) and the bootstrap address tests find it at;
//! - [`cluster`]: a cluster of three such nodes (replication factor 3,
//!   `min.insync.replicas=2`) with the means to move leaders;
//! - [`broker::secure`]: the secure listener and its users' credentials (re-exported by
//!   [`broker`]);
//! - [`read`]: a topic read back to its end offsets as a `read_committed` consumer sees it,
//!   and printed as `cargo kafka read` prints it;
//! - [`registry`]: a local schema registry speaking the Confluent REST API's serializer
//!   subset, in this process or as a process of its own (`cargo kafka registry up`);
//! - [`wire`]: `Metadata`, `ListOffsets` and `Fetch` on a `PLAINTEXT` listener;
//! - [`cli`]: the commands themselves, shared with `cargo xtask kafka`.
#![doc(test(attr(deny(warnings))))]
#![forbid(unsafe_code)]

pub mod apicurio;
pub mod broker;
pub mod cli;
pub mod cluster;
pub mod read;
pub mod registry;
pub mod wire;
