//! Running a world: [`Sim::run_random`] starts each task at its start step and takes random
//! steps (sends, producer commits and aborts, appends, acknowledgements, fetches, deliveries,
//! task commits and aborts); [`Sim::drain`] then closes every transaction, lets every task fetch
//! and deliver until nothing moves, and checks the outcome; [`run`] does both for one seed.
//!
//! The drain is bounded, so a livelock becomes a liveness failure instead of a hang, and it never
//! emits to a channel that a task both reads and writes (a loop through it would never drain).

use std::collections::BTreeSet;

use rand::Rng;

use super::{Outcome, Sim, SimConfig, Tally, Who};

impl Sim {
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
}

/// Runs one random history.
pub fn run(seed: u64, config: &SimConfig) -> Outcome {
    let mut sim = Sim::random(seed, config);
    sim.run_random(config.steps)
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
