//! The delivery-order oracle: checks causal delivery from ground truth, never from Parsley's
//! clocks.
//!
//! A test workload records, per process (a producer, or one task of a stage), the ordered
//! list of its sends and deliveries of uniquely identified records, and where each record was
//! appended (channel and offset). From that alone the oracle rebuilds the real happened-before
//! relation — same process earlier, send → delivery, transitively — and checks the guarantee of
//! the guarantee (the book's specification, §2) at every delivery:
//!
//! > when record `m` is delivered at process `n`, every ancestor `a` of `m` whose channel `n`
//! > consumes and whose offset is at or above `n`'s baseline on that channel has already been
//! > delivered at `n`.
//!
//! It also rejects a record delivered twice at one process (exactly-once).
//!
//! # How
//! Vector timestamps over *processes* (not channels) are computed by replaying the logs in an
//! order consistent with happened-before. `a` is an ancestor of `m` iff `a`'s send precedes
//! `m`'s send under that order, i.e. `vt(send m)[sender(a)] >= local index of send a`. The
//! sends of one sender to one channel form a chain, so the ancestors of `m` among them are a
//! prefix; the oracle keeps, per (process, channel, sender), how long a prefix has been
//! delivered and compares. Cost: `O(events × processes)` memory for the timestamps of sends.

use std::collections::HashMap;
use std::fmt::{self, Debug, Display};
use std::hash::Hash;

/// The unique id of a workload record.
pub type RecordId = u64;

/// Index of a process in a [`History`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessId(usize);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Send(RecordId),
    Deliver(RecordId),
}

#[derive(Clone, Debug)]
struct Placement<C> {
    sender: ProcessId,
    /// 1-based index of the send among its sender's events.
    local: u32,
    channel: C,
    offset: i64,
}

/// One sender's records on one channel, by send order: (local index, offset, record).
type Chain = Vec<(u32, i64, RecordId)>;

/// Chains by (channel, sender).
type Chains<C> = HashMap<(C, ProcessId), Chain>;

#[derive(Debug, Default)]
struct Process<C> {
    name: String,
    events: Vec<Event>,
    /// Consumed channels and their baselines.
    consumes: HashMap<C, i64>,
}

/// Ground-truth logs of a workload, to be checked with [`History::check`].
#[derive(Debug)]
pub struct History<C> {
    processes: Vec<Process<C>>,
    /// Where each record was appended; filled by `send` calls.
    placements: HashMap<RecordId, Placement<C>>,
}

impl<C> Default for History<C> {
    fn default() -> Self {
        History {
            processes: Vec::new(),
            placements: HashMap::new(),
        }
    }
}

/// A delivery that broke the guarantee, or a history that cannot be checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation<C> {
    /// `delivered` reached `process` before its ancestor `missing`.
    CausalOrder {
        /// The process that delivered too early.
        process: String,
        /// Position of the delivery in the process's log (0-based).
        position: usize,
        /// The record delivered.
        delivered: RecordId,
        /// An ancestor of it, on a channel the process consumes, not delivered yet.
        missing: RecordId,
        /// The ancestor's channel.
        channel: C,
        /// The ancestor's offset.
        offset: i64,
        /// The process that sent the ancestor.
        sender: String,
    },
    /// A record delivered twice at one process.
    Duplicate {
        /// The process.
        process: String,
        /// Position of the second delivery.
        position: usize,
        /// The record.
        record: RecordId,
    },
    /// A delivery of a record no process sent.
    UnknownRecord {
        /// The process.
        process: String,
        /// The record.
        record: RecordId,
    },
    /// A record sent twice.
    SentTwice {
        /// The record.
        record: RecordId,
    },
    /// The logs admit no order consistent with happened-before (a delivery before its send).
    Inconsistent {
        /// The processes stuck on a delivery whose send never happens first.
        stuck: Vec<String>,
    },
}

