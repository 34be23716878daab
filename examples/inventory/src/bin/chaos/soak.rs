//! `chaos soak`: the inventory pipeline for a long run at a steady rate, with a fault every few
//! minutes, checked by the oracle at the end.
//!
//! First the pipeline's maximum throughput on the target (unless `--rate` is given), on fresh
//! topics, twice ([`measure_max`]): a backlog drained by both stage processes from their
//! start, and the generator unpaced while both stages run beside it (the live figure, which
//! sets the rate). Then the run: fresh topics, the two stages as processes, the generator
//! paced at half the live rate ([`parsley_inventory::generator::Pacer`]), and a fault every
//! `--fault-every` seconds on average (from the seed), taking the kinds in turn: `kill -9` of a
//! stage process and a restart under the same instance id, a broker restart (the generator
//! pauses between two transactions for it) and a join/leave on one broker; on the three-node
//! cluster `kill -9` of a stage process, `kill -9` and restart of a partition leader's node, a
//! preferred-leader election, and `kill -9` of a stage's transaction or group coordinator
//! ([`cluster`]). A stage process that ends on its own is reported and started again under its
//! instance id, as a supervisor would; the checks then say what the exit did to the records.
//!
//! While it runs, the driver samples each stage process's RSS from `/proc` every
//! [`SAMPLE`], and one `read_committed` reader follows the facts and the ledger: each ledger
//! entry carries its input's send time (`at`: the input record's timestamp, which the
//! producer set when it was sent, carried from a sale to its fact), so its arrival minus `at`
//! is the end-to-end latency. The same reader's records are the delivery logs the oracle
//! checks at the end (decoded as they arrive: one read, no raw records kept).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use indicatif::ProgressBar;
use parsley_inventory::check::{DeliveryLogs, Outcome, TopicNames, check};
use parsley_inventory::generator::{GenConfig, GenControl, GroundTruth, generate};
use parsley_inventory::model::{Event, LedgerEntry};
use parsley_inventory::pipeline::names;
use parsley_runtime::rdkafka::consumer::{BaseConsumer, Consumer};
use parsley_runtime::rdkafka::types::RDKafkaErrorCode;
use parsley_runtime::rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use parsley_runtime::{Admin, TopicSpec};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::cluster::{self, ClusterFault};
use crate::procs::{Driver, Worker, now_ms, run_topics, stop, suite_logs, wait_for_leaders};
use crate::soak_chart;
use crate::soak_report::Report;
use crate::soak_stats::read_proc_mib;

/// How often each stage process's RSS is sampled.
pub(crate) const SAMPLE: Duration = Duration::from_secs(5);

/// Partitions of every topic.
const PARTITIONS: i32 = 4;

/// What `chaos soak` was asked for.
pub(crate) struct SoakArgs {
    pub bootstrap: Option<String>,
    pub minutes: f64,
    pub rate: Option<f64>,
    pub seed: u64,
    pub fault_every: f64,
    pub cluster: bool,
    pub window_minutes: f64,
    pub measure_rounds: usize,
    pub measure_secs: f64,
    pub products: usize,
    pub out: PathBuf,
}

/// A fault of the soak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SoakFault {
    Kill,
    Join,
    Broker,
    Cluster(ClusterFault),
}

impl SoakFault {
    fn name(self) -> &'static str {
        match self {
            SoakFault::Kill => "kill",
            SoakFault::Join => "join",
            SoakFault::Broker => "broker",
            SoakFault::Cluster(c) => c.name(),
        }
    }
}

/// A fault as injected: its start, ms since the run's start, its kind and what it did.
pub(crate) struct Injected {
    pub at: u32,
    pub kind: &'static str,
    pub what: String,
    /// How long it took, healing included, ms.
    pub took: u32,
}

/// One RSS sample of a stage process.
pub(crate) struct RssSample {
    pub at: u32,
    pub stage: &'static str,
    pub pid: u32,
    pub mib: f64,
}

