//! The demo's topology and its read-back, shared by the demo and the fault-injection driver.

use anyhow::{Context, Result};
use parsley_runtime::TopicInfo;
use parsley_stage::{EventTimeOrder, Topology, Utf8};
use parsley_testkit::fixtures::read_committed;

use crate::check::{DeliveryLogs, TopicNames};
use crate::model::{Event, Ledger, LedgerEntry, SalesFacts};

/// The topic names of run `run_id`.
pub fn names(run_id: &str) -> TopicNames {
    TopicNames {
        stock: format!("{run_id}.stock"),
        sales: format!("{run_id}.sales"),
        facts: format!("{run_id}.sale-facts"),
        ledger: format!("{run_id}.ledger"),
    }
}

/// Application `run_id`: stage `sales-facts` (sales → facts) and stage `ledger` (stock + facts
/// → ledger), which orders its deliveries by event time when `event_time` is set (no control
/// stream: what is history at start leaves in event-time order; a record arriving after the
/// watermark passed its time is released at once and counted late).
///
/// # Errors
/// When the builder rejects it (it does not).
pub fn topology(run_id: &str, names: &TopicNames, event_time: bool) -> Result<Topology> {
    Ok(Topology::builder(run_id)
        .stage(
            "sales-facts",
            SalesFacts {
                facts_topic: names.facts.as_str().into(),
            },
            |s| s.source(&names.sales).sink(&names.facts).key_codec(Utf8),
        )
        .stage(
            "ledger",
            Ledger {
                ledger_topic: names.ledger.as_str().into(),
            },
            |s| {
                let s = s
                    .source(&names.stock)
                    .source(&names.facts)
                    .sink(&names.ledger)
                    .key_codec(Utf8);
                if event_time {
                    s.order_by_event_time(EventTimeOrder::new())
                } else {
                    s
                }
            },
        )
        .build()?)
}

/// Reads the facts and the ledger back, as `read_committed` consumers see them.
///
/// # Errors
/// A record that does not decode, named by partition and offset.
pub fn read_logs(facts: &TopicInfo, ledger: &TopicInfo) -> Result<DeliveryLogs> {
    let mut logs = DeliveryLogs::default();
    for r in read_committed(facts) {
        let fact: Event = serde_json::from_slice(r.value.as_deref().unwrap_or_default())
            .with_context(|| format!("fact at {}/{}", r.partition, r.offset))?;
        logs.facts.push((r.partition, r.offset, fact));
    }
    for r in read_committed(ledger) {
        let entry: LedgerEntry = serde_json::from_slice(r.value.as_deref().unwrap_or_default())
            .with_context(|| format!("ledger entry at {}/{}", r.partition, r.offset))?;
        logs.ledger.push((r.partition, entry));
    }
    Ok(logs)
}
