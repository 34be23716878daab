//! Bounding what each channel holds (the book's specification, §4), as a pure plan the stream
//! thread applies.
//!
//! Once per poll batch, [`plan`] reads a task's gate and says, per consumed channel:
//! - a full channel is **paused** — unless an unsettled in-flight claim needs it read
//!   ([`Gate::needs_reading`]): pausing it would deadlock, so it **spills** (untracked records
//!   drop their payloads, leaving stubs) and is read on;
//! - a needed spilled record is **re-fetched**: the channel seeks back to it (spilling records
//!   nobody waits for to make room) and re-reads until where reading had stopped, or until it
//!   is full again and no needed record lies ahead (the re-fetch then ends early and the
//!   channel seeks back to where reading had stopped);
//! - a paused channel **resumes** once it holds at most half the cap.
//!
//! Mid-batch, [`on_offer`] spills at once a channel a claim needs as soon as it exceeds the cap;
//! any other full channel waits for the plan after the batch.
//!
//! At the process's memory bound ([`plan_at_bound`], module `memory`) every channel is taken as
//! full: the same rules pause it or, when a claim needs it, spill it and read on.
//!
//! Invariant: the plan is computed from the gate as it is before any of its steps, and a
//! channel an unsettled in-flight claim needs is never paused.

use std::collections::HashSet;
use std::hash::BuildHasher;

use parsley_clock::Channel;
use parsley_gate::Gate;
use tracing::debug;

use crate::memory::AtBound;
use crate::metrics::StageMetrics;

/// One step of a backpressure plan, applied in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Drop the payloads of the channel's untracked records ([`Gate::spill`]).
    Spill(Channel),
    /// Start re-fetching spilled records from `from` ([`Gate::begin_refetch`]); the consumer
    /// seeks there.
    BeginRefetch {
        /// The channel.
        channel: Channel,
        /// The first needed spilled record.
        from: i64,
    },
    /// End a re-fetch early, the channel being full ([`Gate::end_refetch`]); the consumer
    /// seeks back to `resume`, where reading had stopped.
    EndRefetch {
        /// The channel.
        channel: Channel,
        /// Where reading had stopped.
        resume: i64,
    },
    /// Pause the consumer's partition.
    Pause(Channel),
    /// Resume the consumer's partition.
    Resume(Channel),
}

impl Step {
    /// The channel the step is about.
    pub fn channel(&self) -> Channel {
        match *self {
            Step::Spill(c) | Step::Pause(c) | Step::Resume(c) => c,
            Step::BeginRefetch { channel, .. } | Step::EndRefetch { channel, .. } => channel,
        }
    }
}

/// The backpressure steps for one task's `gate`, given the channels paused now and the cap of
/// fetched-but-undelivered records per channel. Channels not seeded yet are left alone.
pub fn plan<R, S: BuildHasher>(
    gate: &Gate<R>,
    paused: &HashSet<Channel, S>,
    cap: usize,
) -> Vec<Step> {
    let wanted = gate.refetch_wanted();
    let mut steps = Vec::new();
    for channel in gate.consumed() {
        if gate.baseline(&channel).is_none() {
            continue;
        }
        let held = gate.held(&channel);
        let was_paused = paused.contains(&channel);
        let want = wanted.iter().find(|(c, _)| *c == channel).map(|(_, o)| *o);
        let mut pause = was_paused;
        if let Some(r) = gate.refetching(&channel) {
            if held >= cap {
                steps.push(if want.is_some() {
                    Step::Spill(channel)
                } else {
                    Step::EndRefetch {
                        channel,
                        resume: r.resume,
                    }
                });
            }
            pause = false;
        } else if let Some(from) = want {
            if held >= cap {
                steps.push(Step::Spill(channel));
            }
            steps.push(Step::BeginRefetch { channel, from });
            pause = false;
        } else if held >= cap {
            if gate.needs_reading(&channel) {
                steps.push(Step::Spill(channel));
                pause = false;
            } else {
                pause = true;
            }
        } else if held <= cap / 2 {
            pause = false;
        }
        if pause != was_paused {
            steps.push(if pause {
                Step::Pause(channel)
            } else {
                Step::Resume(channel)
            });
        }
    }
    steps
}

/// The backpressure steps for one task's `gate` under the memory bound's decision `at`
/// (module `memory`). Free, it is [`plan`]. Squeezed, every channel is taken as full (a cap
/// of 0): a channel no in-flight claim needs is paused; one a claim needs spills its
/// untracked records and is read on; a spilled record the gate wants is still re-fetched (its
/// delivery is what releases memory). With `keep_reading` (an event-time task with parked
/// records: only reading moves its watermark, which releases them) nothing is paused; each
/// channel spills instead.
pub fn plan_at_bound<R, S: BuildHasher>(
    gate: &Gate<R>,
    paused: &HashSet<Channel, S>,
    cap: usize,
    at: AtBound,
    keep_reading: bool,
) -> Vec<Step> {
    match at {
        AtBound::Free => plan(gate, paused, cap),
        AtBound::Squeeze => {
            let mut steps = Vec::new();
            for step in plan(gate, paused, 0) {
                match step {
                    Step::Pause(c) if keep_reading => {
                        if gate.held(&c) > 0 {
                            steps.push(Step::Spill(c));
                        }
                    }
                    s => steps.push(s),
                }
            }
            steps
        }
    }
}

/// Mid-batch, after `channel` took a record: a channel beyond the cap that an in-flight claim
/// needs spills at once (any other is paused by the plan after the batch); a read beyond the
/// cap is counted.
pub fn on_offer<R>(gate: &mut Gate<R>, channel: Channel, cap: usize, metrics: &StageMetrics) {
    if gate.held(&channel) <= cap {
        return;
    }
    if gate.refetching(&channel).is_none() && gate.needs_reading(&channel) {
        let n = gate.spill(&channel);
        debug!(%channel, spilled = n, "spilling a channel a claim needs");
        metrics.spilled(n);
    }
    if gate.held(&channel) > cap {
        metrics.beyond_cap();
    }
}
