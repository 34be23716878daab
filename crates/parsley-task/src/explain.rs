//! "Why is it waiting?": what every blocked record of a running stage waits for, per stage and
//! per task, with the exact evidence it needs (`Running::explain`,
//! and `GET /explain` on the metrics endpoint (`RuntimeConfig::metrics_address`)).
//!
//! # What is explained
//! Per task (partition `p` of every source of a stage):
//! - every **blocked record** the gate tracks (the head of its channel's queue, or a record a
//!   claim pulled ahead), its key, and what it waits for ([`WaitsFor`]): a coordinate of a
//!   consumed channel up to an offset, an in-flight send of a named sender, a consumed channel
//!   to be seeded, a high watermark of a channel the task does not consume, or a resolution of
//!   its impossible stamp;
//! - the channels **paused by backpressure** ([`PausedChannel`]): full, waiting for the task
//!   to deliver from them;
//! - for a stage ordered by event time, the **watermark** and what holds it down
//!   ([`WatermarkExplanation`], [`WatermarkHolder`]): the input catching up with the history
//!   at task start, the input waiting for its live head, or the control clock;
//! - a **restore held by an open transaction** ([`RestoreWait`]): the changelog partition's
//!   last stable offset pinned below its high watermark by a transaction another producer
//!   keeps open.
//!
//! Channels are named by topic name and partition ([`ChannelName`]), with the topic id (the
//! name of a topic the stage neither reads nor writes is not known: `None`).
//!
//! # How it is taken, and how fresh it is
//! The stream thread owns the tasks and nothing here adds a lock to its per-record path. A
//! caller asks (an atomic flag per stage); the stream thread looks at the flag once per turn
//! (a turn polls for at most 100 ms, then delivers, and commits when due), and when it is set
//! takes a snapshot of its tasks **between turns** and publishes it; the caller waits for that
//! snapshot for at most [`ANSWER_WITHIN`]. A stage whose stream thread does not answer in time
//! — it is committing, restoring a task, or has ended — is explained by its last snapshot,
//! marked `fresh: false` with the time it was taken ([`StageExplanation::taken_at_ms`]).
//! Restore waits are published by the restoring stream thread itself, when it finds one (at
//! most once a second), and are always current.
//!
//! Invariants: a snapshot describes one moment of one stream thread (every task of the stage
//! as it stood between the same two turns); a blocked record is listed with exactly the one
//! reason the gate filed it under (its first unsatisfied claim), so an empty `blocked` list
//! means the gate holds no record back; at most [`MAX_BLOCKED_LISTED`] blocked records are
//! listed per task, the rest counted in [`TaskExplanation::blocked_not_listed`].
//!
//! Units: offsets are `i64` Kafka offsets; times are `i64` milliseconds since the Unix epoch.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parsley_clock::{Channel, TopicId};
use parsley_gate::{Awaiting, Gate, Hold, InputState};
use serde::{Deserialize, Serialize};

/// How long `Running::explain` waits for a stream thread to take a
/// fresh snapshot before it falls back on that stage's last one.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// The most blocked records listed per task; the others are counted.
pub const MAX_BLOCKED_LISTED: usize = 100;

/// A topic partition as an operator knows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChannelName {
    /// The topic's name; `None` when the stage neither reads nor writes the topic (a claim on
    /// a channel of another stage's topic) and so does not know it.
    pub topic: Option<String>,
    /// The partition.
    pub partition: i32,
    /// The topic's id (a UUID: the incarnation of the topic).
    pub topic_id: String,
}

impl fmt::Display for ChannelName {
    /// `topic/partition`, or `<topic id>/partition` when the name is not known.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.topic {
            Some(name) => write!(f, "{name}/{}", self.partition),
            None => write!(f, "<{}>/{}", self.topic_id, self.partition),
        }
    }
}

/// Why every stage of a `Running` waits, in start order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Explanation {
    /// One entry per stage.
    pub stages: Vec<StageExplanation>,
}

