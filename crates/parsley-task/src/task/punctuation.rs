//! A task's punctuation schedules ([`parsley_stage::Processor::schedules`]): when each fires next,
//! and the firings decided but not made yet.
//!
//! # Invariants
//! - A stream-time schedule is armed once, at the first event-time position the task has (the
//!   event time of the first record it releases, or its first watermark when it releases
//!   none): its next firing is the first multiple of its interval above it. It then fires once at each
//!   multiple the position reaches, at that multiple, in ascending order.
//! - A wall-clock schedule is armed at the first tick the task reads: its next firing is the first
//!   multiple of its interval above the tick's time. A tick at or above it decides one firing at
//!   the tick's time (multiples skipped meanwhile are not fired, as in Kafka Streams) and moves
//!   it to the first multiple above the tick. The firing waits as `pending` until the event-time
//!   position reaches the tick's time minus the clock's lag.
//! - Firings due at one event-time position are made in schedule order, after the records and
//!   keyed timers due at that position (the task's release loop).
//! - A firing is made by [`Task`]'s release loop (`Task::punctuate`, here): the processor reads
//!   the task's fold state, its state changes apply, its emissions are stamped like a timer's.
//! - `changed` names exactly the schedules whose changelog record must be written at the next
//!   write; after it the changelog holds each schedule's record ([`PunctuationRecord`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use parsley_stage::changelog::{PunctuationRecord, punctuation_key};
use parsley_stage::{PunctuationType, RawPunctuation, Schedule, StateChange};
use tracing::trace;

use super::{Task, global};
use crate::context::TaskContext;
use crate::error::Result;
use crate::output::Output;
use crate::record::Work;

/// One schedule and where it stands.
#[derive(Debug)]
struct Scheduled {
    schedule: Schedule,
    /// The time of its next firing, ms (`None`: not armed).
    next: Option<i64>,
    /// Wall-clock firings decided, waiting for the event-time position: (position, time).
    pending: VecDeque<(i64, i64)>,
}

/// A firing due now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Firing {
    /// The schedule's index.
    pub schedule: usize,
    /// Its type.
    pub kind: PunctuationType,
    /// The event-time position at which it fires, ms.
    pub at: i64,
    /// The punctuation's time, ms.
    pub time: i64,
}

/// The punctuation schedules of one task (module docs).
#[derive(Debug, Default)]
pub struct Punctuations {
    schedules: Vec<Scheduled>,
    changed: BTreeSet<usize>,
}

impl Punctuations {
    /// The schedules `schedules` of the stage, where `restored` says they stood (by index). A
    /// restored record of another type or interval than its schedule's (the topology changed)
    /// is not used: that schedule starts again, unarmed.
    pub fn new(schedules: &[Schedule], mut restored: BTreeMap<u32, PunctuationRecord>) -> Self {
        let mut changed = BTreeSet::new();
        let schedules = schedules
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let record = restored
                    .remove(&(i as u32))
                    .filter(|r| r.kind == s.kind.to_byte() && r.interval_ms == s.interval_ms);
                if record.is_none() {
                    changed.insert(i);
                }
                let record = record.unwrap_or_default();
                Scheduled {
                    schedule: *s,
                    next: record.next,
                    pending: record.pending.into(),
                }
            })
            .collect();
        Punctuations {
            schedules,
            // Records left of schedules no longer declared are not deleted: harmless, and a
            // restore of an older topology would need them.
            changed,
        }
    }

    /// No schedule.
    pub fn is_empty(&self) -> bool {
        self.schedules.is_empty()
    }

    /// Arms each stream-time schedule not armed yet at event-time position `position` (ms).
    pub fn arm_stream_time(&mut self, position: i64) {
        for (i, s) in self.schedules.iter_mut().enumerate() {
            if s.schedule.kind == PunctuationType::StreamTime && s.next.is_none() {
                s.next = Some(s.schedule.next_after(position));
                self.changed.insert(i);
            }
        }
    }

    /// A tick of the built-in clock read at `tick_ms` (ms since the epoch), the clock's lag
    /// `lag_ms`: arms the wall-clock schedules or decides their firings (module docs). Returns
    /// whether anything changed.
    pub fn tick(&mut self, tick_ms: i64, lag_ms: i64) -> bool {
        let mut any = false;
        for (i, s) in self.schedules.iter_mut().enumerate() {
            if s.schedule.kind != PunctuationType::WallClockTime {
                continue;
            }
            match s.next {
                Some(next) if tick_ms < next => continue,
                Some(_) => s
                    .pending
                    .push_back((tick_ms.saturating_sub(lag_ms), tick_ms)),
                None => {}
            }
            s.next = Some(s.schedule.next_after(tick_ms));
            self.changed.insert(i);
            any = true;
        }
        any
    }

    /// The event-time position of the first firing due at `watermark` (ms), if any.
    pub fn next_due(&self, watermark: i64) -> Option<i64> {
        self.first().map(|(at, _)| at).filter(|at| *at <= watermark)
    }

    /// The event-time position of the first firing decided or waited for, if any.
    pub fn next(&self) -> Option<i64> {
        self.first().map(|(at, _)| at)
    }

    /// (position, schedule) of the first firing, ties in schedule order.
    fn first(&self) -> Option<(i64, usize)> {
        self.schedules
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let at = match s.schedule.kind {
                    PunctuationType::StreamTime => s.next,
                    PunctuationType::WallClockTime => s.pending.front().map(|(at, _)| *at),
                }?;
                Some((at, i))
            })
            .min()
    }

    /// Takes the first firing due at `watermark` (ms), if any, and moves its schedule on.
    pub fn take_due(&mut self, watermark: i64) -> Option<Firing> {
        let (at, i) = self.first().filter(|(at, _)| *at <= watermark)?;
        let s = &mut self.schedules[i];
        let time = match s.schedule.kind {
            PunctuationType::StreamTime => {
                s.next = Some(at.saturating_add(s.schedule.interval_ms));
                at
            }
            PunctuationType::WallClockTime => s.pending.pop_front().expect("a pending firing").1,
        };
        self.changed.insert(i);
        Some(Firing {
            schedule: i,
            kind: s.schedule.kind,
            at,
            time,
        })
    }

    /// The changelog records of the schedules changed since the last call: key and value.
    pub fn take_changes(&mut self) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        std::mem::take(&mut self.changed)
            .into_iter()
            .map(|i| {
                let s = &self.schedules[i];
                let record = PunctuationRecord {
                    kind: s.schedule.kind.to_byte(),
                    interval_ms: s.schedule.interval_ms,
                    next: s.next,
                    pending: s.pending.iter().copied().collect(),
                };
                (punctuation_key(i as u32), Some(record.encode()))
            })
            .collect()
    }
}

