//! Parsley's inventory demo as a library: the domain and handlers ([`model`]), the workload
//! generator ([`generator`]) and the ordering check ([`check`]). `main.rs` wires them to a
//! broker.

pub mod check;
pub mod generator;
pub mod model;
