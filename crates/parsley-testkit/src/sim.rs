//! A deterministic simulator of partitions, producers and stage tasks, to test the real gate
//! and the real `CausalClock` against the [oracle](crate::oracle) (DESIGN.md §8).
//!
//! # What it models
//! - **Partitions** as logs with gaps: transactional records, commit and abort markers,
//!   aborted records; `read_committed` consumers stop at the LSO (the first offset of an open
//!   transaction) and skip markers and aborted records.
//! - **Producers**: transactional ones (their stamps carry in-flight claims) and idempotent ones
//!   (acknowledged claims only, a flush at each channel switch). A send is appended later, at a
//!   random step, keeping per-(sender, partition) order but not order across partitions — so
//!   appends of two senders can land crossed — and acknowledged later still.
//! - **Stage tasks** in a random DAG: each consumes channels of earlier layers through a real
//!   [`Gate`] and a transactional [`CausalClock`] (with [`SimConfig::self_loops`], some also
//!   one of their own output channels), emits to channels of its layer, commits or
//!   aborts its transaction (an abort restores the committed snapshot and rewinds the consumer),
//!   and starts at a random step with baselines at the log start, at the end, or in between.
//! - **Evidence** as the runtime provides it: after every fetch (a poll epoch) the consumer's
//!   position, and the high watermarks the gate asks for.
//!
//! # What it checks
//! After the random steps, every transaction is closed and every task drained. Then
//! - **safety**: the oracle replays the committed ground truth (each process's sends and
//!   deliveries) and checks every delivery of every task (DESIGN.md §2);
//! - **liveness**: every visible record at or above a task's baseline on a channel it consumes
//!   was delivered — nothing is left stuck.
//!
//! A [`Variant`] other than [`Variant::Correct`] switches on one deliberately wrong rule; each
//! must fail, in a fixed history every time ([`scenarios`](crate::scenarios)) and in some share
//! of random ones.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use parsley_clock::{CausalClock, Channel, Coordinate, SenderId, Stamp, TopicId};
use parsley_gate::{Arrival, Faults, Gate, GateSnapshot};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::oracle::History;

/// A record's unique id in a simulation.
pub type RecordId = u64;

/// Which rule set the simulation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The rules of DESIGN.md §3–§4.
    Correct,
    /// The gate delivers every head at once.
    GateOff,
    /// No look-ahead: strict per-channel FIFO.
    StrictFifo,
    /// A task's clock claims its frontier instead of the offsets it delivered.
    ClockClaimsFrontier,
    /// In-flight claims settle on the LSO instead of the high watermark.
    SettleByLso,
    /// A look-ahead delivery moves the frontier over the records below it.
    BridgeOverLookahead,
    /// Blocked records are re-checked only when a frontier moves.
    WakeupsOnlyOnFrontier,
    /// Producers make in-flight claims without transactions.
    InFlightWithoutTransactions,
    /// A full channel is paused even when an in-flight claim needs to read it.
    StrictPause,
}

impl Variant {
    /// The deliberately wrong variants.
    pub const NEGATIVE: [Variant; 8] = [
        Variant::GateOff,
        Variant::StrictFifo,
        Variant::ClockClaimsFrontier,
        Variant::SettleByLso,
        Variant::BridgeOverLookahead,
        Variant::WakeupsOnlyOnFrontier,
        Variant::InFlightWithoutTransactions,
        Variant::StrictPause,
    ];

    fn faults(self) -> Faults {
        Faults {
            gate_off: self == Variant::GateOff,
            strict_fifo: self == Variant::StrictFifo,
            bridge_over_lookahead: self == Variant::BridgeOverLookahead,
            wakeups_only_on_frontier: self == Variant::WakeupsOnlyOnFrontier,
        }
    }
}

/// Sizes and rates of a random history.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Channels (one partition each).
    pub channels: usize,
    /// Transactional producers feeding layer 0.
    pub transactional_producers: usize,
    /// Idempotent (non-transactional) producers feeding layer 0.
    pub idempotent_producers: usize,
    /// Stage tasks.
    pub tasks: usize,
    /// Random steps before the drain.
    pub steps: usize,
    /// Share of stage transactions that abort and restore.
    pub task_abort_ratio: f64,
    /// Share of producer transactions that abort.
    pub producer_abort_ratio: f64,
    /// Fetched, undelivered records per channel before a task stops fetching it (backpressure).
    pub queue_cap: usize,
    /// Share of stage tasks that also consume one of the channels they emit to (a stage that
    /// reads a topic it writes: its own records come back to it once committed).
    pub self_loops: f64,
    /// The rule set.
    pub variant: Variant,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            channels: 7,
            transactional_producers: 2,
            idempotent_producers: 1,
            tasks: 4,
            steps: 400,
            task_abort_ratio: 0.3,
            producer_abort_ratio: 0.1,
            queue_cap: 6,
            self_loops: 0.0,
            variant: Variant::Correct,
        }
    }
}

