//! The few requests of Kafka's wire protocol that the launcher needs, over plain TCP with no
//! client library: `Metadata` (does a broker answer, which brokers the cluster lists, a
//! partition's leader, replicas and in-sync replicas), `ListOffsets` (a partition's log start
//! and last stable offset) and `Fetch` (`read_committed`), with the record batches (magic 2)
//! they return.
//!
//! Only `PLAINTEXT` listeners, and only the request versions Kafka 4 still serves that carry
//! what is needed: `Metadata` v4, `ListOffsets` v2 (the first with an isolation level), `Fetch`
//! v4 (the first with an isolation level and record batches). Uncompressed batches only: a
//! compressed batch is an error naming its codec.
//!
//! A Java client's rules are kept where they decide what a reader sees: control batches are
//! never records, and a transactional batch of a producer whose transaction the fetch response
//! lists as aborted (from its first offset up to its abort marker) is skipped.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

const METADATA: i16 = 3;
const LIST_OFFSETS: i16 = 2;
const FETCH: i16 = 1;
const CLIENT_ID: &str = "parsley-broker";
/// Largest response accepted (a `Fetch` asks for at most [`FETCH_MAX_BYTES`]).
const MAX_RESPONSE: usize = 128 << 20;
/// `max_bytes` of a fetch.
const FETCH_MAX_BYTES: i32 = 16 << 20;
/// `partition_max_bytes` of a fetch (a larger first batch is returned whole all the same).
const PARTITION_MAX_BYTES: i32 = 4 << 20;
/// `ListOffsets` timestamp: the log start offset.
pub const EARLIEST: i64 = -2;
/// `ListOffsets` timestamp: the end offset (with `read_committed`, the last stable offset).
pub const LATEST: i64 = -1;

/// A failed exchange: a connection, a malformed answer or an error code from the broker.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct WireError(pub String);

fn err(what: impl Into<String>) -> WireError {
    WireError(what.into())
}

/// A connection to one broker.
pub struct Connection {
    stream: TcpStream,
    correlation: i32,
}

