//! The few figures of librdkafka's statistics that the metrics endpoint exports.
//!
//! librdkafka sends each client's statistics as one JSON document every
//! `statistics.interval.ms` (its `STATISTICS.md` describes the fields). With the
//! metrics endpoint (`RuntimeConfig::metrics_address`) on, every document of a stage's
//! consumer and producer is digested here and the digest kept with the stage's metrics: the
//! consumer's lag per partition, each broker's request round-trip time, and the producer's
//! transaction state. The last document of each client wins; figures librdkafka marks unknown
//! (an offset below zero, a window without a request) are left out.
//!
//! The lag is the partition's end — its last stable offset (a stage reads `read_committed`),
//! else its high watermark — less the consumer's position (`app_offset`, the next offset it
//! hands to the stage). librdkafka's own `consumer_lag` counts from the offsets the consumer
//! committed; a stage's consumer commits none (its offsets go with the transaction, through
//! the producer), so for a stage that field is always `-1`.
//!
//! Only the fields read here are declared, so a document with more (or fewer optional) fields
//! still digests.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The digest of the last statistics document of each of a stage's clients.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientStatistics {
    /// The stage's consumer of its sources.
    pub consumer: Option<ClientDigest>,
    /// The stage's transactional producer.
    pub producer: Option<ClientDigest>,
}

/// What one statistics document says that the endpoint exports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientDigest {
    /// Consumer lag per partition (offsets), ascending by topic and partition.
    pub lag: Vec<PartitionLag>,
    /// Request round-trip time per broker over librdkafka's last window (`brokers.*.rtt`).
    pub rtt: Vec<BrokerRtt>,
    /// The producer's transaction state (`eos.txn_state`).
    pub transaction: Option<TransactionState>,
}

/// The consumer lag of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLag {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Offsets between the consumer's position and the partition's end (its last stable
    /// offset, else its high watermark).
    pub lag: i64,
}

/// The request round-trip time to one broker.
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerRtt {
    /// The broker's node id.
    pub broker: i32,
    /// Median, seconds.
    pub p50: f64,
    /// 99th percentile, seconds.
    pub p99: f64,
}

/// A transactional producer's state.
#[derive(Debug, Clone, PartialEq)]
pub struct TransactionState {
    /// librdkafka's name of the state (`Ready`, `InTransaction`, `CommittingTransaction`,
    /// `AbortableError`, `FatalError`, …). (The document's `txn_stateage` is not read:
    /// librdkafka 2.12 never records when the transaction state changed, so it gives the time
    /// since its clock's origin, the host's uptime.)
    pub state: String,
}

/// Which client a document came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// A consumer.
    Consumer,
    /// A producer.
    Producer,
}

impl ClientStatistics {
    /// Keeps the digest of `json`, one client's statistics document. A document that does not
    /// parse, or comes from another kind of client, changes nothing.
    pub fn record(&mut self, json: &[u8]) {
        match digest(json) {
            Ok((ClientKind::Consumer, d)) => self.consumer = Some(d),
            Ok((ClientKind::Producer, d)) => self.producer = Some(d),
            Err(e) => {
                tracing::debug!(error = %e, "a librdkafka statistics document that does not digest")
            }
        }
    }
}

/// The digest of one statistics document, and the kind of client that sent it.
///
/// # Errors
/// A document that is not JSON of librdkafka's shape, or of another client type.
pub fn digest(json: &[u8]) -> Result<(ClientKind, ClientDigest), String> {
    let doc: Document = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let kind = match doc.client_type.as_str() {
        "consumer" => ClientKind::Consumer,
        "producer" => ClientKind::Producer,
        other => return Err(format!("client type {other:?}")),
    };
    let mut lag: Vec<PartitionLag> = Vec::new();
    if kind == ClientKind::Consumer {
        for (topic, t) in &doc.topics {
            for p in t.partitions.values() {
                let end = if p.ls_offset >= 0 {
                    p.ls_offset
                } else {
                    p.hi_offset
                };
                if p.partition >= 0 && end >= 0 && p.app_offset >= 0 {
                    lag.push(PartitionLag {
                        topic: topic.clone(),
                        partition: p.partition,
                        lag: (end - p.app_offset).max(0),
                    });
                }
            }
        }
    }
    lag.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    let mut rtt: Vec<BrokerRtt> = doc
        .brokers
        .values()
        .filter(|b| b.nodeid >= 0)
        .filter_map(|b| {
            let w = b.rtt.as_ref().filter(|w| w.cnt > 0)?;
            Some(BrokerRtt {
                broker: b.nodeid,
                p50: micros(w.p50),
                p99: micros(w.p99),
            })
        })
        .collect();
    rtt.sort_by_key(|r| r.broker);
    let transaction = doc
        .eos
        .filter(|e| !e.txn_state.is_empty())
        .map(|e| TransactionState { state: e.txn_state });
    Ok((
        kind,
        ClientDigest {
            lag,
            rtt,
            transaction,
        },
    ))
}