impl Explanation {
    /// `true` when no task of any stage waits for anything: no blocked record, no paused
    /// channel, no held restore, and no watermark held by an input.
    pub fn is_idle(&self) -> bool {
        self.stages
            .iter()
            .flat_map(|s| &s.tasks)
            .all(TaskExplanation::is_idle)
    }
}

/// Why the tasks of one stage wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageExplanation {
    /// The stage's name.
    pub stage: String,
    /// When the stream thread took the snapshot, ms since the epoch; `None` when it never took
    /// one (it ended, or is still starting, before the first request).
    pub taken_at_ms: Option<i64>,
    /// `true` when the snapshot was taken for this request; `false` when the stream thread did
    /// not answer within [`ANSWER_WITHIN`] (busy committing or restoring, or ended) and the
    /// stage's last snapshot is shown.
    pub fresh: bool,
    /// The tasks this instance owns (those restoring included), by partition.
    pub tasks: Vec<TaskExplanation>,
}

/// Why one task (partition `partition` of every source of its stage) waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskExplanation {
    /// The task (partition).
    pub partition: i32,
    /// Blocked records, by channel and offset (at most [`MAX_BLOCKED_LISTED`]).
    pub blocked: Vec<BlockedRecord>,
    /// Blocked records not listed in `blocked`.
    pub blocked_not_listed: usize,
    /// Source channels of the task paused by backpressure.
    pub paused: Vec<PausedChannel>,
    /// Source channels of the task holding records for watermark alignment.
    #[serde(default)]
    pub ahead: Vec<AheadChannel>,
    /// The event-time watermark, for a stage ordered by event time (after the task's restore).
    pub event_time: Option<WatermarkExplanation>,
    /// The restore of the task's changelog partition, while an open transaction holds it.
    pub restore: Option<RestoreWait>,
    /// The partitions of its global sources the task still reads to their end before it
    /// hands the records of its other sources to its gate (its bootstrap).
    #[serde(default)]
    pub bootstrap: Vec<BootstrapChannel>,
}

/// A partition of a global source a task reads to its end before its first join: where the
/// task stands on it and the end offset (the last stable offset) it found when it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapChannel {
    /// The channel.
    pub channel: ChannelName,
    /// The first offset the task has not delivered yet; `None` before it has read any.
    pub position: Option<i64>,
    /// The end offset to reach.
    pub end: i64,
}

impl TaskExplanation {
    /// An entry for `partition` that waits for nothing (yet).
    pub fn new(partition: i32) -> Self {
        TaskExplanation {
            partition,
            blocked: Vec::new(),
            blocked_not_listed: 0,
            paused: Vec::new(),
            ahead: Vec::new(),
            event_time: None,
            restore: None,
            bootstrap: Vec::new(),
        }
    }

    /// `true` when the task waits for nothing: no blocked record, no paused channel, no held
    /// restore, no watermark held by an input (one the control clock alone moves is not
    /// waiting).
    pub fn is_idle(&self) -> bool {
        self.blocked.is_empty()
            && self.blocked_not_listed == 0
            && self.paused.is_empty()
            && self.ahead.is_empty()
            && self.restore.is_none()
            && self.bootstrap.is_empty()
            && self.event_time.as_ref().is_none_or(|e| {
                !matches!(
                    e.held_by,
                    Some(
                        WatermarkHolder::CatchingUp { .. }
                            | WatermarkHolder::AwaitingLiveHead { .. }
                    )
                )
            })
    }
}

/// A record the gate holds back, and what it waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockedRecord {
    /// Its channel.
    pub channel: ChannelName,
    /// Its offset.
    pub offset: i64,
    /// Its key: the text of a UTF-8 key, else `0x` and its bytes in hex; `None` for a null
    /// key, or when the record is spilled (its payload is re-fetched when needed).
    pub key: Option<String>,
    /// What it waits for.
    pub waits_for: WaitsFor,
}