impl Task {
    /// Makes the first punctuation due at `watermark`: the processor reads the fold state of
    /// any key, its state changes apply, and its emissions carry the punctuation's time as
    /// their timestamp and no headers unless they set their own.
    ///
    /// # Errors
    /// The processor's (a punctuation has no input record for a bad-record policy); as
    /// [`Task::deliver`].
    pub(super) fn punctuate(
        &mut self,
        ctx: &TaskContext,
        out: &mut dyn Output,
        work: &mut Work,
        watermark: i64,
    ) -> Result<()> {
        let Some(firing) = self.punctuations.take_due(watermark) else {
            return Ok(());
        };
        self.changed = true;
        self.advance_position(firing.at);
        let step = ctx.processor.punctuate(
            RawPunctuation {
                schedule: firing.schedule,
                kind: firing.kind,
                time: firing.time,
                partition: self.partition,
            },
            &global::FoldLookup(&self.fold),
        )?;
        for (key, change) in step.states {
            match change {
                StateChange::Keep => {}
                StateChange::Set(s) => self.fold.set(&key, Some(s)),
                StateChange::Delete => self.fold.set(&key, None),
            }
        }
        for emission in step.emit {
            self.emit(ctx, out, emission, firing.time, &[])?;
            work.emissions += 1;
        }
        trace!(
            partition = self.partition,
            schedule = firing.schedule,
            time = firing.time,
            "punctuated"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedules() -> [Schedule; 2] {
        [
            Schedule {
                interval_ms: 10,
                kind: PunctuationType::StreamTime,
            },
            Schedule {
                interval_ms: 100,
                kind: PunctuationType::WallClockTime,
            },
        ]
    }

    #[test]
    fn stream_time_fires_at_every_multiple_and_wall_clock_once_per_tick_past_one() {
        let mut p = Punctuations::new(&schedules(), BTreeMap::new());
        assert_eq!(p.take_changes().len(), 2, "both written once, unarmed");
        p.arm_stream_time(5);
        assert_eq!(p.next_due(9), None);
        assert_eq!(p.next(), Some(10));
        let times: Vec<i64> = std::iter::from_fn(|| p.take_due(35))
            .map(|f| f.time)
            .collect();
        assert_eq!(times, [10, 20, 30]);
        // The first tick arms the wall-clock schedule; one past two multiples fires once.
        assert!(p.tick(1_050, 20));
        assert!(!p.tick(1_099, 20));
        assert!(p.tick(1_320, 20));
        assert_eq!(p.next(), Some(40));
        let fired: Vec<Firing> = std::iter::from_fn(|| p.take_due(2_000))
            .filter(|f| f.kind == PunctuationType::WallClockTime)
            .collect();
        assert_eq!(
            fired,
            [Firing {
                schedule: 1,
                kind: PunctuationType::WallClockTime,
                at: 1_300,
                time: 1_320
            }]
        );
        // Restored from its records: where it stood.
        let records: BTreeMap<u32, PunctuationRecord> = p
            .take_changes()
            .into_iter()
            .map(|(k, v)| {
                (
                    parsley_stage::changelog::punctuation_of(&k).unwrap(),
                    PunctuationRecord::decode(&v.unwrap()).unwrap(),
                )
            })
            .collect();
        let mut q = Punctuations::new(&schedules(), records.clone());
        assert!(q.take_changes().is_empty());
        assert_eq!(q.next(), Some(2_010));
        assert!(q.tick(1_400, 20));
        assert_eq!(q.take_due(1_380).map(|f| f.time), Some(1_400));
        // Another interval: not used.
        let mut other = schedules();
        other[0].interval_ms = 7;
        let r = Punctuations::new(&other, records);
        assert_eq!(r.next(), None);
    }
}