/// What a simulation found.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Deliveries in committed transactions.
    pub deliveries: u64,
    /// Of which delivered ahead of earlier records of their channel (look-ahead).
    pub lookahead: u64,
    /// Of which records the delivering task sent itself (a task that reads what it writes).
    pub own: u64,
    /// Records sent (committed or idempotent).
    pub sends: u64,
    /// Stage transactions aborted and restored.
    pub task_aborts: u64,
    /// Records spilled by full channels that a claim needed read.
    pub spilled: u64,
    /// Spilled records re-fetched.
    pub refetched: u64,
    /// The oracle's first violation, with the history that made it.
    pub violation: Option<String>,
    /// Records that stayed undelivered after the drain, with what they waited for.
    pub stall: Option<String>,
}

impl Outcome {
    /// `true` when the oracle found a violation or something stayed stuck.
    pub fn failed(&self) -> bool {
        self.violation.is_some() || self.stall.is_some()
    }
}

#[derive(Debug, Clone)]
enum Entry {
    Record {
        id: RecordId,
        txn: Option<usize>,
        stamp: Stamp,
    },
    Marker,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxnState {
    Open,
    Committed,
    Aborted,
}

#[derive(Debug, Clone)]
struct PendingSend {
    id: RecordId,
    seq: u64,
    channel: usize,
    stamp: Stamp,
}

/// The producing side of a producer or a task.
#[derive(Debug, Clone)]
struct Out {
    clock: CausalClock,
    /// Sends go into transactions (visible at commit) or straight to the log.
    transactional: bool,
    txn: Option<usize>,
    pending: Vec<PendingSend>,
    /// Appended, not acknowledged: (seq, coordinate), in append order.
    unacked: Vec<(u64, Coordinate)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Send(RecordId),
    Deliver(RecordId),
}

struct Producer {
    name: String,
    out: Out,
    /// The clock at the beginning of the open transaction.
    snapshot: Option<CausalClock>,
    writes: Vec<usize>,
    uncommitted: Vec<Ev>,
    committed: Vec<Ev>,
}

struct Committed {
    gate: GateSnapshot,
    clock: CausalClock,
}

struct Task {
    name: String,
    consumes: Vec<usize>,
    emits: Vec<usize>,
    start_step: usize,
    started: bool,
    gate: Gate<RecordId>,
    out: Out,
    committed_state: Option<Committed>,
    positions: BTreeMap<usize, i64>,
    baselines: BTreeMap<usize, i64>,
    uncommitted: Vec<Ev>,
    committed: Vec<Ev>,
    lookahead: u64,
    uncommitted_lookahead: u64,
    own: u64,
    uncommitted_own: u64,
}

/// One simulated world.
pub struct Sim {
    rng: StdRng,
    variant: Variant,
    channels: Vec<Channel>,
    logs: Vec<Vec<Entry>>,
    txns: Vec<TxnState>,
    /// Partitions each transaction wrote to (where its markers go).
    txn_partitions: Vec<BTreeSet<usize>>,
    /// Record id → (channel, offset), for appended records.
    placements: HashMap<RecordId, (usize, i64)>,
    producers: Vec<Producer>,
    tasks: Vec<Task>,
    next_id: RecordId,
    epoch: u64,
    task_abort_ratio: f64,
    producer_abort_ratio: f64,
    task_aborts: u64,
    /// Backpressure: fetched, undelivered records per channel before fetching stops.
    queue_cap: usize,
    spilled: u64,
    refetched: u64,
    /// Impossible stamps the gates reported (truthful stamps: none may appear).
    impossible: Vec<parsley_gate::ImpossibleStamp>,
    /// Step log, for reports.
    trace: Vec<String>,
}

impl Sim {
    /// A random world from `seed`.
    pub fn random(seed: u64, config: &SimConfig) -> Sim {
        let n = config.channels.max(3);
        // Layers: channel i is in layer 0 for the first third, then 1, then 2.
        let layer = |i: usize| (i * 3 / n).min(2);
        let layer0: Vec<usize> = (0..n).filter(|i| layer(*i) == 0).collect();
        let mut sim = Sim::empty(seed, n, config.variant);
        sim.task_abort_ratio = config.task_abort_ratio;
        sim.producer_abort_ratio = config.producer_abort_ratio;
        sim.queue_cap = config.queue_cap;
        let producers = config.transactional_producers + config.idempotent_producers;
        for p in 0..producers {
            let transactional = p < config.transactional_producers;
            let mut writes: Vec<usize> = layer0
                .iter()
                .copied()
                .filter(|_| sim.rng.random_bool(0.7))
                .collect();
            if writes.is_empty() {
                writes.push(layer0[sim.rng.random_range(0..layer0.len())]);
            }
            sim.add_producer(transactional, writes);
        }
        for _ in 0..config.tasks {
            let l = sim.rng.random_range(1..=2usize);
            let earlier: Vec<usize> = (0..n).filter(|i| layer(*i) < l).collect();
            let mine: Vec<usize> = (0..n).filter(|i| layer(*i) == l).collect();
            let mut consumes: Vec<usize> = earlier
                .iter()
                .copied()
                .filter(|_| sim.rng.random_bool(0.5))
                .collect();
            if consumes.is_empty() {
                consumes.push(earlier[sim.rng.random_range(0..earlier.len())]);
            }
            let mut emits: Vec<usize> = mine
                .iter()
                .copied()
                .filter(|_| sim.rng.random_bool(0.6))
                .collect();
            if emits.is_empty() {
                emits.push(mine[sim.rng.random_range(0..mine.len())]);
            }
            if config.self_loops > 0.0 && sim.rng.random_bool(config.self_loops.min(1.0)) {
                consumes.push(emits[sim.rng.random_range(0..emits.len())]);
            }
            let start = if sim.rng.random_bool(0.5) {
                0
            } else {
                sim.rng.random_range(0..config.steps.max(1))
            };
            sim.add_task(consumes, emits, start);
        }
        sim
    }