impl<C: Debug> Display for Violation<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::CausalOrder {
                process,
                position,
                delivered,
                missing,
                channel,
                offset,
                sender,
            } => write!(
                f,
                "causal order violated at {process} (delivery #{position}): record {delivered} was delivered before its ancestor {missing} (sent by {sender} to {channel:?}@{offset})"
            ),
            Violation::Duplicate {
                process,
                position,
                record,
            } => write!(
                f,
                "record {record} delivered twice at {process} (second time at delivery #{position})"
            ),
            Violation::UnknownRecord { process, record } => {
                write!(f, "{process} delivered record {record}, which nobody sent")
            }
            Violation::SentTwice { record } => write!(f, "record {record} was sent twice"),
            Violation::Inconsistent { stuck } => write!(
                f,
                "the logs admit no causal order: {stuck:?} deliver records before they are sent"
            ),
        }
    }
}

impl<C: Debug> std::error::Error for Violation<C> {}

/// What a successful check covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Report {
    /// Deliveries checked.
    pub deliveries: u64,
    /// Sends in the history.
    pub sends: u64,
    /// Ancestor constraints checked (one per delivery, consumed channel and sender with a
    /// non-empty ancestor prefix).
    pub constraints: u64,
}

impl<C: Clone + Eq + Hash + Debug> History<C> {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a process named `name` (a producer or one task of a stage).
    pub fn process(&mut self, name: impl Into<String>) -> ProcessId {
        self.processes.push(Process {
            name: name.into(),
            events: Vec::new(),
            consumes: HashMap::new(),
        });
        ProcessId(self.processes.len() - 1)
    }

    /// Declares that `p` consumes `channel` from `baseline` on.
    pub fn consumes(&mut self, p: ProcessId, channel: C, baseline: i64) {
        self.processes[p.0].consumes.insert(channel, baseline);
    }

    /// Appends to `p`'s log the send of record `id`, appended at `channel`/`offset`.
    ///
    /// # Errors
    /// [`Violation::SentTwice`] when `id` was sent before.
    pub fn send(
        &mut self,
        p: ProcessId,
        id: RecordId,
        channel: C,
        offset: i64,
    ) -> Result<(), Violation<C>> {
        let proc = &mut self.processes[p.0];
        proc.events.push(Event::Send(id));
        let local = proc.events.len() as u32;
        if self
            .placements
            .insert(
                id,
                Placement {
                    sender: p,
                    local,
                    channel,
                    offset,
                },
            )
            .is_some()
        {
            return Err(Violation::SentTwice { record: id });
        }
        Ok(())
    }

    /// Appends to `p`'s log the delivery of record `id`.
    pub fn deliver(&mut self, p: ProcessId, id: RecordId) {
        self.processes[p.0].events.push(Event::Deliver(id));
    }

