//! `process`: a [`Handler`] inside the pipeline (the processor API's escape hatch), with the
//! punctuation schedules of Kafka Streams' `ProcessorContext.schedule` ([`Schedules`]).
//!
//! The handler's fold state is one slot of each key's state (named after the operator). A
//! punctuator reads that slot of any key of the task and writes it by key; its emissions go on
//! downstream like the handler's, stamped with the punctuation's time. Punctuation needs the
//! stage to order by event time (the builder's [`crate::StreamsBuilder::event_time`] order, with
//! the built-in clock for a wall-clock schedule).
//!
//! Above `stream` (whose [`KStream`] it extends), `flow`, `state`, `processor` and `graph`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use parsley_stage::{
    Auto, Bincode, Codec, Error, FoldStates, Handler, Part, Punctuation, PunctuationType,
    Punctuator, Record, Schedule, StateChange,
};

use crate::data::{Data, auto_codecs};
use crate::flow::{Children, Ctx, forward, forward_at};
use crate::processor::OnPunctuation;
use crate::state::Slots;
use crate::stream::KStream;

/// The punctuation schedules of a `process` operator ([`KStream::process_with`]): each an
/// interval in ms, a [`PunctuationType`] and a [`Punctuator`] over the handler's key `K`,
/// output `V` and state `S`.
pub struct Schedules<K, V, S> {
    list: Vec<(Schedule, SharedPunctuator<K, V, S>)>,
}

/// A punctuator shared by the operator's compiled stage.
type SharedPunctuator<K, V, S> = Arc<dyn Punctuator<K, V, S>>;

impl<K, V, S> Schedules<K, V, S> {
    /// Schedules `punctuator` every `interval_ms` ms (`> 0`) of `kind`'s time (Kafka Streams'
    /// `ProcessorContext.schedule(interval, type, punctuator)`; the book's DSL chapter,
    /// "Punctuation"). The topology's build reports an interval `<= 0`, and a wall-clock
    /// schedule when the builder's event-time order has no built-in clock.
    pub fn schedule(
        mut self,
        interval_ms: i64,
        kind: PunctuationType,
        punctuator: impl Punctuator<K, V, S>,
    ) -> Self {
        self.list
            .push((Schedule { interval_ms, kind }, Arc::new(punctuator)));
        self
    }
}

impl<K: Data, V: Data> KStream<K, V> {
    /// Runs `handler` on each record (the processor API inside the DSL): it sees the record
    /// and its key's fold state, and the records it emits continue downstream (the
    /// emissions' topics are not used). Its fold state is kept per key in the stage's state,
    /// so the stream is repartitioned first when an operator changed the key; the key may
    /// change in its emissions, so a stateful operator after it repartitions again.
    pub fn process<H>(&self, handler: H) -> KStream<K, H::Output>
    where
        H: Handler<Key = K, Value = V>,
        H::Output: Data,
    {
        self.process_with(handler, |s| s)
    }

    /// [`KStream::process`] with punctuation: `schedules` adds the operator's schedules
    /// ([`Schedules::schedule`]). A punctuator reads the handler's fold state of any key
    /// (`FoldStates::get`) and sets or deletes it by key; what it emits continues downstream
    /// with the punctuation's time as timestamp. The operator's stage orders by event time.
    ///
    /// ```
    /// use parsley_dsl::StreamsBuilder;
    /// use parsley_stage::{
    ///     EventTimeOrder, Handler, HandlerResult, Punctuated, PunctuationType, Record, Step,
    ///     FoldStates,
    /// };
    ///
    /// /// Counts each key's records; emits nothing itself.
    /// struct Count;
    /// impl Handler for Count {
    ///     type Key = String;
    ///     type Value = String;
    ///     type Output = u64;
    ///     type State = u64;
    ///     fn handle(&self, _: Record<'_, String, String>, n: Option<u64>)
    ///         -> HandlerResult<String, u64, u64>
    ///     {
    ///         Ok(Step::none().set_state(n.unwrap_or(0) + 1))
    ///     }
    /// }
    ///
    /// let builder = StreamsBuilder::new("shop");
    /// builder.event_time(EventTimeOrder::new());
    /// builder
    ///     .stream::<String, String>("orders")
    ///     .process_with(Count, |s| {
    ///         // Every minute of event time: the count of customer "alice". (A closure names
    ///         // its state's type with `'_`, so that it takes any lifetime.)
    ///         s.schedule(60_000, PunctuationType::StreamTime, |_, state: &FoldStates<'_, String, u64>| {
    ///             let n = state.get(&"alice".to_string())?;
    ///             Ok(Punctuated::none().emit("", "alice".to_string(), n.unwrap_or(0)))
    ///         })
    ///     })
    ///     .to("alice-counts");
    /// builder.build()?;
    /// # Ok::<(), parsley_stage::Error>(())
    /// ```
    pub fn process_with<H>(
        &self,
        handler: H,
        schedules: impl FnOnce(Schedules<K, H::Output, H::State>) -> Schedules<K, H::Output, H::State>,
    ) -> KStream<K, H::Output>
    where
        H: Handler<Key = K, Value = V>,
        H::Output: Data,
    {
        let keeps_state = std::any::TypeId::of::<H::State>() != std::any::TypeId::of::<()>();
        let schedules = schedules(Schedules { list: Vec::new() }).list;
        let name = self.graph.borrow().name("process", self.next_name.clone());
        let input = self.keyed(&format!("{name}-input"), auto_codecs());
        let input = KStream {
            next_name: Some(name),
            ..input
        };
        let punctuators: Rc<RefCell<Vec<(Schedule, OnPunctuation)>>> = Rc::default();
        let registered = punctuators.clone();
        let stream = input.then(
            "process",
            "process (handler)".into(),
            keeps_state || !schedules.is_empty(),
            true,
            move |out, slot| {
                for (schedule, punctuator) in schedules {
                    let on = on_punctuation::<H>(out.clone(), slot.clone(), punctuator);
                    registered.borrow_mut().push((schedule, on));
                }
                Arc::new(move |ctx: &mut Ctx<'_>, k, v| {
                    let state: Option<H::State> = if keeps_state { ctx.load(&slot)? } else { None };
                    let (topic, partition, offset) = (ctx.topic, ctx.partition, ctx.offset);
                    let record = Record {
                        topic,
                        partition,
                        offset,
                        timestamp: ctx.timestamp,
                        key: k,
                        value: v,
                        headers: ctx.headers(),
                    };
                    let step = handler
                        .handle(record, state)
                        .map_err(|source| Error::Handler {
                            stage: ctx.stage.to_string(),
                            topic: topic.to_string(),
                            partition,
                            offset,
                            source,
                        })?;
                    match step.state {
                        StateChange::Keep => {}
                        StateChange::Set(s) => ctx.store(&slot, Some(&s))?,
                        StateChange::Delete => ctx.store::<H::State>(&slot, None)?,
                    }
                    forward_all(&out, ctx, step.emit)
                })
            },
        );
        let mut g = stream.graph.borrow_mut();
        for (schedule, on) in punctuators.take() {
            g.add_punctuation(stream.node, schedule, on);
        }
        drop(g);
        stream
    }
}

