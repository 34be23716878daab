//! The inventory domain: events, ledger entries and the two stages' handlers.
//!
//! - `stock` topic: `InStock` (first delivery of a product) and `Restocked` events, written by
//!   the warehouse (the generator), each with a padded note so stock records are heavier
//!   than sales.
//! - `sales` topic: `Sold` events, written by the shop only after the stock it sells from was
//!   acknowledged, so every sale causally depends on the stock events before it.
//! - stage one (`sales-facts`) turns each sale into a `SaleRecorded` fact.
//! - stage two (`ledger`) consumes the facts together with the original `stock` topic and keeps
//!   each product's stock level; it writes one ledger entry per delivered record. A fact
//!   delivered before the stock it depends on drives the level below zero: the business
//!   symptom of a causal violation. In the demo it orders its deliveries by event time, so each
//!   product's ledger is its timeline: entries in the order the movements happened (the stock
//!   events' timestamps and, carried through stage one, the sales').
//!
//! All topics are keyed by product and have the same partition count (co-partitioned).

use std::sync::Arc;

use parsley_stage::{Handler, HandlerError, Record, Step};
use serde::{Deserialize, Serialize};

/// Bit set in the id of a fact derived from a sale: `fact id = sale id | FACT_BIT`.
pub const FACT_BIT: u64 = 1 << 62;

/// An inventory event.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "kind")]
pub enum Event {
    /// A product is stocked for the first time.
    InStock {
        /// Unique event id.
        id: u64,
        /// Product key.
        product: String,
        /// Units added.
        qty: u32,
        /// Free text (padding that makes stock records heavier than sales).
        note: String,
    },
    /// More units arrive.
    Restocked {
        /// Unique event id.
        id: u64,
        /// Product key.
        product: String,
        /// Units added.
        qty: u32,
        /// Free text.
        note: String,
    },
    /// Units are sold.
    Sold {
        /// Unique event id.
        id: u64,
        /// Product key.
        product: String,
        /// Units sold.
        qty: u32,
    },
    /// Stage one's fact about a sale.
    SaleRecorded {
        /// Unique event id (`sale | FACT_BIT`).
        id: u64,
        /// The sale it records.
        sale: u64,
        /// Product key.
        product: String,
        /// Units sold.
        qty: u32,
        /// Units of this product sold so far, this sale included.
        units_sold: u64,
    },
}

impl Event {
    /// The event's unique id.
    pub fn id(&self) -> u64 {
        match self {
            Event::InStock { id, .. }
            | Event::Restocked { id, .. }
            | Event::Sold { id, .. }
            | Event::SaleRecorded { id, .. } => *id,
        }
    }
}

/// Stage two's output: one entry per delivered record.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LedgerEntry {
    /// Id of the record the ledger task delivered.
    pub delivered: u64,
    /// Product key.
    pub product: String,
    /// Stock level after the record.
    pub level: i64,
    /// When the movement happened: the delivered record's event time (its Kafka timestamp,
    /// carried from the sale to its fact), ms since the epoch.
    pub at: i64,
}

/// Stage one: a sale becomes a fact with the product's running total.
#[derive(Debug, Clone)]
pub struct SalesFacts {
    /// The topic facts are written to (shared with each emission: no allocation per record).
    pub facts_topic: Arc<str>,
}

impl Handler for SalesFacts {
    type Key = String;
    type Value = Event;
    type Output = Event;
    type State = u64;

    fn handle(
        &self,
        r: Record<'_, String, Event>,
        sold: Option<u64>,
    ) -> Result<Step<String, Event, u64>, HandlerError> {
        let Event::Sold { id, product, qty } = r.value else {
            return Err(format!("sales topic carries a non-sale: {:?}", r.value).into());
        };
        let units_sold = sold.unwrap_or(0) + u64::from(qty);
        let fact = Event::SaleRecorded {
            id: id | FACT_BIT,
            sale: id,
            product,
            qty,
            units_sold,
        };
        Ok(Step::none()
            .emit(Arc::clone(&self.facts_topic), r.key, fact)
            .set_state(units_sold))
    }
}

/// Stage two: the stock level per product, one ledger entry per delivery.
#[derive(Debug, Clone)]
pub struct Ledger {
    /// The topic ledger entries are written to (shared with each emission).
    pub ledger_topic: Arc<str>,
}

impl Handler for Ledger {
    type Key = String;
    type Value = Event;
    type Output = LedgerEntry;
    type State = i64;

    fn handle(
        &self,
        r: Record<'_, String, Event>,
        level: Option<i64>,
    ) -> Result<Step<String, LedgerEntry, i64>, HandlerError> {
        let level = level.unwrap_or(0);
        let (delivered, level) = match &r.value {
            Event::InStock { id, qty, .. } | Event::Restocked { id, qty, .. } => {
                (*id, level + i64::from(*qty))
            }
            Event::SaleRecorded { id, qty, .. } => (*id, level - i64::from(*qty)),
            Event::Sold { .. } => {
                return Err("the ledger reads facts, not raw sales".into());
            }
        };
        let entry = LedgerEntry {
            delivered,
            product: r.key.clone(),
            level,
            at: r.timestamp,
        };
        Ok(Step::none()
            .emit(Arc::clone(&self.ledger_topic), r.key, entry)
            .set_state(level))
    }
}