/// What a blocked record waits for: the one claim of its stamp the gate found unsatisfied
/// first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum WaitsFor {
    /// Its cause: the record at `offset` of the consumed channel `channel` to be delivered (or
    /// proven absent), i.e. the channel's frontier to reach `offset`.
    Frontier {
        /// The channel of the cause.
        channel: ChannelName,
        /// The cause's offset.
        offset: i64,
        /// The channel's frontier now: every offset at or below it is delivered or absent.
        frontier: Option<i64>,
    },
    /// An in-flight claim: the send with sequence `seq` of `sender` (the record's own sender)
    /// on `channel` to be delivered, or proven absent by the channel's evidence.
    InFlight {
        /// The sender's id (a UUID).
        sender: String,
        /// The claimed channel.
        channel: ChannelName,
        /// The claimed send sequence.
        seq: u64,
    },
    /// The consumed channel `channel` to be assigned and seeded (a claim on a consumed
    /// channel is never ignored).
    Seeding {
        /// The channel.
        channel: ChannelName,
    },
    /// A high watermark of `channel`, which the task does not consume, read after the record's
    /// poll (to replace an in-flight claim by a coordinate).
    HighWatermark {
        /// The channel.
        channel: ChannelName,
    },
    /// A decision on its impossible stamp (the stage's impossible-stamp policy).
    Resolution,
}

impl fmt::Display for WaitsFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitsFor::Frontier {
                channel,
                offset,
                frontier,
            } => {
                write!(f, "cause {channel}@{offset}")?;
                match frontier {
                    Some(frontier) => write!(f, " (delivered through {frontier})"),
                    None => Ok(()),
                }
            }
            WaitsFor::InFlight {
                sender,
                channel,
                seq,
            } => write!(f, "in-flight send #{seq} of sender {sender} on {channel}"),
            WaitsFor::Seeding { channel } => write!(f, "{channel} to be assigned (seeding)"),
            WaitsFor::HighWatermark { channel } => {
                write!(f, "a high watermark of {channel} (not consumed)")
            }
            WaitsFor::Resolution => write!(f, "a resolution of its impossible stamp"),
        }
    }
}

/// A source channel holding records for watermark alignment
/// ([`EventTimeOrder::max_drift_ms`](parsley_stage::EventTimeOrder::max_drift_ms)): what the
/// consumer returned of it from its first record beyond the watermark plus the limit
/// `max_drift_ms` (the drift plus the clock's lag) waits in memory (`held_records`), not yet
/// offered to the gate, and goes on as the watermark rises. Its delivered event time runs
/// `drift_ms` ahead of the watermark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AheadChannel {
    /// The channel.
    pub channel: ChannelName,
    /// How far its delivered event time runs ahead of the watermark, ms; `None` while the
    /// watermark has no value yet (everything delivered waits).
    pub drift_ms: Option<i64>,
    /// The limit, ms.
    pub max_drift_ms: i64,
    /// Records of the channel held for it; 0 when absent from a snapshot.
    #[serde(default)]
    pub held_records: u64,
}

/// A source channel paused by backpressure: it holds `held` fetched, undelivered records, at
/// least the cap; it resumes once it holds at most half of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PausedChannel {
    /// The channel.
    pub channel: ChannelName,
    /// Fetched, undelivered records it holds (spilled ones excluded).
    pub held: usize,
    /// The cap per channel (`RuntimeConfig::max_queued_per_channel`).
    pub cap: usize,
}

/// The event-time watermark of a task and what holds it where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatermarkExplanation {
    /// The watermark, ms since the epoch; `None` while some input has no evidence yet.
    pub watermark_ms: Option<i64>,
    /// Records parked, waiting for the watermark to pass their event time.
    pub parked: usize,
    /// What holds it; `None` when nothing does (every input at its live head, no control
    /// stream: records are released on arrival).
    pub held_by: Option<WatermarkHolder>,
}

