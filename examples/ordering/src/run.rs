//! One measured run: fresh topics, the seeded history, then one strategy reading it while live
//! traffic flows, until every record is released or the run's grace period after the live
//! traffic ends.

use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use parsley_runtime::{Admin, changelog_topic};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::{info, warn};

use crate::baseline::{BaselineSettings, Job, Mechanism};
use crate::error::{Error, Result};
use crate::measure::{Anchor, ClockBreakdown, Release, Summary, TickSeen};
use crate::observe::Observer;
use crate::offsets::{self, Clock, OffsetsSettings};
use crate::plain::{self, PlainDrain};
use crate::produce::{self, LiveTraffic};
use crate::workload::{History, Workload, WorkloadConfig};

/// The four strategies of the experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// (a) a fixed event-time window.
    Window,
    /// (b) timeout idleness in two layers.
    TwoLayer,
    /// (c) timeout idleness in one layer.
    OneLayer,
    /// (d) offset completeness: the Parsley stage.
    Offsets,
    /// Reference: the same Parsley stage without event-time ordering (arrival order, the
    /// causal gate only): what ordering costs.
    Arrival,
}

impl Strategy {
    /// All five, in the table's order.
    pub const ALL: [Strategy; 5] = [
        Strategy::Window,
        Strategy::TwoLayer,
        Strategy::OneLayer,
        Strategy::Offsets,
        Strategy::Arrival,
    ];

    /// The table's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Window => "fixed window",
            Strategy::TwoLayer => "timeout, two layers",
            Strategy::OneLayer => "timeout, one layer",
            Strategy::Offsets => "offset completeness",
            Strategy::Arrival => "Parsley, arrival order",
        }
    }

    /// A short name for flags and files.
    pub fn slug(self) -> &'static str {
        match self {
            Strategy::Window => "window",
            Strategy::TwoLayer => "two-layer",
            Strategy::OneLayer => "one-layer",
            Strategy::Offsets => "offsets",
            Strategy::Arrival => "arrival",
        }
    }

    /// Parses [`Strategy::slug`].
    ///
    /// # Errors
    /// [`Error::Config`] for an unknown name.
    pub fn from_slug(s: &str) -> Result<Self> {
        Strategy::ALL
            .into_iter()
            .find(|x| x.slug() == s)
            .ok_or_else(|| {
                Error::config(
                    "strategies",
                    format!(
                        "unknown strategy {s:?} (window, two-layer, one-layer, offsets, arrival)"
                    ),
                )
            })
    }
}

/// Settings of the strategies (times in ms unless a `Duration`).
#[derive(Debug, Clone, PartialEq)]
pub struct StrategySettings {
    /// (a): the window, ms of event time.
    pub window_ms: i64,
    /// (b): idleness at the source, per partition.
    pub source_idle: Duration,
    /// (b): idleness at the union, per topic.
    pub union_idle: Duration,
    /// (c): idleness per partition.
    pub idle: Duration,
    /// (a)–(c): how often the watermark is emitted.
    pub watermark_interval: Duration,
    /// (a)–(c): every topic's consumer starts after a delay drawn from `[0, start_spread]`
    /// by the seed ([`start_delays`]).
    pub start_spread: Duration,
    /// (a)–(c): one event topic per seed is slow to start: its delay is drawn from
    /// `[0, slow_start]`.
    pub slow_start: Duration,
    /// (b)–(d): the clock's lag, ms (the baselines' processing-time source and the Parsley
    /// stage's clock).
    pub control_lag_ms: i64,
    /// (d): the Parsley stage's live clock.
    pub clock: Clock,
    /// (d): the runtime's commit interval.
    pub commit_interval: Duration,
    /// (d): forward released events to an output topic (tests read it back).
    pub output: bool,
    /// (d): also time a plain consumer reading the same history first.
    pub plain_reference: bool,
}