    /// An empty world with `channels` channels, for scripted scenarios.
    pub fn empty(seed: u64, channels: usize, variant: Variant) -> Sim {
        Sim {
            rng: StdRng::seed_from_u64(seed),
            variant,
            channels: (0..channels)
                .map(|i| Channel::new(TopicId::from_halves(0x5EED, i as i64 + 1), 0))
                .collect(),
            logs: vec![Vec::new(); channels],
            txns: Vec::new(),
            txn_partitions: Vec::new(),
            placements: HashMap::new(),
            producers: Vec::new(),
            tasks: Vec::new(),
            next_id: 1,
            epoch: 0,
            task_abort_ratio: 0.0,
            producer_abort_ratio: 0.0,
            task_aborts: 0,
            queue_cap: usize::MAX,
            spilled: 0,
            refetched: 0,
            impossible: Vec::new(),
            trace: Vec::new(),
        }
    }

    fn sender_id(&mut self) -> SenderId {
        SenderId::from_bytes(self.rng.random())
    }

    /// Adds a producer writing `writes`; returns its index.
    pub fn add_producer(&mut self, transactional: bool, writes: Vec<usize>) -> usize {
        let id = self.sender_id();
        // Under the wrong variant, idempotent producers also make in-flight claims.
        let clock = if transactional || self.variant == Variant::InFlightWithoutTransactions {
            CausalClock::transactional(id)
        } else {
            CausalClock::new(id)
        };
        let i = self.producers.len();
        self.producers.push(Producer {
            name: format!(
                "producer/{i}{}",
                if transactional { "" } else { "(idempotent)" }
            ),
            out: Out {
                clock,
                transactional,
                txn: None,
                pending: Vec::new(),
                unacked: Vec::new(),
            },
            snapshot: None,
            writes,
            uncommitted: Vec::new(),
            committed: Vec::new(),
        });
        i
    }

    /// Sets the backpressure cap (fetched, undelivered records per channel).
    pub fn set_queue_cap(&mut self, cap: usize) {
        self.queue_cap = cap;
    }

    /// `who` consumed the record at `c`/`offset` (a plain producer that read it): its later
    /// sends claim it.
    pub fn observe(&mut self, who: Who, c: usize, offset: i64) {
        let coordinate = self.channels[c].at(offset);
        self.out_mut(who)
            .clock
            .learn(coordinate)
            .expect("offsets are >= 0");
    }

    /// Adds a task consuming `consumes` and emitting to `emits`, starting at `start_step`.
    pub fn add_task(
        &mut self,
        consumes: Vec<usize>,
        emits: Vec<usize>,
        start_step: usize,
    ) -> usize {
        let id = self.sender_id();
        let i = self.tasks.len();
        let mut gate = Gate::new(consumes.iter().map(|c| self.channels[*c]));
        gate.set_faults(self.variant.faults());
        self.tasks.push(Task {
            name: format!("task/{i}"),
            consumes,
            emits,
            start_step,
            started: false,
            gate,
            out: Out {
                clock: CausalClock::transactional(id),
                transactional: true,
                txn: None,
                pending: Vec::new(),
                unacked: Vec::new(),
            },
            committed_state: None,
            positions: BTreeMap::new(),
            baselines: BTreeMap::new(),
            uncommitted: Vec::new(),
            committed: Vec::new(),
            lookahead: 0,
            uncommitted_lookahead: 0,
            own: 0,
            uncommitted_own: 0,
        });
        i
    }

    fn high_watermark(&self, c: usize) -> i64 {
        self.logs[c].len() as i64
    }

    /// The last stable offset: the first record of a still-open transaction, or the end.
    fn lso(&self, c: usize) -> i64 {
        self.logs[c]
            .iter()
            .position(|e| {
                matches!(e, Entry::Record { txn: Some(t), .. } if self.txns[*t] == TxnState::Open)
            })
            .map_or(self.high_watermark(c), |o| o as i64)
    }

    fn visible(&self, c: usize, offset: i64) -> Option<(RecordId, Stamp)> {
        match &self.logs[c][offset as usize] {
            Entry::Record { id, txn, stamp } => match txn {
                None => Some((*id, stamp.clone())),
                Some(t) if self.txns[*t] == TxnState::Committed => Some((*id, stamp.clone())),
                Some(_) => None,
            },
            Entry::Marker => None,
        }
    }

    // ----- producing -----

    fn out_mut(&mut self, who: Who) -> &mut Out {
        match who {
            Who::Producer(p) => &mut self.producers[p].out,
            Who::Task(t) => &mut self.tasks[t].out,
        }
    }

