//! `cargo xtask conformance`: Parsley's DSL against the real Kafka Streams, scenario by
//! scenario (the `parsley-conformance` crate in `compare/conformance/`).
//!
//! 1. Builds the Kafka Streams program of `compare/conformance/kafka-streams/` with Maven
//!    (Kafka Streams 4.4 and its `kafka-streams-test-utils`; see [`crate::compare::java`]).
//! 2. Runs the corpus (`compare/conformance/corpus.jsonl`), then the generated scenarios,
//!    spread evenly over the operators, through Kafka Streams' `TopologyTestDriver` and
//!    Parsley's, and compares their outputs exactly, then after the documented normalisations.
//! 3. Prints, per operator, the scenarios run, equal, documented differences and differing;
//!    which normalisation made how many equal, with the book's section for each; and each
//!    undocumented difference as its minimal scenario with both sides' outputs.
//!
//! Exits non-zero on any undocumented difference.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, anyhow};

use crate::compare::java;

/// Generated scenarios of `--quick`.
pub const QUICK: usize = 400;

/// The options of `cargo xtask conformance`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConformanceArgs {
    /// Generated scenarios in all, spread evenly over the operators.
    #[arg(long, default_value_t = 10_000)]
    scenarios: usize,
    /// A few hundred scenarios (as the test command runs).
    #[arg(long)]
    quick: bool,
    /// The generator's seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only the operators whose name contains this (e.g. `session`).
    #[arg(long)]
    only: Option<String>,
}

impl ConformanceArgs {
    /// The arguments of `--quick`, as the test command runs it.
    pub fn quick() -> Self {
        ConformanceArgs {
            scenarios: QUICK,
            quick: true,
            seed: 1,
            only: None,
        }
    }
}

/// Runs the comparison (module docs).
///
/// # Errors
/// Maven or Java failing.
pub fn run(args: &ConformanceArgs) -> Result<ExitCode> {
    let jar = java::build_program(&java::CONFORMANCE)?;
    let scenarios = if args.quick { QUICK } else { args.scenarios };
    let config = parsley_conformance::Config {
        jar,
        scenarios,
        seed: args.seed,
        only: args.only.clone(),
        corpus: Some(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../compare/conformance/corpus.jsonl"),
        ),
    };
    println!(
        "xtask: conformance: the corpus and {scenarios} generated scenarios (seed {}), Kafka Streams 4.4 against Parsley",
        args.seed
    );
    let start = Instant::now();
    let report = parsley_conformance::run(&config).map_err(|e| anyhow!("{e}"))?;
    print!("{}", report.render(&parsley_conformance::normalise::all()));
    println!("xtask: conformance: {:.1} s", start.elapsed().as_secs_f64());
    if report.passed() {
        println!("xtask: conformance: no undocumented difference");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("xtask: conformance: undocumented differences (above)");
        Ok(ExitCode::FAILURE)
    }
}