/// What holds an event-time watermark down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WatermarkHolder {
    /// An input still reading the history that existed at task start: it waits until its
    /// frontier reaches `startup_end - 1`.
    CatchingUp {
        /// The input channel.
        channel: ChannelName,
        /// The highest event time in its delivered prefix, ms; `None`: nothing delivered.
        delivered_max_ms: Option<i64>,
        /// Its frontier (`-1`: nothing delivered or proven absent yet).
        frontier: i64,
        /// The high watermark read at task start; `None` before it was read.
        startup_end: Option<i64>,
    },
    /// An input caught up with its history whose latest fetch response shows records not yet
    /// delivered: it waits until its frontier reaches `head - 1`.
    AwaitingLiveHead {
        /// The input channel.
        channel: ChannelName,
        /// The highest event time in its delivered prefix, ms.
        delivered_max_ms: Option<i64>,
        /// Its frontier.
        frontier: i64,
        /// Its live head: the last stable offset of its latest fetch response.
        head: Option<i64>,
    },
    /// The control clock (processing time minus its lag) is the lowest bound.
    Control {
        /// Processing time minus the lag, ms; `None` before the first control record or tick.
        time_ms: Option<i64>,
        /// The lag, ms.
        lag_ms: i64,
    },
}

impl fmt::Display for WatermarkHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let max = |m: &Option<i64>| m.map_or_else(|| "nothing".to_string(), |t| t.to_string());
        match self {
            WatermarkHolder::CatchingUp {
                channel,
                delivered_max_ms,
                frontier,
                startup_end,
            } => {
                let end = startup_end.map_or_else(|| "?".to_string(), |e| e.to_string());
                write!(
                    f,
                    "{channel} catching up: delivered through {frontier} of startup end {end} (max event time {})",
                    max(delivered_max_ms)
                )
            }
            WatermarkHolder::AwaitingLiveHead {
                channel,
                delivered_max_ms,
                frontier,
                head,
            } => {
                let head = head.map_or_else(|| "?".to_string(), |h| h.to_string());
                write!(
                    f,
                    "{channel} behind its live head: delivered through {frontier} of head {head} (max event time {})",
                    max(delivered_max_ms)
                )
            }
            WatermarkHolder::Control { time_ms, lag_ms } => match time_ms {
                Some(t) => write!(
                    f,
                    "the control clock: its time {} less its lag {lag_ms} ms holds event time at {t}",
                    t.saturating_add(*lag_ms)
                ),
                None => write!(
                    f,
                    "the control clock, which has no time yet (lag {lag_ms} ms): no tick or control record read"
                ),
            },
        }
    }
}

/// A task's restore held by an open transaction on its changelog partition: a
/// `read_committed` consumer reads nothing past the last stable offset, which the transaction
/// pins below the high watermark until its producer commits or aborts it (or the coordinator
/// aborts it after the producer's `transaction.timeout.ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreWait {
    /// The changelog topic.
    pub changelog: String,
    /// Its partition (the task's).
    pub partition: i32,
    /// The last stable offset: the open transaction's first offset, where the restore stands.
    pub last_stable_offset: i64,
    /// The high watermark the restore reads up to.
    pub high_watermark: i64,
    /// The transactional id of the producer holding the transaction, when it is a Parsley
    /// stage (it names itself on its changelog records).
    pub producer: Option<String>,
}

