//! Intake: the stage's consumer and the one poll loop.
//!
//! One consumer per stage (`read_committed`, explicit positions, range assignment), subscribed
//! to the sources. [`Intake`] owns it and what the poll loop keeps between polls: the record
//! deferred behind rebalance events, the poll epoch, the channels paused for backpressure and
//! those bounded and held for watermark alignment. The stream thread's poll loop
//! (`StageRunner::take_batch`) is the only caller of [`Intake::poll`]: one poll batch is what
//! the consumer has ready, up to [`MAX_BATCH`] records — one evidence epoch, after which
//! positions and high watermarks are read once. Each record is copied out of the consumer's
//! buffer, its stamp decoded ([`Fetched`]), and offered to its task (through
//! [`Intake::hold`], which keeps it back beyond its channel's alignment bound).
//!
//! Rebalance events arrive from the consumer's callback during a poll. While the transaction
//! is open they are handled at once, before the record polled with them is offered (newly
//! assigned channels are seeded first); while a commit is in flight they cannot be (a
//! revocation commits first), so the batch stops and that record waits, unoffered, so no
//! position passes it.
//!
//! Watermark alignment does not pause an input ahead at the consumer: its records beyond its
//! bound are held (module `held`) until the bound reaches them, and its partition is paused only
//! while what it holds is above half the hold buffer's cap, once it reached the cap.
//!
//! Invariant: every record polled is offered to its task exactly once, in poll order per
//! channel (a held channel's records once it is released); the consumer's pauses are exactly
//! the channels in `full` or paused for their held records (backpressure's pauses and the hold
//! buffer's, kept apart so that one reason's resume does not lift the other's); a channel holds
//! records only while alignment bounds it.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parsley_clock::Channel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tracing::debug;

use super::alignment::Bound;
use super::held::{ALIGNED_PARTITION_FETCH_BYTES, HOLD_BYTES, Held, Pushed};
use super::rebalance::{RebalanceContext, RebalanceEvent};
use crate::admin::Admin;
use crate::clients::ClientRole;
use crate::config::RuntimeConfig;
use crate::security::Endpoint;
use parsley_task::context::TaskContext;
use parsley_task::error::Operation;
use parsley_task::error::{Error, Result};
use parsley_task::output::Header;
use parsley_task::record::{Fetched, FetchedMessage, fetched};
use parsley_task::{ChannelMap, ChannelSet};

/// The longest a poll waits before it looks whether a query was filed: an idle stage answers
/// an interactive query within this, not at the end of its whole wait (up to 100 ms).
const QUERY_SLICE: Duration = Duration::from_millis(5);
/// Most records taken from the consumer in one poll batch (one evidence epoch). Positions,
/// high watermarks and deliveries are read once per batch, so a larger batch spreads that work
/// over more records during catch-up (500 spent about a tenth of a history drain on it); a live
/// batch holds only what is ready.
pub(crate) const MAX_BATCH: usize = 2000;

/// How a poll batch is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taking {
    /// The transaction is open: wait up to this long for a first record; rebalance events are
    /// handled within the batch.
    Waiting(Duration),
    /// A commit is in flight: take only what is ready; a rebalance event ends the batch.
    Ready,
}

/// What a poll batch took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Taken {
    /// Records offered to the tasks.
    pub records: usize,
    /// The batch stopped at a rebalance event it could not handle ([`Taking::Ready`]).
    pub at_rebalance: bool,
}

/// What [`Intake::hold`] did with a record.
pub(crate) enum Hold {
    /// Not held: offer it.
    Offer(Box<Fetched>),
    /// Held; `first`: the channel held nothing before.
    Held {
        /// The channel held nothing before.
        first: bool,
    },
}

/// What one poll gave.
pub(crate) enum Polled {
    /// A record, to offer.
    Record(Box<Fetched>),
    /// Rebalance events wait (the record polled with them, if any, is deferred).
    Rebalance,
    /// Nothing was ready.
    Nothing,
    /// The poll failed: what it means is for the caller to decide (module `evidence`).
    Failed(KafkaError),
}

