//! Interactive queries between a caller and a stream thread: what a caller asks of a stage's
//! fold state ([`StoreQuery`]), what the stream thread answers ([`StoreAnswer`]), the slot the
//! two meet in ([`Queries`], kept with the stage's metrics), the one pure rule of a read
//! that waits for a stamp ([`shortfalls`]), and how far behind a standby is ([`StandbyAt`]).
//!
//! The stream thread owns the fold state; a caller never touches it. A caller files a request
//! and waits on its own reply channel; the stream thread takes the requests between two turns
//! and answers from the state as its last delivered record left it. A request that waits for
//! a stamp stays with the stream thread until the task's gate has delivered what the stamp
//! claims, or until its deadline.
//!
//! Invariants:
//! - a turn nobody asked about costs one relaxed atomic load ([`Queries::take`]);
//! - every request is answered exactly once, or its reply channel is dropped (the stage ended):
//!   a caller never waits on a request nobody holds;
//! - [`shortfalls`] is empty exactly when, for every entry `(c, o)` of the stamp on a channel
//!   `c` the gate consumes, the gate's frontier `F[c] >= o`: every offset up to `o` of `c` is
//!   delivered or absent, so the fold state reflects the claimed record;
//! - a stale read ([`StoreQuery::GetStale`], [`StoreQuery::AllStale`]) answers from a task the
//!   thread runs whenever it runs one for the partition, and from a standby only otherwise; a
//!   standby's answer carries where it stood when it was read ([`StandbyAt`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;

use parsley_clock::{Channel, Clock};
use parsley_gate::Gate;

/// What a caller asks of a stage's fold state; keys are their bytes in the fold state.
#[derive(Debug, Clone)]
pub enum StoreQuery {
    /// The fold state of `key` in the task that owns it (the stage's partitioner decides),
    /// now; with `at_least`, once the task has delivered everything the stamp claims (or,
    /// failing that, at its deadline).
    Get {
        /// The key's bytes.
        key: Vec<u8>,
        /// The stamp to wait for, if any.
        at_least: Option<AtLeast>,
    },
    /// Every key's fold state in every task this instance runs.
    All,
    /// The task that owns `key` (the key's bytes): [`StoreAnswer::Task`].
    TaskOf {
        /// The key's bytes.
        key: Vec<u8>,
    },
    /// As [`StoreQuery::Get`] when the thread runs the key's task; otherwise the fold state of
    /// `key` in this instance's standby of the task, with where the standby stands
    /// ([`StoreAnswer::Stale`]). With `at_least`, a standby is not read: a stamp claims input
    /// offsets and a standby follows the changelog ([`StoreAnswer::StandbyCannotWait`]).
    GetStale {
        /// The key's bytes.
        key: Vec<u8>,
        /// The stamp to wait for, if any (the owning task's only).
        at_least: Option<AtLeast>,
    },
    /// Every key's fold state in every task the thread runs and, with `standbys`, in every
    /// standby of this instance: [`StoreAnswer::StaleEntries`].
    AllStale {
        /// Whether the standbys are read too (by one thread only: they are the process's).
        standbys: bool,
    },
}

/// Where a standby stood when it answered a read: the next changelog offset it reads and its
/// changelog partition's high watermark as its consumer last fetched it (offsets, i64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyAt {
    /// The next changelog offset the standby reads: every record below it applied.
    pub position: i64,
    /// The changelog partition's high watermark as last fetched; `None` before the standby's
    /// consumer had a fetch response.
    pub end: Option<i64>,
}

impl StandbyAt {
    /// Offsets between the end and the position, at least 0 (`None`: the end is not known
    /// yet). Commit markers count: a standby that has read everything committed is at lag 0;
    /// the records of a transaction still open on the partition count as lag.
    pub fn lag(&self) -> Option<i64> {
        Some((self.end? - self.position).max(0))
    }
}

/// A read's wait for a stamp: the claims the task must have delivered, and until when to wait.
#[derive(Debug, Clone)]
pub struct AtLeast {
    /// What the caller's write claims (a `CausalProducer`'s clock): channel → offset.
    pub stamp: Clock,
    /// When the stream thread gives up and answers [`StoreAnswer::Short`].
    pub deadline: Instant,
}

