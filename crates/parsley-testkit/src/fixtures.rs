//! Fixtures for tests against the real broker: unique topics, an admin client, and reading a
//! topic back up to its end offsets as `read_committed` sees them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parsley_clock::{Stamp, codec};
use parsley_runtime::{Admin, TopicInfo, TopicSpec};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::broker;

/// Deadline for fixture calls; a safety net that fails the test loudly, never a
/// synchronisation point.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The bootstrap address of the test broker.
///
/// # Panics
/// When no broker is known: run `cargo kafka up` or `cargo xtask test`.
pub fn bootstrap() -> String {
    broker::bootstrap().unwrap_or_else(|e| panic!("{e}"))
}

/// A topic name unique to this run: `{prefix}-{random}`, so tests never collide.
pub fn unique_topic(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// An admin client for the test broker.
///
/// # Panics
/// When the client cannot be created.
pub fn admin() -> Admin {
    Admin::new(&bootstrap(), Duration::from_secs(30)).expect("admin client")
}

/// Creates a unique topic with `partitions` partitions and returns its description.
///
/// # Panics
/// When creation fails.
pub fn create_topic(prefix: &str, partitions: i32) -> TopicInfo {
    let name = unique_topic(prefix);
    admin()
        .create_topics(&[TopicSpec::new(name, partitions)])
        .expect("create topic")
        .remove(0)
}

/// One record read back from a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// The record timestamp, ms since the epoch, if it has one.
    pub timestamp: Option<i64>,
    /// The decoded stamp header, if present.
    pub stamp: Option<Stamp>,
    /// Every header, in order (`None`: a null value), the stamp included.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl ReadRecord {
    /// The value of the first header named `name`, as UTF-8 text (lossy), if present and not
    /// null.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// A `read_committed` consumer (no group) for `topic`.
///
/// # Panics
/// When the client cannot be created.
pub fn committed_consumer() -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique_topic("fixture"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .expect("consumer")
}

/// The end offsets of `topic`'s partitions as a `read_committed` consumer sees them (the LSO).
///
/// # Panics
/// On a broker error.
pub fn committed_end_offsets(topic: &TopicInfo) -> HashMap<i32, i64> {
    use rdkafka::types::RDKafkaErrorCode as C;
    let c = committed_consumer();
    let started = Instant::now();
    (0..topic.partitions)
        .map(|p| {
            loop {
                match c.fetch_watermarks(&topic.name, p, DEADLINE) {
                    Ok((_, high)) => return (p, high),
                    // Right after a broker restart the partition's leader is not elected yet.
                    Err(e)
                        if matches!(
                            e.rdkafka_error_code(),
                            Some(
                                C::NotLeaderForPartition
                                    | C::LeaderNotAvailable
                                    | C::AllBrokersDown
                            )
                        ) && started.elapsed() < DEADLINE =>
                    {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => panic!("watermarks of {}/{p}: {e}", topic.name),
                }
            }
        })
        .collect()
}

/// Reads every committed record of `topic` from offset 0 until the consumer's position on
/// each partition reaches the end offset a `read_committed` consumer saw when the call began
/// (evidence: positions, not silence). Records are returned per partition in offset order.
///
/// A node that cannot be reached (a stopped node of a cluster) is not an error: its partitions
/// are read once they are led elsewhere.
///
/// # Panics
/// On a broker error, a malformed stamp, or when the end is not reached within [`DEADLINE`].
pub fn read_committed(topic: &TopicInfo) -> Vec<ReadRecord> {
    let ends = committed_end_offsets(topic);
    let consumer = committed_consumer();
    let mut tpl = TopicPartitionList::new();
    for p in 0..topic.partitions {
        tpl.add_partition_offset(&topic.name, p, Offset::Beginning)
            .expect("tpl");
    }
    consumer.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let started = Instant::now();
    loop {
        let positions = consumer.position().expect("position");
        let done = (0..topic.partitions).all(|p| {
            let end = ends[&p];
            end == 0
                || matches!(
                    positions.find_partition(&topic.name, p).map(|e| e.offset()),
                    Some(Offset::Offset(o)) if o >= end
                )
        });
        if done {
            return out;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "read_committed({}): ends {ends:?} not reached, positions {positions:?}",
            topic.name
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = match m {
                Ok(m) => m,
                // A node of a cluster that is down (the consumer carries on with the others).
                Err(rdkafka::error::KafkaError::MessageConsumption(
                    rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure
                    | rdkafka::types::RDKafkaErrorCode::AllBrokersDown,
                )) => continue,
                Err(e) => panic!("poll: {e}"),
            };
            let stamp = m.headers().and_then(|h| {
                h.iter()
                    .find(|h| parsley_clock::is_stamp_header(h.key))
                    .map(|h| codec::decode(h.value.unwrap_or_default()).expect("stamp"))
            });
            let headers = m.headers().map_or_else(Vec::new, |h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            });
            out.push(ReadRecord {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                timestamp: m.timestamp().to_millis(),
                stamp,
                headers,
            });
        }
    }
}

/// The values of every committed record of `topic`, as UTF-8 text, partition by partition in
/// offset order.
///
/// # Panics
/// On a broker error, a record without a value or a value that is not UTF-8.
pub fn committed_values(topic: &TopicInfo) -> Vec<String> {
    read_committed(topic)
        .into_iter()
        .map(|r| String::from_utf8(r.value.expect("a value")).expect("UTF-8"))
        .collect()
}

/// Runs `topology` on the local broker until stage `stage` has committed `deliveries`, stops
/// it (a final commit) and returns the stage's counters.
///
/// # Panics
/// As [`wait_committed`], or when the runtime cannot start or stop.
pub fn run_until(
    topology: &parsley_stage::Topology,
    stage: &str,
    deliveries: u64,
) -> parsley_runtime::MetricsSnapshot {
    let running = parsley_runtime::Runtime::new(
        topology.clone(),
        parsley_runtime::RuntimeConfig::new(bootstrap()),
    )
    .start()
    .expect("the runtime starts");
    wait_committed(&running, stage, deliveries);
    running.stop().expect("the runtime stops")[0].1
}

/// Waits for the first stage of `running` to fail and returns its error: the stage's own typed
/// error, as [`Progress::Failed`](parsley_runtime::Progress::Failed) carries it (match on
/// `*error`).
///
/// # Panics
/// When no stage fails within [`DEADLINE`].
pub fn next_failure(running: &parsley_runtime::Running) -> std::sync::Arc<parsley_runtime::Error> {
    let started = Instant::now();
    loop {
        let left = DEADLINE.saturating_sub(started.elapsed());
        match running.next_progress(left) {
            Some(parsley_runtime::Progress::Failed { error, .. }) => return error,
            Some(_) if !left.is_zero() => {}
            _ => panic!("no stage failed within {DEADLINE:?}"),
        }
    }
}

/// Waits for progress events of `running` until stage `stage` has committed at least
/// `deliveries` deliveries; returns its counters then.
///
/// # Panics
/// When a stage fails, or the count is not reached within [`DEADLINE`].
pub fn wait_committed(
    running: &parsley_runtime::Running,
    stage: &str,
    deliveries: u64,
) -> parsley_runtime::MetricsSnapshot {
    wait_metrics(
        running,
        stage,
        &format!("{deliveries} committed deliveries"),
        |m| m.committed_deliveries >= deliveries,
    )
}

/// Waits until the counters of stage `stage` satisfy `done` (described by `what`); returns
/// them then. Progress events wake the wait early; counters that move without a commit (such
/// as `fetched`) are re-read at least every 20 ms.
///
/// # Panics
/// When a stage fails, or `done` does not hold within [`DEADLINE`].
pub fn wait_metrics(
    running: &parsley_runtime::Running,
    stage: &str,
    what: &str,
    done: impl Fn(&parsley_runtime::MetricsSnapshot) -> bool,
) -> parsley_runtime::MetricsSnapshot {
    let started = Instant::now();
    loop {
        if let Some((_, m)) = running.metrics().into_iter().find(|(n, _)| n == stage)
            && done(&m)
        {
            return m;
        }
        let left = DEADLINE.saturating_sub(started.elapsed());
        assert!(
            !left.is_zero(),
            "stage {stage} did not reach {what} within {DEADLINE:?}: {:?}",
            running.metrics()
        );
        if let Some(parsley_runtime::Progress::Failed { stage, error }) =
            running.next_progress(left.min(Duration::from_millis(20)))
        {
            panic!("stage {stage} failed: {error}")
        }
    }
}

/// Waits until the per-task metrics of `stage` satisfy `done` and returns them; `what` names
/// the condition in the failure message.
///
/// # Panics
/// When the stage fails, or the condition does not hold within [`DEADLINE`].
pub fn wait_tasks(
    running: &parsley_runtime::Running,
    stage: &str,
    what: &str,
    done: impl Fn(&[parsley_runtime::TaskMetrics]) -> bool,
) -> Vec<parsley_runtime::TaskMetrics> {
    let started = Instant::now();
    loop {
        if let Some((_, tasks)) = running.task_metrics().into_iter().find(|(n, _)| n == stage)
            && done(&tasks)
        {
            return tasks;
        }
        let left = DEADLINE.saturating_sub(started.elapsed());
        assert!(
            !left.is_zero(),
            "stage {stage} did not reach {what} within {DEADLINE:?}: {:?}",
            running.task_metrics()
        );
        if let Some(parsley_runtime::Progress::Failed { stage, error }) =
            running.next_progress(left.min(Duration::from_millis(20)))
        {
            panic!("stage {stage} failed: {error}")
        }
    }
}

/// A plain producer for scripted histories: `transactional_id` makes it transactional
/// (transactions initialised).
///
/// # Panics
/// When the client cannot be created or initialised.
pub fn raw_producer(transactional_id: Option<&str>) -> rdkafka::producer::BaseProducer {
    use rdkafka::producer::Producer;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "0");
    if let Some(id) = transactional_id {
        config.set("transactional.id", id);
    }
    let producer: rdkafka::producer::BaseProducer = config.create().expect("producer");
    if transactional_id.is_some() {
        producer
            .init_transactions(DEADLINE)
            .expect("init transactions");
    }
    producer
}