impl Connection {
    /// Connects to `address` (`host:port`) within `timeout`; every later read and write waits
    /// at most `timeout` too.
    ///
    /// # Errors
    /// An address that does not resolve, or no connection within `timeout`.
    pub fn open(address: &str, timeout: Duration) -> Result<Connection, WireError> {
        let addrs = address
            .to_socket_addrs()
            .map_err(|e| err(format!("{address}: {e}")))?;
        let mut last = err(format!("{address}: no address"));
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(stream) => {
                    let io = |e: std::io::Error| err(format!("{address}: {e}"));
                    stream.set_read_timeout(Some(timeout)).map_err(io)?;
                    stream.set_write_timeout(Some(timeout)).map_err(io)?;
                    stream.set_nodelay(true).map_err(io)?;
                    return Ok(Connection {
                        stream,
                        correlation: 0,
                    });
                }
                Err(e) => last = err(format!("{address}: {e}")),
            }
        }
        Err(last)
    }

    /// Sends request `api` at `version` with `body`; returns the response body.
    fn call(&mut self, api: i16, version: i16, body: &[u8]) -> Result<Vec<u8>, WireError> {
        self.correlation += 1;
        let mut header = Vec::with_capacity(16 + body.len());
        put_i16(&mut header, api);
        put_i16(&mut header, version);
        put_i32(&mut header, self.correlation);
        put_str(&mut header, CLIENT_ID);
        header.extend_from_slice(body);
        let mut frame = Vec::with_capacity(4 + header.len());
        put_i32(&mut frame, header.len() as i32);
        frame.extend_from_slice(&header);
        let io = |e: std::io::Error| err(format!("request {api} v{version}: {e}"));
        self.stream.write_all(&frame).map_err(io)?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(io)?;
        let size = i32::from_be_bytes(size);
        if size < 4 || size as usize > MAX_RESPONSE {
            return Err(err(format!("a response of {size} bytes")));
        }
        let mut response = vec![0u8; size as usize];
        self.stream.read_exact(&mut response).map_err(io)?;
        let mut r = Reader::new(&response);
        if r.i32()? != self.correlation {
            return Err(err("a response to another request"));
        }
        Ok(response[4..].to_vec())
    }

    /// The cluster's metadata: every broker it lists (registered and unfenced), and `topics`
    /// (none when empty).
    ///
    /// # Errors
    /// As [`Connection::open`], or a malformed answer.
    pub fn metadata(&mut self, topics: &[&str]) -> Result<Metadata, WireError> {
        let mut body = Vec::new();
        put_i32(&mut body, topics.len() as i32);
        for t in topics {
            put_str(&mut body, t);
        }
        body.push(0); // allow_auto_topic_creation: false
        let response = self.call(METADATA, 4, &body)?;
        let mut r = Reader::new(&response);
        r.i32()?; // throttle_time_ms
        let mut brokers = Vec::new();
        for _ in 0..r.len()? {
            let id = r.i32()?;
            let host = r.string()?;
            let port = r.i32()?;
            r.nullable_string()?; // rack
            brokers.push(BrokerAddress { id, host, port });
        }
        r.nullable_string()?; // cluster_id
        r.i32()?; // controller_id
        let mut topics = Vec::new();
        for _ in 0..r.len()? {
            let error = r.i16()?;
            let name = r.string()?;
            r.i8()?; // is_internal
            let mut partitions = Vec::new();
            for _ in 0..r.len()? {
                let error = r.i16()?;
                let id = r.i32()?;
                let leader = r.i32()?;
                let replicas = r.i32_array()?;
                let isr = r.i32_array()?;
                partitions.push(PartitionMetadata {
                    id,
                    error,
                    leader,
                    replicas,
                    isr,
                });
            }
            partitions.sort_by_key(|p| p.id);
            topics.push(TopicMetadata {
                name,
                error,
                partitions,
            });
        }
        brokers.sort_by_key(|b| b.id);
        Ok(Metadata { brokers, topics })
    }

    /// The offset at `timestamp` ([`EARLIEST`] or [`LATEST`]) of each of `partitions` of
    /// `topic`, as a `read_committed` reader sees them, in the order asked.
    ///
    /// # Errors
    /// A partition error code (not its leader, no such partition), or a malformed answer.
    pub fn list_offsets(
        &mut self,
        topic: &str,
        partitions: &[i32],
        timestamp: i64,
    ) -> Result<Vec<i64>, WireError> {
        let mut body = Vec::new();
        put_i32(&mut body, -1); // replica_id: a client
        body.push(1); // isolation_level: read_committed
        put_i32(&mut body, 1);
        put_str(&mut body, topic);
        put_i32(&mut body, partitions.len() as i32);
        for p in partitions {
            put_i32(&mut body, *p);
            put_i64(&mut body, timestamp);
        }
        let response = self.call(LIST_OFFSETS, 2, &body)?;
        let mut r = Reader::new(&response);
        r.i32()?; // throttle_time_ms
        let mut found = Vec::new();
        for _ in 0..r.len()? {
            r.string()?;
            for _ in 0..r.len()? {
                let partition = r.i32()?;
                let error = r.i16()?;
                r.i64()?; // timestamp
                let offset = r.i64()?;
                if error != 0 {
                    return Err(err(format!(
                        "offsets of {topic}/{partition}: error code {error} ({})",
                        error_name(error)
                    )));
                }
                found.push((partition, offset));
            }
        }
        partitions
            .iter()
            .map(|p| {
                found
                    .iter()
                    .find(|(q, _)| q == p)
                    .map(|(_, o)| *o)
                    .ok_or_else(|| err(format!("no offset for {topic}/{p}")))
            })
            .collect()
    }

    /// The records of `topic`/`partition` a `read_committed` reader sees from `offset` on,
    /// as far as one fetch returns them (waiting up to `max_wait` for the first), and the
    /// offset to fetch next.
    ///
    /// # Errors
    /// A partition error code, a compressed batch, or a malformed answer.
    pub fn fetch(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_wait: Duration,
    ) -> Result<(Vec<Record>, i64), WireError> {
        let mut body = Vec::new();
        put_i32(&mut body, -1); // replica_id
        put_i32(&mut body, max_wait.as_millis().min(i32::MAX as u128) as i32);
        put_i32(&mut body, 1); // min_bytes
        put_i32(&mut body, FETCH_MAX_BYTES);
        body.push(1); // isolation_level: read_committed
        put_i32(&mut body, 1);
        put_str(&mut body, topic);
        put_i32(&mut body, 1);
        put_i32(&mut body, partition);
        put_i64(&mut body, offset);
        put_i32(&mut body, PARTITION_MAX_BYTES);
        let response = self.call(FETCH, 4, &body)?;
        let mut r = Reader::new(&response);
        r.i32()?; // throttle_time_ms
        let mut out = (Vec::new(), offset);
        for _ in 0..r.len()? {
            r.string()?;
            for _ in 0..r.len()? {
                let id = r.i32()?;
                let error = r.i16()?;
                r.i64()?; // high_watermark
                r.i64()?; // last_stable_offset
                let mut aborted = Vec::new();
                for _ in 0..r.len()?.max(0) {
                    aborted.push(AbortedTransaction {
                        producer_id: r.i64()?,
                        first_offset: r.i64()?,
                    });
                }
                let records = r.nullable_bytes()?.unwrap_or_default();
                if id != partition {
                    continue;
                }
                if error != 0 {
                    return Err(err(format!(
                        "fetching {topic}/{partition} at {offset}: error code {error} ({})",
                        error_name(error)
                    )));
                }
                out = committed_records(records, offset, &aborted)?;
            }
        }
        Ok(out)
    }
}

