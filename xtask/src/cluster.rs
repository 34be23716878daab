//! The local three-node cluster (`parsley_testkit::cluster`) from the command line (`cargo
//! kafka up --brokers 3` starts it alone), the cluster's own test group (`cargo xtask test
//! --cluster`: the tests of `crates/parsley-runtime/tests/cluster.rs`, which move leaders and
//! coordinators) and the fault-injection driver's cluster mode (`cargo xtask chaos --cluster`).
//! `cargo xtask failover` measures how fast a stage commits again after its coordinator's node
//! is killed. The single broker stays what every other command uses.

use std::process::ExitCode;

use anyhow::{Context, Result};
use parsley_testkit::broker;
use parsley_testkit::cluster::{self, Up};

use crate::{TestCounts, cargo, counted_tests, ensure_prerequisites};

/// Runs `f` with the local cluster's bootstrap list: started if needed (three nodes) and
/// stopped afterwards unless `keep` or it was already running.
pub(crate) fn with_cluster(
    keep: bool,
    f: impl FnOnce(&str) -> Result<ExitCode>,
) -> Result<ExitCode> {
    ensure_prerequisites()?;
    println!(
        "xtask: making sure the local {}-node cluster runs",
        cluster::DEFAULT_NODES
    );
    let up = cluster::up(cluster::DEFAULT_NODES).context("starting the local cluster")?;
    let started = matches!(up, Up::Started(_));
    println!(
        "xtask: cluster {} at {}",
        if started {
            "started"
        } else {
            "already running"
        },
        up.bootstrap()
    );
    let result = f(up.bootstrap());
    if started && !keep {
        cluster::down().context("stopping the local cluster")?;
        println!("xtask: cluster stopped");
    }
    result
}

/// The cluster's test group: the ignored tests of `parsley-runtime`'s `cluster` test binary,
/// one at a time (they stop and start nodes), with `$PARSLEY_BOOTSTRAP` pointing at the
/// cluster.
pub(crate) fn test(keep: bool) -> Result<ExitCode> {
    with_cluster(keep, |bootstrap| {
        let mut counts = TestCounts::default();
        let mut cmd = ignored_runtime_tests("cluster", bootstrap);
        let code = counted_tests(&mut cmd, "the cluster tests", &mut counts)?;
        println!("xtask: cluster tests: {counts}");
        Ok(code)
    })
}

/// The failover measurement (`crates/parsley-runtime/tests/failover.rs`): `runs` kills of the
/// `kind` coordinator's node (`group`, `txn` or `both`), its figures printed as it goes.
pub(crate) fn failover(runs: u32, kind: &str, debug: Option<&str>, keep: bool) -> Result<ExitCode> {
    with_cluster(keep, |bootstrap| {
        let mut cmd = ignored_runtime_tests("failover", bootstrap);
        cmd.arg("--nocapture")
            .env("PARSLEY_FAILOVER_RUNS", runs.to_string())
            .env("PARSLEY_FAILOVER_KIND", kind);
        if let Some(debug) = debug {
            cmd.env("PARSLEY_FAILOVER_DEBUG", debug);
        }
        let status = cmd.status().context("running the failover measurement")?;
        Ok(if status.success() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    })
}

/// `cargo test` of the ignored tests of `parsley-runtime`'s test binary `test`, one at a time
/// (they stop and start nodes), with `$PARSLEY_BOOTSTRAP` pointing at `bootstrap`; more libtest
/// arguments may follow.
fn ignored_runtime_tests(test: &str, bootstrap: &str) -> std::process::Command {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "-j2",
        "--package",
        "parsley-runtime",
        "--test",
        test,
    ])
    .args(["--", "--ignored", "--test-threads=1"])
    .env(broker::BOOTSTRAP_ENV, bootstrap);
    cmd
}