/// Sends one record with `stamp` (if any) in the stamp header to an explicit
/// partition and waits until it is acknowledged — appended in the log, in the producer's open
/// transaction if it has one. Used to script append orders.
///
/// # Panics
/// When the send fails or is not acknowledged within [`DEADLINE`].
pub fn send_stamped(
    producer: &rdkafka::producer::BaseProducer,
    topic: &str,
    partition: i32,
    key: &[u8],
    value: &[u8],
    stamp: Option<&Stamp>,
) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, Producer};
    let bytes = stamp.map(codec::encode);
    let mut record = BaseRecord::to(topic)
        .partition(partition)
        .key(key)
        .payload(value);
    if let Some(b) = &bytes {
        record = record.headers(OwnedHeaders::new().insert(Header {
            key: parsley_clock::STAMP_HEADER,
            value: Some(b.as_slice()),
        }));
    }
    producer.send(record).map_err(|(e, _)| e).expect("send");
    producer.flush(DEADLINE).expect("flush");
}

/// A thread that sends `0`, `1`, `2`, … (key `k`, unstamped, each acknowledged before the
/// next) to partition 0 of `topic` until `stop` is set; it returns how many it sent. Used to
/// keep a stage busy while a test kills nodes.
///
/// # Panics
/// In the thread, when a send fails (see [`send_stamped`]).
pub fn spawn_writer(
    topic: &TopicInfo,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let (name, stop) = (topic.name.clone(), stop.clone());
    std::thread::spawn(move || {
        let p = raw_producer(None);
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            send_stamped(&p, &name, 0, b"k", n.to_string().as_bytes(), None);
            n += 1;
        }
        n
    })
}

