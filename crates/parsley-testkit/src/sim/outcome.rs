//! What a simulation found, after the drain: liveness (no record left undelivered in a gate,
//! every position at the end of its channel), no truthful stamp judged impossible, and safety —
//! the [oracle](crate::oracle) replaying the committed ground truth (each process's sends and
//! deliveries) — as an [`Outcome`]; and the counts of many random histories as a [`Tally`] (summed by
//! [`tally`](super::run::tally), beside the run it repeats).

use std::fmt::Write as _;

use parsley_clock::Channel;

use super::{Ev, Sim};
use crate::oracle::History;

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

impl Sim {
    pub(super) fn outcome(&self) -> Outcome {
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
    /// Records spilled (their payloads dropped; `refetched` counts those read again).
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
