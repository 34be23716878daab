//! The stage processes of the fault-injection driver and of the soak: how a stage runs as an
//! OS process (`chaos worker`), how the driver starts, stops and kills one, and the run's
//! topics.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use parsley_inventory::check::TopicNames;
use parsley_inventory::pipeline::{names, topology};
use parsley_runtime::{Admin, CrashPoint, Runtime, RuntimeConfig, changelog_topic};

/// Broker restarts are injected on purpose: the clients' connection errors are expected noise
/// (workers log theirs to their own files).
pub(crate) const QUIET: &str = "warn,librdkafka=off,rdkafka::client=off";

/// The commit interval of every stage process (the runtime's default), in ms.
pub(crate) const COMMIT_INTERVAL_MS: u64 = 100;

/// The transaction timeout of every stage process, ms.
pub(crate) const TRANSACTION_TIMEOUT_MS: i64 = 10_000;

/// The client timeout of every stage process (`RuntimeConfig::timeout`), ms: the longest of its
/// configured timeouts, and so the longest the pipeline may go without a delivery, with work
/// in hand, before a stage's log must say why ([`pauses`]).
pub(crate) const STAGE_TIMEOUT_MS: i64 = 60_000;

/// Settings every stage process uses: short session and transaction timeouts, so that a
/// killed process's membership and open transaction are cleared within seconds.
pub(crate) fn stage_config(bootstrap: &str, instance: &str) -> RuntimeConfig {
    let mut c = RuntimeConfig::new(bootstrap)
        .consumer_property("session.timeout.ms", "6000")
        .consumer_property("heartbeat.interval.ms", "1000")
        .producer_property("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS.to_string());
    if let Ok(contexts) = std::env::var("CHAOS_RDKAFKA_DEBUG") {
        c = c.client_property("debug", contexts);
    }
    c.instance_id = instance.to_string();
    c.timeout = Duration::from_millis(STAGE_TIMEOUT_MS as u64);
    c.commit_interval(Duration::from_millis(COMMIT_INTERVAL_MS))
}

pub(crate) fn worker(
    bootstrap: &str,
    run_id: &str,
    stage: &str,
    instance: &str,
    (event_time, crash_after_changelog, threads): (bool, bool, usize),
) -> Result<()> {
    // By default arrival (causal) order: live traffic under faults without a control stream
    // makes an event-time ledger count late records, so event-time order itself is not what
    // the suite checks; `--event-time` puts the timer queue's state through the faults.
    let topology = topology(run_id, &names(run_id), event_time)?;
    let mut config = stage_config(bootstrap, instance).stream_threads(threads);
    if crash_after_changelog {
        config = config.crash_at(CrashPoint::AfterChangelog);
    }
    let running = Runtime::new(topology, config).start_stages(&[stage])?;
    // Stops cleanly when stdin closes (the driver's graceful stop) or on SIGINT/SIGTERM; a
    // failed stage is the worker's error.
    let shutdown = running.shutdown_signal().clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        shutdown.trigger();
    });
    running.wait_for_signal()?;
    Ok(())
}

/// A stage process.
pub(crate) struct Worker {
    pub(crate) stage: &'static str,
    pub(crate) instance: String,
    pub(crate) child: Child,
    /// Its log file (warnings and its delivery journal).
    pub(crate) log: PathBuf,
}

pub(crate) struct Driver {
    pub(crate) bootstrap: String,
    pub(crate) run_id: String,
    pub(crate) exe: PathBuf,
    pub(crate) logs: PathBuf,
    pub(crate) spawned: u32,
    pub(crate) event_time: bool,
    /// Workers journal every delivery into their logs (the fault suite's re-read
    /// measurement); off for the soak, whose hour of deliveries would fill the disk.
    pub(crate) journal: bool,
    /// Stream threads per stage process.
    pub(crate) threads: usize,
}

impl Driver {
    pub(crate) fn spawn(&mut self, stage: &'static str, instance: &str) -> Result<Worker> {
        self.spawn_with(stage, instance, false)
    }

    /// [`Driver::spawn`], armed to crash after its changelog write when `crash` is set.
    pub(crate) fn spawn_with(
        &mut self,
        stage: &'static str,
        instance: &str,
        crash: bool,
    ) -> Result<Worker> {
        self.spawned += 1;
        let log = self.logs.join(format!(
            "{}-{stage}-{instance}-{}.log",
            self.run_id, self.spawned
        ));
        let file = std::fs::File::create(&log).with_context(|| format!("{}", log.display()))?;
        let mut command = Command::new(&self.exe);
        command.args([
            "worker",
            "--bootstrap",
            &self.bootstrap,
            "--run-id",
            &self.run_id,
            "--stage",
            stage,
            "--instance",
            instance,
        ]);
        if self.event_time {
            command.arg("--event-time");
        }
        if crash {
            command.arg("--crash-after-changelog");
        }
        command.args(["--threads", &self.threads.to_string()]);
        // `CHAOS_WORKER_LOG` replaces the workers' log filter (e.g.
        // `info,librdkafka=debug,parsley_runtime=debug` with `CHAOS_RDKAFKA_DEBUG=cgrp,eos`)
        // to see why a worker stopped.
        if let Ok(filter) = std::env::var("CHAOS_WORKER_LOG") {
            command.env("RUST_LOG", filter);
        } else if !self.journal {
            command.env("RUST_LOG", format!("{QUIET},parsley_runtime=info"));
        }
        let child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .context("starting a worker")?;
        Ok(Worker {
            stage,
            instance: instance.to_string(),
            child,
            log,
        })
    }
}