/// The first key of `k0`, `k1`, … that murmur2 (the Java client's partitioner, which stages
/// check their sources' keys against) puts on `partition` of a topic with `partitions`
/// partitions: for writing a keyed record to a chosen partition.
///
/// # Panics
/// When `partition` is not in `0..partitions`.
pub fn key_on(partition: i32, partitions: i32) -> String {
    assert!(
        (0..partitions).contains(&partition),
        "partition {partition} of {partitions}"
    );
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| parsley_runtime::partition_for(k.as_bytes(), partitions) == partition)
        .expect("murmur2 reaches every partition")
}

/// Commits `offsets` (topic, partition, next offset) for consumer group `group`, as a plain
/// consumer would: sets the point a new member of the group starts from.
///
/// # Panics
/// On a broker error.
pub fn commit_group_offsets(group: &str, offsets: &[(&str, i32, i64)]) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for (t, p, o) in offsets {
        tpl.add_partition_offset(t, *p, Offset::Offset(*o))
            .expect("tpl");
    }
    consumer
        .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
        .expect("commit offsets");
}

/// The committed offset of `topic`/`partition` for `group` (read with `require_stable` under
/// `read_committed`), `None` when the group has none.
///
/// # Panics
/// On a broker error.
pub fn group_offset(group: &str, topic: &str, partition: i32) -> Option<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let committed = consumer
        .committed_offsets(tpl, DEADLINE)
        .expect("committed offsets");
    match committed.elements()[0].offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// A stage handler that forwards every record's key and value, unchanged, to one topic (UTF-8
