//! Test kit for Parsley (dev-only).
//!
//! **Internal: not published.** This crate is the repository's own test infrastructure — it
//! downloads and starts a Kafka broker, and builds the gate with its deliberately wrong
//! variants (`negative-controls`) for the simulator — so it has `publish = false` and no
//! stability promise. A service tests its topologies with `parsley::TopologyTestDriver`,
//! which needs no broker; the broker fixtures here serve Parsley's own integration tests.
//!
//! - [`broker`]: a single-node Apache Kafka broker (KRaft) started from Maven Central jars on
//!   the machine's Java 17, and the bootstrap address tests find it at (`parsley-broker`'s,
//!   re-exported: the launcher builds no C, so `cargo kafka up` compiles in seconds);
//! - [`cluster`]: a cluster of three such nodes (replication factor 3, `min.insync.replicas=2`)
//!   with the means to move leaders: kill, stop and start a node, elect the preferred leader,
//!   find a group's or a transactional id's coordinator (`parsley-broker`'s, re-exported);
//! - [`exposition`]: a strict reader of the Prometheus text format, for tests of the runtime's
//!   metrics endpoint;
//! - [`fixtures`]: unique topics, an admin client, reading a topic back as `read_committed`
//!   sees it;
//! - [`oracle`]: the delivery-order oracle, which checks causal delivery from ground-truth
//!   logs without reading Parsley's clocks (the book's specification, §2, §8);
//! - [`replay`]: "replay equals live": a pipeline run live while its input is written, then
//!   replayed under fresh application ids with randomized fetch sizes, outputs compared key by
//!   key;
//! - [`sim`]: a deterministic simulator of partitions with gaps, producers and stage tasks that
//!   drives the real gate and clock and checks them with the oracle, with negative controls.
#![doc(test(attr(deny(warnings))))]
#![forbid(unsafe_code)]

pub use parsley_broker::{broker, cluster};
pub mod exposition;
pub mod fixtures;
pub mod logs;
pub mod oracle;
pub mod replay;
pub mod scenarios;
pub mod sim;
