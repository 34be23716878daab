//! The simulated stage tasks, each running a real [`Gate`] and a transactional [`CausalClock`]:
//! a task is started (each channel seeded at the log start, at the end, or in between), fetches
//! from its position up to the LSO as a `read_committed` consumer does — with backpressure,
//! spilling and re-fetching — hands its gate the evidence it asks for, delivers what the gate
//! releases (the stamp merged into its clock, outputs emitted), and commits, or aborts and
//! restores its gate and clock from the last committed snapshot and rewinds its positions.
//!
//! Of the wrong rules that are not gate faults, three are applied here:
//! [`Variant::ClockClaimsFrontier`], [`Variant::SettleByLso`] and [`Variant::StrictPause`]
//! ([`Variant::InFlightWithoutTransactions`] is applied to producers, in `produce`).
//!
//! Invariants kept here: each fetch is one poll epoch, and the evidence handed to the gate is
//! read after it; records are offered in offset order, then the position after them; a task's
//! deliveries and sends count in the history only once its transaction commits.

use std::collections::{BTreeMap, BTreeSet};

use parsley_clock::{CausalClock, Channel};
use parsley_gate::{Arrival, Gate};
use rand::Rng;

use super::{Committed, Ev, Out, RecordId, Sim, Task, TxnState, Variant, Who};

impl Sim {
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
}