/// A broker the metadata lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddress {
    /// Its node id.
    pub id: i32,
    /// Its advertised host.
    pub host: String,
    /// Its advertised port.
    pub port: i32,
}

impl BrokerAddress {
    /// `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// A partition as the metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMetadata {
    /// The partition.
    pub id: i32,
    /// Its error code (0: none).
    pub error: i16,
    /// The leader's node id, -1 while it has none.
    pub leader: i32,
    /// The replicas, the preferred leader first.
    pub replicas: Vec<i32>,
    /// The in-sync replicas.
    pub isr: Vec<i32>,
}

/// A topic as the metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    /// Its name.
    pub name: String,
    /// Its error code (0: none; [`UNKNOWN_TOPIC_OR_PARTITION`]: it does not exist).
    pub error: i16,
    /// Its partitions, by id.
    pub partitions: Vec<PartitionMetadata>,
}

/// An answer to a `Metadata` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// The brokers, by id.
    pub brokers: Vec<BrokerAddress>,
    /// The topics asked for.
    pub topics: Vec<TopicMetadata>,
}

/// Kafka's error code for a topic or partition that does not exist.
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// The name of the error codes a reader meets most.
fn error_name(code: i16) -> &'static str {
    match code {
        1 => "OFFSET_OUT_OF_RANGE",
        3 => "UNKNOWN_TOPIC_OR_PARTITION",
        5 => "LEADER_NOT_AVAILABLE",
        6 => "NOT_LEADER_OR_FOLLOWER",
        _ => "see Kafka's protocol error codes",
    }
}

/// A record as a `read_committed` reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key (`None`: null).
    pub key: Option<Vec<u8>>,
    /// Its value (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
    /// Its timestamp, ms since the Unix epoch.
    pub timestamp: i64,
    /// Its headers in order (`None`: a null value).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

struct AbortedTransaction {
    producer_id: i64,
    first_offset: i64,
}

/// The records of the batches in `data` at or after `from`, minus control batches and the
/// batches of aborted transactions; and the offset after the last whole batch (`from` when
/// there is none). `data` may end with a partial batch, which is left for the next fetch.
fn committed_records(
    data: &[u8],
    from: i64,
    aborted: &[AbortedTransaction],
) -> Result<(Vec<Record>, i64), WireError> {
    let mut aborted: Vec<&AbortedTransaction> = aborted.iter().collect();
    aborted.sort_by_key(|a| std::cmp::Reverse(a.first_offset));
    let mut aborting: BTreeSet<i64> = BTreeSet::new();
    let mut records = Vec::new();
    let mut next = from;
    let mut rest = data;
    while rest.len() >= 12 {
        let mut head = Reader::new(rest);
        let base_offset = head.i64()?;
        let length = head.i32()?;
        if length < 49 {
            return Err(err(format!("a record batch of {length} bytes")));
        }
        if rest.len() < 12 + length as usize {
            break; // partial: fetched again from `next`
        }
        let mut b = Reader::new(&rest[12..12 + length as usize]);
        rest = &rest[12 + length as usize..];
        b.i32()?; // partition_leader_epoch
        let magic = b.i8()?;
        if magic != 2 {
            return Err(err(format!("a record batch of magic {magic}")));
        }
        b.i32()?; // crc
        let attributes = b.i16()?;
        let last_offset = base_offset + i64::from(b.i32()?);
        let base_timestamp = b.i64()?;
        b.i64()?; // max_timestamp
        let producer_id = b.i64()?;
        b.i16()?; // producer_epoch
        b.i32()?; // base_sequence
        let count = b.i32()?;
        next = last_offset + 1;
        let transactional = attributes & 0x10 != 0;
        let control = attributes & 0x20 != 0;
        if producer_id >= 0 {
            while aborted
                .last()
                .is_some_and(|a| a.first_offset <= last_offset)
            {
                aborting.extend(aborted.pop().map(|a| a.producer_id));
            }
            if control {
                // The first record's key: version (int16), then the type: 0 abort, 1 commit.
                let first = parse_record(&mut b, 0, base_offset, base_timestamp)?;
                let kind = first.key.as_deref().and_then(|k| k.get(2..4));
                if kind == Some(&[0, 0]) {
                    aborting.remove(&producer_id);
                }
                continue;
            }
            if transactional && aborting.contains(&producer_id) {
                continue;
            }
        }
        if control {
            continue;
        }
        let codec = attributes & 0x07;
        if codec != 0 {
            let name = ["none", "gzip", "snappy", "lz4", "zstd"]
                .get(codec as usize)
                .copied()
                .unwrap_or("unknown");
            return Err(err(format!(
                "a record batch at offset {base_offset} is compressed with {name}: this reader \
                 reads uncompressed batches only"
            )));
        }
        for _ in 0..count {
            let record = parse_record(&mut b, 0, base_offset, base_timestamp)?;
            if record.offset >= from {
                records.push(record);
            }
        }
    }
    Ok((records, next))
}