/// The stage's consumer and what the poll loop keeps between polls.
pub(crate) struct Intake {
    consumer: BaseConsumer<RebalanceContext>,
    /// A record polled together with rebalance events: offered once they are handled.
    deferred: Option<Box<Fetched>>,
    /// Poll batches so far: the epoch of the records of the current batch.
    epoch: u64,
    /// Records fetched so far (orders deliveries in arrival order under
    /// `GateMode::Off`).
    arrivals: u64,
    /// When the current batch took its first record (one clock read per batch).
    batch_time: Option<Instant>,
    /// The channels paused by backpressure (their queues are full).
    full: ChannelSet,
    /// The channels paused while their task reads its global sources to their end (module
    /// `tasks::global`).
    bootstrapping: ChannelSet,
    /// The channels bounded by watermark alignment, and their bounds.
    bounds: ChannelMap<Bound>,
    /// What the consumer returned of bounded channels beyond their bounds, and after.
    held: Held<Box<Fetched>>,
    /// Held records were released since the stream thread last asked.
    released: bool,
    /// What the consumer connects to, for a security failure.
    endpoint: Endpoint,
}

impl Intake {
    /// The stage's consumer (`read_committed`, explicit positions, range assignment),
    /// subscribed to `sources`: it joins the group while the caller goes on. Its rebalance
    /// events are served only when it is first polled, so the assignment is handled once
    /// everything else is ready. `aligned`: the stage has watermark alignment, and its consumer
    /// fetches less of a partition per response (`consumer_settings`).
    pub(crate) fn subscribe(
        config: &RuntimeConfig,
        group: &str,
        admin: &Arc<Admin>,
        sources: &[String],
        aligned: bool,
    ) -> Result<Self> {
        let own = consumer_settings(group, aligned);
        let cc = config.client_config(group, ClientRole::Consumer, &own);
        let endpoint = Endpoint::of(&cc, ClientRole::Consumer);
        let consumer: BaseConsumer<RebalanceContext> = cc
            .create_with_context(RebalanceContext::new(config, admin.clone()))
            .map_err(|e| {
                Error::from(
                    crate::client_error::client(Operation::CreateConsumer, e).with_group(group),
                )
            })?;
        let topics: Vec<&str> = sources.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| crate::client_error::kafka(Operation::Subscribe, e))?;
        debug!("subscribed: joining the group");
        Ok(Intake {
            consumer,
            deferred: None,
            epoch: 0,
            arrivals: 0,
            batch_time: None,
            full: ChannelSet::default(),
            bootstrapping: ChannelSet::default(),
            bounds: ChannelMap::default(),
            held: Held::new(HOLD_BYTES),
            released: false,
            endpoint,
        })
    }

    /// The consumer, for local evidence reads.
    pub(crate) fn consumer(&self) -> &BaseConsumer<RebalanceContext> {
        &self.consumer
    }

    /// The epoch of the current poll batch.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The channels paused by backpressure now.
    pub(crate) fn full(&self) -> &ChannelSet {
        &self.full
    }

    /// `true` when the consumer does not fetch `channel` now (paused by backpressure, or for
    /// what it holds).
    pub(crate) fn is_paused(&self, channel: &Channel) -> bool {
        self.full.contains(channel)
            || self.bootstrapping.contains(channel)
            || self.held.is_full(channel)
    }

    /// The consumer's `position` of `channel` as the gate may take it: at most the first
    /// record held of it, which the gate has not seen.
    pub(crate) fn gate_position(&self, channel: &Channel, position: i64) -> i64 {
        self.held
            .first(channel)
            .map_or(position, |first| first.min(position))
    }

    /// Records of `channel` held for watermark alignment now.
    pub(crate) fn held_records(&self, channel: &Channel) -> usize {
        self.held.len_of(channel)
    }

    /// The bytes held for watermark alignment now, over every input (module `held`).
    pub(crate) fn held_bytes(&self) -> usize {
        self.held.bytes()
    }

    /// Holds `f` when watermark alignment bounds its channel and `f` lies beyond the bound or
    /// records of the channel are held already (`Held`, `first` when none were), pausing its
    /// partition once it holds [`HOLD_BYTES`]; else hands it back to be offered.
    pub(crate) fn hold(&mut self, ctx: &TaskContext, f: Box<Fetched>) -> Result<Hold> {
        let Some(bound) = self.bounds.get(&f.channel) else {
            return Ok(Hold::Offer(f));
        };
        let channel = f.channel;
        let first = self.held.len_of(&channel) == 0;
        if first && f.arrival.timestamp <= bound.up_to {
            return Ok(Hold::Offer(f));
        }
        if self.held.push(channel, f) == Pushed::Full && !self.full.contains(&channel) {
            debug!(%channel, "watermark alignment: holding the cap, pausing the partition");
            self.pause(ctx, channel, true)?;
        }
        Ok(Hold::Held { first })
    }

    /// Sets watermark alignment's bound of `channel` (`None`: none) and returns the records
    /// held of it that may go on now (module `held`), in offset order, to be offered first
    /// (marked with the current poll epoch); resumes its partition if it was paused for what it
    /// held and that is down to half the cap.
    pub(crate) fn set_bound(
        &mut self,
        ctx: &TaskContext,
        channel: Channel,
        bound: Option<Bound>,
    ) -> Result<impl Iterator<Item = Box<Fetched>> + '_> {
        let (up_to, at_least_one) = match bound {
            Some(b) => {
                self.bounds.insert(channel, b);
                (b.up_to, b.at_least_one)
            }
            None => {
                self.bounds.remove(&channel);
                (i64::MAX, true)
            }
        };
        let (records, resume) = self.held.release(&channel, up_to, at_least_one);
        if resume && !self.full.contains(&channel) {
            pause_partition(&self.consumer, ctx, channel, false)?;
        }
        self.released |= records.len() > 0;
        let epoch = self.epoch;
        Ok(records.map(move |mut f| {
            f.arrival.epoch = epoch;
            f
        }))
    }

    /// `true` once if held records were released since the last call: they wait in the gates,
    /// so the next poll should not wait for new ones.
    pub(crate) fn take_released(&mut self) -> bool {
        std::mem::take(&mut self.released)
    }

    /// `true` when rebalance events or a record polled with them wait.
    pub(crate) fn rebalance_waiting(&self) -> bool {
        self.deferred.is_some() || self.consumer.context().has_events()
    }

    /// The rebalance events recorded since the last call.
    pub(crate) fn take_events(&self) -> Vec<RebalanceEvent> {
        self.consumer.context().take_events()
    }

    /// Starts a poll batch: a new evidence epoch.
    pub(crate) fn next_epoch(&mut self) {
        self.epoch += 1;
        self.batch_time = None;
    }

    /// Polls once, waiting at most `timeout`.
    pub(crate) fn poll(&mut self, timeout: Duration, ctx: &TaskContext) -> Result<Polled> {
        let fetched = match poll_sliced(&self.consumer, timeout, ctx) {
            Some(Ok(m)) => {
                let at = *self.batch_time.get_or_insert_with(Instant::now);
                self.arrivals += 1;
                Some(fetched(
                    ctx,
                    &PolledMessage(&m),
                    self.arrivals,
                    self.epoch,
                    at,
                )?)
            }
            Some(Err(e)) => return Ok(Polled::Failed(e)),
            None => None,
        };
        if self.consumer.context().has_events() {
            self.deferred = fetched;
            return Ok(Polled::Rebalance);
        }
        Ok(fetched.map_or(Polled::Nothing, Polled::Record))
    }

    /// Pauses or resumes the partition of source channel `channel` for backpressure (its
    /// queue in the gate is full); the consumer pauses it while backpressure or what it holds
    /// asks to.
    pub(crate) fn set_full(
        &mut self,
        ctx: &TaskContext,
        channel: Channel,
        full: bool,
    ) -> Result<()> {
        let was = self.is_paused(&channel);
        if full {
            self.full.insert(channel);
        } else {
            self.full.remove(&channel);
        }
        if self.is_paused(&channel) != was {
            self.pause(ctx, channel, !was)?;
        }
        Ok(())
    }

    /// Pauses or resumes the partition of source channel `channel` while its task reads its
    /// global sources to their end: what is fetched meanwhile waits in the task's memory, so
    /// the consumer stops fetching more.
    pub(crate) fn set_bootstrapping(
        &mut self,
        ctx: &TaskContext,
        channel: Channel,
        bootstrapping: bool,
    ) -> Result<()> {
        let was = self.is_paused(&channel);
        if bootstrapping {
            self.bootstrapping.insert(channel);
        } else {
            self.bootstrapping.remove(&channel);
        }
        if self.is_paused(&channel) != was {
            self.pause(ctx, channel, !was)?;
        }
        Ok(())
    }

    /// Pauses (`true`) or resumes the partition of source channel `channel` at the consumer.
    fn pause(&self, ctx: &TaskContext, channel: Channel, pause: bool) -> Result<()> {
        pause_partition(&self.consumer, ctx, channel, pause)
    }

    /// Resumes every paused partition and lets every held channel go on, forgetting what it
    /// held (read again from the positions the caller seeks to).
    pub(crate) fn resume_all(&mut self, ctx: &TaskContext) -> Result<()> {
        for channel in self.full.clone() {
            self.set_full(ctx, channel, false)?;
        }
        for channel in self.bootstrapping.clone() {
            self.set_bootstrapping(ctx, channel, false)?;
        }
        for channel in self.held.clear() {
            self.pause(ctx, channel, false)?;
        }
        self.bounds.clear();
        Ok(())
    }

    /// The record polled together with the rebalance events just handled, if any: to be
    /// offered now.
    pub(crate) fn take_deferred(&mut self) -> Option<Box<Fetched>> {
        self.deferred.take()
    }

    /// The error for a security failure `code` of the consumer ([`Endpoint::error`]).
    pub(crate) fn security_error(
        &self,
        code: rdkafka::types::RDKafkaErrorCode,
        message: String,
    ) -> Error {
        self.endpoint.error(code, message)
    }

    /// Drops a record polled behind a rebalance event: it is read again from the committed
    /// offsets after a recovery.
    pub(crate) fn drop_deferred(&mut self) {
        self.deferred = None;
    }

    /// Moves the consumer's fetch position of source channel `channel` to `offset`; records
    /// held of it at or above `offset` are forgotten (the consumer returns them again).
    pub(crate) fn seek(
        &mut self,
        ctx: &TaskContext,
        channel: Channel,
        offset: i64,
        timeout: Duration,
    ) -> Result<()> {
        self.held.forget_from(&channel, offset);
        let topic = &ctx.source_of(channel)?.name;
        self.consumer
            .seek(topic, channel.partition, Offset::Offset(offset), timeout)
            .map_err(|e| {
                Error::from(
                    crate::client_error::client(Operation::Seek, e)
                        .with_partition(topic, channel.partition)
                        .with_offset(offset),
                )
            })
    }

    /// The positions where the current assignment starts again: the group's committed
    /// offsets, or the log start where it has none (as on assignment).
    ///
    /// # Errors
    /// As on assignment:
    /// [`RecordError::RecordsLost`](parsley_task::error::RecordError::RecordsLost) for a committed
    /// offset below the log start; client errors.
    pub(crate) fn start_positions(&self) -> Result<Vec<(String, i32, i64)>> {
        let assignment = self
            .consumer
            .assignment()
            .map_err(|e| crate::client_error::kafka(Operation::ReadAssignment, e))?;
        self.consumer
            .context()
            .start_positions(&self.consumer, &assignment)
    }

    /// Gives up the assignment (after a revocation is committed).
    pub(crate) fn unassign(&mut self) -> Result<()> {
        self.consumer
            .unassign()
            .map_err(|e| crate::client_error::kafka(Operation::UnassignAfterRevocation, e))?;
        // Nothing is paused or held once nothing is assigned.
        self.full.clear();
        self.bootstrapping.clear();
        self.bounds.clear();
        self.held.clear();
        Ok(())
    }

    /// The group metadata that goes with the offsets into the transaction (EOS v2).
    pub(crate) fn group_metadata(&self) -> Result<rdkafka::consumer::ConsumerGroupMetadata> {
        self.consumer.group_metadata().ok_or_else(|| {
            Error::admin(
                Operation::Commit,
                "the consumer has no group metadata".into(),
            )
        })
    }

    /// Tells the rebalance callback that the stream thread is done with the consumer.
    pub(crate) fn close(&self) {
        self.consumer.context().close();
    }
}

