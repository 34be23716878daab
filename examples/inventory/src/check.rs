//! The demo's ordering check: the oracle of `parsley-testkit`, fed with ground truth only.
//!
//! Processes and their logs:
//! - `generator/p`: slice `p`'s committed sends, in send order (from the generator);
//! - `sales-facts/p`: task `p` of stage one. It emits exactly one fact per delivered sale, to
//!   the same partition, so the order of partition `p` of the facts topic *is* its delivery
//!   log: deliver(sale), send(fact) for each fact;
//! - `ledger/p`: task `p` of stage two. It emits one ledger entry per delivery, so partition
//!   `p` of the ledger topic is its delivery log.
//!
//! Nothing here reads a Parsley clock or stamp: happened-before is rebuilt from these logs.

use std::collections::HashMap;

use parsley_testkit::oracle::{History, Report, Violation};

use crate::generator::GroundTruth;
use crate::model::{Event, FACT_BIT, LedgerEntry};

/// A channel by topic name and partition.
pub type Chan = (String, i32);

/// Topic names of one run.
#[derive(Debug, Clone)]
pub struct TopicNames {
    /// Stock events (generator → stage two).
    pub stock: String,
    /// Sales (generator → stage one).
    pub sales: String,
    /// Facts (stage one → stage two).
    pub facts: String,
    /// Ledger entries (stage two's output).
    pub ledger: String,
}

/// What the stages wrote, read back in partition order.
#[derive(Debug, Clone, Default)]
pub struct DeliveryLogs {
    /// The facts topic: (partition, offset, fact).
    pub facts: Vec<(i32, i64, Event)>,
    /// The ledger topic: (partition, entry).
    pub ledger: Vec<(i32, LedgerEntry)>,
}

/// The verdict of the check.
#[derive(Debug)]
pub struct Outcome {
    /// The oracle's verdict.
    pub oracle: Result<Report, Violation<Chan>>,
    /// Ledger entries with a negative stock level (a sale applied before its stock).
    pub oversold: u64,
    /// Exactly once on state: outputs whose state is not the fold of the committed outputs
    /// before them (a fact's `units_sold` is not the sum of its product's sales delivered so
    /// far, a ledger entry's `level` not the sum of its product's movements), per stage. State
    /// that counted a record twice (restored from an uncommitted changelog write, or kept
    /// across an abort) or lost one shows here.
    pub state: Vec<String>,
    /// Records that should have been delivered and were not (per stage), or were delivered
    /// more than once.
    pub completeness: Vec<String>,
    /// Ledger entries whose event time (`at`) is below an earlier entry's of the same product:
    /// out of event-time order. Not part of [`Outcome::passed`]: a ledger in arrival order has
    /// them by design; an event-time ledger may have them only for records it counted late.
    pub event_time_disorder: u64,
}

impl Outcome {
    /// `true` when the oracle found no violation, every record was delivered exactly once and
    /// every state is the fold of the deliveries before it.
    pub fn passed(&self) -> bool {
        self.oracle.is_ok()
            && self.completeness.is_empty()
            && self.state.is_empty()
            && self.oversold == 0
    }
}

