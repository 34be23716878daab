//! Parsley's inventory demo as a library: the domain and handlers ([`model`]), the workload
//! generator ([`generator`]), the ordering check ([`check`]) and the topology
//! ([`pipeline`]). `main.rs` wires them to a broker; `bin/chaos.rs` runs them under faults.
#![forbid(unsafe_code)]

pub mod check;
pub mod generator;
pub mod model;
pub mod pipeline;
