//! Reading a topic back to its end as a `read_committed` consumer sees it, and printing it as
//! `cargo kafka read` does, over the wire client of [`crate::wire`] (no client library).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::{Duration, Instant};

use crate::wire::{Connection, EARLIEST, LATEST, Record, UNKNOWN_TOPIC_OR_PARTITION, WireError};

/// How long reading a topic back may take: a safety net, not a decision.
const READ_DEADLINE: Duration = Duration::from_secs(300);
/// How long one request may wait for its connection or answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Every record of `topic` that a `read_committed` consumer sees, partition by partition in
/// offset order, from each partition's log start up to the last stable offsets read when the
/// call begins. Done when every partition's next offset has reached its end: evidence, not
/// silence (a topic written in transactions ends with a marker the position passes).
///
/// `bootstrap` is a `PLAINTEXT` listener's `host:port` (or a comma-separated list); each
/// partition is read from its leader.
///
/// # Errors
/// No such topic, a connection or protocol error, a compressed batch, or the ends not reached
/// within five minutes.
pub fn read_to_end(bootstrap: &str, topic: &str) -> Result<Vec<Record>, WireError> {
    let mut refused = Vec::new();
    let mut first = None;
    for address in bootstrap.split(',') {
        match Connection::open(address.trim(), REQUEST_TIMEOUT) {
            Ok(c) => {
                first = Some(c);
                break;
            }
            Err(e) => refused.push(e.to_string()),
        }
    }
    let mut first = first.ok_or_else(|| {
        WireError(format!(
            "no broker of {bootstrap} answers: {}",
            refused.join("; ")
        ))
    })?;
    let metadata = first.metadata(&[topic])?;
    let t = metadata
        .topics
        .iter()
        .find(|t| t.name == topic)
        .filter(|t| t.error != UNKNOWN_TOPIC_OR_PARTITION)
        .ok_or_else(|| WireError(format!("no topic {topic}")))?;
    let mut connections: HashMap<i32, Connection> = HashMap::new();
    let mut per_partition = Vec::new();
    let started = Instant::now();
    for p in &t.partitions {
        let leader = metadata
            .brokers
            .iter()
            .find(|b| b.id == p.leader)
            .ok_or_else(|| WireError(format!("{topic}/{} has no leader now", p.id)))?;
        let c = match connections.entry(leader.id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Connection::open(&leader.address(), REQUEST_TIMEOUT)?)
            }
        };
        let start = c.list_offsets(topic, &[p.id], EARLIEST)?[0];
        let end = c.list_offsets(topic, &[p.id], LATEST)?[0];
        let mut next = start;
        let mut records = Vec::new();
        while next < end {
            if started.elapsed() > READ_DEADLINE {
                return Err(WireError(format!(
                    "reading {topic}: partition {} not read to its end {end} within \
                     {READ_DEADLINE:?} (at {next})",
                    p.id
                )));
            }
            let (fetched, after) = c.fetch(topic, p.id, next, Duration::from_millis(500))?;
            records.extend(
                fetched
                    .into_iter()
                    .filter(|r| r.offset < end)
                    .map(|r| Record {
                        partition: p.id,
                        ..r
                    }),
            );
            next = after;
        }
        per_partition.push(records);
    }
    Ok(per_partition.concat())
}

/// A record as `cargo kafka read` prints it: `key<TAB>value` (UTF-8, `-` for an absent part),
/// then `<TAB>name=value` per header, Parsley's stamp as its size.
pub fn record_line(r: &Record) -> String {
    let headers: String = r
        .headers
        .iter()
        .map(|(name, value)| match value {
            Some(v) if parsley_clock::is_stamp_header(name) => {
                format!("\t{name}=<stamp, {} bytes>", v.len())
            }
            value => format!("\t{name}={}", text(value)),
        })
        .collect();
    format!("{}\t{}{headers}", text(&r.key), text(&r.value))
}

/// A key, value or header value as text: UTF-8 (lossy), `-` when absent.
fn text(b: &Option<Vec<u8>>) -> String {
    b.as_deref().map_or_else(
        || "-".to_string(),
        |b| String::from_utf8_lossy(b).into_owned(),
    )
}

/// Prints `topic` to `out`: every record up to the end offsets read now ([`record_line`]), or
/// with `last` the last value of each key sorted by key (`key<TAB>value`); then a count on
/// standard error.
///
/// # Errors
/// As [`read_to_end`]; a failed write.
pub fn print_topic(
    bootstrap: &str,
    topic: &str,
    last: bool,
    out: &mut impl Write,
) -> Result<(), WireError> {
    let records = read_to_end(bootstrap, topic)?;
    match write_records(topic, &records, last, out) {
        // A reader that stopped early (`| head`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(|e| WireError(format!("writing the records: {e}"))),
    }
}

fn write_records(
    topic: &str,
    records: &[Record],
    last: bool,
    out: &mut impl Write,
) -> std::io::Result<()> {
    if last {
        let finals: BTreeMap<String, String> = records
            .iter()
            .map(|r| (text(&r.key), text(&r.value)))
            .collect();
        for (k, v) in &finals {
            writeln!(out, "{k}\t{v}")?;
        }
        eprintln!("{topic}: {} records, {} keys", records.len(), finals.len());
    } else {
        for r in records {
            writeln!(out, "{}", record_line(r))?;
        }
        eprintln!("{topic}: {} records", records.len());
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_printed_with_its_headers_and_the_stamp_as_its_size() {
        let record = Record {
            partition: 0,
            offset: 3,
            key: Some(b"order-7".to_vec()),
            value: None,
            timestamp: 1,
            headers: vec![
                (parsley_clock::STAMP_HEADER.to_string(), Some(vec![0; 12])),
                (
                    "parsley.dlq.reason".to_string(),
                    Some(b"MissingValue".to_vec()),
                ),
                ("empty".to_string(), None),
            ],
        };
        assert_eq!(
            record_line(&record),
            format!(
                "order-7\t-\t{}=<stamp, 12 bytes>\tparsley.dlq.reason=MissingValue\tempty=-",
                parsley_clock::STAMP_HEADER
            )
        );
        let plain = Record {
            headers: Vec::new(),
            ..record
        };
        assert_eq!(record_line(&plain), "order-7\t-");
    }
}
