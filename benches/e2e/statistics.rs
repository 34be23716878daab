//! librdkafka statistics of a worker's clients (`--statistics`): written by the worker, one
//! JSON document per line, and summarised per record by the benchmark — what each loop asks
//! of the broker: requests by type, records per produce batch, fetches.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

/// How often the loops' clients report librdkafka statistics when asked to.
pub const INTERVAL: Duration = Duration::from_millis(500);

/// Appends librdkafka statistics documents to a file, one per line (shared by a loop's
/// clients; written on librdkafka's threads).
#[derive(Clone)]
pub struct StatisticsFile(Arc<Mutex<std::fs::File>>);

impl StatisticsFile {
    /// Creates (truncates) `path`.
    ///
    /// # Errors
    /// When the file cannot be created.
    pub fn create(path: &Path) -> Result<Self> {
        let file = std::fs::File::create(path).with_context(|| format!("creating {path:?}"))?;
        Ok(StatisticsFile(Arc::new(Mutex::new(file))))
    }

    /// Appends one document and a newline. A failed write is reported on stderr: statistics
    /// are a diagnosis, not the measurement.
    pub fn write(&self, json: &[u8]) {
        let mut file = self.0.lock().expect("statistics file");
        if let Err(e) = file.write_all(json).and_then(|()| file.write_all(b"\n")) {
            eprintln!("e2e: writing statistics: {e}");
        }
    }
}

/// One client's totals at its last report.
#[derive(Debug, Default)]
struct Client {
    /// Requests sent, by type, over every broker connection.
    requests: BTreeMap<String, u64>,
    /// Per topic: records produced and produce batches (summed over the reports' windows).
    produced: BTreeMap<String, (u64, u64)>,
    /// Records consumed.
    consumed: u64,
}

/// Summarises the statistics file `path` of a run whose output topic is `output`: one line,
/// figures per 1,000 records.
///
/// # Errors
/// When the file cannot be read or a document is not JSON.
pub fn summary(path: &Path, output: &str) -> Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path:?}"))?;
    let mut clients: BTreeMap<String, Client> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let doc: Value = serde_json::from_str(line).with_context(|| format!("parsing {path:?}"))?;
        let name = doc["name"].as_str().unwrap_or_default().to_string();
        let client = clients.entry(name).or_default();
        // Counters are totals since the client started: the last report holds them all.
        client.requests.clear();
        for broker in doc["brokers"]
            .as_object()
            .into_iter()
            .flat_map(|b| b.values())
        {
            for (kind, n) in broker["req"].as_object().into_iter().flatten() {
                *client.requests.entry(kind.clone()).or_default() += n.as_u64().unwrap_or(0);
            }
        }
        client.consumed = doc["rxmsgs"].as_u64().unwrap_or(0);
        if doc["type"] != "producer" {
            // A consumer's topic windows count fetched batches.
            continue;
        }
        for (topic, t) in doc["topics"].as_object().into_iter().flatten() {
            let records: u64 = t["partitions"]
                .as_object()
                .into_iter()
                .flat_map(|p| p.values())
                .filter(|p| p["partition"].as_i64().unwrap_or(-1) >= 0)
                .map(|p| p["txmsgs"].as_u64().unwrap_or(0))
                .sum();
            // `batchcnt` is a window over the reporting interval: its count is the batches
            // of that window.
            let batches = t["batchcnt"]["cnt"].as_u64().unwrap_or(0);
            let entry = client.produced.entry(topic.clone()).or_default();
            entry.0 = records;
            entry.1 += batches;
        }
    }
    let mut requests: BTreeMap<String, u64> = BTreeMap::new();
    let mut consumed = 0;
    let (mut out_records, mut out_batches, mut other_batches) = (0, 0, 0);
    for client in clients.values() {
        for (kind, n) in &client.requests {
            *requests.entry(kind.clone()).or_default() += n;
        }
        consumed += client.consumed;
        for (topic, &(records, batches)) in &client.produced {
            if topic == output {
                out_records += records;
                out_batches += batches;
            } else {
                other_batches += batches;
            }
        }
    }
    let per_k = |n: u64| n as f64 * 1000.0 / out_records.max(1) as f64;
    let get = |kind: &str| requests.get(kind).copied().unwrap_or(0);
    Ok(format!(
        "per 1,000 output records: {:.2} Produce, {:.3} AddPartitionsToTxn, {:.3} EndTxn, {:.3} TxnOffsetCommit, {:.3} Fetch, {:.3} ListOffsets, {:.3} Metadata requests; output batches of {:.0} records, {} batches to other topics; {} records consumed, {} produced to the output (at the last report)",
        per_k(get("Produce")),
        per_k(get("AddPartitionsToTxn")),
        per_k(get("EndTxn")),
        per_k(get("TxnOffsetCommit")),
        per_k(get("Fetch")),
        per_k(get("ListOffsets")),
        per_k(get("Metadata")),
        out_records as f64 / out_batches.max(1) as f64,
        other_batches,
        consumed,
        out_records,
    ))
}