/// Forwards a handler's or a punctuator's emissions to `out`, each with its own timestamp and
/// headers when it set them (its headers then hold for everything after it).
fn forward_all<K: Data, V: Data>(
    out: &Children<K, V>,
    ctx: &mut Ctx<'_>,
    emit: Vec<parsley_stage::Emission<K, V>>,
) -> Result<(), Error> {
    for e in emit {
        let before = e.headers.map(|h| ctx.headers.replace(h));
        let forwarded = match e.timestamp {
            Some(at) => forward_at(out, ctx, at, e.key, e.value),
            None => forward(out, ctx, e.key, e.value),
        };
        if let Some(before) = before {
            ctx.headers = before;
        }
        forwarded?;
    }
    Ok(())
}

/// The punctuator of a `process` operator whose state is slot `slot` and whose output goes to
/// `out`, over bytes (module docs).
fn on_punctuation<H>(
    out: Children<H::Key, H::Output>,
    slot: String,
    punctuator: SharedPunctuator<H::Key, H::Output, H::State>,
) -> OnPunctuation
where
    H: Handler,
    H::Key: Data,
    H::Output: Data,
{
    Arc::new(move |ctx: &mut Ctx<'_>, p: Punctuation| {
        let lookup = ctx.lookup;
        let stage = ctx.stage.to_string();
        let state_read = |message: String| Error::StateRead {
            stage: stage.clone(),
            message,
        };
        let read = |key: &[u8]| -> Result<Option<Vec<u8>>, String> {
            let raw = lookup.state_of(key)?;
            let value: Option<H::State> = Slots::new(raw.as_deref())
                .get(&slot)
                .map_err(|e| e.to_string())?;
            value
                .map(|v| Bincode.encode(&v).map_err(|e| e.to_string()))
                .transpose()
        };
        let state = FoldStates::new(&read, &Auto, &Bincode);
        let punctuated = punctuator
            .punctuate(p, &state)
            .map_err(|source| Error::Punctuator {
                stage: stage.clone(),
                partition: p.partition,
                time: p.time,
                source,
            })?;
        // Each key's whole state as it becomes (`None`: deleted), later changes over earlier.
        let mut written: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        for (key, change) in punctuated.states {
            let value = match change {
                StateChange::Keep => continue,
                StateChange::Set(s) => Some(s),
                StateChange::Delete => None,
            };
            let key = Codec::<H::Key>::encode(&Auto, &key)
                .map_err(|e| ctx.encode_error("punctuation state key", e))?;
            let current = match written.get(&key) {
                Some(v) => v.clone(),
                None => lookup
                    .state_of(&key)
                    .map_err(state_read)?
                    .map(Cow::into_owned),
            };
            let mut slots = Slots::new(current.as_deref());
            slots
                .decoded()
                .map_err(|e| ctx.decode_error(Part::State, e))?;
            slots
                .put_timestamped(&slot, value.as_ref(), None)
                .map_err(|e| ctx.encode_error("state", e))?;
            let new = match slots
                .into_change()
                .map_err(|e| ctx.encode_error("state", e))?
            {
                StateChange::Keep => current,
                StateChange::Set(bytes) => Some(bytes),
                StateChange::Delete => None,
            };
            written.insert(key, new);
        }
        forward_all(&out, ctx, punctuated.emit)?;
        Ok(written
            .into_iter()
            .map(|(k, v)| (k, v.map_or(StateChange::Delete, StateChange::Set)))
            .collect())
    })
}
