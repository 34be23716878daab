//! `cargo xtask soak`: the inventory pipeline for a long run (an hour by default) at half its
//! measured maximum throughput, with a fault every few minutes, checked by the oracle at the
//! end (the fault-injection driver's `soak` mode: `examples/inventory/src/bin/chaos/soak.rs`).
//! Its CSV and chart go to `target/soak/`. The test command runs a two-minute version on the
//! local broker ([`short`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use parsley_testkit::broker;

use crate::{chaos_driver, status_code};

/// What `cargo xtask soak` was asked for.
pub(crate) struct SoakArgs {
    pub minutes: f64,
    /// Committed input records per second; `None`: half the measured maximum.
    pub rate: Option<f64>,
    pub seed: u64,
    pub fault_every: f64,
    pub cluster: bool,
    /// Further arguments for the driver.
    pub args: Vec<String>,
}

/// `--rate`: a number of records per second, or `measured` (half the measured maximum).
pub(crate) fn parse_rate(s: &str) -> Result<Option<f64>, String> {
    if s == "measured" {
        return Ok(None);
    }
    match s.parse::<f64>() {
        Ok(r) if r > 0.0 => Ok(Some(r)),
        _ => Err(format!(
            "{s:?}: a positive number of records per second, or `measured`"
        )),
    }
}

/// Where the soak writes its CSV and chart.
fn out_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/soak")
}

/// Runs the soak on `bootstrap` (dev profile, the one the test command builds).
pub(crate) fn run(bootstrap: &str, a: &SoakArgs) -> Result<ExitCode> {
    let mut cmd = chaos_driver("soak");
    cmd.args([
        "--bootstrap",
        bootstrap,
        "--minutes",
        &a.minutes.to_string(),
        "--seed",
        &a.seed.to_string(),
        "--fault-every",
        &a.fault_every.to_string(),
        "--out",
    ])
    .arg(out_dir())
    .args(&a.args);
    if let Some(rate) = a.rate {
        cmd.args(["--rate", &rate.to_string()]);
    }
    if a.cluster {
        // The driver's cluster faults find the cluster through the variable too.
        cmd.arg("--cluster").env(broker::BOOTSTRAP_ENV, bootstrap);
    }
    status_code(&mut cmd, "the soak")
}

/// The test command's two-minute soak on the local broker: a short measurement, a fault
/// every 30 s on average (kill -9, broker restart, join/leave), windows of a minute.
pub(crate) fn short(bootstrap: &str) -> Result<ExitCode> {
    run(
        bootstrap,
        &SoakArgs {
            minutes: 2.0,
            rate: None,
            seed: 1,
            fault_every: 30.0,
            cluster: false,
            args: [
                "--window-minutes",
                "1",
                "--measure-secs",
                "15",
                "--measure-rounds",
                "100",
            ]
            .map(String::from)
            .to_vec(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_a_number_or_measured() {
        assert_eq!(parse_rate("measured"), Ok(None));
        assert_eq!(parse_rate("1500"), Ok(Some(1500.0)));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
    }
}