/// keys and values): its output topic is the stage's delivery log.
#[derive(Debug, Clone)]
pub struct Forward(pub String);

impl parsley_stage::Handler for Forward {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: parsley_stage::Record<'_, String, String>,
        _: Option<()>,
    ) -> parsley_stage::HandlerResult<String, String, ()> {
        Ok(parsley_stage::Step::none().emit(self.0.as_str(), r.key, r.value))
    }
}

/// Application `app` of one stage, `count`, counting the records of each key of `input`
/// into `output` with [`CountKeys`] (UTF-8 throughout): the topology of most restore,
/// rebalance and recovery tests.
///
/// # Panics
/// When the topology is invalid.
pub fn count_topology(app: &str, input: &str, output: &str) -> parsley_stage::Topology {
    parsley_stage::Topology::builder(app)
        .stage("count", CountKeys::new(output), |s| {
            utf8_stage(s, &[input], &[output])
        })
        .build()
        .expect("a valid topology")
}

/// `per_partition` keys (`k0`, `k1`, …) on each of `partitions` partitions, where the default
/// partitioner (murmur2) puts them: (partition, key) pairs in the order found.
pub fn keys_on_each_partition(per_partition: usize, partitions: i32) -> Vec<(i32, String)> {
    let mut seen = vec![0usize; partitions.max(0) as usize];
    let total = per_partition * seen.len();
    (0..)
        .map(|i| format!("k{i}"))
        .map(|k| (parsley_runtime::partition_for(k.as_bytes(), partitions), k))
        .filter(|(p, _)| {
            seen[*p as usize] += 1;
            seen[*p as usize] <= per_partition
        })
        .take(total)
        .collect()
}

/// A stage handler that counts the records of each key (its fold state) and emits `key=n`, the
/// running count, to one topic (UTF-8 keys and values). [`CountKeys::failing_once_on`] makes
/// the first record with a given value fail in the handler, before the transaction commits.
#[derive(Debug)]
pub struct CountKeys {
    sink: String,
    fail_once_on: Option<String>,
    failed: std::sync::atomic::AtomicBool,
}