/// librdkafka's µs as seconds.
fn micros(us: i64) -> f64 {
    us as f64 / 1_000_000.0
}

/// The fields of a statistics document read here.
#[derive(Deserialize)]
struct Document {
    #[serde(rename = "type")]
    client_type: String,
    #[serde(default)]
    brokers: BTreeMap<String, Broker>,
    #[serde(default)]
    topics: BTreeMap<String, Topic>,
    eos: Option<Eos>,
}

#[derive(Deserialize)]
struct Broker {
    /// `-1` for the bootstrap entries and the logical brokers.
    nodeid: i32,
    rtt: Option<Window>,
}

/// A window of librdkafka's latency figures, µs.
#[derive(Deserialize)]
struct Window {
    cnt: i64,
    p50: i64,
    p99: i64,
}

#[derive(Deserialize)]
struct Topic {
    #[serde(default)]
    partitions: BTreeMap<String, Partition>,
}

#[derive(Deserialize)]
struct Partition {
    /// `-1` for the unassigned-partition entry.
    partition: i32,
    /// The next offset the consumer hands to the application; below zero when unknown (as
    /// every offset here).
    #[serde(default = "unknown")]
    app_offset: i64,
    /// The last stable offset.
    #[serde(default = "unknown")]
    ls_offset: i64,
    /// The high watermark.
    #[serde(default = "unknown")]
    hi_offset: i64,
}

fn unknown() -> i64 {
    -1
}

#[derive(Deserialize)]
struct Eos {
    #[serde(default)]
    txn_state: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A consumer's document cut down to the fields that matter (librdkafka 2.12's shape).
    const CONSUMER: &str = r#"{
        "name": "app.s-consumer#consumer-1", "type": "consumer", "ts": 1, "age": 2,
        "brokers": {
            "127.0.0.1:9092/bootstrap": { "nodeid": -1, "rtt": { "cnt": 0, "p50": 0, "p99": 0 } },
            "GroupCoordinator": { "nodeid": -1, "rtt": { "cnt": 3, "p50": 900, "p99": 1200 } },
            "127.0.0.1:9092/2": { "nodeid": 2, "rtt": { "cnt": 0, "p50": 0, "p99": 0 } },
            "127.0.0.1:9092/1": { "nodeid": 1, "rtt": { "min": 10, "cnt": 7, "p50": 1500, "p99": 250000 } }
        },
        "topics": {
            "in": { "topic": "in", "partitions": {
                "1": { "partition": 1, "app_offset": 5, "ls_offset": 5, "hi_offset": 5, "consumer_lag": -1 },
                "0": { "partition": 0, "app_offset": 3, "ls_offset": 15, "hi_offset": 17, "consumer_lag": -1 },
                "-1": { "partition": -1, "app_offset": -1001, "ls_offset": -1001, "hi_offset": -1001 },
                "2": { "partition": 2, "app_offset": -1001, "ls_offset": 9, "hi_offset": 9 },
                "3": { "partition": 3, "app_offset": 2, "ls_offset": -1001, "hi_offset": 4 }
            } }
        }
    }"#;

    #[test]
    fn a_consumers_document_gives_its_lag_per_partition_and_its_brokers_round_trips() {
        let (kind, d) = digest(CONSUMER.as_bytes()).unwrap();
        assert_eq!(kind, ClientKind::Consumer);
        let lag = |topic: &str, partition, lag| PartitionLag {
            topic: topic.into(),
            partition,
            lag,
        };
        // To the last stable offset, else the high watermark; the unassigned entry and a
        // partition without a position are left out.
        assert_eq!(
            d.lag,
            vec![lag("in", 0, 12), lag("in", 1, 0), lag("in", 3, 2)]
        );
        // Only real brokers with requests in the window.
        assert_eq!(
            d.rtt,
            vec![BrokerRtt {
                broker: 1,
                p50: 0.0015,
                p99: 0.25
            }]
        );
        assert_eq!(d.transaction, None);
    }

    #[test]
    fn a_producers_document_gives_its_transaction_state() {
        let json = r#"{ "type": "producer", "brokers": {}, "topics": {
            "out": { "partitions": { "0": { "partition": 0 } } } },
            "eos": { "idemp_state": "Assigned", "txn_state": "InTransaction", "txn_stateage": 2500 } }"#;
        let mut stats = ClientStatistics::default();
        stats.record(json.as_bytes());
        let producer = stats.producer.clone().unwrap();
        assert_eq!(
            producer.transaction,
            Some(TransactionState {
                state: "InTransaction".into()
            })
        );
        assert!(producer.lag.is_empty(), "a producer has no consumer lag");
        assert_eq!(stats.consumer, None);
        // A document that does not digest leaves the last one.
        stats.record(b"{ not json");
        stats.record(br#"{ "type": "admin" }"#);
        assert_eq!(stats.producer, Some(producer));
    }
}
