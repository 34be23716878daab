//! Upstream completeness: when has an event-time input that other stages of the topology
//! write (a repartition topic, or any topic a stage writes and another reads) received the
//! history that existed when the task started?
//!
//! Such a topic's startup end says nothing while the stages writing it are still reading
//! their own history: a stage started beside them finds the topic short, would be caught up at
//! once, and would take the history that arrives afterwards as live — late, in arrival order
//! (a replay then gives another order than the live run did). And its event times are not
//! ordered within a partition, since every task of the writing stage writes every partition,
//! so its delivered maximum bounds nothing while it is read.
//!
//! So, for each such input channel of an event-time task (completeness from
//! Kafka's evidence, carried across stages):
//! 1. at task start the channel is marked **unordered** for the watermark tracker (it holds the
//!    watermark while catching up) and gets **no startup end**, so it is not caught up;
//! 2. the stages that feed it — the stages writing the topic, the stages writing their
//!    sources, and so on — are taken one after the other, upstream first. For each, the ends
//!    of its sources (last stable offsets; high watermarks for a topic another stage writes,
//!    whose commit markers may lag behind the writer's committed offsets) are read when its
//!    turn comes (for the first, at task
//!    start; for one whose sources do not exist yet, once they do), and the channel waits
//!    until that stage's consumer group has **committed** every record below them: a
//!    committed offset at or beyond each, or one below it with only commit or abort markers
//!    and aborted records between, read with `read_committed` (module `caught_up`: a stage
//!    stopped after committing its last record, before a commit carried its offset over a
//!    trailing marker, stays one marker short for ever, and must not be waited for for ever).
//!    EOS commits a stage's outputs with its input offsets, so everything that stage writes for
//!    that history is then in the topic (a stage that orders by event time may still hold
//!    parked records: their outputs come later, as live records);
//! 3. after the last one, the channel's high watermark is its startup end, and catch-up goes
//!    on as for any input.
//!
//! Such a topic's records also carry their writing task's claims on the topic itself (a stage
//! claims the outputs it has sent once they are acknowledged). When no stage writing the topic
//! reads it, those claims name the writer's own sends, so the timer queue takes only that
//! writer's records below the claimed offset as the record's parked ancestors, not the other
//! writers' records there (module `event_time`, parked ancestors). Otherwise a task that ran
//! ahead in event time would hold back the records of the others while history is read, and
//! live, where its records are released already, it would not: the replay would differ.
//!
//! The committed offsets are read at most once per commit interval (a stage commits no more
//! often than that). Nothing here is persisted: a restarted task waits again, for the offsets
//! of its own start.
//!
//! Invariant: a waiting channel has no startup end, so it is not caught up and its task's
//! watermark does not pass anything it may still receive.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parsley_clock::Channel;
use parsley_stage::{StageSpec, Topology};
use tracing::info;

use crate::admin::Admin;
use crate::caught_up::StageProgress;
use crate::config::RuntimeConfig;
use parsley_task::context::FedByStages;
use parsley_task::error::SetupError;
use parsley_task::error::{Error, Result};

/// The stages that feed each source of `stage` that other stages of `topology` write: per
/// such source, the stages writing it and, transitively, those writing their sources, ordered
/// upstream first (a stage after the stages that write its sources; topology order breaks
/// cycles and ties). `stage` itself is never among them.
pub(crate) fn feeding_stages(
    topology: &Topology,
    stage: &StageSpec,
) -> Vec<(String, Vec<StageSpec>)> {
    let stages = topology.stages();
    let writers = |topic: &str| -> Vec<usize> {
        (0..stages.len())
            .filter(|&i| stages[i].name() != stage.name())
            .filter(|&i| stages[i].sinks().iter().any(|s| s == topic))
            .collect()
    };
    let inputs = |s: &StageSpec| -> Vec<String> {
        s.sources()
            .iter()
            .filter(|t| Some(t.as_str()) != s.clock_topic())
            .cloned()
            .collect()
    };
    let mut out = Vec::new();
    for topic in inputs(stage) {
        let mut closure: Vec<usize> = Vec::new();
        let mut todo = writers(&topic);
        while let Some(i) = todo.pop() {
            if closure.contains(&i) {
                continue;
            }
            closure.push(i);
            for t in inputs(&stages[i]) {
                todo.extend(writers(&t));
            }
        }
        if closure.is_empty() {
            continue;
        }
        closure.sort_unstable();
        // Upstream first: take the first stage (in topology order) none of whose sources is
        // written by a stage not taken yet; in a cycle, the first one left.
        let mut ordered: Vec<usize> = Vec::new();
        while ordered.len() < closure.len() {
            let left: Vec<usize> = closure
                .iter()
                .copied()
                .filter(|i| !ordered.contains(i))
                .collect();
            let ready = left.iter().copied().find(|&i| {
                inputs(&stages[i])
                    .iter()
                    .flat_map(|t| writers(t))
                    .all(|w| !left.contains(&w) || w == i)
            });
            ordered.push(ready.unwrap_or(left[0]));
        }
        out.push((
            topic,
            ordered.into_iter().map(|i| stages[i].clone()).collect(),
        ));
    }
    out
}

