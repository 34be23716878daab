//! A shop on Kafka, one of the two pipelines `cargo xtask compare` runs in Parsley and in
//! Kafka Streams on the same input: orders, payments of most of them, and revenue per
//! customer (each payment joined with its order, summed by the order's customer).
//!
//! - [`model`]: the records (JSON values; keys are order ids or customer ids, UTF-8);
//! - [`orders`]: the seeded order generator and its plain producer (`produce-orders`);
//! - [`payments`]: the payments service (`payments`): it reads the orders and pays each one
//!   (but every K-th) through Parsley's [`CausalProducer`](parsley::CausalProducer),
//!   so that each payment's stamp claims its order;
//! - [`plain`]: the plain idempotent producer the generator writes with;
//! - [`pipeline`]: revenue per customer in Parsley's DSL, compiled into a
//!   [`Topology`](parsley::Topology) (with the Kafka Streams version beside it, and both line
//!   counts), and revenue per customer and hour in event-time windows
//!   ([`pipeline::hourly_revenue`], which `cargo xtask replay` replays); the binary's `run`
//!   subcommand runs either with Parsley's runtime;
//! - [`deliveries`]: each order with its customer (a foreign-key join) and its city's region
//!   (a global table), with the Kafka Streams version beside it and both line counts.
#![forbid(unsafe_code)]

pub mod deliveries;
pub mod model;
pub mod orders;
pub mod payments;
pub mod pipeline;
pub mod plain;