/// A claim of a stamp a task has not delivered yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shortfall {
    /// The channel (a partition the task reads).
    pub channel: Channel,
    /// The offset the stamp claims on it (i64).
    pub claimed: i64,
    /// The task's frontier on it: every offset up to it delivered or absent (i64); `None`
    /// while the channel is not seeded.
    pub delivered: Option<i64>,
}

/// Every key's fold state in the tasks of a stage: `(task, key, state)`.
pub type Entries = Vec<(i32, Vec<u8>, Vec<u8>)>;

/// What the stream thread answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreAnswer {
    /// The key's fold state (`None`: the key has none).
    Value(Option<Vec<u8>>),
    /// Every key's fold state, `(task, key, state)`, by task then key bytes.
    Entries(Entries),
    /// This instance runs no task of that partition (another instance owns it, or it is
    /// restoring).
    NotOwned {
        /// The key's task.
        partition: i32,
    },
    /// The deadline passed with these claims of the stamp not delivered by the key's task
    /// `partition`, each with its channel's topic name.
    Short {
        /// The key's task.
        partition: i32,
        /// The claims not delivered, with their topics' names.
        short: Vec<(String, Shortfall)>,
    },
    /// The task that owns the key asked for by [`StoreQuery::TaskOf`]; `None` when the
    /// stage's sources are all `KeyPartitioning::Unchecked` (no key has one task).
    Task(Option<i32>),
    /// Reading the fold state failed (a state store read).
    Failed(String),
    /// The answer to [`StoreQuery::GetStale`]: the key's fold state in task `partition`, from
    /// the task the thread runs (`standby: None`) or from this instance's standby of it.
    Stale {
        /// The key's task.
        partition: i32,
        /// The key's fold state (`None`: the key has none there).
        value: Option<Vec<u8>>,
        /// Where the standby stood, when the state is a standby's.
        standby: Option<StandbyAt>,
    },
    /// The answer to [`StoreQuery::AllStale`]: `(task, key, state)` of the tasks the thread
    /// runs and of the standbys read, by task then key bytes.
    StaleEntries {
        /// Every key's fold state.
        entries: Entries,
        /// The tasks the thread runs.
        owned: Vec<i32>,
        /// The standbys read, each with where it stood.
        standbys: Vec<(i32, StandbyAt)>,
    },
    /// A [`StoreQuery::GetStale`] with a stamp for a key whose task is only a standby here.
    StandbyCannotWait {
        /// The key's task.
        partition: i32,
    },
}

/// One request: the query and where its answer goes.
#[derive(Debug)]
pub struct Request {
    /// What is asked.
    pub query: StoreQuery,
    /// Where the answer goes; a dropped sender tells the caller the stage ended.
    pub reply: Sender<StoreAnswer>,
}

impl Request {
    /// Sends `answer` to the caller (who may have stopped waiting: nothing to do then).
    pub fn answer(self, answer: StoreAnswer) {
        let _ = self.reply.send(answer);
    }
}

/// The requests filed with a stage and not taken by its stream thread yet.
#[derive(Debug, Default)]
pub struct Queries {
    /// Whether `requests` may hold something: one relaxed load per turn when nobody asks.
    asked: AtomicBool,
    requests: Mutex<Vec<Request>>,
}

impl Queries {
    /// Files `query`; the answer arrives on the receiver.
    pub fn ask(&self, query: StoreQuery) -> Receiver<StoreAnswer> {
        let (reply, answer) = channel();
        self.requests
            .lock()
            .expect("queries")
            .push(Request { query, reply });
        self.asked.store(true, Ordering::Release);
        answer
    }

    /// Whether a request was filed and not taken yet: the stream thread cuts its wait for
    /// records short to answer it (one relaxed load).
    pub fn asked(&self) -> bool {
        self.asked.load(Ordering::Relaxed)
    }