/// Where a waiting channel is in its chain of feeding stages.
#[derive(Debug)]
struct Waiting {
    /// The topic of the channel.
    topic: String,
    /// The stage it waits for now: an index into its chain.
    step: usize,
    /// What that stage must commit: `(topic, partition, offset)`; `None` until its sources
    /// exist (an internal topic is created when a stage touching it starts).
    targets: Option<Vec<(String, i32, i64)>>,
}

/// The target offsets of `reader`'s stage's sources ([`StageProgress::targets`]), read now;
/// `None` while one of them does not exist yet.
fn targets_of(reader: &StageProgress, admin: &Admin) -> Result<Option<Vec<(String, i32, i64)>>> {
    match reader.targets(admin) {
        Ok(ends) => Ok(Some(ends)),
        Err(Error::Setup(SetupError::UnknownTopic { .. })) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The feeding stages of a stage's inputs and the channels waiting for them (module docs).
pub(crate) struct Upstreams {
    /// A progress reader per feeding stage.
    readers: Vec<StageProgress>,
    /// Per source topic that other stages write: its chain, as indices into `readers`, and
    /// whether a stage writing it also reads it.
    chains: BTreeMap<String, (Vec<usize>, FedByStages)>,
    /// The channels waiting.
    waiting: BTreeMap<Channel, Waiting>,
    /// Not before this instant is the group's progress read again.
    next_look: Instant,
}

impl Upstreams {
    /// The feeding stages `feeding` ([`feeding_stages`]) of a stage of application `app`.
    ///
    /// # Errors
    /// Creating a progress reader.
    pub(crate) fn new(
        app: &str,
        feeding: &[(String, Vec<StageSpec>)],
        config: &RuntimeConfig,
    ) -> Result<Self> {
        let mut readers: Vec<StageProgress> = Vec::new();
        let mut chains = BTreeMap::new();
        for (topic, stages) in feeding {
            let fed = FedByStages {
                read_by_writers: stages
                    .iter()
                    .any(|s| s.sinks().contains(topic) && s.sources().contains(topic)),
            };
            let mut chain = Vec::new();
            for spec in stages {
                let i = match readers.iter().position(|r| r.stage() == spec.name()) {
                    Some(i) => i,
                    None => {
                        let others = feeding.iter().flat_map(|(_, stages)| stages);
                        readers.push(StageProgress::new(app, spec, others, config)?);
                        readers.len() - 1
                    }
                };
                chain.push(i);
            }
            chains.insert(topic.clone(), (chain, fed));
        }
        Ok(Upstreams {
            readers,
            chains,
            waiting: BTreeMap::new(),
            next_look: Instant::now(),
        })
    }

    /// How other stages write `topic`; `None` when none does.
    pub(crate) fn fed(&self, topic: &str) -> Option<FedByStages> {
        self.chains.get(topic).map(|(_, fed)| *fed)
    }

    /// `true` when channels wait and their feeding stages' progress is due to be read again
    /// (at most once per `interval`, counted from `now`, which then starts the next one).
    pub(crate) fn look_due(&mut self, now: Instant, interval: Duration) -> bool {
        if self.waiting.is_empty() || now < self.next_look {
            return false;
        }
        self.next_look = now + interval;
        true
    }

    /// Makes `channel` of `topic` wait for its feeding stages, from now (step 2 of the module
    /// docs): reads what the first of them must commit.
    ///
    /// # Errors
    /// Reading the last stable offsets.
    pub(crate) fn wait(&mut self, admin: &Admin, channel: Channel, topic: &str) -> Result<()> {
        let Some((chain, _)) = self.chains.get(topic) else {
            return Ok(());
        };
        let targets = targets_of(&self.readers[chain[0]], admin)?;
        info!(
            topic,
            partition = channel.partition,
            stage = self.readers[chain[0]].stage(),
            "event-time input written by other stages: its history ends where their history \
             does; it waits for them to commit what their sources held"
        );
        self.waiting.insert(
            channel,
            Waiting {
                topic: topic.to_string(),
                step: 0,
                targets,
            },
        );
        Ok(())
    }

    /// Moves every waiting channel along its chain as far as the committed offsets allow;
    /// returns the channels whose whole chain has committed, with their topics (no longer
    /// waiting). `keep` says which channels still belong to a task here.
    ///
    /// # Errors
    /// Reading committed or last stable offsets.
    pub(crate) fn advance(
        &mut self,
        admin: &Admin,
        timeout: Duration,
        keep: impl Fn(&Channel) -> bool,
    ) -> Result<Vec<(Channel, String)>> {
        self.waiting.retain(|c, _| keep(c));
        let mut done = Vec::new();
        for (channel, w) in &mut self.waiting {
            let chain = &self.chains[&w.topic].0;
            loop {
                let reader = &mut self.readers[chain[w.step]];
                if w.targets.is_none() {
                    w.targets = targets_of(reader, admin)?;
                }
                let Some(targets) = &w.targets else {
                    break; // its sources do not exist yet
                };
                if !reader.reached(targets, timeout)? {
                    break;
                }
                w.step += 1;
                w.targets = None;
                if w.step == chain.len() {
                    done.push((*channel, w.topic.clone()));
                    break;
                }
            }
        }
        for (c, _) in &done {
            self.waiting.remove(c);
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use parsley_stage::{EventTimeOrder, Topology};
    use parsley_testkit::fixtures::{Forward, utf8_stage};

    use super::*;

    /// `a` writes `mid` from `in`; `b` writes `mid2` from `mid` and `loop` from `loop`; `c`
    /// reads `mid2` and `other` with the built-in clock, writing `out`; `d` reads `c`'s `out`;
    /// `e` reads `loop`.
    fn topology() -> Topology {
        Topology::builder("app")
            .stage("e", Forward("e-out".into()), |s| {
                utf8_stage(s, &["loop"], &["e-out"])
            })
            .stage("d", Forward("end".into()), |s| {
                utf8_stage(s, &["out"], &["end"])
            })
            .stage("c", Forward("out".into()), |s| {
                utf8_stage(s, &["mid2", "other"], &["out"])
                    .order_by_event_time(EventTimeOrder::new().clock(500))
            })
            .stage("b", Forward("mid2".into()), |s| {
                utf8_stage(s, &["mid", "loop"], &["mid2", "loop"])
            })
            .stage("a", Forward("mid".into()), |s| {
                utf8_stage(s, &["in"], &["mid"])
            })
            .build()
            .unwrap()
    }

    fn names(feeding: &[(String, Vec<StageSpec>)]) -> Vec<(&str, Vec<&str>)> {
        feeding
            .iter()
            .map(|(t, stages)| (t.as_str(), stages.iter().map(StageSpec::name).collect()))
            .collect()
    }

    #[test]
    fn the_stages_feeding_a_source_come_upstream_first_without_the_stage_or_its_clock() {
        let t = topology();
        let c = t.stage("c").unwrap();
        assert_eq!(c.sources().len(), 3, "mid2, other and the clock's topic");
        // `b` is listed before `a` in the topology, but reads what `a` writes.
        assert_eq!(names(&feeding_stages(&t, c)), [("mid2", vec!["a", "b"])]);
        assert_eq!(
            names(&feeding_stages(&t, t.stage("d").unwrap())),
            [("out", vec!["a", "b", "c"])]
        );
        // `b` writes `loop` itself: it does not wait for itself.
        assert_eq!(
            names(&feeding_stages(&t, t.stage("b").unwrap())),
            [("mid", vec!["a"])]
        );
        assert!(feeding_stages(&t, t.stage("a").unwrap()).is_empty());
    }

    #[test]
    fn a_topic_whose_writer_also_reads_it_is_told_apart() {
        let t = topology();
        let config = RuntimeConfig::new("127.0.0.1:9");
        let of = |stage: &str| {
            Upstreams::new("app", &feeding_stages(&t, t.stage(stage).unwrap()), &config).unwrap()
        };
        let written = FedByStages {
            read_by_writers: false,
        };
        assert_eq!(of("c").fed("mid2"), Some(written));
        assert_eq!(of("c").fed("other"), None);
        assert_eq!(
            of("e").fed("loop"),
            Some(FedByStages {
                read_by_writers: true
            })
        );
    }
}