impl CountKeys {
    /// Counts and never fails.
    pub fn new(sink: &str) -> Self {
        CountKeys {
            sink: sink.to_string(),
            fail_once_on: None,
            failed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Counts; the first record whose value is `value` fails its handler (`"dying before the
    /// commit"`), later ones are counted.
    pub fn failing_once_on(sink: &str, value: &str) -> Self {
        CountKeys {
            fail_once_on: Some(value.to_string()),
            ..CountKeys::new(sink)
        }
    }
}

impl parsley_stage::Handler for CountKeys {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = u64;

    fn handle(
        &self,
        r: parsley_stage::Record<'_, String, String>,
        n: Option<u64>,
    ) -> parsley_stage::HandlerResult<String, String, u64> {
        use std::sync::atomic::Ordering;
        if self.fail_once_on.as_deref() == Some(r.value.as_str())
            && !self.failed.swap(true, Ordering::SeqCst)
        {
            return Err("dying before the commit".into());
        }
        let n = n.unwrap_or(0) + 1;
        let line = format!("{}={n}", r.key);
        Ok(parsley_stage::Step::none()
            .set_state(n)
            .emit(self.sink.as_str(), r.key, line))
    }
}

/// A stage handler that sums the `u32` values (JSON) of each key into one topic as
/// `key=total` (UTF-8 keys and output) and fails on the value 13 (`"unlucky"`): a value that
/// does not decode, a handler error and a record without a key are its bad records.
#[derive(Debug, Clone)]
pub struct SumValues(pub String);

impl parsley_stage::Handler for SumValues {
    type Key = String;
    type Value = u32;
    type Output = String;
    type State = u32;

    fn handle(
        &self,
        r: parsley_stage::Record<'_, String, u32>,
        s: Option<u32>,
    ) -> parsley_stage::HandlerResult<String, String, u32> {
        if r.value == 13 {
            return Err("unlucky".into());
        }
        let total = s.unwrap_or(0) + r.value;
        let line = format!("{}={total}", r.key);
        Ok(parsley_stage::Step::none()
            .set_state(total)
            .emit(self.0.as_str(), r.key, line))
    }
}

/// A stage handler that keeps no fold state (`State = ()`) and copies each record to one topic,
/// a record without a key too: its keys are `Option<String>` (JSON: an absent key is `None`),
/// its values UTF-8 text.
#[derive(Debug, Clone)]
pub struct CopyRecords(pub String);

impl parsley_stage::Handler for CopyRecords {
    type Key = Option<String>;
    type Value = String;
    type Output = String;
    type State = ();

    fn handle(
        &self,
        r: parsley_stage::Record<'_, Option<String>, String>,
        _: Option<()>,
    ) -> parsley_stage::HandlerResult<Option<String>, String, ()> {
        Ok(parsley_stage::Step::none().emit(self.0.as_str(), r.key, r.value))
    }
}

/// A topology of application `app` with one stage, `forward`, that reads `sources` and
/// forwards every record to `sink` ([`Forward`]), with `policy` for impossible stamps.
///
/// # Panics
/// When the topology is invalid.
pub fn forward_topology(
    app: &str,
    sources: &[&str],
    sink: &str,
    policy: parsley_stage::ImpossiblePolicy,
) -> parsley_stage::Topology {
    forward_topology_with(app, sources, sink, |s| s.on_impossible_stamp(policy))
}

/// [`forward_topology`]'s stage (UTF-8 codecs throughout), further configured by `configure`
/// (for example `|s| s.order_by_event_time(EventTimeOrder::new())`).
///
/// # Panics
/// When the topology is invalid.
pub fn forward_topology_with(
    app: &str,
    sources: &[&str],
    sink: &str,
    configure: impl FnOnce(parsley_stage::StageBuilder<Forward>) -> parsley_stage::StageBuilder<Forward>,
) -> parsley_stage::Topology {
    parsley_stage::Topology::builder(app)
        .stage("forward", Forward(sink.to_string()), |s| {
            configure(utf8_stage(s, sources, &[sink]))
        })
        .build()
        .expect("a valid topology")
}

/// Stage `s` reading `sources` and writing `sinks`, with UTF-8 keys, values and outputs: the
/// shape of most test stages.
pub fn utf8_stage<H>(
    s: parsley_stage::StageBuilder<H>,
    sources: &[&str],
    sinks: &[&str],
) -> parsley_stage::StageBuilder<H>
where
    H: parsley_stage::Handler<Key = String, Value = String, Output = String>,
{
    use parsley_stage::Utf8;
    let s = sources.iter().fold(s, |s, t| s.source(*t));
    sinks
        .iter()
        .fold(s, |s, t| s.sink(*t))
        .key_codec(Utf8)
        .value_codec(Utf8)
        .output_codec(Utf8)
}

/// A GET of `path` on the HTTP endpoint at `address` (the metrics endpoint): its status and
/// body, waiting at most 30 s.
///
/// # Panics
/// When the request fails or the body is not UTF-8.
pub fn http_get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    let r = minreq::get(format!("http://{address}{path}"))
        .with_timeout(30)
        .send()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    (r.status_code, r.as_str().expect("UTF-8").to_string())
}