/// Checks the delivery logs against the ground truth.
pub fn check(
    truth: &GroundTruth,
    topics: &TopicNames,
    partitions: i32,
    logs: &DeliveryLogs,
) -> Outcome {
    let mut h: History<Chan> = History::new();
    let mut completeness = Vec::new();
    let mut setup = || -> Result<(), Violation<Chan>> {
        for (p, sends) in truth.slices.iter().enumerate() {
            let g = h.process(format!("generator/{p}"));
            for s in sends {
                h.send(g, s.id, (s.topic.clone(), s.partition), s.offset)?;
            }
        }
        let stage_one: Vec<_> = (0..partitions)
            .map(|p| {
                let t = h.process(format!("sales-facts/{p}"));
                h.consumes(t, (topics.sales.clone(), p), 0);
                t
            })
            .collect();
        for (p, offset, fact) in &logs.facts {
            let Event::SaleRecorded { id, sale, .. } = fact else {
                continue;
            };
            let t = stage_one[*p as usize];
            h.deliver(t, *sale);
            h.send(t, *id, (topics.facts.clone(), *p), *offset)?;
        }
        let stage_two: Vec<_> = (0..partitions)
            .map(|p| {
                let t = h.process(format!("ledger/{p}"));
                h.consumes(t, (topics.stock.clone(), p), 0);
                h.consumes(t, (topics.facts.clone(), p), 0);
                t
            })
            .collect();
        for (p, entry) in &logs.ledger {
            h.deliver(stage_two[*p as usize], entry.delivered);
        }
        Ok(())
    };
    let oracle = setup().and_then(|()| h.check());

    // Exactly once: every committed sale reaches stage one once; every stock event and fact
    // reaches stage two once.
    let mut seen: HashMap<u64, u32> = HashMap::new();
    for (_, _, f) in &logs.facts {
        if let Event::SaleRecorded { sale, .. } = f {
            *seen.entry(*sale).or_default() += 1;
        }
    }
    let sales: Vec<u64> = truth
        .slices
        .iter()
        .flatten()
        .filter(|s| s.topic == topics.sales)
        .map(|s| s.id)
        .collect();
    let missing = sales.iter().filter(|id| !seen.contains_key(id)).count();
    let duplicated = seen.values().filter(|n| **n > 1).count();
    if missing > 0 || duplicated > 0 || seen.len() != sales.len() {
        completeness.push(format!(
            "stage one: {missing} sale(s) never delivered, {duplicated} delivered more than once, {} delivered in all of {} committed",
            seen.len(),
            sales.len()
        ));
    }
    let mut ledger_seen: HashMap<u64, u32> = HashMap::new();
    for (_, e) in &logs.ledger {
        *ledger_seen.entry(e.delivered).or_default() += 1;
    }
    let expected = truth.stock_events as usize + logs.facts.len();
    let duplicated = ledger_seen.values().filter(|n| **n > 1).count();
    if ledger_seen.len() != expected || duplicated > 0 {
        completeness.push(format!(
            "stage two: {} distinct records delivered, {expected} expected, {duplicated} more than once",
            ledger_seen.len()
        ));
    }
    let state = state_check(truth, logs);
    let oversold = logs.ledger.iter().filter(|(_, e)| e.level < 0).count() as u64;
    // A product's entries are in one partition, in delivery order.
    let mut latest: HashMap<&str, i64> = HashMap::new();
    let mut event_time_disorder = 0;
    for (_, e) in &logs.ledger {
        let seen = latest.entry(e.product.as_str()).or_insert(e.at);
        if e.at < *seen {
            event_time_disorder += 1;
        }
        *seen = (*seen).max(e.at);
    }
    Outcome {
        oracle,
        oversold,
        completeness,
        state,
        event_time_disorder,
    }
}