/// One record of a batch (its `partition` left to the caller).
fn parse_record(
    b: &mut Reader<'_>,
    partition: i32,
    base_offset: i64,
    base_timestamp: i64,
) -> Result<Record, WireError> {
    let length = b.varint()?;
    let start = b.at;
    b.i8()?; // attributes
    let timestamp = base_timestamp + b.varint()?;
    let offset = base_offset + b.varint()?;
    let key = b.varint_bytes()?;
    let value = b.varint_bytes()?;
    let mut headers = Vec::new();
    for _ in 0..b.varint()? {
        let name = b.varint_bytes()?.unwrap_or_default();
        let value = b.varint_bytes()?;
        headers.push((String::from_utf8_lossy(&name).into_owned(), value));
    }
    if (b.at - start) as i64 != length {
        return Err(err(format!(
            "a record at offset {offset} of {length} bytes that reads as {}",
            b.at - start
        )));
    }
    Ok(Record {
        partition,
        offset,
        key,
        value,
        timestamp,
        headers,
    })
}

fn put_i16(b: &mut Vec<u8>, v: i16) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn put_i32(b: &mut Vec<u8>, v: i32) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn put_i64(b: &mut Vec<u8>, v: i64) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    put_i16(b, s.len() as i16);
    b.extend_from_slice(s.as_bytes());
}

