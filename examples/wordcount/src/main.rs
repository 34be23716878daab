//! `wordcount`: the word-count pipeline's command line.
//!
//! - `produce-lines`: writes generated lines (keyless records) to an existing topic.
//!
//! `cargo xtask compare` runs it, and the same pipeline in Kafka Streams, on the same input.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use wordcount::produce::produce_lines;

/// Word count on Kafka: input generator.
#[derive(Parser, Debug)]
#[command(name = "wordcount")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// The subcommands. The Parsley pipeline itself (`run`) is not part of this binary yet.
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Write N lines of 3–12 words (seeded, Zipf-like over 200 words) as keyless records to an
    /// existing topic; returns once every record is acknowledged.
    ProduceLines {
        /// Kafka bootstrap servers.
        #[arg(long)]
        bootstrap: String,
        /// The topic (it must exist).
        #[arg(long)]
        topic: String,
        /// How many lines.
        #[arg(long)]
        lines: u64,
        /// Seed of the generator: the same seed writes the same lines.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wordcount: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Cmd::ProduceLines {
            bootstrap,
            topic,
            lines,
            seed,
        } => {
            let p = produce_lines(&bootstrap, &topic, lines, seed)?;
            println!(
                "wordcount: wrote {} lines ({} words) to {topic} in {:.1} s",
                p.records,
                p.words,
                p.elapsed.as_secs_f64()
            );
            Ok(())
        }
    }
}