/// Refolds each stage's state from the ground truth along its delivery log (a product's
/// records are in one partition, in delivery order) and compares it with what each output
/// says the state was: stage one's `units_sold`, stage two's `level`. One line per stage with
/// mismatches, naming the first.
fn state_check(truth: &GroundTruth, logs: &DeliveryLogs) -> Vec<String> {
    let delta: HashMap<u64, i64> = truth
        .slices
        .iter()
        .flatten()
        .map(|s| (s.id, s.delta))
        .collect();
    let mut out = Vec::new();
    let mut sold: HashMap<&str, u64> = HashMap::new();
    let mut wrong = 0;
    let mut first = None;
    for (p, offset, fact) in &logs.facts {
        let Event::SaleRecorded {
            sale,
            product,
            units_sold,
            ..
        } = fact
        else {
            continue;
        };
        let total = sold.entry(product.as_str()).or_default();
        *total += delta.get(sale).map_or(0, |d| d.unsigned_abs());
        if *units_sold != *total {
            wrong += 1;
            first.get_or_insert(format!(
                "fact of sale {sale} at {p}@{offset} says {units_sold} sold of {product}, the deliveries before it {total}"
            ));
        }
    }
    if let Some(first) = first {
        out.push(format!(
            "stage one: {wrong} fact(s) whose units_sold is not the fold of the sales delivered before them; first: {first}"
        ));
    }
    let mut level: HashMap<&str, i64> = HashMap::new();
    let mut wrong = 0;
    let mut first = None;
    for (p, e) in &logs.ledger {
        let l = level.entry(e.product.as_str()).or_default();
        *l += delta.get(&(e.delivered & !FACT_BIT)).copied().unwrap_or(0);
        if e.level != *l {
            wrong += 1;
            first.get_or_insert(format!(
                "entry for record {} in partition {p} says level {} of {}, the deliveries before it {l}",
                e.delivered, e.level, e.product
            ));
        }
    }
    if let Some(first) = first {
        out.push(format!(
            "stage two: {wrong} ledger entr(ies) whose level is not the fold of the deliveries before them; first: {first}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::Sent;

    fn topics() -> TopicNames {
        TopicNames {
            stock: "stock".into(),
            sales: "sales".into(),
            facts: "facts".into(),
            ledger: "ledger".into(),
        }
    }

    /// One slice: stock event 1 (offset 0), then sale 2 (offset 0 of sales).
    fn truth() -> GroundTruth {
        GroundTruth {
            slices: vec![vec![
                Sent {
                    id: 1,
                    topic: "stock".into(),
                    partition: 0,
                    offset: 0,
                    delta: 5,
                },
                Sent {
                    id: 2,
                    topic: "sales".into(),
                    partition: 0,
                    offset: 0,
                    delta: -1,
                },
            ]],
            stock_events: 1,
            sales: 1,
            ..GroundTruth::default()
        }
    }

    fn logs(ledger_order: &[u64], levels: &[i64]) -> DeliveryLogs {
        // Event time: stock event 1 at 10, the sale (and its fact) at 20.
        let at = |id: u64| if id == 1 { 10 } else { 20 };
        DeliveryLogs {
            facts: vec![(
                0,
                0,
                Event::SaleRecorded {
                    id: 2 | FACT_BIT,
                    sale: 2,
                    product: "p".into(),
                    qty: 1,
                    units_sold: 1,
                },
            )],
            ledger: ledger_order
                .iter()
                .zip(levels)
                .map(|(&delivered, &level)| {
                    (
                        0,
                        LedgerEntry {
                            delivered,
                            product: "p".into(),
                            level,
                            at: at(delivered),
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn the_causal_delivery_log_passes() {
        let outcome = check(&truth(), &topics(), 1, &logs(&[1, 2 | FACT_BIT], &[5, 4]));
        assert!(outcome.passed(), "{outcome:?}");
        assert_eq!(outcome.event_time_disorder, 0);
        assert_eq!(outcome.oracle.unwrap().deliveries, 3);
    }

    #[test]
    fn a_deliberately_misordered_delivery_log_fails_the_check() {
        // The ledger delivered the fact of sale 2 before stock event 1 it depends on.
        let outcome = check(&truth(), &topics(), 1, &logs(&[2 | FACT_BIT, 1], &[-1, 4]));
        assert!(!outcome.passed());
        match outcome.oracle {
            Err(Violation::CausalOrder {
                ref process,
                delivered,
                missing,
                ..
            }) => {
                assert_eq!(process, "ledger/0");
                assert_eq!((delivered, missing), (2 | FACT_BIT, 1));
            }
            ref other => panic!("expected a causal-order violation, got {other:?}"),
        }
        assert_eq!(outcome.oversold, 1);
        assert_eq!(
            outcome.event_time_disorder, 1,
            "the stock event at 10 after the fact at 20"
        );
    }

    #[test]
    fn state_that_counted_a_record_twice_fails_the_check() {
        // The deliveries are right, but the level after the sale says 3, not 5 - 1: the state
        // took the sale twice (as a restore from an uncommitted changelog write would).
        let outcome = check(&truth(), &topics(), 1, &logs(&[1, 2 | FACT_BIT], &[5, 3]));
        assert!(outcome.oracle.is_ok() && outcome.completeness.is_empty());
        assert!(!outcome.passed());
        assert_eq!(outcome.state.len(), 1, "{:?}", outcome.state);
        assert!(
            outcome.state[0].starts_with("stage two: 1 ledger entr(ies)"),
            "{:?}",
            outcome.state
        );
        // Stage one's running total counted twice.
        let mut twice = logs(&[1, 2 | FACT_BIT], &[5, 4]);
        if let Event::SaleRecorded { units_sold, .. } = &mut twice.facts[0].2 {
            *units_sold = 2;
        }
        let outcome = check(&truth(), &topics(), 1, &twice);
        assert_eq!(outcome.state.len(), 1, "{:?}", outcome.state);
        assert!(
            outcome.state[0].starts_with("stage one: 1 fact(s)"),
            "{:?}",
            outcome.state
        );
    }

    #[test]
    fn a_lost_or_duplicated_delivery_fails_the_check() {
        let lost = check(&truth(), &topics(), 1, &logs(&[1], &[5]));
        assert!(!lost.passed());
        assert!(
            lost.completeness[0].contains("stage two"),
            "{:?}",
            lost.completeness
        );
        let twice = check(
            &truth(),
            &topics(),
            1,
            &logs(&[1, 2 | FACT_BIT, 1], &[5, 4, 9]),
        );
        assert!(matches!(
            twice.oracle,
            Err(Violation::Duplicate { record: 1, .. })
        ));
    }
}
