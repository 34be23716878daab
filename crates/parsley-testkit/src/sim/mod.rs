//! A deterministic simulator of partitions, producers and stage tasks, to test the real gate
//! and the real `CausalClock` against the [oracle](crate::oracle) (the book's specification, §8).
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
//!   deliveries) and checks every delivery of every task (the book's specification, §2);
//! - **liveness**: every visible record at or above a task's baseline on a channel it consumes
//!   was delivered — nothing is left stuck.
//!
//! A [`Variant`] other than [`Variant::Correct`] switches on one deliberately wrong rule; each
//! must fail, in a fixed history every time ([`scenarios`](crate::scenarios)) and in some share
//! of random ones.

// Where the parts live:
// - this file: the world — partitions as logs with gaps, transactions, producers and stage
//   tasks (`Sim`, `Who`) — and the views of it the other parts share;
// - `config`: the rule set and the sizes of a random history (`Variant`, `SimConfig`), and the
//   random world built from them;
// - `produce`: sends, appends and acknowledgements of producers and tasks, and producer
//   transactions;
// - `task`: stage tasks — starting, fetching with backpressure, evidence, delivering,
//   committing or aborting;
// - `run`: random steps, the drain, and `run`;
// - `outcome`: the safety and liveness checks (`Outcome`) and the counts of many histories
//   (`Tally`, `tally`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use parsley_clock::{CausalClock, Channel, Coordinate, SenderId, Stamp, TopicId};
use parsley_gate::{Gate, GateSnapshot};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod config;
mod outcome;
mod produce;
mod run;
mod task;

pub use config::{SimConfig, Variant};
pub use outcome::{Outcome, Tally};
pub use run::run;
pub use run::tally;

/// A record's unique id in a simulation.
pub type RecordId = u64;

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

    /// Sets the backpressure cap (fetched, undelivered records per channel).
    pub fn set_queue_cap(&mut self, cap: usize) {
        self.queue_cap = cap;
    }

    /// The channel of index `c`.
    pub fn channel(&self, c: usize) -> Channel {
        self.channels[c]
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

    fn out_mut(&mut self, who: Who) -> &mut Out {
        match who {
            Who::Producer(p) => &mut self.producers[p].out,
            Who::Task(t) => &mut self.tasks[t].out,
        }
    }

    fn out(&self, who: Who) -> &Out {
        match who {
            Who::Producer(p) => &self.producers[p].out,
            Who::Task(t) => &self.tasks[t].out,
        }
    }

    fn senders(&self) -> Vec<Who> {
        (0..self.producers.len())
            .map(Who::Producer)
            .chain((0..self.tasks.len()).map(Who::Task))
            .collect()
    }

    /// `c{index}@{offset}` for a coordinate of this world.
    fn name(&self, co: Coordinate) -> String {
        match self.channels.iter().position(|c| *c == co.channel) {
            Some(i) => format!("c{i}@{}", co.offset),
            None => co.to_string(),
        }
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
}

/// Who sends: a producer or a task, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Who {
    /// Producer `i`.
    Producer(usize),
    /// Task `i`.
    Task(usize),
}
