//! The readers of a stage's global sources ([`parsley_stage::StageSettings::global_source`]):
//! one consumer per task, `read_committed`, assigned every partition of every global source
//! at the task's own positions, never joining a group and never committing — a task keeps
//! those positions in its changelog snapshot, and the stage's group never sees them.
//!
//! Each turn, after the stage's consumer is polled, every reader is polled without waiting
//! and its records are offered to its task's gate like any other input's; the evidence phase
//! hands each task its reader's positions. A task's reader is opened when the task is
//! restored, at the first offset its gate has not delivered of each global channel, and
//! dropped with the task. While a task reads its global sources to their end (its bootstrap),
//! the stage's consumer pauses the task's other partitions (`Intake::set_bootstrapping`): what
//! was fetched before waits in the task, nothing more is fetched, and the poll waits at most
//! a few ms so the readers are polled often.
//!
//! A reader's transient error (a broker restarting, a leader moving) is logged and the read
//! goes on, as the stage's own consumer does; a position below its partition's log start
//! (retention deleted rows a restored task had not read) is `RecordsLost` naming the topic,
//! partition and lost range; any other error stops the stage.
//!
//! Invariants:
//! - a reader exists exactly for each task here with global sources, and reads for that task
//!   only;
//! - a global channel is never paused, spilled or sought on the stage's consumer: it is not
//!   assigned there.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parsley_clock::Channel;
use parsley_task::context::TaskContext;
use parsley_task::error::{Error, Operation, RecordError, Result};
use parsley_task::record::fetched;
use parsley_task::task::Task;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, warn};

use crate::stage::intake::{MAX_BATCH, PolledMessage};

/// The readers of the global sources, one per task (module docs).
pub(crate) struct GlobalReaders {
    /// How a reader is configured (as a changelog's restore consumer: assigned, never
    /// joining its group).
    config: ClientConfig,
    readers: BTreeMap<i32, BaseConsumer>,
    /// Records offered so far: their arrival order.
    arrivals: u64,
    /// The bound of a metadata request (the runtime's timeout).
    timeout: Duration,
}

impl GlobalReaders {
    /// No reader yet; each is created with `config`; a metadata request waits at most
    /// `timeout`.
    pub(crate) fn new(config: ClientConfig, timeout: Duration) -> Self {
        GlobalReaders {
            config,
            readers: BTreeMap::new(),
            arrivals: 0,
            timeout,
        }
    }

    /// Opens the reader of task `partition` at `positions` (each global channel's first
    /// offset not delivered), replacing the one it had.
    ///
    /// # Errors
    /// Creating the consumer or assigning it.
    pub(crate) fn open(
        &mut self,
        ctx: &TaskContext,
        partition: i32,
        positions: &[(Channel, i64)],
    ) -> Result<()> {
        self.readers.remove(&partition);
        let consumer: BaseConsumer = self
            .config
            .create()
            .map_err(|e| crate::client_error::kafka(Operation::CreateConsumer, e))?;
        let mut tpl = TopicPartitionList::with_capacity(positions.len());
        for &(channel, offset) in positions {
            let topic = &ctx.source_of(channel)?.name;
            tpl.add_partition_offset(topic, channel.partition, Offset::Offset(offset))
                .map_err(|e| crate::client_error::kafka(Operation::Assign, e))?;
        }
        consumer
            .assign(&tpl)
            .map_err(|e| crate::client_error::kafka(Operation::Assign, e))?;
        debug!(partition, ?positions, "global sources: reader opened");
        self.readers.insert(partition, consumer);
        Ok(())
    }

    /// Drops every reader (the tasks are gone).
    pub(crate) fn clear(&mut self) {
        self.readers.clear();
    }

    /// Polls every reader without waiting, at most [`MAX_BATCH`] records each, and offers
    /// each record to its task; returns how many. `epoch` is the stage consumer's poll batch.
    ///
    /// # Errors
    /// A failed poll; the task's, as [`Task::offer`].
    pub(crate) fn take(
        &mut self,
        ctx: &TaskContext,
        tasks: &mut BTreeMap<i32, Task>,
        epoch: u64,
    ) -> Result<usize> {
        let mut offered = 0;
        let at = Instant::now();
        for (&partition, reader) in &self.readers {
            let Some(task) = tasks.get_mut(&partition) else {
                continue;
            };
            for _ in 0..MAX_BATCH {
                let Some(polled) = reader.poll(std::time::Duration::ZERO) else {
                    break;
                };
                let m = match polled {
                    Ok(m) => m,
                    Err(e) if crate::client_error::transient(&e) => {
                        warn!(partition, error = %e, "global sources: transient error, carrying on");
                        break;
                    }
                    Err(e) => return Err(self.failed(ctx, task, reader, e)),
                };
                self.arrivals += 1;
                let mut f = fetched(ctx, &PolledMessage(&m), self.arrivals, epoch, at)?;
                // The record is this task's, whatever its partition.
                f.partition = partition;
                task.offer(ctx, f)?;
                offered += 1;
            }
        }
        Ok(offered)
    }

    /// The error a reader's failed poll `e` means: [`RecordError::RecordsLost`] for the first
    /// global channel of `task` whose position lies below its log start offset when the fetch
    /// was out of range, else the poll's error.
    fn failed(
        &self,
        ctx: &TaskContext,
        task: &Task,
        reader: &BaseConsumer,
        e: KafkaError,
    ) -> Error {
        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::AutoOffsetReset) {
            let fetching = reader.position().ok();
            for (channel, undelivered) in task.global_positions(ctx) {
                let Ok(source) = ctx.source_of(channel) else {
                    continue;
                };
                let from = fetching
                    .as_ref()
                    .and_then(|p| p.find_partition(&source.name, channel.partition))
                    .and_then(|e| match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    })
                    .unwrap_or(undelivered);
                match reader.fetch_watermarks(&source.name, channel.partition, self.timeout) {
                    Ok((log_start, _)) if from < log_start => {
                        return Error::Record(RecordError::RecordsLost {
                            topic: source.name.clone(),
                            partition: channel.partition,
                            from,
                            log_start,
                        });
                    }
                    Ok(_) => {}
                    Err(lookup) => {
                        warn!(error = %lookup, "global sources: cannot name the channel a fetch lost");
                    }
                }
            }
        }
        crate::client_error::kafka(Operation::Poll, e)
    }

    /// Hands each task its reader's positions (evidence that every record below was offered).
    ///
    /// # Errors
    /// Reading the positions; the gate's.
    pub(crate) fn positions(
        &self,
        ctx: &TaskContext,
        tasks: &mut BTreeMap<i32, Task>,
    ) -> Result<()> {
        for (&partition, reader) in &self.readers {
            let Some(task) = tasks.get_mut(&partition) else {
                continue;
            };
            let positions = reader
                .position()
                .map_err(|e| crate::client_error::kafka(Operation::ReadPositions, e))?;
            for e in positions.elements() {
                let Offset::Offset(position) = e.offset() else {
                    continue;
                };
                let source = ctx.source_index(e.topic())?;
                let channel = Channel::new(ctx.sources[source].id, e.partition());
                task.position(ctx, channel, position)?;
            }
        }
        Ok(())
    }
}