impl fmt::Display for Explanation {
    /// A table with one row per wait: stage, task, channel, offset, key, waits for. A task
    /// that waits for nothing has no row; when none waits, one line says so.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rows = vec![[
            "STAGE".to_string(),
            "TASK".into(),
            "CHANNEL".into(),
            "OFFSET".into(),
            "KEY".into(),
            "WAITS FOR".into(),
        ]];
        for stage in &self.stages {
            for task in &stage.tasks {
                let row = |channel: String, offset: String, key: String, why: String| {
                    [
                        stage.stage.clone(),
                        task.partition.to_string(),
                        channel,
                        offset,
                        key,
                        why,
                    ]
                };
                let none = || "-".to_string();
                for b in &task.blocked {
                    rows.push(row(
                        b.channel.to_string(),
                        b.offset.to_string(),
                        b.key.clone().unwrap_or_else(none),
                        b.waits_for.to_string(),
                    ));
                }
                if task.blocked_not_listed > 0 {
                    rows.push(row(
                        none(),
                        none(),
                        none(),
                        format!("{} more blocked records", task.blocked_not_listed),
                    ));
                }
                for p in &task.paused {
                    rows.push(row(
                        p.channel.to_string(),
                        none(),
                        none(),
                        format!("paused by backpressure: holds {} of cap {}", p.held, p.cap),
                    ));
                }
                for a in &task.ahead {
                    let ahead = a.drift_ms.map_or_else(
                        || "the watermark has no value yet".to_string(),
                        |d| format!("{d} ms ahead of the watermark"),
                    );
                    rows.push(row(
                        a.channel.to_string(),
                        none(),
                        none(),
                        format!(
                            "held by watermark alignment: {ahead} (limit {} ms), {} records held",
                            a.max_drift_ms, a.held_records
                        ),
                    ));
                }
                if let Some(et) = &task.event_time
                    && let Some(holder) = &et.held_by
                {
                    let (channel, offset) = match holder {
                        WatermarkHolder::CatchingUp {
                            channel, frontier, ..
                        }
                        | WatermarkHolder::AwaitingLiveHead {
                            channel, frontier, ..
                        } => (channel.to_string(), (frontier + 1).to_string()),
                        WatermarkHolder::Control { .. } => (none(), none()),
                    };
                    let watermark = et
                        .watermark_ms
                        .map_or_else(|| "none".to_string(), |w| w.to_string());
                    rows.push(row(
                        channel,
                        offset,
                        none(),
                        format!(
                            "watermark {watermark} ({} parked) held by {holder}",
                            et.parked
                        ),
                    ));
                }
                for b in &task.bootstrap {
                    rows.push(row(
                        b.channel.to_string(),
                        b.position.map_or_else(none, |p| p.to_string()),
                        none(),
                        format!(
                            "global table read to its end offset {} before the task's first join (its other sources wait)",
                            b.end
                        ),
                    ));
                }
                if let Some(r) = &task.restore {
                    rows.push(row(
                        format!("{}/{}", r.changelog, r.partition),
                        r.last_stable_offset.to_string(),
                        none(),
                        format!(
                            "restore: an open transaction{} pins the last stable offset {} below the high watermark {}",
                            r.producer
                                .as_ref()
                                .map(|p| format!(" of {p}"))
                                .unwrap_or_default(),
                            r.last_stable_offset,
                            r.high_watermark
                        ),
                    ));
                }
            }
        }
        if rows.len() == 1 {
            let stale = self.stages.iter().filter(|s| !s.fresh).count();
            return if stale == 0 {
                writeln!(f, "nothing waits")
            } else {
                writeln!(
                    f,
                    "nothing waits ({stale} stage(s) did not answer: last snapshot shown)"
                )
            };
        }
        let widths: Vec<usize> = (0..6)
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        for r in &rows {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                if c == 5 {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// The name of a channel, its topic named by `names` (`None`: not known).
pub fn channel_name(channel: Channel, names: &dyn Fn(TopicId) -> Option<String>) -> ChannelName {
    ChannelName {
        topic: names(channel.topic),
        partition: channel.partition,
        topic_id: channel.topic.to_string(),
    }
}

/// A key as shown: its text when it is UTF-8, else `0x` and its bytes in hex.
pub fn key_text(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) => text.to_string(),
        Err(_) => {
            let mut hex = String::with_capacity(2 + 2 * key.len());
            hex.push_str("0x");
            for b in key {
                hex.push_str(&format!("{b:02x}"));
            }
            hex
        }
    }
}

