//! The Kafka Streams modes: the benchmark's two topologies in the project's Kafka Streams 4.4
//! program (`compare/kafka-streams/`, class `Bench`), which `cargo xtask bench e2e` builds with
//! Maven and passes as `--ks-jar`.
//!
//! - `ks` (`bench-pass`): `stream(input).to(output)`, byte-array serdes;
//! - `ks-count` (`bench-count`): `groupByKey().count()` of String keys (the value, a byte
//!   array, not looked at), the store named `counts`, each update to the output as an 8-byte
//!   `Long`.
//!
//! Both run with `processing.guarantee=exactly_once_v2` (so `read_committed`), the benchmark's
//! commit interval, one stream thread and `statestore.cache.max.bytes=0`: with the record
//! cache off, a count writes the key's new count after every record, as Parsley's count does;
//! every other setting is Kafka Streams' default. The program runs until its standard input is
//! closed (the benchmark closes it once the application's committed offsets cover the input),
//! closes, deletes its local state and prints the worker's `e2e-result` line with its peak RSS
//! and CPU time (read from `/proc/self`, as the Rust workers read theirs).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::worker::{Mode, WorkerArgs};

/// The name of `ks-count`'s store.
const STORE: &str = "counts";

/// The built program and where its local state goes.
#[derive(Debug, Clone)]
pub struct Program {
    /// `parsley-ks-compare.jar`, its dependencies in `libs/` beside it.
    pub jar: PathBuf,
    /// Kafka Streams' `state.dir`.
    pub state_dir: PathBuf,
}

impl Program {
    /// The program in `jar`, its state in `state_dir` (default: `bench-state/` beside the jar).
    pub fn new(jar: PathBuf, state_dir: Option<PathBuf>) -> Self {
        let state_dir = state_dir.unwrap_or_else(|| {
            jar.parent()
                .map_or_else(|| PathBuf::from("bench-state"), |d| d.join("bench-state"))
        });
        Program { jar, state_dir }
    }

    /// Starts the JVM for one Kafka Streams case: standard input and output piped (closing
    /// the input stops it; the output holds its report), standard error inherited.
    ///
    /// # Errors
    /// When `args.mode` is not a Kafka Streams mode or Java cannot be started.
    pub fn spawn(&self, args: &WorkerArgs) -> Result<Child> {
        let mode = match args.mode {
            Mode::Ks => "bench-pass",
            Mode::KsCount => "bench-count",
            other => bail!("{other} is not a Kafka Streams mode"),
        };
        if !self.jar.is_file() {
            bail!(
                "no Kafka Streams program at {} (`cargo xtask bench e2e` builds it)",
                self.jar.display()
            );
        }
        // The heap of `cargo xtask compare`'s runs of the same program.
        Command::new("java")
            .args(["-Xms256m", "-Xmx1g", "-jar"])
            .arg(&self.jar)
            .arg(mode)
            .args(["--bootstrap", &args.bootstrap])
            .args(["--application-id", &args.group])
            .args(["--input", &args.input])
            .args(["--output", &args.output])
            .args(["--commit-interval-ms", &args.commit_interval_ms.to_string()])
            .arg("--state-dir")
            .arg(&self.state_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the Kafka Streams program (java)")
    }
}

/// The internal topics a Kafka Streams case of application `app` creates: `ks-count`'s
/// store changelog.
pub fn internal_topics(mode: Mode, app: &str) -> Vec<String> {
    match mode {
        Mode::KsCount => vec![format!("{app}-{STORE}-changelog")],
        _ => Vec::new(),
    }
}
