//! A compiled stage: its sources' entry points over the fused operators, as the runtime's
//! [`Processor`].
//!
//! Above `flow` and `state`; below `graph`, which compiles stages into it, and the operators
//! that read sources: it imports nothing of theirs.

use std::sync::Arc;

use parsley_stage::{
    Error, NoLookup, Processor, Punctuation, RawDelivery, RawPunctuated, RawPunctuation, RawRecord,
    RawStep, RawTimer, Schedule, StateChange, StateLookup,
};

use crate::flow::Ctx;
use crate::state::Slots;

/// A record's value bytes, borrowed or handed over.
pub(crate) enum Value<'a> {
    Borrowed(Option<&'a [u8]>),
    Owned(Option<Vec<u8>>),
}

/// A source's entry point: decodes the record's key and value and pushes them into the
/// source's operators.
pub(crate) type Root =
    Arc<dyn Fn(&mut Ctx<'_>, Option<&[u8]>, Value<'_>) -> Result<(), Error> + Send + Sync>;

/// A windowed operator's timer: closes the windows of the key in the context's state that
/// the watermark (the context's) has passed.
pub(crate) type OnTimer = Arc<dyn Fn(&mut Ctx<'_>) -> Result<(), Error> + Send + Sync>;

/// A `process` operator's punctuator: called with a context for the punctuation (its time
/// as timestamp, no key state; the task's keys readable through its lookup), it forwards its
/// emissions to the operator's children and returns the fold-state changes it made, by key.
pub(crate) type OnPunctuation = Arc<
    dyn Fn(&mut Ctx<'_>, Punctuation) -> Result<Vec<(Vec<u8>, StateChange<Vec<u8>>)>, Error>
        + Send
        + Sync,
>;

/// A stage the DSL compiled.
pub(crate) struct DslProcessor {
    pub(crate) stage: String,
    /// Entry point per source topic.
    pub(crate) roots: Vec<(String, Root)>,
    /// Whether an operator of the stage keeps state by key.
    pub(crate) stateful: bool,
    /// The timers of the stage's windowed operators, each called on every timer of a key.
    pub(crate) on_timer: Vec<OnTimer>,
    /// The punctuation schedules of the stage's `process` operators, and the punctuator of
    /// each (same order).
    pub(crate) schedules: Vec<Schedule>,
    pub(crate) on_punctuation: Vec<OnPunctuation>,
}

impl DslProcessor {
    fn run(
        &self,
        record: RawRecord<'_>,
        value: Value<'_>,
        state: Option<&[u8]>,
        lookup: &dyn StateLookup,
    ) -> Result<RawStep, Error> {
        let Some((_, root)) = self.roots.iter().find(|(t, _)| t == record.topic) else {
            return Err(Error::Handler {
                stage: self.stage.clone(),
                topic: record.topic.to_string(),
                partition: record.partition,
                offset: record.offset,
                source: format!("{} is not a source of this stage", record.topic).into(),
            });
        };
        let mut ctx = Ctx {
            stage: &self.stage,
            topic: record.topic,
            partition: record.partition,
            offset: record.offset,
            raw_key: record.key,
            timestamp: record.timestamp,
            watermark: record.watermark,
            state: Slots::new(state),
            task: Slots::new(record.task_state),
            emit: Vec::new(),
            timers: Vec::new(),
            too_late: 0,
            record_headers: record.headers,
            headers: None,
            lookup,
        };
        root(&mut ctx, record.key, value)?;
        self.step(ctx)
    }

    /// The step a context made.
    fn step(&self, ctx: Ctx<'_>) -> Result<RawStep, Error> {
        let Ctx {
            state,
            task,
            emit,
            timers,
            too_late,
            ..
        } = ctx;
        let encode_error = |what| {
            move |source| Error::Encode {
                stage: self.stage.clone(),
                what,
                source,
            }
        };
        let state = state.into_change().map_err(encode_error("state"))?;
        let task_state = task.into_change().map_err(encode_error("task state"))?;
        Ok(RawStep {
            emit,
            state,
            task_state,
            timers,
            too_late,
        })
    }
}

impl Processor for DslProcessor {
    fn process(&self, record: RawRecord<'_>, state: Option<&[u8]>) -> Result<RawStep, Error> {
        self.run(record, Value::Borrowed(record.value), state, &NoLookup)
    }

    fn process_delivery(
        &self,
        delivery: RawDelivery<'_>,
        state: Option<&[u8]>,
    ) -> Result<RawStep, Error> {
        self.process_delivery_with(delivery, state, &NoLookup)
    }

    fn process_delivery_with(
        &self,
        delivery: RawDelivery<'_>,
        state: Option<&[u8]>,
        lookup: &dyn StateLookup,
    ) -> Result<RawStep, Error> {
        let RawDelivery {
            topic,
            partition,
            offset,
            timestamp,
            key,
            value,
            watermark,
            headers,
            task_state,
        } = delivery;
        let record = RawRecord {
            topic,
            partition,
            offset,
            timestamp,
            key,
            value: None,
            watermark,
            headers,
            task_state,
        };
        self.run(record, Value::Owned(value), state, lookup)
    }

    fn on_timer(&self, timer: RawTimer<'_>, state: Option<&[u8]>) -> Result<RawStep, Error> {
        let mut ctx = Ctx {
            stage: &self.stage,
            topic: "",
            partition: timer.partition,
            offset: -1,
            raw_key: Some(timer.key),
            timestamp: timer.time,
            watermark: Some(timer.watermark),
            state: Slots::new(state),
            task: Slots::new(timer.task_state),
            emit: Vec::new(),
            timers: Vec::new(),
            too_late: 0,
            record_headers: &[],
            headers: None,
            lookup: &NoLookup,
        };
        for on_timer in &self.on_timer {
            on_timer(&mut ctx)?;
        }
        self.step(ctx)
    }

    fn uses_timers(&self) -> bool {
        !self.on_timer.is_empty()
    }

    fn schedules(&self) -> &[Schedule] {
        &self.schedules
    }

    fn punctuate(
        &self,
        p: RawPunctuation,
        lookup: &dyn StateLookup,
    ) -> Result<RawPunctuated, Error> {
        let Some(on_punctuation) = self.on_punctuation.get(p.schedule) else {
            return Ok(RawPunctuated::default());
        };
        let mut ctx = Ctx {
            stage: &self.stage,
            topic: "",
            partition: p.partition,
            offset: -1,
            // Only stateless operators follow a punctuating `process` in its stage (its
            // emissions may change the key): no key's state and no task state is read here.
            raw_key: None,
            timestamp: p.time,
            watermark: None,
            state: Slots::new(None),
            task: Slots::new(None),
            emit: Vec::new(),
            timers: Vec::new(),
            too_late: 0,
            record_headers: &[],
            headers: None,
            lookup,
        };
        let states = on_punctuation(
            &mut ctx,
            Punctuation {
                schedule: p.schedule,
                kind: p.kind,
                time: p.time,
                partition: p.partition,
            },
        )?;
        Ok(RawPunctuated {
            emit: ctx.emit,
            states,
        })
    }

    fn keeps_state(&self) -> bool {
        self.stateful
    }
}