/// The blocked records of `gate` (at most [`MAX_BLOCKED_LISTED`], by channel and offset) and
/// how many more there are; `key` reads a held payload's key bytes (`None`: a null key).
pub fn blocked_records<R>(
    gate: &Gate<R>,
    key: impl Fn(&R) -> Option<&[u8]>,
    names: &dyn Fn(TopicId) -> Option<String>,
) -> (Vec<BlockedRecord>, usize) {
    let heads = gate.blocked_heads();
    let more = heads.len().saturating_sub(MAX_BLOCKED_LISTED);
    let listed = heads
        .into_iter()
        .take(MAX_BLOCKED_LISTED)
        .map(|b| BlockedRecord {
            channel: channel_name(b.head.channel, names),
            offset: b.head.offset,
            key: gate.payload(&b.head).and_then(&key).map(key_text),
            waits_for: match b.awaits {
                Awaiting::Frontier(cause) => WaitsFor::Frontier {
                    channel: channel_name(cause.channel, names),
                    offset: cause.offset,
                    frontier: gate.frontier(&cause.channel),
                },
                Awaiting::InFlight {
                    sender,
                    channel,
                    seq,
                } => WaitsFor::InFlight {
                    sender: sender.to_string(),
                    channel: channel_name(channel, names),
                    seq,
                },
                Awaiting::Seeding(channel) => WaitsFor::Seeding {
                    channel: channel_name(channel, names),
                },
                Awaiting::Evidence(channel) => WaitsFor::HighWatermark {
                    channel: channel_name(channel, names),
                },
                Awaiting::Resolution => WaitsFor::Resolution,
            },
        })
        .collect();
    (listed, more)
}

/// The channels of `gate` in `paused` (the consumer's paused partitions), with what they hold
/// against `cap`, by channel.
pub fn paused_channels<R, S: std::hash::BuildHasher>(
    gate: &Gate<R>,
    paused: &HashSet<Channel, S>,
    cap: usize,
    names: &dyn Fn(TopicId) -> Option<String>,
) -> Vec<PausedChannel> {
    gate.consumed()
        .filter(|c| paused.contains(c))
        .map(|c| PausedChannel {
            channel: channel_name(c, names),
            held: gate.held(&c),
            cap,
        })
        .collect()
}

/// The watermark `watermark_ms`, with `parked` records waiting for it, held by `hold`
/// ([`parsley_gate::WatermarkTracker::held_by`]).
pub fn watermark(
    watermark_ms: Option<i64>,
    parked: usize,
    hold: Option<Hold>,
    names: &dyn Fn(TopicId) -> Option<String>,
) -> WatermarkExplanation {
    let held_by = hold.map(|h| match h {
        Hold::Input {
            channel,
            state: InputState::CatchingUp,
            delivered_max,
            frontier,
            startup_end,
            ..
        } => WatermarkHolder::CatchingUp {
            channel: channel_name(channel, names),
            delivered_max_ms: delivered_max,
            frontier,
            startup_end,
        },
        Hold::Input {
            channel,
            delivered_max,
            frontier,
            head,
            ..
        } => WatermarkHolder::AwaitingLiveHead {
            channel: channel_name(channel, names),
            delivered_max_ms: delivered_max,
            frontier,
            head,
        },
        Hold::Control { time_ms, lag_ms } => WatermarkHolder::Control { time_ms, lag_ms },
    });
    WatermarkExplanation {
        watermark_ms,
        parked,
        held_by,
    }
}

/// The wall clock now, ms since the epoch.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A stage's explanation, between its stream thread and the callers (kept with the stage's
/// metrics): a request flag the stream thread looks at once per turn, the last snapshot it
/// published, and the restore waits its restores report.
#[derive(Debug, Default)]
pub struct Explained {
    requested: AtomicBool,
    latest: Mutex<Published>,
    published: Condvar,
    /// Restores held by an open transaction, by task.
    restores: Mutex<BTreeMap<i32, RestoreWait>>,
}

