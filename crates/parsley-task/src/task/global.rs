//! A task's global sources ([`parsley_stage::StageSettings::global_source`]): every task reads
//! every partition of them, through its own gate, and keeps what they say in its fold state
//! under their own keys, where a record of another source finds it by key
//! ([`parsley_stage::StateLookup`]).
//!
//! # Invariants
//! - **Bootstrap.** From [`Task::start_bootstrap`] until the gate's frontier of every global
//!   channel has reached the end offset read when the task started, the task offers nothing of
//!   its other channels to its gate: their fetched records wait here, in fetch order, and are
//!   offered as they came once the global channels are caught up. So the first record of
//!   another source is handled after the global sources' history that existed at task start —
//!   Kafka Streams bootstraps its global stores the same way before its stream threads run.
//! - **Positions.** A global channel's offset is never committed to the stage's consumer group
//!   (every task reads it at its own position): [`Task::write_changelog`] leaves it out of the
//!   offsets it returns and keeps it in the task's snapshot, from which a restore resumes it.
//! - A lookup reads the fold state between two records (the open transaction's changes
//!   included), never a half-applied step.

use std::borrow::Cow;

use parsley_clock::Channel;
use parsley_stage::StateLookup;

use super::{FoldState, Task};
use crate::context::TaskContext;
use crate::error::Result;
use crate::output::Output;
use crate::record::{Fetched, Work};

/// What a task holds back while it reads its global sources to their end offsets.
#[derive(Debug, Default)]
pub(super) struct Bootstrap {
    /// Per global channel: the end offset read when the task started (the offset after its last
    /// record then).
    ends: Vec<(Channel, i64)>,
    /// Records of the other channels fetched meanwhile, in fetch order: each kept in the box
    /// it came in, which `offer` takes back.
    #[allow(clippy::vec_box)]
    waiting: Vec<Box<Fetched>>,
    /// The consumer's positions on the other channels meanwhile, the latest of each: handed
    /// to the gate after the records that wait (a position says every record below it was
    /// offered).
    positions: Vec<(Channel, i64)>,
}

/// The fold state, read by key for a processor ([`parsley_stage::StateLookup`]).
pub(super) struct FoldLookup<'a>(pub(super) &'a FoldState);

impl StateLookup for FoldLookup<'_> {
    fn state_of(&self, key: &[u8]) -> std::result::Result<Option<Cow<'_, [u8]>>, String> {
        self.0.get(key).map_err(|e| e.to_string())
    }
}

impl Task {
    /// Starts the bootstrap of the task's global sources: `ends` gives, for each global channel,
    /// the end offset (high watermark) read when the task started. Until the gate's frontier of
    /// each has reached it, records of the task's other channels wait (module docs). Channels
    /// already caught up need no wait; with none left, no bootstrap starts.
    pub fn start_bootstrap(&mut self, ends: Vec<(Channel, i64)>) {
        let bootstrap = Bootstrap {
            ends,
            ..Bootstrap::default()
        };
        self.bootstrap = (!self.bootstrapped(&bootstrap)).then(|| Box::new(bootstrap));
    }

    /// Whether the task still reads its global sources to their end offsets (module docs).
    pub fn bootstrapping(&self) -> bool {
        self.bootstrap.is_some()
    }

    /// The global channels still short of their end offsets, with the frontier and end of each:
    /// what a bootstrapping task waits for.
    pub fn bootstrap_remaining(&self) -> Vec<(Channel, Option<i64>, i64)> {
        let Some(b) = &self.bootstrap else {
            return Vec::new();
        };
        b.ends
            .iter()
            .map(|&(c, end)| (c, self.gate.frontier(&c), end))
            .filter(|&(_, frontier, end)| frontier.is_none_or(|f| f < end - 1))
            .collect()
    }

    /// The first offset not yet delivered of each global channel: where a reader of the global
    /// sources fetches for this task from.
    pub fn global_positions(&self, ctx: &TaskContext) -> Vec<(Channel, i64)> {
        ctx.global_channels()
            .into_iter()
            .filter_map(|c| self.gate.first_undelivered(&c).map(|o| (c, o)))
            .collect()
    }

    fn bootstrapped(&self, b: &Bootstrap) -> bool {
        b.ends
            .iter()
            .all(|(c, end)| self.gate.frontier(c).is_some_and(|f| f >= end - 1))
    }

    /// Keeps `fetched` back when the task bootstraps and it is not of a global channel;
    /// returns it otherwise.
    pub(super) fn hold_for_bootstrap(
        &mut self,
        ctx: &TaskContext,
        fetched: Box<Fetched>,
    ) -> Option<Box<Fetched>> {
        match &mut self.bootstrap {
            Some(b) if !ctx.is_global(fetched.channel) => {
                b.waiting.push(fetched);
                None
            }
            _ => Some(fetched),
        }
    }

    /// Hands the gate the consumer's position on `channel` (the offset after the last record
    /// fetched; [`parsley_gate::Gate::position`]), kept back with the records of a channel
    /// that waits for the bootstrap.
    ///
    /// # Errors
    /// The gate's, naming the task.
    pub fn position(&mut self, ctx: &TaskContext, channel: Channel, position: i64) -> Result<()> {
        if let Some(b) = &mut self.bootstrap
            && !ctx.is_global(channel)
        {
            match b.positions.iter_mut().find(|(c, _)| *c == channel) {
                Some((_, p)) => *p = (*p).max(position),
                None => b.positions.push((channel, position)),
            }
            return Ok(());
        }
        self.gate
            .position(channel, position)
            .map_err(|e| ctx.gate_error(self.partition, e))
    }

    /// Ends the bootstrap once every global channel is caught up, offers the records that
    /// waited and delivers what the gate then releases.
    ///
    /// # Errors
    /// As [`Task::offer`] and [`Task::deliver`].
    pub(super) fn end_bootstrap(
        &mut self,
        ctx: &TaskContext,
        out: &mut dyn Output,
    ) -> Result<Option<Work>> {
        let done = self
            .bootstrap
            .as_ref()
            .is_some_and(|b| self.bootstrapped(b));
        if !done {
            return Ok(None);
        }
        let Some(b) = self.bootstrap.take() else {
            return Ok(None);
        };
        for fetched in b.waiting {
            self.offer(ctx, fetched)?;
        }
        for (channel, position) in b.positions {
            self.position(ctx, channel, position)?;
        }
        self.deliver(ctx, out).map(Some)
    }
}