/// Samples the RSS of the current stage processes every [`SAMPLE`] on a thread of its own,
/// so that a fault that takes seconds to inject and heal leaves no gap.
struct Sampler {
    pids: Arc<Mutex<Vec<(&'static str, u32)>>>,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<RssSample>>,
}

impl Sampler {
    fn start(started: Instant) -> Sampler {
        let pids: Arc<Mutex<Vec<(&'static str, u32)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (pids, stop) = (pids.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut out = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let now: Vec<(&'static str, u32)> =
                        pids.lock().map(|p| p.clone()).unwrap_or_default();
                    for (stage, pid) in now {
                        // A process killed a moment ago is gone: no sample.
                        if let Some(mib) = read_proc_mib(&format!("/proc/{pid}/status"), "VmRSS") {
                            out.push(RssSample {
                                at: started.elapsed().as_millis() as u32,
                                stage,
                                pid,
                                mib,
                            });
                        }
                    }
                    // The sampling period (a cadence, not a wait for an event).
                    std::thread::sleep(SAMPLE);
                }
                out
            })
        };
        Sampler { pids, stop, handle }
    }

    /// The stage processes to sample from now on.
    fn track(&self, workers: &[Worker]) {
        if let Ok(mut p) = self.pids.lock() {
            *p = workers.iter().map(|w| (w.stage, w.child.id())).collect();
        }
    }

    fn finish(self) -> Vec<RssSample> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().unwrap_or_default()
    }
}

/// What a reader of the outputs collected.
struct ReadBack {
    logs: DeliveryLogs,
    /// (arrival, ms since the run's start; end-to-end latency, ms) per ledger entry.
    latencies: Vec<(u32, u32)>,
    /// The first and the last arrival of a ledger entry, ms since the epoch.
    first_last: Option<(i64, i64)>,
}

/// A `read_committed` reader following the facts and the ledger from their start.
struct Reader {
    stop: Arc<AtomicBool>,
    facts: Arc<AtomicU64>,
    ledger: Arc<AtomicU64>,
    handle: JoinHandle<Result<ReadBack>>,
}