impl Default for StrategySettings {
    /// Window 5 s; idleness 1 s per partition (one layer and the two-layer source), 500 ms
    /// per topic at the union; watermarks every 200 ms (Flink's default); consumers start
    /// within 300 ms, one slow topic within 2 s; lag 20 ms; the built-in clock ticking every
    /// 20 ms; commit interval 100 ms.
    fn default() -> Self {
        StrategySettings {
            window_ms: 5_000,
            source_idle: Duration::from_millis(1_000),
            union_idle: Duration::from_millis(500),
            idle: Duration::from_millis(1_000),
            watermark_interval: Duration::from_millis(200),
            start_spread: Duration::from_millis(300),
            slow_start: Duration::from_millis(2_000),
            control_lag_ms: 20,
            clock: Clock::BuiltIn {
                tick_interval_ms: 20,
            },
            commit_interval: Duration::from_millis(100),
            output: false,
            plain_reference: true,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The strategy.
    pub strategy: Strategy,
    /// The workload's seed.
    pub seed: u64,
    /// History events written.
    pub history_records: u64,
    /// Live events written.
    pub live_records: u64,
    /// The figures.
    pub summary: Summary,
    /// The plain consumer's drain of the same history, if timed.
    pub plain: Option<PlainDrain>,
    /// Per topic: its consumer's start delay (baselines only).
    pub start_delays: Vec<Duration>,
    /// The output topic, when [`StrategySettings::output`] is set (left in place for the
    /// caller to read back; the other topics are deleted).
    pub output: Option<String>,
    /// Every release, in the order reported.
    pub releases: Vec<Release>,
    /// Offset completeness: the runtime's violation counter (records that arrived with an
    /// event time below their task's watermark).
    pub late: Option<u64>,
    /// Offset completeness with the built-in clock: where the steady live hold went.
    pub clock: Option<ClockBreakdown>,
}

/// The per-topic start delays of seed `seed`, in [`Workload::topics`] order: every consumer
/// connects after a delay in `[0, spread]`, and one event topic, chosen by the seed, is slow:
/// its delay is drawn from `[0, slow]` instead (if that is longer).
pub fn start_delays(
    seed: u64,
    workload: &Workload,
    spread: Duration,
    slow: Duration,
) -> Vec<Duration> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x00de_1a75);
    let mut draw =
        |max: Duration| Duration::from_millis(rng.random_range(0..=max.as_millis() as u64));
    let mut delays: Vec<Duration> = workload.topics().iter().map(|_| draw(spread)).collect();
    let slow_topic = (seed as usize) % workload.config().event_topics;
    delays[slow_topic] = delays[slow_topic].max(draw(slow));
    delays
}

