//! What a random history is made of: the rule set ([`Variant`], and the gate faults each wrong
//! variant switches on), the sizes and rates ([`SimConfig`]), and the world [`Sim::random`]
//! builds from them — channels in three layers, producers writing to layer 0, and stage tasks in
//! a random DAG, each consuming channels of earlier layers and emitting to channels of its own
//! layer (with [`SimConfig::self_loops`], some also consuming one of their own output channels).

use parsley_gate::Faults;
use rand::Rng;

use super::Sim;

/// Which rule set the simulation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The rules of the book's specification, §3–§4.
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

    pub(super) fn faults(self) -> Faults {
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
}
