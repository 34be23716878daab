//! `cargo xtask bench`: the benchmarks on the local broker, each a release build of the
//! `parsley-benches` crate's `e2e` binary (the end-to-end benchmark, or one of its subcommands)
//! with the flags given here forwarded.

use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use parsley_testkit::broker;

use crate::{compare, ensure_prerequisites, release_bin};

#[derive(Subcommand)]
pub(crate) enum BenchCmd {
    /// A task moved to another instance, with and without a standby of it there
    /// (`RuntimeConfig::standby_replicas`): what its restore read and its first commit after the
    /// assignment; goal ≤ 2 s with a standby (release build; the book's "Benchmarks" chapter
    /// has the figures).
    Standby {
        /// Unique keys per task, two tasks (default: 5,000,000).
        #[arg(long)]
        keys: Option<u64>,
        /// State on the heap instead of a state directory per instance.
        #[arg(long)]
        memory: bool,
        /// Leave a broker this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
    },
    /// What an interactive query of a running count costs: `get`, `range`, `all` and
    /// `GET /store/{name}/{key}` idle, `get` while busy, `get_at_least` after a write (release
    /// build; the book's "Benchmarks" chapter has the figures).
    Queries {
        /// Records preloaded (default: 1,000,000).
        #[arg(long)]
        records: Option<u64>,
        /// Distinct keys among them (default: 100,000).
        #[arg(long)]
        keys: Option<u64>,
        /// State on the heap instead of a state directory.
        #[arg(long)]
        memory: bool,
        /// Leave a broker this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
    },
    /// A raw rdkafka transactional consume→produce loop, a Parsley pass-through stage and a
    /// Parsley count per key against Kafka Streams 4.4's pass-through and count: throughput,
    /// CPU per record, live-record latency and peak memory, side by side (release build; the
    /// book's "Benchmarks" chapter has the figures).
    E2e {
        /// Records preloaded per input (default: 1,000,000, or 500 MiB of payload when that
        /// is fewer; 100,000 with `--quick`).
        #[arg(long)]
        records: Option<u64>,
        /// Payload sizes in bytes, comma-separated (default: 100,1024; 100 with `--quick`).
        #[arg(long)]
        payloads: Option<String>,
        /// Commit interval of every mode, ms (default: 100).
        #[arg(long)]
        commit_interval_ms: Option<u64>,
        /// Stream threads of the Parsley modes' stage (`RuntimeConfig::stream_threads`;
        /// default 1).
        #[arg(long)]
        threads: Option<usize>,
        /// A smoke run: small inputs, one run per mode, no latency phase.
        #[arg(long)]
        quick: bool,
        /// Leave a broker this command started running afterwards.
        #[arg(long)]
        keep_broker: bool,
        /// Extra arguments for the benchmark binary (after `--`; `-- --help` lists them).
        #[arg(last = true)]
        args: Vec<String>,
    },
}

/// Runs the benchmark `kind`.
///
/// # Errors
/// A failed build, a broker that cannot start, Kafka Streams' program that cannot be built.
pub(crate) fn run(kind: BenchCmd) -> Result<ExitCode> {
    match kind {
        BenchCmd::E2e {
            records,
            payloads,
            commit_interval_ms,
            quick,
            keep_broker,
            threads,
            mut args,
        } => {
            if quick {
                args.push("--quick".to_string());
            }
            let help = args.iter().any(|a| a == "--help" || a == "-h");
            if !help && runs_kafka_streams(&args) {
                ensure_prerequisites()?;
                broker::check_java()?;
                let jar = compare::java::build()?;
                args.extend(["--ks-jar".to_string(), jar.display().to_string()]);
            }
            release_bin(
                ("parsley-benches", "e2e", "the end-to-end benchmark"),
                [
                    ("--records", records.map(|r| r.to_string())),
                    ("--payloads", payloads),
                    (
                        "--commit-interval-ms",
                        commit_interval_ms.map(|c| c.to_string()),
                    ),
                    ("--threads", threads.map(|t| t.to_string())),
                ],
                args,
                keep_broker,
            )
        }
        BenchCmd::Standby {
            keys,
            memory,
            keep_broker,
        } => release_bin(
            (
                "parsley-benches",
                "e2e",
                "the standby benchmark (a moved task's restore)",
            ),
            [],
            subcommand("standby", [("--keys", keys)], memory),
            keep_broker,
        ),
        BenchCmd::Queries {
            records,
            keys,
            memory,
            keep_broker,
        } => release_bin(
            (
                "parsley-benches",
                "e2e",
                "the queries benchmark (interactive queries of a running count)",
            ),
            [],
            subcommand(
                "queries",
                [("--records", records), ("--keys", keys)],
                memory,
            ),
            keep_broker,
        ),
    }
}

/// The arguments of the `e2e` binary's subcommand `name`: the name first (its flags follow
/// it), then each flag that has a value, then `--memory` when asked.
fn subcommand<const N: usize>(
    name: &str,
    flags: [(&str, Option<u64>); N],
    memory: bool,
) -> Vec<String> {
    let mut args = vec![name.to_string()];
    for (flag, value) in flags {
        if let Some(v) = value {
            args.extend([flag.to_string(), v.to_string()]);
        }
    }
    if memory {
        args.push("--memory".to_string());
    }
    args
}

/// Whether the end-to-end benchmark's arguments `args` select a Kafka Streams mode: no
/// `--modes` (the default runs every mode), or a `--modes` list naming `ks` or `ks-count`.
pub(crate) fn runs_kafka_streams(args: &[String]) -> bool {
    let mut modes = None;
    for (i, a) in args.iter().enumerate() {
        if let Some(v) = a.strip_prefix("--modes=") {
            modes = Some(v);
        } else if a == "--modes" {
            modes = args.get(i + 1).map(String::as_str);
        }
    }
    modes.is_none_or(|m| m.split(',').any(|m| matches!(m.trim(), "ks" | "ks-count")))
}

#[cfg(test)]
mod tests {
    use super::subcommand;

    #[test]
    fn a_subcommand_comes_first_with_the_flags_given_then_memory() {
        assert_eq!(
            subcommand("queries", [("--records", Some(5)), ("--keys", None)], true),
            ["queries", "--records", "5", "--memory"]
        );
        assert_eq!(
            subcommand("standby", [("--keys", None)], false),
            ["standby"]
        );
    }
}