/// Runs `strategy` on a fresh copy of the workload `config` (its `prefix` gets a unique
/// suffix): writes the history (ticking `bar`), starts the strategy and the live traffic
/// together, collects releases until every event is released or `grace` has passed since the
/// live events ended, stops everything and deletes the topics.
///
/// # Errors
/// Any [`Error`] of the generator or the strategy.
pub fn run(
    bootstrap: &str,
    config: &WorkloadConfig,
    strategy: Strategy,
    settings: &StrategySettings,
    grace: Duration,
    bar: &ProgressBar,
) -> Result<RunOutcome> {
    let admin = Admin::new(bootstrap, Duration::from_secs(60))
        .map_err(|e| Error::runtime("creating an admin client", e))?;
    let unique = format!(
        "{}-{}-s{}-{:x}",
        config.prefix,
        strategy.slug(),
        config.seed,
        produce::now_ms()
    );
    let workload = Workload::new(WorkloadConfig {
        prefix: unique.clone(),
        ..config.clone()
    })?;
    produce::create_topics(&admin, &workload)?;
    let mut cleanup: Vec<String> = workload.topics();
    let result = measure(
        bootstrap,
        &admin,
        &workload,
        strategy,
        settings,
        grace,
        bar,
        &mut cleanup,
    );
    let keep = result.as_ref().ok().and_then(|r| r.output.clone());
    cleanup.retain(|t| Some(t) != keep.as_ref());
    let names: Vec<&str> = cleanup.iter().map(String::as_str).collect();
    if let Err(e) = admin.delete_topics(&names) {
        warn!(error = %e, "deleting the run's topics");
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn measure(
    bootstrap: &str,
    admin: &Admin,
    workload: &Workload,
    strategy: Strategy,
    settings: &StrategySettings,
    grace: Duration,
    bar: &ProgressBar,
    cleanup: &mut Vec<String>,
) -> Result<RunOutcome> {
    let c = workload.config();
    if settings.clock == Clock::Ticker && c.control_interval_ms == 0 {
        return Err(Error::config(
            "control_interval_ms",
            "the hand-run control stream needs a ticker: a control interval above 0",
        ));
    }
    let history = workload.history(produce::now_ms());
    bar.set_length(history.events.len() as u64);
    bar.set_position(0);
    bar.set_message(format!(
        "seed {}: {}: writing history",
        c.seed,
        strategy.name()
    ));
    produce::write_history(bootstrap, workload, &history, bar)?;
    let mut plain = None;
    if strategy == Strategy::Offsets && settings.plain_reference {
        bar.set_message(format!(
            "seed {}: plain consumer reading the history",
            c.seed
        ));
        let p = plain::drain(
            bootstrap,
            admin,
            &offsets::sources(workload, settings.clock),
            c.partitions,
            &format!("{}.plain", c.prefix),
        )?;
        info!(records = p.records, elapsed = ?p.elapsed, "plain consumer drained the history");
        plain = Some(p);
    }
    bar.set_message(format!("seed {}: {}: running", c.seed, strategy.name()));
    let (tx, rx) = std::sync::mpsc::channel();
    let delays = start_delays(c.seed, workload, settings.start_spread, settings.slow_start);
    let mut output = None;
    let anchor = Anchor::now();
    info!(
        strategy = strategy.name(),
        seed = c.seed,
        "run started: the drain is timed from here"
    );
    let mut late = None;
    let mut ticks = None;
    let (releases, live) = match strategy {
        Strategy::Offsets | Strategy::Arrival => {
            let out_topic = settings.output.then(|| format!("{}.released", c.prefix));
            if let Some(o) = &out_topic {
                admin
                    .create_topics(&[parsley_runtime::TopicSpec::new(o.clone(), c.partitions)])
                    .map_err(|e| Error::runtime("creating the output topic", e))?;
                cleanup.push(o.clone());
            }
            let application = format!("{}-app", c.prefix);
            let o = OffsetsSettings {
                event_time: strategy == Strategy::Offsets,
                clock: settings.clock,
                lag_ms: settings.control_lag_ms,
                commit_interval: settings.commit_interval,
                output: out_topic.clone(),
            };
            offsets::clear_journal();
            let topology = offsets::topology(&application, workload, &o, tx)?;
            if let Some(stage) = topology.stage(offsets::STAGE) {
                cleanup.push(changelog_topic(&stage.group_id(&application)));
            }
            let running = offsets::start(bootstrap, topology, &o)?;
            // The clock's ticks, as a `read_committed` consumer sees them commit.
            let observer = match (strategy, settings.clock) {
                (Strategy::Offsets, Clock::BuiltIn { .. }) => {
                    let topic = parsley_stage::clock_topic(&application, offsets::STAGE);
                    cleanup.push(topic.clone());
                    Some(Observer::start(
                        bootstrap,
                        &[(topic, c.partitions)],
                        Box::new(|_, _| Some(())),
                    )?)
                }
                _ => None,
            };
            let live = LiveTraffic::start(bootstrap, workload, &history)?;
            let label = format!("seed {}: {}", c.seed, strategy.name());
            let collected = collect(&rx, &history, &live, grace, bar, || {
                // Restore, then catch-up progress of the stage's tasks.
                bar.set_message(format!(
                    "{label}: {}",
                    parsley_runtime::progress_summary(&running.task_metrics())
                ));
                offsets::check(&running)
            });
            let stopped = running
                .stop()
                .map_err(|e| Error::runtime("stopping the offset-completeness stage", e));
            if let Some(o) = observer {
                ticks = Some(
                    o.stop()?
                        .into_iter()
                        .map(|t| TickSeen {
                            partition: t.partition,
                            timestamp_ms: t.timestamp,
                            visible: t.at,
                        })
                        .collect::<Vec<_>>(),
                );
            }
            let summary = live.stop()?;
            let mut releases = collected?;
            late = stopped?.iter().map(|(_, m)| m.late).reduce(|a, b| a + b);
            releases.extend(rx.try_iter());
            output = out_topic;
            (releases, summary)
        }
        baseline => {
            let mechanism = match baseline {
                Strategy::Window => Mechanism::Window {
                    window_ms: settings.window_ms,
                },
                Strategy::TwoLayer => Mechanism::TwoLayer {
                    source_idle: settings.source_idle,
                    union_idle: settings.union_idle,
                },
                _ => Mechanism::OneLayer {
                    idle: settings.idle,
                },
            };
            let b = BaselineSettings {
                mechanism,
                watermark_interval: settings.watermark_interval,
                control_lag_ms: settings.control_lag_ms,
                start_delays: delays.clone(),
            };
            let job = Job::start(bootstrap, workload, &b, tx)?;
            let live = LiveTraffic::start(bootstrap, workload, &history)?;
            let collected = collect(&rx, &history, &live, grace, bar, || Ok(()));
            let stopped = job.stop();
            let summary = live.stop()?;
            let mut releases = collected?;
            stopped?;
            releases.extend(rx.try_iter());
            (releases, summary)
        }
    };
    let history_records = history.events.len() as u64;
    let summary = Summary::of(&releases, anchor, history_records, live.records);
    let clock = ticks.zip(summary.history_drain).map(|(ticks, drain)| {
        ClockBreakdown::of(
            &releases,
            &ticks,
            anchor,
            anchor.instant + drain,
            settings.control_lag_ms,
            |p| workload.partition_of(p),
        )
    });
    Ok(RunOutcome {
        strategy,
        seed: c.seed,
        history_records,
        live_records: live.records,
        summary,
        plain,
        start_delays: if matches!(strategy, Strategy::Offsets | Strategy::Arrival) {
            Vec::new()
        } else {
            delays
        },
        output,
        releases,
        late,
        clock,
    })
}

/// Collects releases until every event (history and all live events) is released, or `grace`
/// after the live events ended; `check` is called between receives (a failed stage ends the
/// run).
fn collect(
    rx: &Receiver<Release>,
    history: &History,
    live: &LiveTraffic,
    grace: Duration,
    bar: &ProgressBar,
    check: impl Fn() -> Result<()>,
) -> Result<Vec<Release>> {
    let total_history = history.events.len() as u64;
    let mut releases = Vec::with_capacity(total_history as usize);
    let mut live_done_at: Option<Instant> = None;
    bar.set_position(0);
    loop {
        // Looked at every 10 ms, never waited on: a receiver blocked in `recv` makes every
        // send wake it, a futex call per record on the thread being measured (the stage's
        // handler reports each release). The instants are taken by the senders; this loop only
        // notices when everything is in.
        std::thread::sleep(Duration::from_millis(10));
        let before = releases.len();
        let disconnected = loop {
            match rx.try_recv() {
                Ok(r) => releases.push(r),
                Err(TryRecvError::Empty) => break false,
                Err(TryRecvError::Disconnected) => break true,
            }
        };
        if releases.len() > before {
            bar.set_position(releases.len() as u64);
        }
        if disconnected {
            break;
        }
        check()?;
        if live_done_at.is_none() && live.is_done() {
            live_done_at = Some(Instant::now());
            bar.set_length(total_history + live.records_written());
        }
        if let Some(done) = live_done_at {
            if releases.len() as u64 >= total_history + live.records_written() {
                break;
            }
            if done.elapsed() >= grace {
                info!(
                    released = releases.len(),
                    "grace period over with records still held"
                );
                break;
            }
        }
    }
    Ok(releases)
}
