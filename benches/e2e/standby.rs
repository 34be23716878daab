//! `cargo xtask bench standby`: how long a task that moves to another instance takes to commit
//! again, with and without a standby of it there (`RuntimeConfig::standby_replicas`).
//!
//! Per case, on fresh topics (an input and an output of two partitions, so two tasks): the input
//! is preloaded with `--keys` unique keys per task; instance A of the count per key
//! ([`crate::parsley::count_topology`]) counts them all, then instance B joins and the group
//! gives each instance one task. Both run in this process, each with a state directory of its
//! own (`--memory`: state on the heap). In the `standby` case both keep one standby per task,
//! and the benchmark waits until B's standby of A's task has read A's changelog partition to its
//! end. Then A stops (a final commit, then it leaves the group), one record is written to A's
//! task, and B's figures are polled every 5 ms until B's first commit covering that record. The
//! `none` case does the same without standbys: the task's restore reads its changelog whole.
//!
//! Printed per case: the changelog records the moved task's restore read, its restore time (the
//! task's own figure), and the time from A's stop to that first commit — the rebalance, the
//! restore and the commit, an upper bound of the time from the assignment to the first commit.
//! The goal: with a standby, the first commit at most 2 s after the assignment.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use parsley_runtime::{Admin, Progress, Running, Runtime, RuntimeConfig, TaskPhase};

use crate::load::{self, Keys};
use crate::worker::check_deadline;

/// The goal: a moved task's first commit at most this long after the group assigned it.
const GOAL: Duration = Duration::from_secs(2);

#[derive(Args, Debug, Clone)]
pub struct StandbyArgs {
    /// Kafka bootstrap servers.
    #[arg(long)]
    pub bootstrap: String,
    /// Unique keys per task (two tasks).
    #[arg(long, default_value_t = 5_000_000)]
    pub keys: u64,
    /// State on the heap instead of a state directory per instance.
    #[arg(long)]
    pub memory: bool,
}

/// One case's figures for the moved task.
struct Moved {
    /// Changelog offsets its restore read (end − start).
    read: i64,
    /// Its restore, as the task reports it.
    restore: Duration,
    /// From A's stop (its final commit made and its group left) to B's first commit covering
    /// the record written then: the rebalance, the restore and the commit, what a user of the
    /// task waits. It bounds the time from the assignment to the first commit from above.
    first_commit: Duration,
}

/// Runs both cases and prints their figures; `Ok(false)` when the standby case misses the goal.
///
/// # Errors
/// A stage that fails, a deadline passed, client errors.
pub fn run(args: &StandbyArgs) -> Result<bool> {
    let mut met = true;
    println!(
        "standby: {} unique keys per task, two tasks, state {}",
        args.keys,
        if args.memory { "in memory" } else { "on disk" }
    );
    for standby in [false, true] {
        let m = case(args, standby)?;
        let name = if standby { "standby" } else { "none" };
        println!(
            "standby: {name:>7}: the moved task's restore read {} changelog records in {:.2} s; its first commit {:.2} s after A stopped",
            m.read,
            m.restore.as_secs_f64(),
            m.first_commit.as_secs_f64()
        );
        if standby && m.first_commit > GOAL {
            met = false;
        }
    }
    println!(
        "standby: goal: with a standby, the first commit within {} s of the assignment (A's stop, the rebalance included): {}",
        GOAL.as_secs(),
        if met { "met" } else { "NOT met" }
    );
    Ok(met)
}