/// The last snapshot a stream thread published.
#[derive(Debug, Default)]
struct Published {
    /// Snapshots published so far.
    generation: u64,
    taken_at_ms: Option<i64>,
    tasks: Vec<TaskExplanation>,
}

impl Explained {
    /// `true` (once) when a caller asked for a snapshot since the last one: one relaxed load
    /// per turn when nobody asks.
    pub fn wanted(&self) -> bool {
        self.requested.load(Ordering::Relaxed) && self.requested.swap(false, Ordering::AcqRel)
    }

    /// Publishes the stream thread's snapshot of its running tasks and wakes the callers.
    pub fn publish(&self, tasks: Vec<TaskExplanation>) {
        let mut latest = self.latest.lock().expect("explanation");
        latest.generation += 1;
        latest.taken_at_ms = Some(now_ms());
        latest.tasks = tasks;
        self.published.notify_all();
    }

    /// Sets (or clears, `None`) the restore wait of task `partition`.
    pub fn set_restore(&self, partition: i32, wait: Option<RestoreWait>) {
        let mut restores = self.restores.lock().expect("restore waits");
        match wait {
            Some(wait) => restores.insert(partition, wait),
            None => restores.remove(&partition),
        };
    }

    /// Forgets the restore waits of the tasks this instance no longer owns.
    pub fn retain_restores(&self, keep: &dyn Fn(i32) -> bool) {
        self.restores
            .lock()
            .expect("restore waits")
            .retain(|p, _| keep(*p));
    }

    /// Asks the stream thread for a snapshot; returns the generation to wait beyond.
    fn request(&self) -> u64 {
        let generation = self.latest.lock().expect("explanation").generation;
        self.requested.store(true, Ordering::Release);
        generation
    }

    /// The explanation of stage `stage`: the first snapshot published beyond `generation`
    /// (waiting until `deadline`, not at all when `wait` is false), else the last one; with
    /// the current restore waits merged in (a restoring task gets an entry of its own).
    fn answer(
        &self,
        stage: &str,
        generation: u64,
        deadline: Instant,
        wait: bool,
    ) -> StageExplanation {
        let mut latest = self.latest.lock().expect("explanation");
        while wait && latest.generation <= generation {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            latest = self
                .published
                .wait_timeout(latest, left)
                .expect("explanation")
                .0;
        }
        let (fresh, taken_at_ms) = (latest.generation > generation, latest.taken_at_ms);
        let mut tasks: BTreeMap<i32, TaskExplanation> = latest
            .tasks
            .iter()
            .map(|t| (t.partition, t.clone()))
            .collect();
        drop(latest);
        for (partition, wait) in self.restores.lock().expect("restore waits").iter() {
            tasks
                .entry(*partition)
                .or_insert_with(|| TaskExplanation::new(*partition))
                .restore = Some(wait.clone());
        }
        StageExplanation {
            stage: stage.to_string(),
            taken_at_ms,
            fresh,
            tasks: tasks.into_values().collect(),
        }
    }
}

/// Asks every stage of `stages` (name, its explanation slot, whether its stream thread has
/// ended) at once, then gathers their answers, waiting at most `within` in all.
pub fn explain<'a>(
    stages: impl IntoIterator<Item = (&'a str, &'a Explained, bool)>,
    within: Duration,
) -> Explanation {
    let asked: Vec<_> = stages
        .into_iter()
        .map(|(name, slot, ended)| (name, slot, ended, slot.request()))
        .collect();
    let deadline = Instant::now() + within;
    Explanation {
        stages: asked
            .into_iter()
            .map(|(name, slot, ended, generation)| slot.answer(name, generation, deadline, !ended))
            .collect(),
    }
}

#[cfg(test)]
mod tests;
