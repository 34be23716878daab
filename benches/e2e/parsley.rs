//! The Parsley cases, run by the runtime: a topology of one pass-through stage, and a count
//! per key written with the DSL.
//!
//! The pass-through handler emits each record's key and value unchanged to the output topic;
//! keys and values are raw bytes (`parsley_stage::Bytes`, the identity codec), so no
//! serialisation cost is added: the value the runtime copied out of the consumer is what it
//! sends. The stage stamps every output, keeps its gate snapshot in its changelog and commits
//! outputs, snapshot and input offsets in one transaction per commit interval — everything a
//! real stage does, with no user logic.
//!
//! The count ([`count_topology`]) is what a user writes:
//! `stream::<String, Vec<u8>>(input).group_by_key().count().to_stream().to(output)`. The key is
//! read as UTF-8 text, the value as bytes (and not looked at); the stream is not re-keyed, so
//! the count runs in the stage that reads the input, with no repartition topic. After each
//! record the key's new count goes to the output (key as UTF-8, count as a JSON number: the
//! `Auto` codec's choice for an `i64`), and the count itself lives in the stage's per-key state
//! and its changelog, committed with the outputs and the input offsets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use parsley_dsl::StreamsBuilder;
use parsley_runtime::{Progress, Runtime, RuntimeConfig, StatisticsSink};
use parsley_stage::{Bytes, Handler, HandlerResult, KeyPartitioning, Record, Step, Topology};

use crate::statistics::{self, StatisticsFile};
use crate::worker::{Measured, Mode, WorkerArgs, check_deadline};

/// The pass-through stage's name (its consumer group is `{application}.pass`).
pub const STAGE: &str = "pass";

/// The name of the count (its state slot; the DSL names the stage after its source topic).
pub const COUNT: &str = "counts";

/// Emits its input unchanged to `sink`.
#[derive(Debug, Clone)]
pub struct PassThrough {
    /// The output topic (shared with each emission: no allocation per record).
    pub sink: Arc<str>,
}

impl Handler for PassThrough {
    type Key = Vec<u8>;
    type Value = Vec<u8>;
    type Output = Vec<u8>;
    type State = ();

    fn handle(
        &self,
        record: Record<'_, Vec<u8>, Vec<u8>>,
        _state: Option<()>,
    ) -> HandlerResult<Vec<u8>, Vec<u8>, ()> {
        Ok(Step::none().emit(Arc::clone(&self.sink), record.key, record.value))
    }
}

/// The pass-through topology of application `app` from `input` to `output`; `unchecked_keys`
/// opts the input out of the key-partition check.
///
/// # Errors
/// When the names are not legal topic names.
pub fn topology(app: &str, input: &str, output: &str, unchecked_keys: bool) -> Result<Topology> {
    let handler = PassThrough {
        sink: output.into(),
    };
    Topology::builder(app)
        .stage(STAGE, handler, |s| {
            let s = s
                .source(input)
                .sink(output)
                .key_codec(Bytes)
                .value_codec(Bytes)
                .output_codec(Bytes);
            if unchecked_keys {
                s.key_partitioning(input, KeyPartitioning::Unchecked)
            } else {
                s
            }
        })
        .build()
        .context("building the pass-through topology")
}

/// The count per key of application `app`, from `input` to `output` (module docs).
///
/// # Errors
/// When the names are not legal topic names.
pub fn count_topology(app: &str, input: &str, output: &str) -> Result<Topology> {
    let builder = StreamsBuilder::new(app);
    builder
        .stream::<String, Vec<u8>>(input)
        .group_by_key()
        .named(COUNT)
        .count()
        .to_stream()
        .to(output);
    builder.build().context("building the count topology")
}

/// The topology of a Parsley `mode` for `args`.
///
/// # Errors
/// When it cannot be built, or `mode` is not a Parsley mode.
pub fn topology_of(mode: Mode, args: &WorkerArgs) -> Result<Topology> {
    match mode {
        Mode::Parsley => topology(&args.group, &args.input, &args.output, args.unchecked_keys),
        Mode::ParsleyCount => count_topology(&args.group, &args.input, &args.output),
        _ => bail!("{mode} is not a Parsley mode"),
    }
}

/// The runtime configuration of `args`: its commit interval, its state directory and its
/// memory bound.
fn config_of(args: &WorkerArgs) -> RuntimeConfig {
    let mut config = RuntimeConfig::new(&args.bootstrap)
        .commit_interval(args.commit_interval())
        .stream_threads(args.threads);
    if let Some(dir) = &args.state_dir {
        config = config.state_dir(dir);
    }
    if let Some(bytes) = args.state_memory_bytes {
        config = config.state_memory_bytes(bytes);
    }
    config
}

/// What a restart's restore read: changelog records (offsets) over every task.
pub struct Restored {
    /// Offsets read: the sum over tasks of the end minus where the restore started.
    pub read: i64,
    /// The changelog's size: the sum over tasks of its high watermark.
    pub end: i64,
    /// The restores' time, summed over tasks (each from its start to the task running).
    pub took: Duration,
    /// A plain consumer's read of the whole changelog ([`raw_read`]).
    pub raw_read: Duration,
}

