//! The producing side of the world, shared by producers and tasks ([`Who`]): a send stamped by
//! the sender's real [`CausalClock`], appended later and
//! acknowledged later still, flushing, and the end of a producer's transaction (commit, or abort
//! and restore of the producer's clock).
//!
//! Invariants kept here: a send is appended after every earlier send of its sender to the same
//! channel (but not in order across channels, so appends of two senders can land crossed); a
//! transactional sender's records are visible once its transaction commits, an idempotent
//! producer's at once; a transaction's markers go to every partition it wrote to; an idempotent
//! sender flushes before it switches channels.

use std::collections::BTreeSet;

use parsley_clock::CausalClock;

use super::{Entry, Ev, Out, PendingSend, Producer, RecordId, Sim, TxnState, Variant, Who};

impl Sim {
    /// Adds a producer writing `writes`; returns its index.
    pub fn add_producer(&mut self, transactional: bool, writes: Vec<usize>) -> usize {
        let id = self.sender_id();
        // Under the wrong variant, idempotent producers also make in-flight claims.
        let clock = if transactional || self.variant == Variant::InFlightWithoutTransactions {
            CausalClock::transactional(id)
        } else {
            CausalClock::new(id)
        };
        let i = self.producers.len();
        self.producers.push(Producer {
            name: format!(
                "producer/{i}{}",
                if transactional { "" } else { "(idempotent)" }
            ),
            out: Out {
                clock,
                transactional,
                txn: None,
                pending: Vec::new(),
                unacked: Vec::new(),
            },
            snapshot: None,
            writes,
            uncommitted: Vec::new(),
            committed: Vec::new(),
        });
        i
    }

    /// `who` consumed the record at `c`/`offset` (a plain producer that read it): its later
    /// sends claim it.
    pub fn observe(&mut self, who: Who, c: usize, offset: i64) {
        let coordinate = self.channels[c].at(offset);
        self.out_mut(who)
            .clock
            .learn(coordinate)
            .expect("offsets are >= 0");
    }

    /// Stamps and queues a send of `who` to channel `c`; returns the record id.
    pub fn send(&mut self, who: Who, c: usize) -> RecordId {
        let channel = self.channels[c];
        if self.out_mut(who).transactional && self.out_mut(who).txn.is_none() {
            let t = self.txns.len();
            self.txns.push(TxnState::Open);
            self.txn_partitions.push(BTreeSet::new());
            let out = self.out_mut(who);
            out.txn = Some(t);
            if let Who::Producer(p) = who {
                self.producers[p].snapshot = Some(self.producers[p].out.clock.clone());
            }
        }
        let stamp = match self.out_mut(who).clock.stamp(channel) {
            Ok(s) => s,
            Err(_) => {
                // An idempotent sender flushes before switching channels.
                self.flush(who);
                self.out_mut(who)
                    .clock
                    .stamp(channel)
                    .expect("nothing unacknowledged after a flush")
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let seq = stamp.sender.expect("stamped").seq;
        self.out_mut(who).pending.push(PendingSend {
            id,
            seq,
            channel: c,
            stamp,
        });
        match who {
            Who::Producer(p) => self.producers[p].uncommitted.push(Ev::Send(id)),
            Who::Task(t) => self.tasks[t].uncommitted.push(Ev::Send(id)),
        }
        if let Who::Producer(p) = who
            && !self.producers[p].out.transactional
        {
            // Idempotent: visible once appended; part of the history from now on.
            let evs = std::mem::take(&mut self.producers[p].uncommitted);
            self.producers[p].committed.extend(evs);
        }
        self.trace.push(format!("{who:?} sends #{id} to c{c}"));
        id
    }

    /// Appends the oldest pending send of `who` to channel `c` (per-sender order per partition).
    pub fn append(&mut self, who: Who, c: usize) -> bool {
        let out = self.out_mut(who);
        let Some(i) = out.pending.iter().position(|p| p.channel == c) else {
            return false;
        };
        let p = out.pending.remove(i);
        let txn = out.txn.filter(|_| out.transactional);
        let offset = self.logs[c].len() as i64;
        if let Some(t) = txn {
            self.txn_partitions[t].insert(c);
        }
        self.logs[c].push(Entry::Record {
            id: p.id,
            txn,
            stamp: p.stamp,
        });
        self.placements.insert(p.id, (c, offset));
        let coordinate = self.channels[c].at(offset);
        self.out_mut(who).unacked.push((p.seq, coordinate));
        self.trace
            .push(format!("#{} appended at c{c}@{offset}", p.id));
        true
    }

    /// Acknowledges the oldest appended send of `who` on channel `c`.
    pub fn ack(&mut self, who: Who, c: usize) -> bool {
        let channel = self.channels[c];
        let out = self.out_mut(who);
        let Some(i) = out.unacked.iter().position(|(_, co)| co.channel == channel) else {
            return false;
        };
        let (seq, coordinate) = out.unacked.remove(i);
        out.clock
            .acked(seq, coordinate)
            .expect("every appended send is outstanding");
        true
    }

    /// Appends and acknowledges every send of `who`.
    pub fn flush(&mut self, who: Who) {
        while let Some(c) = self.out_mut(who).pending.first().map(|p| p.channel) {
            self.append(who, c);
        }
        while let Some(c) = self.out_mut(who).unacked.first().map(|(_, co)| co.channel) {
            let ci = self.channels.iter().position(|x| *x == c).expect("known");
            self.ack(who, ci);
        }
    }

    /// Ends the open transaction of producer `p`.
    pub fn end_producer_txn(&mut self, p: usize, commit: bool) {
        let who = Who::Producer(p);
        let Some(t) = self.producers[p].out.txn else {
            return;
        };
        self.flush(who);
        self.close_txn(t, commit);
        let prod = &mut self.producers[p];
        prod.out.txn = None;
        let evs = std::mem::take(&mut prod.uncommitted);
        if commit {
            prod.committed.extend(evs);
            prod.snapshot = None;
        } else if let Some(s) = prod.snapshot.take() {
            prod.out.clock = s;
        }
        self.trace.push(format!(
            "producer/{p} {} its transaction",
            if commit { "commits" } else { "aborts" }
        ));
    }

    pub(super) fn close_txn(&mut self, t: usize, commit: bool) {
        let touched = std::mem::take(&mut self.txn_partitions[t]);
        for c in touched {
            self.logs[c].push(Entry::Marker);
        }
        self.txns[t] = if commit {
            TxnState::Committed
        } else {
            TxnState::Aborted
        };
    }
}