/// Reads big-endian fields and varints from a buffer; running out is an error.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.data.len())
            .ok_or_else(|| err("a response shorter than its fields"))?;
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn i8(&mut self) -> Result<i8, WireError> {
        Ok(self.take(1)?[0] as i8)
    }

    fn i16(&mut self) -> Result<i16, WireError> {
        Ok(i16::from_be_bytes(
            self.take(2)?.try_into().unwrap_or_default(),
        ))
    }

    fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }

    fn i64(&mut self) -> Result<i64, WireError> {
        Ok(i64::from_be_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }

    /// An array's length (-1: null, read as empty).
    fn len(&mut self) -> Result<i32, WireError> {
        Ok(self.i32()?.max(0))
    }

    fn string(&mut self) -> Result<String, WireError> {
        Ok(self.nullable_string()?.unwrap_or_default())
    }

    fn nullable_string(&mut self) -> Result<Option<String>, WireError> {
        let n = self.i16()?;
        if n < 0 {
            return Ok(None);
        }
        Ok(Some(
            String::from_utf8_lossy(self.take(n as usize)?).into_owned(),
        ))
    }

    fn nullable_bytes(&mut self) -> Result<Option<&'a [u8]>, WireError> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(None);
        }
        self.take(n as usize).map(Some)
    }

    fn i32_array(&mut self) -> Result<Vec<i32>, WireError> {
        (0..self.len()?).map(|_| self.i32()).collect()
    }

    /// A zigzag varint (Kafka's record fields).
    fn varint(&mut self) -> Result<i64, WireError> {
        let mut raw: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            raw |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok((raw >> 1) as i64 ^ -((raw & 1) as i64));
            }
        }
        Err(err("a varint longer than 10 bytes"))
    }

    /// Bytes with a varint length (-1: null).
    fn varint_bytes(&mut self) -> Result<Option<Vec<u8>>, WireError> {
        let n = self.varint()?;
        if n < 0 {
            return Ok(None);
        }
        Ok(Some(self.take(n as usize)?.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(b: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            if z < 0x80 {
                b.push(z as u8);
                return;
            }
            b.push((z as u8 & 0x7f) | 0x80);
            z >>= 7;
        }
    }

    fn bytes(b: &mut Vec<u8>, v: Option<&[u8]>) {
        match v {
            None => varint(b, -1),
            Some(v) => {
                varint(b, v.len() as i64);
                b.extend_from_slice(v);
            }
        }
    }

    /// A record to encode: key, value, headers.
    type Spec<'a> = (
        Option<&'a [u8]>,
        Option<&'a [u8]>,
        &'a [(&'a str, Option<&'a [u8]>)],
    );

    /// A batch of magic 2 with `records` from `base`.
    fn batch(base: i64, producer_id: i64, attributes: i16, records: &[Spec<'_>]) -> Vec<u8> {
        let mut body = Vec::new();
        put_i32(&mut body, 0); // leader epoch
        body.push(2);
        put_i32(&mut body, 0); // crc, not checked
        put_i16(&mut body, attributes);
        put_i32(&mut body, records.len() as i32 - 1);
        put_i64(&mut body, 1_000);
        put_i64(&mut body, 1_000);
        put_i64(&mut body, producer_id);
        put_i16(&mut body, 0);
        put_i32(&mut body, 0);
        put_i32(&mut body, records.len() as i32);
        for (i, (k, v, hs)) in records.iter().enumerate() {
            let mut r = vec![0u8];
            varint(&mut r, i as i64); // timestamp delta
            varint(&mut r, i as i64); // offset delta
            bytes(&mut r, *k);
            bytes(&mut r, *v);
            varint(&mut r, hs.len() as i64);
            for (n, hv) in *hs {
                bytes(&mut r, Some(n.as_bytes()));
                bytes(&mut r, *hv);
            }
            varint(&mut body, r.len() as i64);
            body.extend_from_slice(&r);
        }
        let mut out = Vec::new();
        put_i64(&mut out, base);
        put_i32(&mut out, body.len() as i32);
        out.extend_from_slice(&body);
        out
    }

    const TXN: i16 = 0x10;
    const CONTROL: i16 = 0x30;
    const ABORT: &[u8] = &[0, 0, 0, 0];
    const COMMIT: &[u8] = &[0, 0, 0, 1];

    #[test]
    fn records_with_keys_values_and_headers_read_back() {
        let data = batch(
            5,
            -1,
            0,
            &[
                (Some(b"k"), Some(b"v"), &[("ps", Some(&[1, 2, 3]))]),
                (None, None, &[("empty", None)]),
            ],
        );
        let (records, next) = committed_records(&data, 5, &[]).unwrap();
        assert_eq!(next, 7);
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].offset, 5);
        assert_eq!(records[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(records[0].timestamp, 1_000);
        assert_eq!(records[0].headers, vec![("ps".into(), Some(vec![1, 2, 3]))]);
        assert_eq!(records[1].offset, 6);
        assert_eq!(records[1].timestamp, 1_001);
        assert_eq!(
            (records[1].key.clone(), records[1].value.clone()),
            (None, None)
        );
        assert_eq!(records[1].headers, vec![("empty".into(), None)]);
        // Records before the fetch offset are dropped; a partial batch at the end waits.
        let (records, next) = committed_records(&data[..data.len() - 1], 6, &[]).unwrap();
        assert_eq!((records.len(), next), (0, 6));
        let (records, _) = committed_records(&data, 6, &[]).unwrap();
        assert_eq!(records[0].offset, 6);
    }

    #[test]
    fn aborted_transactions_and_control_batches_are_not_records() {
        let one: &[Spec<'_>] = &[(Some(b"a"), Some(b"1"), &[])];
        let mut data = Vec::new();
        data.extend(batch(0, 7, TXN, one)); // producer 7, aborted
        data.extend(batch(1, 8, TXN, one)); // producer 8, committed
        data.extend(batch(2, 7, CONTROL, &[(Some(ABORT), Some(b""), &[])]));
        data.extend(batch(3, 8, CONTROL, &[(Some(COMMIT), Some(b""), &[])]));
        data.extend(batch(4, 7, TXN, one)); // producer 7 again, committed
        data.extend(batch(5, 7, CONTROL, &[(Some(COMMIT), Some(b""), &[])]));
        let aborted = [AbortedTransaction {
            producer_id: 7,
            first_offset: 0,
        }];
        let (records, next) = committed_records(&data, 0, &aborted).unwrap();
        assert_eq!(records.iter().map(|r| r.offset).collect::<Vec<_>>(), [1, 4]);
        assert_eq!(next, 6);
    }

    #[test]
    fn a_compressed_batch_is_an_error_naming_its_codec() {
        let data = batch(0, -1, 3, &[(None, Some(b"x"), &[])]);
        let e = committed_records(&data, 0, &[]).unwrap_err();
        assert!(e.0.contains("lz4"), "{e}");
    }
}
