//! `cargo xtask fuzz`: the `cargo-fuzz` targets under `fuzz/` (the stamp decoder, the timer
//! queue's changelog decoder, every changelog record decoder with the restore's fold, the gate
//! fed arbitrary sequences of evidence), each for a given time or number of executions, with libFuzzer's AddressSanitizer build on the nightly
//! toolchain. `cargo-fuzz` is installed from crates.io when missing; the nightly toolchain must
//! be there (`rustup toolchain install nightly`). Each target's corpus grows under
//! `fuzz/corpus/<target>/` (not committed); a failure leaves its input under
//! `fuzz/artifacts/<target>/` and fails the command, naming it. The test command runs every
//! target for [`SHORT_SECONDS`], then `gate_sequences` against a deliberately wrong gate, which
//! must fail ([`negative_control`]): about a minute of fuzzing in all.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;

/// The targets, in the order they run.
pub(crate) const TARGETS: [&str; 4] = [
    "stamp_decode",
    "timer_changelog",
    "changelog_records",
    "gate_sequences",
];

/// Seconds per target in the test command's short run ([`run_short`]): four targets and the
/// negative control (caught within seconds) make about a minute.
pub(crate) const SHORT_SECONDS: u64 = 12;

/// Arguments of `cargo xtask fuzz`.
#[derive(Args, Debug)]
pub(crate) struct FuzzArgs {
    /// One target (default: every target in turn).
    #[arg(long)]
    target: Option<String>,
    /// Seconds per target (default: 20 each).
    #[arg(long)]
    seconds: Option<u64>,
    /// Executions per target instead of a time (libFuzzer's `-runs`).
    #[arg(long, conflicts_with = "seconds")]
    runs: Option<u64>,
    /// Build without AddressSanitizer (several times faster; for long runs of safe code).
    #[arg(long)]
    no_sanitizer: bool,
    /// Only the negative control: `gate_sequences` against a gate that checks no claim, which
    /// must fail.
    #[arg(long, conflicts_with_all = ["target", "seconds", "runs"])]
    negative_control: bool,
}

/// What one target did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Done {
    pub executions: u64,
    pub seconds: u64,
}

/// libFuzzer's closing line, `Done 1234567 runs in 20 second(s)`.
pub(crate) fn done_line(output: &str) -> Option<Done> {
    output.lines().rev().find_map(|line| {
        let rest = line.trim().strip_prefix("Done ")?;
        let mut words = rest.split_whitespace();
        let executions = words.next()?.parse().ok()?;
        let (Some("runs"), Some("in")) = (words.next(), words.next()) else {
            return None;
        };
        let seconds = words.next()?.parse().ok()?;
        Some(Done {
            executions,
            seconds,
        })
    })
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Installs `cargo-fuzz` from crates.io when `cargo fuzz` is missing.
fn ensure_cargo_fuzz() -> Result<()> {
    let present = Command::new("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(());
    }
    println!("xtask: installing cargo-fuzz from crates.io (once)");
    let status = Command::new("cargo")
        .args(["install", "cargo-fuzz", "--locked"])
        .status()
        .context("running cargo install cargo-fuzz")?;
    if !status.success() {
        bail!("cargo install cargo-fuzz failed");
    }
    Ok(())
}

/// Fails, saying what to do, when the nightly toolchain is missing.
fn ensure_nightly() -> Result<()> {
    let ok = Command::new("cargo")
        .args(["+nightly", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!(
            "the fuzz targets need the nightly toolchain (sanitizer flags): rustup toolchain install nightly"
        );
    }
    Ok(())
}

/// Runs the targets; fails on the first target that finds something.
pub(crate) fn run(args: FuzzArgs) -> Result<()> {
    ensure_nightly()?;
    ensure_cargo_fuzz()?;
    if args.negative_control {
        return negative_control();
    }
    let targets: Vec<&str> = match &args.target {
        Some(t) if TARGETS.contains(&t.as_str()) => vec![t.as_str()],
        Some(t) => bail!("no fuzz target {t}: {}", TARGETS.join(", ")),
        None => TARGETS.to_vec(),
    };
    let limit = match (args.runs, args.seconds) {
        (Some(runs), _) => format!("-runs={runs}"),
        (None, seconds) => format!("-max_total_time={}", seconds.unwrap_or(20)),
    };
    for target in targets {
        let started = Instant::now();
        println!("xtask: fuzzing {target} ({limit})");
        let corpus = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .with_context(|| format!("creating {}", corpus.display()))?;
        let mut cmd = Command::new("cargo");
        cmd.current_dir(fuzz_dir())
            .args(["+nightly", "fuzz", "run", target]);
        if args.no_sanitizer {
            cmd.args(["--sanitizer", "none"]);
        }
        let output = cmd
            .arg(&corpus)
            .args(["--", &limit, "-rss_limit_mb=2048", "-print_final_stats=0"])
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("running cargo fuzz run {target}"))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            eprintln!("{stderr}");
            bail!(
                "fuzz target {target} failed: its input is under {}",
                fuzz_dir().join("artifacts").join(target).display()
            );
        }
        match done_line(&stderr) {
            Some(d) => println!(
                "xtask: {target}: {} executions in {} s, nothing found ({:.0} s with the build)",
                d.executions,
                d.seconds,
                started.elapsed().as_secs_f64()
            ),
            None => {
                eprintln!("{stderr}");
                bail!("fuzz target {target}: no closing line from libFuzzer");
            }
        }
    }
    Ok(())
}

/// The test command's short run: every target for [`SHORT_SECONDS`], then the negative
/// control.
pub(crate) fn run_short() -> Result<()> {
    run(FuzzArgs {
        target: None,
        seconds: Some(SHORT_SECONDS),
        runs: None,
        no_sanitizer: false,
        negative_control: false,
    })?;
    negative_control()
}

/// `gate_sequences` against the gate's `gate_off` variant (every head delivered at once, no
/// claim checked): its causal check must find a violation within a minute, or the checks are
/// not checking. Its inputs and artifacts go to a temporary folder.
pub(crate) fn negative_control() -> Result<()> {
    println!("xtask: fuzzing gate_sequences against a gate that checks no claim: it must fail");
    let scratch = std::env::temp_dir().join(format!("parsley-fuzz-control-{}", std::process::id()));
    std::fs::create_dir_all(scratch.join("corpus"))?;
    let output = Command::new("cargo")
        .current_dir(fuzz_dir())
        .args(["+nightly", "fuzz", "run", "--features", "negative-control"])
        .arg("gate_sequences")
        .arg(scratch.join("corpus"))
        .arg("--")
        .arg("-max_total_time=60")
        .arg(format!("-artifact_prefix={}/", scratch.display()))
        .env("PARSLEY_FUZZ_FAULT", "gate_off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running the negative control")?;
    let _ = std::fs::remove_dir_all(&scratch);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let caught = !output.status.success() && stderr.contains("delivered before its cause");
    if !caught {
        eprintln!("{stderr}");
        bail!(
            "the negative control was not caught: gate_sequences found no violation in a gate that checks no claim"
        );
    }
    println!("xtask: the negative control was caught (a record delivered before its cause)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closing_line_gives_executions_and_seconds() {
        let out = "#1048576\tpulse  cov: 90 ft: 200\nDone 3456789 runs in 21 second(s)\n";
        assert_eq!(
            done_line(out),
            Some(Done {
                executions: 3_456_789,
                seconds: 21
            })
        );
        assert_eq!(done_line("INFO: Seed: 1\n"), None);
        assert_eq!(done_line("Done x runs in 3 second(s)"), None);
    }
}
