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

/// Runs the stage of `args.mode` until it has committed `args.records` deliveries, then stops
/// it.
///
/// # Errors
/// When the stage fails or does not get there within the deadline.
pub fn run(args: &WorkerArgs) -> Result<Measured> {
    let mut config = RuntimeConfig::new(&args.bootstrap).commit_interval(args.commit_interval());
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
    // The end: the commit event whose counters cover every record.
    let (metrics, done) = loop {
        match running.next_progress(Duration::from_secs(1)) {
            Some(Progress::Committed { metrics, .. })
                if metrics.committed_deliveries >= args.records =>
            {
                break (metrics, Instant::now());
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