    /// The requests filed since the last call (the stream thread's side).
    pub fn take(&self) -> Vec<Request> {
        if !self.asked.load(Ordering::Relaxed) || !self.asked.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.requests.lock().expect("queries"))
    }
}

/// The claims of `stamp` on channels `gate` consumes that it has not delivered: those whose
/// frontier is below the claimed offset (or unseeded). Empty: the task's fold state reflects
/// everything the stamp claims of its inputs. Channels the gate does not consume are not the
/// task's to wait for. Linear in the stamp's entries, logarithmic per entry.
pub fn shortfalls<R>(stamp: &Clock, gate: &Gate<R>) -> Vec<Shortfall> {
    stamp
        .entries()
        .iter()
        .filter(|(c, _)| gate.consumes(c))
        .filter_map(|&(channel, claimed)| {
            let delivered = gate.frontier(&channel);
            (delivered < Some(claimed)).then_some(Shortfall {
                channel,
                claimed,
                delivered,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use parsley_clock::TopicId;

    fn ch(topic: u8, partition: i32) -> Channel {
        Channel::new(TopicId::from_bytes([topic; 16]), partition)
    }

    fn clock(entries: &[(Channel, i64)]) -> Clock {
        let mut entries = entries.to_vec();
        entries.sort();
        Clock::try_from_sorted(entries).expect("sorted")
    }

    #[test]
    fn a_read_waits_for_each_claim_on_a_channel_the_task_reads_until_its_frontier_reaches_it() {
        let (a, b, other) = (ch(1, 0), ch(2, 0), ch(3, 0));
        let mut gate: Gate<()> = Gate::new([a, b]);
        let stamp = clock(&[(a, 5), (b, 2), (other, 900)]);
        // Not seeded: every claim on a consumed channel is short; `other` is not the task's.
        assert_eq!(
            shortfalls(&stamp, &gate),
            vec![
                Shortfall {
                    channel: a,
                    claimed: 5,
                    delivered: None
                },
                Shortfall {
                    channel: b,
                    claimed: 2,
                    delivered: None
                },
            ]
        );
        // Seeded at 3 (frontier 2) and 0 (frontier -1).
        gate.seed(a, 3).unwrap();
        gate.seed(b, 3).unwrap();
        assert_eq!(
            shortfalls(&stamp, &gate),
            vec![Shortfall {
                channel: a,
                claimed: 5,
                delivered: Some(2)
            }]
        );
        // The consumer's position passes offset 5 with nothing left undelivered: frontier 5.
        gate.position(a, 6).unwrap();
        assert!(shortfalls(&stamp, &gate).is_empty());
        // A frontier one short of the claim is short: the claimed record itself must be in.
        let later = clock(&[(a, 6)]);
        assert_eq!(
            shortfalls(&later, &gate),
            vec![Shortfall {
                channel: a,
                claimed: 6,
                delivered: Some(5)
            }]
        );
    }

    #[test]
    fn a_standbys_lag_is_its_distance_to_the_end_never_below_zero_and_unknown_without_an_end() {
        let at = |position, end| StandbyAt { position, end };
        assert_eq!(at(120, Some(125)).lag(), Some(5));
        assert_eq!(at(125, Some(125)).lag(), Some(0));
        // A position past the last fetched end (commit markers read since): lag 0.
        assert_eq!(at(127, Some(125)).lag(), Some(0));
        assert_eq!(at(0, None).lag(), None);
    }

    #[test]
    fn a_turn_takes_each_request_once() {
        let queries = Queries::default();
        assert!(queries.take().is_empty());
        assert!(!queries.asked());
        let answer = queries.ask(StoreQuery::All);
        assert!(queries.asked(), "a poll's wait ends for it");
        let taken = queries.take();
        assert_eq!(taken.len(), 1);
        assert!(!queries.asked());
        assert!(queries.take().is_empty(), "taken once");
        taken
            .into_iter()
            .for_each(|r| r.answer(StoreAnswer::Value(None)));
        assert_eq!(answer.recv().unwrap(), StoreAnswer::Value(None));
    }
}