    /// Checks every delivery of every process; the first violation found is returned.
    ///
    /// # Errors
    /// The first [`Violation`] in replay order.
    pub fn check(&self) -> Result<Report, Violation<C>> {
        let n = self.processes.len();
        // Vector timestamp of each send, indexed by record.
        let mut send_vt: HashMap<RecordId, Vec<u32>> =
            HashMap::with_capacity(self.placements.len());
        let mut current: Vec<Vec<u32>> = vec![vec![0; n]; n];
        let mut next = vec![0usize; n];
        // Per (process, channel, sender): ordered (local index, offset, record) of the sender's
        // records on the channel, and the delivered flags / prefix pointer.
        let mut chains: Chains<C> = HashMap::new();
        for (&id, pl) in &self.placements {
            chains
                .entry((pl.channel.clone(), pl.sender))
                .or_default()
                .push((pl.local, pl.offset, id));
        }
        for chain in chains.values_mut() {
            chain.sort_unstable();
        }
        let mut progress: HashMap<(ProcessId, C, ProcessId), (usize, Vec<bool>)> = HashMap::new();
        let mut delivered_at: Vec<HashMap<RecordId, usize>> = vec![HashMap::new(); n];
        let mut report = Report::default();

        // Replay in an order consistent with happened-before.
        loop {
            let mut advanced = false;
            let mut all_done = true;
            for p in 0..n {
                while next[p] < self.processes[p].events.len() {
                    all_done = false;
                    let event = self.processes[p].events[next[p]];
                    match event {
                        Event::Send(id) => {
                            current[p][p] = next[p] as u32 + 1;
                            send_vt.insert(id, current[p].clone());
                            report.sends += 1;
                        }
                        Event::Deliver(id) => {
                            let Some(pl) = self.placements.get(&id) else {
                                return Err(Violation::UnknownRecord {
                                    process: self.processes[p].name.clone(),
                                    record: id,
                                });
                            };
                            let Some(vt) = send_vt.get(&id) else {
                                break; // its send has not been replayed yet
                            };
                            let position = next[p];
                            if delivered_at[p].insert(id, position).is_some() {
                                return Err(Violation::Duplicate {
                                    process: self.processes[p].name.clone(),
                                    position,
                                    record: id,
                                });
                            }
                            let vt = vt.clone();
                            self.check_delivery(
                                ProcessId(p),
                                position,
                                id,
                                pl,
                                &vt,
                                &chains,
                                &mut progress,
                                &mut report,
                            )?;
                            for (c, v) in current[p].iter_mut().zip(&vt) {
                                *c = (*c).max(*v);
                            }
                            current[p][p] = next[p] as u32 + 1;
                            report.deliveries += 1;
                        }
                    }
                    next[p] += 1;
                    advanced = true;
                }
            }
            if all_done {
                return Ok(report);
            }
            if !advanced {
                let stuck = (0..n)
                    .filter(|&p| next[p] < self.processes[p].events.len())
                    .map(|p| self.processes[p].name.clone())
                    .collect();
                return Err(Violation::Inconsistent { stuck });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_delivery(
        &self,
        p: ProcessId,
        position: usize,
        id: RecordId,
        pl: &Placement<C>,
        vt: &[u32],
        chains: &Chains<C>,
        progress: &mut HashMap<(ProcessId, C, ProcessId), (usize, Vec<bool>)>,
        report: &mut Report,
    ) -> Result<(), Violation<C>> {
        let proc = &self.processes[p.0];
        for (channel, &baseline) in &proc.consumes {
            for (sender, &bound) in vt.iter().enumerate() {
                let sender = ProcessId(sender);
                let Some(chain) = chains.get(&(channel.clone(), sender)) else {
                    continue;
                };
                // Ancestors: sends of `sender` on `channel` with local index <= bound,
                // excluding the delivered record itself.
                let mut required = chain.partition_point(|&(local, _, _)| local <= bound);
                if sender == pl.sender && *channel == pl.channel {
                    required = required.saturating_sub(1);
                }
                if required == 0 {
                    continue;
                }
                report.constraints += 1;
                let entry = progress
                    .entry((p, channel.clone(), sender))
                    .or_insert_with(|| (0, vec![false; chain.len()]));
                advance(entry, chain, baseline);
                if entry.0 < required {
                    let (_, offset, missing) = chain[entry.0];
                    return Err(Violation::CausalOrder {
                        process: proc.name.clone(),
                        position,
                        delivered: id,
                        missing,
                        channel: channel.clone(),
                        offset,
                        sender: self.processes[sender.0].name.clone(),
                    });
                }
            }
        }
        // Record the delivery in its own chain.
        if let Some(&baseline) = proc.consumes.get(&pl.channel)
            && let Some(chain) = chains.get(&(pl.channel.clone(), pl.sender))
        {
            let entry = progress
                .entry((p, pl.channel.clone(), pl.sender))
                .or_insert_with(|| (0, vec![false; chain.len()]));
            let i = chain.partition_point(|&(local, _, _)| local < pl.local);
            entry.1[i] = true;
            advance(entry, chain, baseline);
        }
        Ok(())
    }
}

/// Moves the prefix pointer over delivered records and records below the baseline.
fn advance(entry: &mut (usize, Vec<bool>), chain: &[(u32, i64, RecordId)], baseline: i64) {
    while entry.0 < chain.len() && (entry.1[entry.0] || chain[entry.0].1 < baseline) {
        entry.0 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// producer P sends a to c1 then b to c2; stage task T consumes c1 and c2.
    fn two_channel_history(order: &[RecordId]) -> History<&'static str> {
        let mut h = History::new();
        let p = h.process("P");
        let t = h.process("T");
        h.send(p, 1, "c1", 0).unwrap();
        h.send(p, 2, "c2", 0).unwrap();
        h.consumes(t, "c1", 0);
        h.consumes(t, "c2", 0);
        for &id in order {
            h.deliver(t, id);
        }
        h
    }

    #[test]
    fn causal_order_passes() {
        let r = two_channel_history(&[1, 2]).check().unwrap();
        assert_eq!(r.deliveries, 2);
        assert_eq!(r.constraints, 1);
    }

    #[test]
    fn an_effect_before_its_cause_is_reported_with_both_records() {
        let err = two_channel_history(&[2, 1]).check().unwrap_err();
        assert_eq!(
            err,
            Violation::CausalOrder {
                process: "T".into(),
                position: 0,
                delivered: 2,
                missing: 1,
                channel: "c1",
                offset: 0,
                sender: "P".into(),
            }
        );
        assert!(
            err.to_string()
                .contains("record 2 was delivered before its ancestor 1")
        );
    }

    #[test]
    fn transitive_ancestry_through_a_stage_is_checked() {
        // P: send a (c1). S consumes c1: deliver a, send b (c2). T consumes c1, c2.
        let mut h = History::new();
        let p = h.process("P");
        let s = h.process("S");
        let t = h.process("T");
        h.send(p, 1, "c1", 0).unwrap();
        h.consumes(s, "c1", 0);
        h.deliver(s, 1);
        h.send(s, 2, "c2", 0).unwrap();
        h.consumes(t, "c1", 0);
        h.consumes(t, "c2", 0);
        h.deliver(t, 2);
        h.deliver(t, 1);
        assert!(matches!(
            h.check(),
            Err(Violation::CausalOrder {
                delivered: 2,
                missing: 1,
                ..
            })
        ));
    }

    #[test]
    fn baseline_and_unconsumed_channels_are_out_of_scope() {
        // a below T's baseline on c1; x on a channel T does not consume.
        let mut h = History::new();
        let p = h.process("P");
        let t = h.process("T");
        h.send(p, 1, "c1", 4).unwrap();
        h.send(p, 9, "other", 0).unwrap();
        h.send(p, 2, "c2", 0).unwrap();
        h.consumes(t, "c1", 5);
        h.consumes(t, "c2", 0);
        h.deliver(t, 2);
        h.check().unwrap();
    }

    #[test]
    fn concurrent_records_may_come_in_any_order() {
        let mut h = History::new();
        let p = h.process("P");
        let q = h.process("Q");
        let t = h.process("T");
        h.send(p, 1, "c1", 0).unwrap();
        h.send(q, 2, "c2", 0).unwrap();
        h.consumes(t, "c1", 0);
        h.consumes(t, "c2", 0);
        h.deliver(t, 2);
        h.deliver(t, 1);
        h.check().unwrap();
    }

    #[test]
    fn duplicates_unknown_records_and_impossible_logs_are_errors() {
        let mut dup = two_channel_history(&[1, 1]);
        assert!(matches!(
            dup.check(),
            Err(Violation::Duplicate { record: 1, .. })
        ));
        let t = ProcessId(1);
        dup.deliver(t, 77);
        let mut unknown = two_channel_history(&[77]);
        assert!(matches!(
            unknown.check(),
            Err(Violation::UnknownRecord { record: 77, .. })
        ));
        // T delivers b, then sends a; P delivers a... and b is sent by P after delivering a.
        let mut h: History<&str> = History::new();
        let p = h.process("P");
        let t2 = h.process("T");
        h.deliver(p, 2);
        h.send(p, 1, "c1", 0).unwrap();
        h.deliver(t2, 1);
        h.send(t2, 2, "c2", 0).unwrap();
        assert!(matches!(h.check(), Err(Violation::Inconsistent { .. })));
        assert!(matches!(
            unknown.send(ProcessId(0), 1, "c9", 3),
            Err(Violation::SentTwice { record: 1 })
        ));
    }
}