impl Reader {
    fn start(bootstrap: &str, names: &TopicNames, origin_ms: i64) -> Result<Reader> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("{}-soak-reader", names.ledger))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .context("the soak's reader")?;
        let mut tpl = TopicPartitionList::new();
        for topic in [&names.facts, &names.ledger] {
            for p in 0..PARTITIONS {
                tpl.add_partition_offset(topic, p, Offset::Beginning)?;
            }
        }
        consumer.assign(&tpl)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (facts, ledger) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let handle = {
            let (stop, n_facts, n_ledger) = (stop.clone(), facts.clone(), ledger.clone());
            let facts_topic = names.facts.clone();
            std::thread::spawn(move || -> Result<ReadBack> {
                let mut back = ReadBack {
                    logs: DeliveryLogs::default(),
                    latencies: Vec::new(),
                    first_last: None,
                };
                // The next offset per (is facts, partition): a fetch repeated after a leader
                // change is not a second record.
                let mut next = [[0i64; PARTITIONS as usize]; 2];
                while !stop.load(Ordering::SeqCst) {
                    let Some(m) = consumer.poll(Duration::from_millis(100)) else {
                        continue;
                    };
                    let m = match m {
                        Ok(m) => m,
                        // Brokers restart on purpose: the reader carries on (and says so only
                        // for errors other than a lost connection).
                        Err(e) => {
                            if !matches!(
                                e.rdkafka_error_code(),
                                Some(
                                    RDKafkaErrorCode::BrokerTransportFailure
                                        | RDKafkaErrorCode::AllBrokersDown
                                )
                            ) {
                                eprintln!("soak: reader: {e}");
                            }
                            continue;
                        }
                    };
                    let is_facts = m.topic() == facts_topic;
                    let (p, offset) = (m.partition(), m.offset());
                    let n = &mut next[usize::from(!is_facts)][p as usize];
                    if offset < *n {
                        continue;
                    }
                    *n = offset + 1;
                    let value = m.payload().unwrap_or_default();
                    if is_facts {
                        let fact: Event = serde_json::from_slice(value)
                            .with_context(|| format!("fact at {p}/{offset}"))?;
                        back.logs.facts.push((p, offset, fact));
                        n_facts.fetch_add(1, Ordering::SeqCst);
                    } else {
                        let entry: LedgerEntry = serde_json::from_slice(value)
                            .with_context(|| format!("ledger entry at {p}/{offset}"))?;
                        let now = now_ms();
                        back.latencies.push((
                            (now - origin_ms).max(0) as u32,
                            (now - entry.at).max(0) as u32,
                        ));
                        back.first_last =
                            Some(back.first_last.map_or((now, now), |(f, _)| (f, now)));
                        back.logs.ledger.push((p, entry));
                        n_ledger.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok(back)
            })
        };
        Ok(Reader {
            stop,
            facts,
            ledger,
            handle,
        })
    }

    /// Waits until the reader has `expected` (facts, ledger entries) — every committed output
    /// of the run — at most `limit`, `watch` looking at the workers between reads (failing on
    /// an exit, or starting the process again); then stops it.
    fn finish(
        self,
        expected: (u64, u64),
        limit: Duration,
        workers: &mut [Worker],
        watch: &mut dyn FnMut(&mut [Worker]) -> Result<()>,
    ) -> Result<ReadBack> {
        let deadline = Instant::now() + limit;
        loop {
            let have = (
                self.facts.load(Ordering::SeqCst),
                self.ledger.load(Ordering::SeqCst),
            );
            if have.0 >= expected.0 && have.1 >= expected.1 {
                break;
            }
            watch(workers)?;
            if Instant::now() > deadline || self.handle.is_finished() {
                self.stop.store(true, Ordering::SeqCst);
                let _ = self.handle.join();
                bail!("outputs {have:?} of {expected:?} after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.stop.store(true, Ordering::SeqCst);
        self.handle
            .join()
            .map_err(|_| anyhow::anyhow!("the reader panicked"))?
    }
}

/// The last line of a worker's log (why it ended).
fn last_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// The last `n` lines of a worker's log, for an error that must explain itself where the log
/// file is gone (a clean clone's run removes its temporary folder).
fn last_lines(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn check_alive(workers: &mut [Worker]) -> Result<()> {
    for w in workers {
        if let Some(status) = w.child.try_wait()? {
            bail!(
                "worker {}/{} exited with {status} (log {}); its last lines:\n{}",
                w.stage,
                w.instance,
                w.log.display(),
                last_lines(&w.log, 30)
            );
        }
    }
    Ok(())
}

/// A stage process that ended on its own (none should) is reported and started again under
/// its id, as a supervisor would: the run goes on, and the oracle still checks that no record
/// was lost or doubled by it. Each such end is added to `exits`.
fn restart_ended(
    workers: &mut [Worker],
    driver: &mut Driver,
    started: Instant,
    exits: &mut Vec<String>,
) -> Result<()> {
    for w in workers.iter_mut() {
        if let Some(status) = w.child.try_wait()? {
            let (stage, instance) = (w.stage, w.instance.clone());
            let log = w.log.clone();
            let last = last_line(&log);
            println!(
                "soak: {:>6.1} min  UNPLANNED  {stage}/{instance} exited with {status}: {last} (log {}); started again",
                started.elapsed().as_secs_f64() / 60.0,
                log.display()
            );
            exits.push(format!(
                "{:.1} min: {stage}/{instance} exited with {status}: {last}",
                started.elapsed().as_secs_f64() / 60.0
            ));
            *w = driver.spawn(stage, &instance)?;
        }
    }
    Ok(())
}

/// A run's topics, its stage processes and its reader.
struct Setup {
    run_id: String,
    names: TopicNames,
    admin: Admin,
    driver: Driver,
    products: usize,
}

impl Setup {
    fn new(bootstrap: &str, logs: &Path, run_id: String, products: usize) -> Result<Setup> {
        let names = names(&run_id);
        let admin = Admin::new(bootstrap, Duration::from_secs(30))?;
        admin.create_topics(
            &[&names.stock, &names.sales, &names.facts, &names.ledger]
                .map(|n| TopicSpec::new(n.as_str(), PARTITIONS)),
        )?;
        let driver = Driver {
            bootstrap: bootstrap.to_string(),
            run_id: run_id.clone(),
            exe: std::env::current_exe()?,
            logs: logs.to_path_buf(),
            spawned: 0,
            event_time: false,
            journal: false,
            threads: 1,
        };
        Ok(Setup {
            run_id,
            names,
            admin,
            driver,
            products,
        })
    }

    fn workers(&mut self) -> Result<Vec<Worker>> {
        Ok(vec![
            self.driver.spawn("sales-facts", "sf-0")?,
            self.driver.spawn("ledger", "lg-0")?,
        ])
    }

    fn gen_config(&self, seed: u64, rounds: usize, rate: Option<f64>) -> GenConfig {
        GenConfig {
            clients: Default::default(),
            products: self.products,
            rounds,
            partitions: PARTITIONS,
            seed,
            note_bytes: 100,
            abort_ratio: 0.1,
            transactional_prefix: format!("{}-generator", self.run_id),
            pace: Duration::ZERO,
            rate,
            control: None,
        }
    }

    /// The generator on a thread of its own, writing this run's inputs.
    fn spawn_generator(
        &self,
        seed: u64,
        rounds: usize,
        rate: Option<f64>,
        control: Option<Arc<GenControl>>,
    ) -> JoinHandle<Result<GroundTruth>> {
        let mut config = self.gen_config(seed, rounds, rate);
        config.control = control;
        let (bootstrap, stock, sales) = (
            self.driver.bootstrap.clone(),
            self.names.stock.clone(),
            self.names.sales.clone(),
        );
        std::thread::spawn(move || {
            generate(&bootstrap, &stock, &sales, &config, &ProgressBar::hidden())
        })
    }

    /// Checks the run and, when it passed, deletes its topics.
    fn verify(&self, truth: &GroundTruth, logs: &DeliveryLogs) -> Result<Outcome> {
        let outcome = check(truth, &self.names, PARTITIONS, logs);
        if outcome.passed() {
            let topics = run_topics(&self.run_id, &self.names);
            self.admin
                .delete_topics(&topics.iter().map(String::as_str).collect::<Vec<_>>())?;
        }
        Ok(outcome)
    }
}

fn expected(truth: &GroundTruth) -> (u64, u64) {
    (truth.sales, truth.stock_events + truth.sales)
}

/// The pipeline's throughput, committed input records per second, measured twice on fresh
/// topics: `drain`, a backlog of `rounds` written first and then drained by both stage
/// processes (what the stages can do); `live`, the generator unpaced for `secs` while both
/// stages run (what the pipeline sustains with its input written beside it on the same
/// machine). Each is the ledger entries a reader saw (one per committed input record) over
/// the time from the first to the last, for the drain from the stages' start.
fn measure_max(a: &SoakArgs, bootstrap: &str, logs: &Path) -> Result<(f64, f64)> {
    let mut rates = [0.0; 2];
    for (i, phase) in ["drain", "live"].into_iter().enumerate() {
        let run_id = format!(
            "soak-{phase}-{}-{:06x}",
            a.seed,
            rand::random::<u32>() & 0xff_ffff
        );
        let mut s = Setup::new(bootstrap, logs, run_id, a.products)?;
        let generator =
            |s: &Setup, rounds, control| s.spawn_generator(a.seed, rounds, None, control);
        let mut spawned = 0;
        let (truth, reader, mut workers) = if phase == "drain" {
            let truth = generator(&s, a.measure_rounds, None)
                .join()
                .map_err(|_| anyhow::anyhow!("the generator panicked"))??;
            let reader = Reader::start(bootstrap, &s.names, now_ms())?;
            spawned = now_ms();
            (truth, reader, s.workers()?)
        } else {
            let reader = Reader::start(bootstrap, &s.names, now_ms())?;
            let workers = s.workers()?;
            let control = Arc::new(GenControl::default());
            let g = generator(&s, usize::MAX, Some(control.clone()));
            // The measurement's length (a duration, not a wait for an event).
            std::thread::sleep(Duration::from_secs_f64(a.measure_secs));
            control.stop();
            let truth = g
                .join()
                .map_err(|_| anyhow::anyhow!("the generator panicked"))??;
            (truth, reader, workers)
        };
        let back = reader.finish(
            expected(&truth),
            Duration::from_secs(600),
            &mut workers,
            &mut check_alive,
        )?;
        for w in workers {
            stop(w)?;
        }
        let outcome = s.verify(&truth, &back.logs)?;
        if !outcome.passed() {
            bail!("the throughput measurement's check failed ({phase}): {outcome:?}");
        }
        let (first, last) = back.first_last.context("no output")?;
        // A backlog's drain counts from the stages' start (their group join and restore
        // included): its outputs come in few large transactions, so the time between the
        // first and the last one says little.
        let first = if phase == "drain" { spawned } else { first };
        let secs = (last - first).max(1) as f64 / 1000.0;
        rates[i] = back.logs.ledger.len() as f64 / secs;
        println!(
            "soak: throughput, {phase}: {} committed input records through both stages in {secs:.1} s: {:.0} records/s (oracle: passed)",
            back.logs.ledger.len(),
            rates[i]
        );
    }
    Ok((rates[0], rates[1]))
}

/// The soak; `Ok(false)` when the check failed.
pub(crate) fn soak(a: SoakArgs) -> Result<bool> {
    let bootstrap = match &a.bootstrap {
        Some(b) => b.clone(),
        None if a.cluster => parsley_testkit::cluster::bootstrap()?,
        None => parsley_testkit::broker::bootstrap()?,
    };
    let logs = suite_logs(&std::env::temp_dir().join("parsley-soak"))?;
    println!(
        "soak: {} min on {bootstrap}, seed {}, a fault every {} s on average; worker logs in {}",
        a.minutes,
        a.seed,
        a.fault_every,
        logs.display()
    );
    let (max, rate) = match a.rate {
        Some(r) => (None, r),
        None => {
            let (drain, live) = measure_max(&a, &bootstrap, &logs)?;
            (Some((drain, live)), live / 2.0)
        }
    };
    // The check holds every record of the run in memory (the ground truth, the outputs, the
    // oracle's history): about 1 KiB per committed input record, measured. A run that would
    // not fit in half the memory available now is refused before it starts.
    let projected_mib = rate * a.minutes * 60.0 / 1024.0;
    let available_mib = read_proc_mib("/proc/meminfo", "MemAvailable").unwrap_or(f64::INFINITY);
    if projected_mib > available_mib / 2.0 {
        bail!(
            "{rate:.0} records/s for {} min would need about {projected_mib:.0} MiB for the check, over half of the {available_mib:.0} MiB available: give a lower --rate",
            a.minutes
        );
    }
    println!("soak: pacing the generator at {rate:.0} committed records/s");
    let mut rng = StdRng::seed_from_u64(a.seed);
    let run_id = format!("soak-{}-{:06x}", a.seed, rand::random::<u32>() & 0xff_ffff);
    let mut s = Setup::new(&bootstrap, &logs, run_id, a.products)?;
    let own_broker = matches!(
        parsley_testkit::broker::status(),
        parsley_testkit::broker::Status::Running { bootstrap: ref b, .. } if *b == bootstrap
    );
    let mut kinds: Vec<SoakFault> = if a.cluster {
        vec![
            SoakFault::Kill,
            SoakFault::Cluster(ClusterFault::Leader),
            SoakFault::Cluster(ClusterFault::Election),
            SoakFault::Cluster(ClusterFault::TxnCoordinator),
            SoakFault::Cluster(ClusterFault::GroupCoordinator),
        ]
    } else if own_broker {
        vec![SoakFault::Kill, SoakFault::Broker, SoakFault::Join]
    } else {
        vec![SoakFault::Kill, SoakFault::Join]
    };
    kinds.shuffle(&mut rng);

    let origin = now_ms();
    let started = Instant::now();
    let reader = Reader::start(&bootstrap, &s.names, origin)?;
    let mut workers = s.workers()?;
    let control = Arc::new(GenControl::default());
    let generator = s.spawn_generator(a.seed, usize::MAX, Some(rate), Some(control.clone()));
    let sources_and_outputs = [
        &s.names.stock,
        &s.names.sales,
        &s.names.facts,
        &s.names.ledger,
    ]
    .map(|n| n.to_string());
    let outputs = [s.names.facts.clone(), s.names.ledger.clone()];
    let topics = run_topics(&s.run_id, &s.names);
    let mut heal = topics.clone();
    heal.extend(["__consumer_offsets", "__transaction_state"].map(String::from));
    let targets = cluster::Targets {
        sources_and_outputs: &sources_and_outputs,
        outputs: &outputs,
        heal: &heal,
        partitions: PARTITIONS,
        stages: workers
            .iter()
            .map(|w| cluster::stage_ids(&bootstrap, &s.run_id, w.stage, &w.instance))
            .collect(),
    };

    let duration = Duration::from_secs_f64(a.minutes * 60.0);
    let gap =
        |rng: &mut StdRng| Duration::from_secs_f64(a.fault_every * rng.random_range(0.5..1.5));
    let mut next_fault = gap(&mut rng);
    let mut faults: Vec<Injected> = Vec::new();
    let mut exits: Vec<String> = Vec::new();
    let sampler = Sampler::start(started);
    let since = |t: Instant| t.duration_since(started).as_millis() as u32;
    while started.elapsed() < duration {
        sampler.track(&workers);
        if started.elapsed() >= next_fault {
            let kind = kinds[faults.len() % kinds.len()];
            let at = Instant::now();
            let what = match kind {
                SoakFault::Kill => {
                    let i = rng.random_range(0..workers.len());
                    let (stage, instance) = (workers[i].stage, workers[i].instance.clone());
                    s.driver.kill_and_respawn(&mut workers, i)?;
                    format!("kill -9 of {stage}/{instance}, restarted under the same id")
                }
                SoakFault::Join => {
                    let stage = if rng.random_bool(0.5) {
                        "sales-facts"
                    } else {
                        "ledger"
                    };
                    let extra = s.driver.spawn(stage, &format!("extra-{}", faults.len()))?;
                    // How long it stays: from the seed (fault timing, not synchronisation).
                    std::thread::sleep(Duration::from_millis(rng.random_range(2_000..5_000)));
                    stop(extra)?;
                    format!("a second {stage} process joined and left")
                }
                SoakFault::Broker => {
                    // The generator is the workload: it pauses between two transactions.
                    control.pause();
                    let restarted = parsley_testkit::broker::restart()
                        .map_err(anyhow::Error::from)
                        .and_then(|_| wait_for_leaders(&s.admin, &topics, PARTITIONS));
                    control.resume();
                    restarted?;
                    "broker restart (same port, same data)".to_string()
                }
                SoakFault::Cluster(c) => cluster::inject(c, &mut rng, &targets)
                    .with_context(|| format!("seed {}: {}", a.seed, c.name()))?,
            };
            println!(
                "soak: {:>6.1} min  {:<11} {what}",
                f64::from(since(at)) / 60_000.0,
                kind.name()
            );
            faults.push(Injected {
                at: since(at),
                kind: kind.name(),
                what,
                took: at.elapsed().as_millis() as u32,
            });
            next_fault = started.elapsed() + gap(&mut rng);
        }
        restart_ended(&mut workers, &mut s.driver, started, &mut exits)?;
        if generator.is_finished() {
            break; // its error is reported below
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    control.stop();
    let rss = sampler.finish();
    let truth = generator
        .join()
        .map_err(|_| anyhow::anyhow!("the generator panicked"))?
        .with_context(|| format!("the generator (seed {})", a.seed))?;
    let generated_for = started.elapsed();
    // While the outputs drain, too, a process that ends on its own is started again.
    let back = reader.finish(
        expected(&truth),
        Duration::from_secs(600),
        &mut workers,
        &mut |workers| restart_ended(workers, &mut s.driver, started, &mut exits),
    )?;
    for w in workers {
        stop(w)?;
    }
    let outcome = s.verify(&truth, &back.logs)?;
    let driver_peak = read_proc_mib("/proc/self/status", "VmHWM").unwrap_or(0.0);
    let report = Report {
        seed: a.seed,
        minutes: a.minutes,
        max,
        rate,
        generated_secs: generated_for.as_secs_f64(),
        truth: &truth,
        faults: &faults,
        rss: &rss,
        latencies: &back.latencies,
        window_ms: (a.window_minutes * 60_000.0) as u32,
        driver_peak_mib: driver_peak,
        outcome: &outcome,
        exits: &exits,
    };
    report.print();
    std::fs::create_dir_all(&a.out)?;
    let csv = a.out.join(format!("soak-{}.csv", a.seed));
    std::fs::write(&csv, report.csv())?;
    let svg = a.out.join(format!("soak-{}.svg", a.seed));
    soak_chart::draw(&report, &svg).map_err(|e| anyhow::anyhow!("the chart: {e}"))?;
    println!("soak: {} and {}", csv.display(), svg.display());
    let passed = outcome.passed();
    if passed && exits.is_empty() {
        if let Err(e) = std::fs::remove_dir_all(&logs) {
            eprintln!("soak: could not remove {}: {e}", logs.display());
        }
    } else if passed {
        println!("soak: worker logs kept in {}", logs.display());
    } else {
        println!(
            "soak: FAILED (replay with --seed {}); worker logs kept in {}",
            a.seed,
            logs.display()
        );
    }
    Ok(passed)
}
