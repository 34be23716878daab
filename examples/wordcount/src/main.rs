//! `wordcount`: the word-count pipeline's command line.
//!
//! - `produce-lines`: writes generated lines (keyless records) to a topic (created if absent);
//! - `run`: the word count in Parsley, until Ctrl-C or, with `--until-caught-up`, until it has
//!   consumed and committed everything its input held.
//!
//! `cargo xtask compare` runs it, and the same pipeline in Kafka Streams, on the same input.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use parsley::prelude::*;
use parsley::{Admin, TopicSpec};
use wordcount::produce::produce_lines;

/// Word count on Kafka: input generator and the Parsley pipeline.
#[derive(Parser, Debug)]
#[command(name = "wordcount")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Write N lines of 3–12 words (seeded, Zipf-like over 200 words) as keyless records to a
    /// topic (created if absent); returns once every record is acknowledged.
    ProduceLines {
        /// Kafka bootstrap servers.
        #[arg(long)]
        bootstrap: String,
        /// The topic.
        #[arg(long, default_value = "lines")]
        topic: String,
        /// The topic's partitions, when it is created (an existing topic is used as it is).
        #[arg(long, default_value_t = 4)]
        partitions: i32,
        /// How many lines.
        #[arg(long)]
        lines: u64,
        /// Seed of the generator: the same seed writes the same lines.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Run the word count in Parsley: lines from the input topic, the count of every word to
    /// the output topic (UTF-8 key, JSON number), until Ctrl-C (SIGINT or SIGTERM), or with
    /// --until-caught-up until every line and every repartitioned word is consumed and
    /// committed. Topics the pipeline creates itself: `{application-id}-words-repartition`.
    Run {
        /// Kafka bootstrap servers.
        #[arg(long)]
        bootstrap: String,
        /// The application id: the prefix of the consumer groups, transactional ids and
        /// internal topics.
        #[arg(long, default_value = "wordcount")]
        application_id: String,
        /// The topic of lines (it must exist).
        #[arg(long, default_value = "lines")]
        input: String,
        /// The topic of counts (created with the input's partition count if absent).
        #[arg(long, default_value = "word-counts")]
        output: String,
        /// Stop cleanly and exit 0 once every stage has committed everything its sources hold.
        #[arg(long)]
        until_caught_up: bool,
        /// With --until-caught-up: fail if that takes longer than this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// Print the compiled topology before starting.
        #[arg(long)]
        describe: bool,
    },
}

fn main() -> ExitCode {
    // Parsley logs through `tracing`: without a subscriber nothing is printed.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
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
            partitions,
            lines,
            seed,
        } => {
            admin(&bootstrap)?
                .create_topic_if_absent(&TopicSpec::new(&topic, partitions))
                .with_context(|| format!("creating {topic}"))?;
            let p = produce_lines(&bootstrap, &topic, lines, seed)?;
            println!(
                "wordcount: wrote {} lines ({} words) to {topic} in {:.1} s",
                p.records,
                p.words,
                p.elapsed.as_secs_f64()
            );
            Ok(())
        }
        Cmd::Run {
            bootstrap,
            application_id,
            input,
            output,
            until_caught_up,
            timeout_secs,
            describe,
        } => {
            let admin = admin(&bootstrap)?;
            let partitions = admin.describe_topics(&[input.as_str()])?[0].partitions;
            admin
                .create_topic_if_absent(&TopicSpec::new(&output, partitions))
                .with_context(|| format!("creating {output}"))?;
            let topology = wordcount::pipeline::topology(&application_id, &input, &output)
                .context("building the topology")?;
            if describe {
                println!("{}", topology.describe());
            }
            let runtime = Runtime::new(topology, RuntimeConfig::new(&bootstrap));
            let started = Instant::now();
            println!("wordcount: running {application_id}: {input} -> {output} on {bootstrap}");
            let stages = if until_caught_up {
                let running = runtime.start()?;
                if let Err(e) = running.wait_until_caught_up(Duration::from_secs(timeout_secs)) {
                    let _ = running.stop();
                    return Err(e).context("waiting for the word count to catch up");
                }
                running.stop()?
            } else {
                runtime.run_until_signal()?
            };
            let per_stage: Vec<String> = stages
                .iter()
                .map(|(stage, m)| format!("{stage} {}", m.committed_deliveries))
                .collect();
            println!(
                "wordcount: {} after {:.1} s; records committed per stage: {}",
                if until_caught_up {
                    "caught up"
                } else {
                    "stopped"
                },
                started.elapsed().as_secs_f64(),
                per_stage.join(", ")
            );
            Ok(())
        }
    }
}

/// An admin client of the cluster at `bootstrap`.
fn admin(bootstrap: &str) -> Result<Admin> {
    Admin::new(bootstrap, Duration::from_secs(30))
        .with_context(|| format!("connecting to {bootstrap}"))
}