/// A polled message as [`fetched`] reads it.
pub(crate) struct PolledMessage<'a, 'm>(pub(crate) &'a BorrowedMessage<'m>);

impl FetchedMessage for PolledMessage<'_, '_> {
    fn topic(&self) -> &str {
        Message::topic(self.0)
    }

    fn partition(&self) -> i32 {
        Message::partition(self.0)
    }

    fn offset(&self) -> i64 {
        Message::offset(self.0)
    }

    fn timestamp_ms(&self) -> Option<i64> {
        Message::timestamp(self.0).to_millis()
    }

    fn key(&self) -> Option<&[u8]> {
        Message::key(self.0)
    }

    fn value(&self) -> Option<&[u8]> {
        self.0.payload()
    }

    fn stamp_header(&self) -> Option<&[u8]> {
        Message::headers(self.0)?
            .iter()
            .find(|h| parsley_clock::is_stamp_header(h.key))
            .map(|h| h.value.unwrap_or_default())
    }

    fn has_user_headers(&self) -> bool {
        Message::headers(self.0)
            .is_some_and(|headers| headers.iter().any(|h| !parsley_stage::is_own_header(h.key)))
    }

    fn all_headers(&self) -> Box<[Header]> {
        Message::headers(self.0).map_or_else(Box::default, |headers| {
            headers
                .iter()
                .map(|h| (Cow::Owned(h.key.to_string()), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
    }
}

/// The settings the runtime gives the stage's consumer of group `group` (a property set on the
/// runtime overrides each); `aligned`: the stage orders by event time with watermark alignment,
/// and fetches at most [`ALIGNED_PARTITION_FETCH_BYTES`] of one partition per response.
fn consumer_settings(group: &str, aligned: bool) -> Vec<(&str, &str)> {
    let mut own = vec![
        ("group.id", group),
        ("isolation.level", "read_committed"),
        ("enable.auto.commit", "false"),
        ("enable.auto.offset.store", "false"),
        // Positions are always explicit; a fetch position that falls out of range
        // (retention overtook a lagging task) is an error, never a silent reset.
        ("auto.offset.reset", "error"),
        // Notice a source's partition count changing within seconds, not librdkafka's
        // default five minutes: the rebalance it causes is checked and stops the stage.
        ("topic.metadata.refresh.interval.ms", "5000"),
        ("partition.assignment.strategy", "range"),
        ("enable.partition.eof", "false"),
        ("fetch.wait.max.ms", "50"),
        // librdkafka stops fetching while 100,000 records (`queued.min.messages`) wait in
        // the consumer's queue and looks again only after `fetch.queue.backoff.ms` (1 s by
        // default): a stage working through a backlog drains its queue in a fraction of
        // that and then waits for records (measured: a 0.5-0.7 s stall every half second
        // at 100 B). Looking again after 10 ms keeps the queue from running dry.
        ("fetch.queue.backoff.ms", "10"),
        // A fetch response carries up to `max.partition.fetch.bytes` (1 MiB) of every
        // partition the broker leads, up to `fetch.max.bytes` (50 MiB by default), and
        // stays in memory until its last record is polled. 4 MiB keeps a stage over many
        // partitions from holding tens of MiB per response (measured: a history drain of
        // 24 million records over 39 partitions peaked at 912 MiB, and at 129 MiB with
        // 4 MiB, in the same time); a stage over at most four partitions fetches as before.
        ("fetch.max.bytes", "4194304"),
    ];
    if aligned {
        // Watermark alignment holds what an input fetched beyond its bound (module
        // `held`): a smaller fetch per partition brings less of it at a time.
        own.push(("max.partition.fetch.bytes", ALIGNED_PARTITION_FETCH_BYTES));
    }
    own
}

/// Pauses (`true`) or resumes the partition of source channel `channel` at `consumer`.
fn pause_partition(
    consumer: &BaseConsumer<RebalanceContext>,
    ctx: &TaskContext,
    channel: Channel,
    pause: bool,
) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&ctx.source_of(channel)?.name, channel.partition);
    if pause {
        consumer.pause(&tpl)
    } else {
        consumer.resume(&tpl)
    }
    .map_err(|e| crate::client_error::kafka(Operation::PauseResume, e))
}

/// One message of `consumer`, waiting at most `timeout` in slices of [`QUERY_SLICE`]: after a
/// slice with nothing, a query filed meanwhile or a rebalance event ends the wait, so an idle
/// stage answers a query within a slice rather than at the end of its whole wait.
fn poll_sliced<'c>(
    consumer: &'c BaseConsumer<RebalanceContext>,
    timeout: Duration,
    ctx: &TaskContext,
) -> Option<rdkafka::error::KafkaResult<BorrowedMessage<'c>>> {
    let started = Instant::now();
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        let polled = consumer.poll(left.min(QUERY_SLICE));
        if polled.is_some()
            || left <= QUERY_SLICE
            || ctx.metrics.queries().asked()
            || consumer.context().has_events()
        {
            return polled;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aligned_stage_fetches_less_of_a_partition_and_a_runtime_property_overrides_it() {
        let fetch = |settings: &[(&str, &str)]| {
            settings
                .iter()
                .find(|(k, _)| *k == "max.partition.fetch.bytes")
                .map(|(_, v)| v.to_string())
        };
        assert_eq!(fetch(&consumer_settings("g", false)), None);
        assert_eq!(
            fetch(&consumer_settings("g", true)),
            Some("262144".to_string())
        );
        let config = RuntimeConfig::new("b:1");
        let c = config.client_config("g", ClientRole::Consumer, &consumer_settings("g", true));
        assert_eq!(c.get("max.partition.fetch.bytes"), Some("262144"));
        assert_eq!(c.get("group.id"), Some("g"));
        let config = config.consumer_property("max.partition.fetch.bytes", "1048576");
        let c = config.client_config("g", ClientRole::Consumer, &consumer_settings("g", true));
        assert_eq!(c.get("max.partition.fetch.bytes"), Some("1048576"));
    }
}