    /// Stamps and queues a send of `who` to channel `c`; returns the record id.
    pub fn send(&mut self, who: Who, c: usize) -> RecordId {
        let channel = self.channels[c];
        if self.out_mut(who).transactional && self.out_mut(who).txn.is_none() {
            let t = self.txns.len();
            self.txns.push(TxnState::Open);
            self.txn_partitions.push(BTreeSet::new());
            let out = self.out_mut(who);
            out.txn = Some(t);
            if let Who::Producer(p) = who {
                self.producers[p].snapshot = Some(self.producers[p].out.clock.clone());
            }
        }
        let stamp = match self.out_mut(who).clock.stamp(channel) {
            Ok(s) => s,
            Err(_) => {
                // An idempotent sender flushes before switching channels.
                self.flush(who);
                self.out_mut(who)
                    .clock
                    .stamp(channel)
                    .expect("nothing unacknowledged after a flush")
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let seq = stamp.sender.expect("stamped").seq;
        self.out_mut(who).pending.push(PendingSend {
            id,
            seq,
            channel: c,
            stamp,
        });
        match who {
            Who::Producer(p) => self.producers[p].uncommitted.push(Ev::Send(id)),
            Who::Task(t) => self.tasks[t].uncommitted.push(Ev::Send(id)),
        }
        if let Who::Producer(p) = who
            && !self.producers[p].out.transactional
        {
            // Idempotent: visible once appended; part of the history from now on.
            let evs = std::mem::take(&mut self.producers[p].uncommitted);
            self.producers[p].committed.extend(evs);
        }
        self.trace.push(format!("{who:?} sends #{id} to c{c}"));
        id
    }

    /// Appends the oldest pending send of `who` to channel `c` (per-sender order per partition).
    pub fn append(&mut self, who: Who, c: usize) -> bool {
        let out = self.out_mut(who);
        let Some(i) = out.pending.iter().position(|p| p.channel == c) else {
            return false;
        };
        let p = out.pending.remove(i);
        let txn = out.txn.filter(|_| out.transactional);
        let offset = self.logs[c].len() as i64;
        if let Some(t) = txn {
            self.txn_partitions[t].insert(c);
        }
        self.logs[c].push(Entry::Record {
            id: p.id,
            txn,
            stamp: p.stamp,
        });
        self.placements.insert(p.id, (c, offset));
        let coordinate = self.channels[c].at(offset);
        self.out_mut(who).unacked.push((p.seq, coordinate));
        self.trace
            .push(format!("#{} appended at c{c}@{offset}", p.id));
        true
    }

    /// Acknowledges the oldest appended send of `who` on channel `c`.
    pub fn ack(&mut self, who: Who, c: usize) -> bool {
        let channel = self.channels[c];
        let out = self.out_mut(who);
        let Some(i) = out.unacked.iter().position(|(_, co)| co.channel == channel) else {
            return false;
        };
        let (seq, coordinate) = out.unacked.remove(i);
        out.clock
            .acked(seq, coordinate)
            .expect("every appended send is outstanding");
        true
    }

    /// Appends and acknowledges every send of `who`.
    pub fn flush(&mut self, who: Who) {
        while let Some(c) = self.out_mut(who).pending.first().map(|p| p.channel) {
            self.append(who, c);
        }
        while let Some(c) = self.out_mut(who).unacked.first().map(|(_, co)| co.channel) {
            let ci = self.channels.iter().position(|x| *x == c).expect("known");
            self.ack(who, ci);
        }
    }

    /// Ends the open transaction of producer `p`.
    pub fn end_producer_txn(&mut self, p: usize, commit: bool) {
        let who = Who::Producer(p);
        let Some(t) = self.producers[p].out.txn else {
            return;
        };
        self.flush(who);
        self.close_txn(t, commit);
        let prod = &mut self.producers[p];
        prod.out.txn = None;
        let evs = std::mem::take(&mut prod.uncommitted);
        if commit {
            prod.committed.extend(evs);
            prod.snapshot = None;
        } else if let Some(s) = prod.snapshot.take() {
            prod.out.clock = s;
        }
        self.trace.push(format!(
            "producer/{p} {} its transaction",
            if commit { "commits" } else { "aborts" }
        ));
    }

    fn close_txn(&mut self, t: usize, commit: bool) {
        let touched = std::mem::take(&mut self.txn_partitions[t]);
        for c in touched {
            self.logs[c].push(Entry::Marker);
        }
        self.txns[t] = if commit {
            TxnState::Committed
        } else {
            TxnState::Aborted
        };
    }

    // ----- consuming -----

    /// Starts task `t`: seeds each consumed channel at its current log start (0), end, or a
    /// random offset in between.
    pub fn start_task(&mut self, t: usize, baselines: Option<&[i64]>) {
        if self.tasks[t].started {
            return;
        }
        let consumes = self.tasks[t].consumes.clone();
        for (i, c) in consumes.iter().enumerate() {
            let end = self.high_watermark(*c);
            let b = match baselines {
                Some(b) => b[i],
                None => match self.rng.random_range(0..3) {
                    0 => 0,
                    1 => end,
                    _ => self.rng.random_range(0..=end),
                },
            };
            let task = &mut self.tasks[t];
            task.gate.seed(self.channels[*c], b).expect("seed once");
            task.positions.insert(*c, b);
            task.baselines.insert(*c, b);
        }
        let task = &mut self.tasks[t];
        task.started = true;
        task.committed_state = Some(Committed {
            gate: task.gate.snapshot(),
            clock: task.out.clock.clone(),
        });
        self.trace.push(format!("task/{t} starts"));
    }

    /// Task `t` polls channel `c`: up to `max` entries from its position to the LSO, then the
    /// evidence the runtime would read after the poll.
    pub fn fetch(&mut self, t: usize, c: usize, max: usize) {
        if !self.tasks[t].started {
            return;
        }
        self.epoch += 1;
        let epoch = self.epoch;
        let lso = self.lso(c);
        let channel = self.channels[c];
        let mut pos = self.tasks[t].positions[&c];
        let mut taken = 0;
        let refetched_before = self.tasks[t].gate.metrics().refetched;
        // Backpressure: a full channel is not read — unless an in-flight claim needs it: then
        // it spills and reads on (under the wrong variant: not read, full stop).
        let full = |sim: &Sim| sim.tasks[t].gate.held(&channel) >= sim.queue_cap;
        // A needed spilled record is re-fetched; records nobody waits for make room for it.
        if self.tasks[t].gate.refetching(&channel).is_none()
            && let Some(&(_, from)) = self.tasks[t]
                .gate
                .refetch_wanted()
                .iter()
                .find(|(ch, _)| *ch == channel)
        {
            if full(self) {
                let n = self.tasks[t].gate.spill(&channel);
                self.spilled += n as u64;
                self.trace
                    .push(format!("task/{t} spills {n} of c{c} to re-fetch"));
            }
            let resume = self.tasks[t]
                .gate
                .begin_refetch(channel, from)
                .expect("a wanted refetch");
            self.trace.push(format!(
                "task/{t} re-fetches c{c} from {from} (resume {resume})"
            ));
            pos = from;
        }
        while pos < lso && taken < max {
            if let Some(r) = self.tasks[t].gate.refetching(&channel) {
                if pos >= r.resume {
                    self.tasks[t].gate.end_refetch(&channel);
                } else if full(self) {
                    let more = self.tasks[t]
                        .gate
                        .refetch_wanted()
                        .iter()
                        .any(|(ch, o)| *ch == channel && *o >= pos);
                    if more {
                        // A needed record lies ahead: records nobody waits for make room.
                        let n = self.tasks[t].gate.spill(&channel);
                        self.spilled += n as u64;
                        self.trace
                            .push(format!("task/{t} spills {n} of c{c} to re-fetch"));
                    } else {
                        // The needed records are back; the rest can wait.
                        self.tasks[t].gate.end_refetch(&channel);
                        pos = r.resume;
                        continue;
                    }
                }
            } else if full(self) {
                let needed = self.tasks[t].gate.needs_reading(&channel);
                if self.variant == Variant::StrictPause || !needed {
                    break;
                }
                let n = self.tasks[t].gate.spill(&channel);
                self.spilled += n as u64;
                self.trace.push(format!("task/{t} spills {n} of c{c}"));
            }
            if let Some((id, stamp)) = self.visible(c, pos) {
                let arrival = Arrival {
                    offset: pos,
                    timestamp: pos,
                    epoch,
                    stamp: Some(stamp),
                    payload: id,
                };
                self.tasks[t]
                    .gate
                    .offer(channel, arrival)
                    .expect("fetched records are offered in order");
                self.trace
                    .push(format!("task/{t} fetches #{id} c{c}@{pos}"));
                taken += 1;
            }
            pos += 1;
        }
        if let Some(r) = self.tasks[t].gate.refetching(&channel)
            && pos >= r.resume
        {
            self.tasks[t].gate.end_refetch(&channel);
        }
        self.refetched += self.tasks[t].gate.metrics().refetched - refetched_before;
        self.tasks[t].positions.insert(c, pos);
        let task = &mut self.tasks[t];
        task.gate
            .position(channel, pos)
            .expect("positions follow offers");
        self.evidence(t);
        let found = self.tasks[t].gate.take_impossible();
        self.impossible.extend(found);
    }

    /// Hands task `t` the high watermarks its gate asks for (the LSO under
    /// [`Variant::SettleByLso`]).
    fn evidence(&mut self, t: usize) {
        let epoch = self.epoch;
        // A reading can unblock a record that then needs evidence on another channel: read
        // until the gate asks for nothing new (the runtime does the same per poll batch).
        let mut served = BTreeSet::new();
        loop {
            let wanted: Vec<Channel> = self.tasks[t]
                .gate
                .evidence_wanted()
                .into_iter()
                .filter(|c| !served.contains(c))
                .collect();
            if wanted.is_empty() {
                return;
            }
            for channel in wanted {
                let c = self
                    .channels
                    .iter()
                    .position(|x| *x == channel)
                    .expect("known");
                let value = if self.variant == Variant::SettleByLso {
                    self.lso(c)
                } else {
                    self.high_watermark(c)
                };
                self.tasks[t].gate.high_watermark(channel, value, epoch);
                served.insert(channel);
            }
        }
    }

    /// Task `t` delivers one record if its gate allows; with `emit`, sends an output to each
    /// channel listed. Returns the delivered record.
    pub fn deliver(&mut self, t: usize, emit: &[usize]) -> Option<RecordId> {
        let d = self.tasks[t].gate.next_delivery()?;
        let id = d.payload;
        let task = &mut self.tasks[t];
        if task.out.txn.is_none() {
            let tx = self.txns.len();
            self.txns.push(TxnState::Open);
            self.txn_partitions.push(BTreeSet::new());
            task.out.txn = Some(tx);
        }
        if self.variant == Variant::ClockClaimsFrontier {
            // Wrong: claim the frontier of the channel, not the delivered offset.
            if let Some(s) = &d.stamp {
                for co in s.clock.iter() {
                    task.out.clock.learn(co).expect("offsets are >= 0");
                }
            }
            let f = task.gate.frontier(&d.coordinate.channel).unwrap_or(-1);
            if f >= 0 {
                task.out
                    .clock
                    .learn(d.coordinate.channel.at(f))
                    .expect("offsets are >= 0");
            }
        } else {
            task.out.clock.observe(d.coordinate, d.stamp.as_ref());
        }
        for r in &d.replacements {
            task.out
                .clock
                .learn(*r)
                .expect("replacement offsets are >= 0");
        }
        task.uncommitted.push(Ev::Deliver(id));
        task.uncommitted_lookahead += u64::from(d.lookahead);
        task.uncommitted_own += u64::from(
            d.stamp
                .as_ref()
                .and_then(|s| s.sender)
                .is_some_and(|tag| tag.sender == task.out.clock.sender()),
        );
        self.trace.push(format!(
            "task/{t} delivers #{id} ({}){}",
            d.coordinate,
            if d.lookahead { " ahead" } else { "" }
        ));
        for c in emit {
            self.send(Who::Task(t), *c);
        }
        Some(id)
    }

    /// Ends the open transaction of task `t`: commit, or abort and restore.
    pub fn end_task_txn(&mut self, t: usize, commit: bool) {
        if !self.tasks[t].started {
            return;
        }
        let who = Who::Task(t);
        self.flush(who);
        if let Some(tx) = self.tasks[t].out.txn.take() {
            self.close_txn(tx, commit);
        }
        let channels = self.channels.clone();
        let variant = self.variant;
        let task = &mut self.tasks[t];
        if commit {
            let evs = std::mem::take(&mut task.uncommitted);
            task.committed.extend(evs);
            task.lookahead += std::mem::take(&mut task.uncommitted_lookahead);
            task.own += std::mem::take(&mut task.uncommitted_own);
            task.committed_state = Some(Committed {
                gate: task.gate.snapshot(),
                clock: task.out.clock.clone(),
            });
        } else {
            self.task_aborts += 1;
            task.uncommitted.clear();
            task.uncommitted_lookahead = 0;
            task.uncommitted_own = 0;
            let committed = task.committed_state.as_ref().expect("started");
            let mut gate =
                Gate::restore(task.consumes.iter().map(|c| channels[*c]), &committed.gate)
                    .expect("snapshot of the same channels");
            gate.set_faults(variant.faults());
            task.gate = gate;
            task.out.clock = committed.clock.clone();
            for c in task.consumes.clone() {
                let first = task
                    .gate
                    .first_undelivered(&channels[c])
                    .expect("restored channels are seeded");
                task.positions.insert(c, first);
            }
        }
        self.trace.push(format!(
            "task/{t} {}",
            if commit {
                "commits"
            } else {
                "aborts and restores"
            }
        ));
    }

    // ----- running -----

    /// Runs `steps` random steps, then closes everything and drains every task.
    pub fn run_random(&mut self, steps: usize) -> Outcome {
        for step in 0..steps {
            for t in 0..self.tasks.len() {
                if !self.tasks[t].started && self.tasks[t].start_step <= step {
                    self.start_task(t, None);
                }
            }
            self.random_step();
        }
        self.drain()
    }

    fn random_step(&mut self) {
        let np = self.producers.len();
        let nt = self.tasks.len();
        match self.rng.random_range(0..100) {
            0..25 if np > 0 => {
                let p = self.rng.random_range(0..np);
                let w = self.producers[p].writes.clone();
                let c = w[self.rng.random_range(0..w.len())];
                self.send(Who::Producer(p), c);
            }
            25..30 if np > 0 => {
                let p = self.rng.random_range(0..np);
                let commit = !self.rng.random_bool(self.producer_abort_ratio);
                self.end_producer_txn(p, commit);
            }
            30..45 => {
                if let Some((who, c)) = self.pick_pending() {
                    self.append(who, c);
                }
            }
            45..55 => {
                if let Some((who, c)) = self.pick_unacked() {
                    self.ack(who, c);
                }
            }
            55..75 if nt > 0 => {
                let t = self.rng.random_range(0..nt);
                let cs = self.tasks[t].consumes.clone();
                let c = cs[self.rng.random_range(0..cs.len())];
                let max = self.rng.random_range(1..=3);
                self.fetch(t, c, max);
            }
            75..95 if nt > 0 => {
                let t = self.rng.random_range(0..nt);
                let emit = self.random_emits(t);
                self.deliver(t, &emit);
            }
            95..100 if nt > 0 => {
                let t = self.rng.random_range(0..nt);
                let commit = !self.rng.random_bool(self.task_abort_ratio);
                self.end_task_txn(t, commit);
            }
            _ => {}
        }
    }

    fn random_emits(&mut self, t: usize) -> Vec<usize> {
        let emits = self.tasks[t].emits.clone();
        emits
            .into_iter()
            .filter(|_| self.rng.random_bool(0.5))
            .collect()
    }

    fn senders(&self) -> Vec<Who> {
        (0..self.producers.len())
            .map(Who::Producer)
            .chain((0..self.tasks.len()).map(Who::Task))
            .collect()
    }

    fn out(&self, who: Who) -> &Out {
        match who {
            Who::Producer(p) => &self.producers[p].out,
            Who::Task(t) => &self.tasks[t].out,
        }
    }

    fn pick_pending(&mut self) -> Option<(Who, usize)> {
        let options: Vec<(Who, usize)> = self
            .senders()
            .into_iter()
            .flat_map(|w| {
                let cs: BTreeSet<usize> = self.out(w).pending.iter().map(|p| p.channel).collect();
                cs.into_iter().map(move |c| (w, c))
            })
            .collect();
        if options.is_empty() {
            return None;
        }
        Some(options[self.rng.random_range(0..options.len())])
    }

    fn pick_unacked(&mut self) -> Option<(Who, usize)> {
        let options: Vec<(Who, usize)> = self
            .senders()
            .into_iter()
            .flat_map(|w| {
                self.out(w)
                    .unacked
                    .iter()
                    .map(|(_, co)| co.channel)
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .map(move |c| (w, c))
            })
            .map(|(w, c)| {
                (
                    w,
                    self.channels.iter().position(|x| *x == c).expect("known"),
                )
            })
            .collect();
        if options.is_empty() {
            return None;
        }
        Some(options[self.rng.random_range(0..options.len())])
    }

    /// Closes every transaction, starts every task, and lets tasks fetch and deliver until
    /// nothing moves; then checks safety and liveness.
    pub fn drain(&mut self) -> Outcome {
        for t in 0..self.tasks.len() {
            self.start_task(t, None);
        }
        for p in 0..self.producers.len() {
            self.end_producer_txn(p, true);
            self.flush(Who::Producer(p));
        }
        for t in 0..self.tasks.len() {
            self.end_task_txn(t, true);
        }
        // A bound on rounds turns a livelock (positions that keep moving without deliveries)
        // into a liveness failure instead of a hang.
        for _round in 0..100_000 {
            let mut moved = false;
            for t in 0..self.tasks.len() {
                for c in self.tasks[t].consumes.clone() {
                    let before = self.tasks[t].positions[&c];
                    let refetched = self.tasks[t].gate.metrics().refetched;
                    self.fetch(t, c, usize::MAX);
                    moved |= self.tasks[t].positions[&c] != before
                        || self.tasks[t].gate.metrics().refetched != refetched;
                }
                // One emission per delivery, never to a channel that a task both writes and
                // reads (SimConfig::self_loops): a loop through it would never drain. Without
                // self-loops this is the task's first output channel.
                let emits: Vec<usize> = self.tasks[t]
                    .emits
                    .iter()
                    .copied()
                    .filter(|c| {
                        !self
                            .tasks
                            .iter()
                            .any(|o| o.consumes.contains(c) && o.emits.contains(c))
                    })
                    .take(1)
                    .collect();
                while self.deliver(t, &emits).is_some() {
                    moved = true;
                }
                self.end_task_txn(t, true);
            }
            if !moved {
                break;
            }
        }
        self.outcome()
    }

    fn outcome(&self) -> Outcome {
        let mut out = Outcome {
            task_aborts: self.task_aborts,
            spilled: self.spilled,
            refetched: self.refetched,
            ..Outcome::default()
        };
        // Liveness: nothing stuck in a gate, every position at the end.
        let mut stuck = String::new();
        for task in &self.tasks {
            for c in &task.consumes {
                let channel = self.channels[*c];
                let queued = task.gate.queued(&channel);
                let held = task.gate.held(&channel);
                let pos = task.positions[c];
                if queued > 0 || pos < self.high_watermark(*c) {
                    let blocked: Vec<String> = task
                        .gate
                        .blocked_heads()
                        .iter()
                        .map(|b| format!("{} awaits {:?}", self.name(b.head), b.awaits))
                        .collect();
                    let _ = writeln!(
                        stuck,
                        "{}: c{c} has {queued} undelivered record(s) ({held} held, the rest spilled), frontier {:?}, position {pos} of {}, re-fetch wanted {:?}; blocked: {blocked:?}",
                        task.name,
                        task.gate.frontier(&channel),
                        self.high_watermark(*c),
                        task.gate.refetch_wanted(),
                    );
                }
            }
        }
        if !stuck.is_empty() {
            stuck.push_str("last steps (newest first):\n");
            for line in self.trace.iter().rev().take(30) {
                let _ = writeln!(stuck, "  {line}");
            }
            out.stall = Some(stuck);
        }
        if let Some(false_alarm) = self.impossible.first() {
            out.violation = Some(format!(
                "a truthful stamp was judged impossible: {false_alarm:?}"
            ));
            return out;
        }
        // Safety: the oracle on committed ground truth.
        let mut h: History<Channel> = History::new();
        let mut setup = || -> Result<(), String> {
            for prod in &self.producers {
                let p = h.process(&prod.name);
                for ev in &prod.committed {
                    if let Ev::Send(id) = ev {
                        let Some(&(c, o)) = self.placements.get(id) else {
                            return Err(format!("#{id} never appended"));
                        };
                        h.send(p, *id, self.channels[c], o)
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
            for task in &self.tasks {
                let p = h.process(&task.name);
                for (c, b) in &task.baselines {
                    h.consumes(p, self.channels[*c], *b);
                }
                for ev in &task.committed {
                    match ev {
                        Ev::Send(id) => {
                            let &(c, o) =
                                self.placements.get(id).expect("committed sends appended");
                            h.send(p, *id, self.channels[c], o)
                                .map_err(|e| e.to_string())?;
                        }
                        Ev::Deliver(id) => h.deliver(p, *id),
                    }
                }
            }
            Ok(())
        };
        if let Err(e) = setup() {
            out.violation = Some(format!("inconsistent ground truth: {e}"));
            return out;
        }
        match h.check() {
            Ok(report) => {
                out.deliveries = report.deliveries;
                out.sends = report.sends;
            }
            Err(v) => {
                let tail: Vec<&String> = self.trace.iter().rev().take(40).collect();
                let mut text = format!("{v}\nlast steps (newest first):\n");
                for line in tail {
                    let _ = writeln!(text, "  {line}");
                }
                out.violation = Some(text);
            }
        }
        out.lookahead = self.tasks.iter().map(|t| t.lookahead).sum();
        out.own = self.tasks.iter().map(|t| t.own).sum();
        out
    }

    /// A debugging view of task `t`'s gate.
    pub fn debug_task(&self, t: usize) -> String {
        let task = &self.tasks[t];
        format!(
            "consumes {:?} emits {:?} evidence_wanted {:?} blocked {:?}",
            task.consumes,
            task.emits,
            task.gate.evidence_wanted(),
            task.gate.blocked_heads()
        )
    }

    /// `c{index}@{offset}` for a coordinate of this world.
    fn name(&self, co: Coordinate) -> String {
        match self.channels.iter().position(|c| *c == co.channel) {
            Some(i) => format!("c{i}@{}", co.offset),
            None => co.to_string(),
        }
    }

    /// The channel of index `c`.
    pub fn channel(&self, c: usize) -> Channel {
        self.channels[c]
    }
}

/// Who sends: a producer or a task, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Who {
    /// Producer `i`.
    Producer(usize),
    /// Task `i`.
    Task(usize),
}

/// Runs one random history.
pub fn run(seed: u64, config: &SimConfig) -> Outcome {
    let mut sim = Sim::random(seed, config);
    sim.run_random(config.steps)
}

/// Failure counts of many random histories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Histories run.
    pub histories: u64,
    /// Histories with an oracle violation.
    pub violations: u64,
    /// Histories where something stayed stuck.
    pub stalls: u64,
    /// Deliveries checked.
    pub deliveries: u64,
    /// Of which look-ahead deliveries.
    pub lookahead: u64,
    /// Of which deliveries of the task's own records.
    pub own: u64,
    /// Stage aborts and restores.
    pub task_aborts: u64,
    /// Records spilled and re-fetched.
    pub spilled: u64,
    /// Spilled records re-fetched.
    pub refetched: u64,
    /// The first failing seed, if any.
    pub first_failure: Option<(u64, String)>,
}

impl Tally {
    /// Adds the counts of `other` (histories run after these); keeps the first failure.
    pub fn absorb(&mut self, other: Tally) {
        self.histories += other.histories;
        self.violations += other.violations;
        self.stalls += other.stalls;
        self.deliveries += other.deliveries;
        self.lookahead += other.lookahead;
        self.own += other.own;
        self.task_aborts += other.task_aborts;
        self.spilled += other.spilled;
        self.refetched += other.refetched;
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
    }
}

/// Runs `histories` random histories from `first_seed` on.
pub fn tally(first_seed: u64, histories: u64, config: &SimConfig) -> Tally {
    let mut t = Tally::default();
    for seed in first_seed..first_seed + histories {
        let o = run(seed, config);
        t.histories += 1;
        t.deliveries += o.deliveries;
        t.lookahead += o.lookahead;
        t.own += o.own;
        t.spilled += o.spilled;
        t.refetched += o.refetched;
        t.task_aborts += o.task_aborts;
        t.violations += u64::from(o.violation.is_some());
        t.stalls += u64::from(o.stall.is_some());
        if o.failed() && t.first_failure.is_none() {
            t.first_failure = Some((seed, o.violation.or(o.stall).unwrap_or_default()));
        }
    }
    t
}