impl Driver {
    /// `kill -9` of `workers[i]`, then a new process of the same stage under the same
    /// instance id in its place (a restarted process keeps its identity). Returns the killed
    /// process's log and the kill's moment (ms since the epoch).
    pub(crate) fn kill_and_respawn(
        &mut self,
        workers: &mut [Worker],
        i: usize,
    ) -> Result<(PathBuf, i64)> {
        let w = &mut workers[i];
        let at = now_ms();
        w.child.kill()?; // SIGKILL
        w.child.wait()?;
        let killed = w.log.clone();
        let (stage, instance) = (w.stage, w.instance.clone());
        workers[i] = self.spawn(stage, &instance)?;
        Ok((killed, at))
    }
}

/// Closes a worker's stdin (graceful stop) and waits for it; `Err` if it failed.
pub(crate) fn stop(mut w: Worker) -> Result<()> {
    drop(w.child.stdin.take());
    let status = w.child.wait()?;
    if !status.success() {
        bail!("worker {}/{} exited with {status}", w.stage, w.instance);
    }
    Ok(())
}

/// How long a failing suite's worker logs are kept (they are read after it; a suite whose runs
/// all pass removes its own at the end).
pub(crate) const KEEP_LOGS: Duration = Duration::from_secs(24 * 3600);

/// A fresh directory for this suite's worker logs under `root` (one per invocation, so
/// concurrent suites do not mix their logs), after removing the directories of suites that
/// ended more than [`KEEP_LOGS`] ago.
pub(crate) fn suite_logs(root: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(root)?;
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > KEEP_LOGS);
        if old {
            let path = entry.path();
            // Logs of suites before this layout were files directly under `root`.
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if let Err(e) = removed {
                eprintln!("chaos: could not remove old logs {}: {e}", path.display());
            }
        }
    }
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let dir = root.join(format!("suite-{stamp}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Every topic of run `run_id`: inputs, outputs and the stages' changelogs.
pub(crate) fn run_topics(run_id: &str, names: &TopicNames) -> Vec<String> {
    let mut topics = vec![
        names.stock.clone(),
        names.sales.clone(),
        names.facts.clone(),
        names.ledger.clone(),
    ];
    topics.extend(
        ["sales-facts", "ledger"].map(|stage| changelog_topic(&format!("{run_id}.{stage}"))),
    );
    topics
}

/// Waits until every partition of `topics` answers a `ListOffsets` (it has a leader), at most
/// three minutes.
pub(crate) fn wait_for_leaders(admin: &Admin, topics: &[String], partitions: i32) -> Result<()> {
    let all: Vec<(&str, i32)> = topics
        .iter()
        .flat_map(|t| (0..partitions).map(move |p| (t.as_str(), p)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        match admin.high_watermarks(&all) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                eprintln!("chaos: waiting for partition leaders after the broker restart: {e}");
            }
            Err(e) => bail!("partitions without a leader 180 s after a broker restart: {e}"),
        }
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suite_gets_a_fresh_log_directory_and_old_logs_go() {
        let root = std::env::temp_dir().join(format!("parsley-chaos-test-{}", std::process::id()));
        std::fs::create_dir_all(root.join("suite-old")).unwrap();
        std::fs::write(root.join("chaos-1-old.log"), b"x").unwrap();
        std::fs::write(root.join("chaos-2-new.log"), b"x").unwrap();
        let two_days_ago = SystemTime::now() - 2 * KEEP_LOGS;
        for old in ["suite-old", "chaos-1-old.log"] {
            std::fs::File::options()
                .read(true)
                .write(old.ends_with(".log"))
                .open(root.join(old))
                .unwrap()
                .set_modified(two_days_ago)
                .unwrap();
        }
        let dir = suite_logs(&root).unwrap();
        assert!(dir.is_dir() && dir.starts_with(&root));
        assert!(!root.join("suite-old").exists());
        assert!(!root.join("chaos-1-old.log").exists());
        assert!(
            root.join("chaos-2-new.log").exists(),
            "recent logs are kept"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
