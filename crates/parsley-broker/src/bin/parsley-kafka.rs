//! `cargo kafka up|down|status|read`: this checkout's local Kafka broker, with nothing to
//! compile but this small crate (see `parsley_broker::cli`).
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    parsley_broker::cli::main(&args)
}