/// One case (module docs).
fn case(args: &StandbyArgs, standby: bool) -> Result<Moved> {
    let run = format!(
        "standby-{}-{}",
        if standby { "on" } else { "off" },
        std::process::id()
    );
    let (input, output) = (format!("{run}-in"), format!("{run}-out"));
    let admin = Admin::new(&args.bootstrap, Duration::from_secs(60))?;
    crate::create(&admin, &[&input, &output], 2)?;
    let records = 2 * args.keys;
    load::preload(&args.bootstrap, &input, 2, records, 8, Keys::Unique)?;
    let topology = crate::parsley::count_topology(&run, &input, &output)?;
    let stage = topology.stages()[0].name().to_string();
    let changelog = parsley_runtime::changelog_topic(&topology.stages()[0].group_id(&run));
    let dirs: Vec<PathBuf> = ["a", "b"]
        .iter()
        .map(|i| std::env::temp_dir().join(format!("{run}-{i}")))
        .collect();
    let config = |i: usize| {
        let c = RuntimeConfig::new(&args.bootstrap)
            .instance_id(format!("{run}-{i}"))
            .standby_replicas(usize::from(standby));
        if args.memory {
            c
        } else {
            c.state_dir(&dirs[i])
        }
    };

    let a = Runtime::new(topology.clone(), config(0))
        .start()
        .context("starting instance A")?;
    wait(&a, &stage, "A counts the preload", |r| {
        Ok(committed(r, &stage) >= records)
    })?;
    let b = Runtime::new(topology, config(1))
        .start()
        .context("starting instance B")?;
    let one_each = |r: &Running| -> Result<Option<i32>> {
        let tasks = tasks(r, &stage);
        Ok((tasks.len() == 1 && tasks[0].phase == TaskPhase::Running).then(|| tasks[0].partition))
    };
    wait(&b, &stage, "one task on each instance", |r| {
        Ok(one_each(r)?.is_some() && one_each(&a)?.is_some())
    })?;
    let on_a = one_each(&a)?.context("A's task")?;
    if standby {
        let end = admin.high_watermarks(&[(changelog.as_str(), on_a)])?[0];
        wait(&b, &stage, "B's standby of A's task at its end", |r| {
            Ok(r.standby_metrics()
                .into_iter()
                .find(|(n, _)| *n == stage)
                .is_some_and(|(_, s)| s.iter().any(|s| s.partition == on_a && s.position >= end)))
        })?;
    }

    let producer = load::producer(&args.bootstrap, 0)?;
    let before = committed(&b, &stage);
    a.stop().context("stopping instance A")?;
    let stopped = Instant::now();
    load::send_one(&producer, &input, on_a, 2)?;
    let moved = loop {
        let now = tasks(&b, &stage);
        if let Some(t) = now.iter().find(|t| t.partition == on_a)
            && t.phase == TaskPhase::Running
            && committed(&b, &stage) > before
        {
            break Moved {
                read: t.restore_end - t.restore_start,
                restore: Duration::from_millis(t.restore_ms),
                first_commit: stopped.elapsed(),
            };
        }
        if let Some(Progress::Failed { error, .. }) = b.next_progress(Duration::from_millis(5)) {
            bail!("instance B failed: {error}");
        }
        check_deadline(stopped, "the moved task's first commit")?;
    };
    b.stop().context("stopping instance B")?;
    admin
        .delete_topics(&[&input, &output, &changelog])
        .context("deleting the case's topics")?;
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(moved)
}

/// Committed deliveries of stage `stage` of `r`.
pub(crate) fn committed(r: &Running, stage: &str) -> u64 {
    r.metrics()
        .into_iter()
        .find(|(n, _)| n == stage)
        .map_or(0, |(_, m)| m.committed_deliveries)
}

/// The tasks of stage `stage` of `r`.
fn tasks(r: &Running, stage: &str) -> Vec<parsley_runtime::TaskMetrics> {
    r.task_metrics()
        .into_iter()
        .find(|(n, _)| n == stage)
        .map(|(_, t)| t)
        .unwrap_or_default()
}

/// Waits until `done` holds for `r` (`what`, for the error).
pub(crate) fn wait(
    r: &Running,
    stage: &str,
    what: &str,
    done: impl Fn(&Running) -> Result<bool>,
) -> Result<()> {
    let started = Instant::now();
    while !done(r)? {
        if let Some(Progress::Failed { error, .. }) = r.next_progress(Duration::from_millis(20)) {
            bail!("stage {stage} failed while waiting for {what}: {error}");
        }
        check_deadline(started, what)?;
    }
    Ok(())
}