/// Starts the stage of `args` again and waits until every task has restored (the partitions
/// of its input, `--partitions` of the `topics` command); returns what the restores read.
///
/// # Errors
/// When the stage fails or its tasks do not all run within the deadline.
pub fn restart(args: &WorkerArgs) -> Result<Restored> {
    let topology = topology_of(args.mode, args)?;
    let stage = topology.stages()[0].name().to_string();
    let admin = parsley_runtime::Admin::new(&args.bootstrap, Duration::from_secs(30))?;
    let partitions = admin.describe_topics(&[args.input.as_str()])?[0].partitions as usize;
    let started = Instant::now();
    let running = Runtime::new(topology, config_of(args))
        .start()
        .context("restarting the stage")?;
    let tasks = loop {
        if let Some((_, tasks)) = running
            .task_metrics()
            .into_iter()
            .find(|(n, _)| *n == stage)
            && tasks.len() == partitions
            && tasks
                .iter()
                .all(|t| t.phase == parsley_runtime::TaskPhase::Running)
        {
            break tasks;
        }
        if let Some(Progress::Failed { error, .. }) =
            running.next_progress(Duration::from_millis(5))
        {
            bail!("the restarted stage failed: {error}");
        }
        check_deadline(started, "the restarted stage's restore")?;
    };
    let took = Duration::from_millis(tasks.iter().map(|t| t.restore_ms).sum());
    running.stop().context("stopping the restarted stage")?;
    let changelog = parsley_runtime::changelog_topic(
        &topology_of(args.mode, args)?.stages()[0].group_id(&args.group),
    );
    let raw_read = raw_read(&args.bootstrap, &changelog, partitions as i32)?;
    Ok(Restored {
        read: tasks.iter().map(|t| t.restore_end - t.restore_start).sum(),
        end: tasks.iter().map(|t| t.restore_end).sum(),
        took,
        raw_read,
    })
}

/// How long a plain `read_committed` consumer takes to read `topic`'s `partitions` partitions
/// from their start to their high watermarks, one partition after the other as restores do (a
/// new consumer for each): the reference for a restore that reads its changelog whole.
///
/// # Errors
/// Client errors; no end within the deadline.
pub fn raw_read(bootstrap: &str, topic: &str, partitions: i32) -> Result<Duration> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    let admin = parsley_runtime::Admin::new(bootstrap, Duration::from_secs(30))?;
    let started = Instant::now();
    for p in 0..partitions {
        let end = admin.high_watermarks(&[(topic, p)])?[0];
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("{topic}.raw-read"))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("fetch.wait.max.ms", "50")
            .create()
            .context("creating the raw reader")?;
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)?;
        consumer.assign(&tpl)?;
        let mut next = 0;
        while next < end {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => next = m.offset() + 1,
                // The end of the partition (a commit marker may follow the last record).
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => bail!("reading {topic}/{p}: {e}"),
                None => {}
            }
            check_deadline(started, "the raw read of the changelog")?;
        }
    }
    Ok(started.elapsed())
}

/// Runs the stage of `args.mode` until it has committed `args.records` deliveries, then stops
/// it.
///
/// # Errors
/// When the stage fails or does not get there within the deadline.
pub fn run(args: &WorkerArgs) -> Result<Measured> {
    let mut config = config_of(args);
    if let Some(path) = &args.statistics {
        let file = StatisticsFile::create(path)?;
        config = config.statistics(
            statistics::INTERVAL,
            StatisticsSink::new(move |json| file.write(json)),
        );
    }
    let topology = topology_of(args.mode, args)?;
    let runtime = Runtime::new(topology, config);
    let started = Instant::now();
    let running = runtime.start().context("starting the stage")?;
    // The first fetch: the stream thread's fetch counter, looked at every millisecond (the
    // resolution of this start time; the runtime sends no event before its first commit).
    let first_fetch = loop {
        if running.metrics()[0].1.fetched > 0 {
            break Instant::now();
        }
        if let Some(Progress::Failed { error, .. }) =
            running.next_progress(Duration::from_millis(1))
        {
            bail!("the stage failed: {error}");
        }
        check_deadline(started, "waiting for the stage's first fetch")?;
    };
    // The end: the commit after which the stage's counters (summed over its stream threads;
    // an event carries its own thread's) cover every record.
    let (metrics, done) = loop {
        match running.next_progress(Duration::from_secs(1)) {
            Some(Progress::Committed { .. })
                if running.metrics()[0].1.committed_deliveries >= args.records =>
            {
                break (running.metrics()[0].1, Instant::now());
            }
            Some(Progress::Failed { error, .. }) => bail!("the stage failed: {error}"),
            Some(Progress::Stopped { .. }) => bail!("the stage stopped before the end"),
            Some(Progress::Committed { .. }) | None => {}
        }
        check_deadline(started, "the Parsley stage")?;
    };
    running.stop().context("stopping the stage")?;
    Ok(Measured {
        records: metrics.committed_deliveries,
        elapsed: done.duration_since(first_fetch),
        transactions: metrics.transactions,
    })
}
