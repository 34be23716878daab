//! Runtime configuration.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;

use crate::clients::{ClientRole, ClientSettings};
use parsley_task::GateMode;

/// How a [`Runtime`](crate::Runtime) talks to Kafka and paces its transactions.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// `host:port[,…]` of the cluster.
    pub bootstrap: String,
    /// How often a stream thread commits its transaction (outputs, state, input offsets).
    /// Also bounds the end-to-end latency of a record. Default 100 ms.
    pub commit_interval: Duration,
    /// Fetched-but-undelivered records per channel before its partition is paused.
    /// Default 10,000.
    pub max_queued_per_channel: usize,
    /// Deadline of each blocking Kafka call (commit, metadata, acks). Default 30 s.
    pub timeout: Duration,
    /// Distinguishes this process's transactional ids from other instances'. Default: random.
    /// Give a process the same id across its restarts (and no other live process that id):
    /// its restart then fences its predecessor's producer at once and, with
    /// [`RuntimeConfig::static_membership`], takes its tasks back without a rebalance.
    pub instance_id: String,
    /// Static group membership (KIP-345): each stage's consumer joins its group as
    /// `group.instance.id = {group}-{instance_id}` ([`RuntimeConfig::group_instance_id`]).
    /// Default `false`. See [`RuntimeConfig::static_membership`].
    pub static_membership: bool,
    /// Whether the gate enforces stamps. Default [`GateMode::Causal`].
    pub gate: GateMode,
    /// The user's librdkafka settings for every client the runtime creates, and per role
    /// (security, client id prefix, anything librdkafka takes; see [`ClientSettings`]).
    pub clients: ClientSettings,
    /// librdkafka statistics of the stage's consumer and producer: how often, and who
    /// receives them. Default: none.
    pub statistics: Option<(Duration, StatisticsSink)>,
    /// Where the stages' metrics, health and explanations are served over HTTP. Default:
    /// nowhere. See
    /// [`RuntimeConfig::metrics_address`].
    pub metrics_address: Option<SocketAddr>,
    /// The `host:port` at which this instance serves its application (Kafka Streams'
    /// `application.server`), advertised to the other instances of its stages for
    /// [`Running::key_owner`](crate::Running::key_owner). Default: none. See
    /// [`RuntimeConfig::application_endpoint`].
    pub application_endpoint: Option<String>,
    /// Where the stages keep their fold state: `None` (the default) on the heap; `Some(dir)`
    /// on disk, in an embedded store under `dir/{group id}` with a local checkpoint, so state
    /// may outgrow memory and a restart reads only the changelog's tail. See
    /// [`RuntimeConfig::state_dir`].
    pub state_dir: Option<PathBuf>,
    /// Topic configs for the changelogs the runtime creates, over
    /// [`CHANGELOG_DEFAULTS`](crate::CHANGELOG_DEFAULTS). Default: none. See
    /// [`RuntimeConfig::changelog_property`].
    pub changelog: Vec<(String, String)>,
    /// Warm copies kept per task, on average over the instances. Default 0. See
    /// [`RuntimeConfig::standby_replicas`].
    pub standby_replicas: usize,
    /// Stream threads per stage in this process. Default 1. See
    /// [`RuntimeConfig::stream_threads`].
    pub stream_threads: usize,
    /// The stream thread this configuration is for (its index among its stage's threads in
    /// this process): set by the runtime for each thread it starts.
    pub(crate) thread: usize,
    /// One memory bound for the state of every stage run with this configuration (its clones
    /// share it). Default: none. See [`RuntimeConfig::state_memory_bytes`].
    pub state_memory: Option<parsley_task::memory::MemoryBudget>,
    /// Where the stage aborts its process on purpose, for fault-injection tests.
    #[cfg(feature = "fault-injection")]
    crash: Option<crate::fault::CrashPoint>,
    /// The fault put into the stage's producer on purpose, for fault-injection tests.
    #[cfg(feature = "fault-injection")]
    fault: Option<crate::fault::ArmedFault>,
}

/// Receives the statistics of a stage's librdkafka clients: one JSON document per client
/// every interval (librdkafka's `statistics.interval.ms`; the fields are described in
/// librdkafka's `STATISTICS.md`, and `rdkafka::statistics::Statistics` parses them). Called on
/// a librdkafka thread: it should hand the bytes on and return.
#[derive(Clone)]
pub struct StatisticsSink(Arc<Receive>);

/// What a [`StatisticsSink`] calls with each document.
type Receive = dyn Fn(&[u8]) + Send + Sync;

impl StatisticsSink {
    /// A sink that calls `receive` with each JSON document.
    pub fn new(receive: impl Fn(&[u8]) + Send + Sync + 'static) -> Self {
        StatisticsSink(Arc::new(receive))
    }

    /// Hands one JSON document to the sink.
    pub(crate) fn receive(&self, json: &[u8]) {
        (self.0)(json);
    }
}

impl fmt::Debug for StatisticsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StatisticsSink")
    }
}

impl RuntimeConfig {
    /// Defaults for the cluster at `bootstrap`.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        RuntimeConfig {
            bootstrap: bootstrap.into(),
            commit_interval: Duration::from_millis(100),
            max_queued_per_channel: 10_000,
            timeout: Duration::from_secs(30),
            instance_id: uuid_like(),
            static_membership: false,
            gate: GateMode::Causal,
            clients: ClientSettings::new(),
            statistics: None,
            metrics_address: None,
            application_endpoint: None,
            state_dir: None,
            changelog: Vec::new(),
            standby_replicas: 0,
            stream_threads: 1,
            thread: 0,
            state_memory: None,
            #[cfg(feature = "fault-injection")]
            crash: None,
            #[cfg(feature = "fault-injection")]
            fault: None,
        }
    }

    /// Arms a crash point: a stage run with this configuration aborts its process there (see
    /// [`CrashPoint`](crate::CrashPoint)). For fault-injection tests only; exists with
    /// the cargo feature `fault-injection`.
    #[cfg(feature = "fault-injection")]
    pub fn crash_at(mut self, point: crate::fault::CrashPoint) -> Self {
        self.crash = Some(point);
        self
    }

    /// Arms a producer fault: a stage run with this configuration puts it into its producer
    /// once (see [`ProducerFault`](crate::ProducerFault)). For fault-injection tests only;
    /// exists with the cargo feature `fault-injection`.
    #[cfg(feature = "fault-injection")]
    pub fn inject(mut self, fault: crate::fault::ProducerFault) -> Self {
        self.fault = Some(crate::fault::ArmedFault::new(fault));
        self
    }

    /// Whether the armed producer fault is `fault` and fires now (once per configuration).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn fire(&self, fault: crate::fault::ProducerFault) -> bool {
        self.fault.as_ref().is_some_and(|f| f.fire(fault))
    }

    /// The armed crash point, if any.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn crash_point(&self) -> Option<crate::fault::CrashPoint> {
        self.crash
    }

    /// Sets the commit interval.
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// Sets the gate mode; see `GateMode::Off` before using it.
    pub fn gate(mut self, mode: GateMode) -> Self {
        self.gate = mode;
        self
    }

    /// Sets the instance id ([`RuntimeConfig::instance_id`]): stable across a process's
    /// restarts, unique among the live processes of the application.
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = id.into();
        self
    }

    /// Turns static group membership (KIP-345) on or off (default off, as in Kafka Streams,
    /// which leaves it off unless `group.instance.id` is set).
    ///
    /// On: each stage's consumer joins its group with `group.instance.id =
    /// {group}-{instance_id}`. A process restarted with the same [`instance_id`] within the
    /// session timeout gets its tasks back at once, without a rebalance and without waiting
    /// for the coordinator to expire the member it replaces — the point is a process whose
    /// every restart (a deploy, a crash, `kill -9`) would otherwise leave its tasks idle for
    /// up to `session.timeout.ms` or move them twice. Useful only when each process keeps its
    /// `instance_id` across restarts (the default id is random: set one).
    ///
    /// The price: a static member does not leave its group when it stops — librdkafka sends no
    /// `LeaveGroup` for one, even on a clean [`Running::stop`](crate::Running::stop). Its tasks
    /// stay its own, idle, until it comes back or its session times out (`session.timeout.ms`,
    /// librdkafka's default 45 s; up to the broker's `group.max.session.timeout.ms`): another
    /// instance takes them over only then. To move a stopped static member's tasks sooner,
    /// remove the member from the group (the Java admin client's
    /// `removeMembersFromConsumerGroup`, KIP-345; librdkafka has no such call) or give it a
    /// shorter session timeout.
    ///
    /// [`instance_id`]: RuntimeConfig::instance_id
    pub fn static_membership(mut self, on: bool) -> Self {
        self.static_membership = on;
        self
    }

    /// The `group.instance.id` of the stage whose consumer group is `group`:
    /// `{group}-{instance_id}` with [static membership](RuntimeConfig::static_membership),
    /// else `None` (a dynamic member).
    ///
    /// Stream thread `i > 0` of a stage ([`RuntimeConfig::stream_threads`]) is a member of its
    /// own: `{group}-{instance_id}-{i}`.
    pub fn group_instance_id(&self, group: &str) -> Option<String> {
        self.static_membership.then(|| match self.thread {
            0 => format!("{group}-{}", self.instance_id),
            i => format!("{group}-{}-{i}", self.instance_id),
        })
    }

    /// The consumer's `session.timeout.ms` as the user set it, else librdkafka's default
    /// (45 s): how long the group coordinator waits for a member that stopped heartbeating
    /// (a dead process, a static member that stopped) before it gives its partitions to
    /// others.
    pub(crate) fn session_timeout(&self) -> Duration {
        self.clients
            .get(ClientRole::Consumer, "session.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(Duration::from_secs(45), Duration::from_millis)
    }

    /// The transactional id of the stage whose consumer group is `group`, for its first stream
    /// thread: `{group}-{instance_id}-0`. Each stream thread has a transactional producer of its
    /// own, thread `i` with id `{group}-{instance_id}-{i}`
    /// ([`RuntimeConfig::thread_transactional_id`]).
    pub fn transactional_id(&self, group: &str) -> String {
        self.thread_transactional_id(group, self.thread)
    }

    /// The transactional id of stream thread `thread` of the stage whose consumer group is
    /// `group`: `{group}-{instance_id}-{thread}` (as Kafka Streams' exactly-once v2, one
    /// transactional producer per stream thread). Grant `WRITE` on the transactional ids with
    /// the prefix `{group}-{instance_id}-` to cover every thread.
    pub fn thread_transactional_id(&self, group: &str, thread: usize) -> String {
        format!("{group}-{}-{thread}", self.instance_id)
    }

    /// Runs `n` stream threads per stage in this process (Kafka Streams' `num.stream.threads`;
    /// default 1, and `0` counts as 1). Each thread is a member of the stage's consumer group
    /// with a consumer of its own and a transactional producer of its own
    /// ([`RuntimeConfig::thread_transactional_id`]), so the group's assignor spreads the stage's
    /// tasks over the threads of every instance, and each task lives on one thread. The
    /// threads of a stage share its state store under [`RuntimeConfig::state_dir`] (a task
    /// moving between them finds its local state) and its standbys. Metrics, health, queries
    /// and explanations cover every thread of a stage. [`Runtime::run_stage`](crate::Runtime::run_stage)
    /// runs one stream thread, the calling one.
    pub fn stream_threads(mut self, n: usize) -> Self {
        self.stream_threads = n.max(1);
        self
    }

    /// This configuration for stream thread `thread` of a stage.
    pub(crate) fn for_thread(mut self, thread: usize) -> Self {
        self.thread = thread;
        self
    }

    /// Refuses a consumer `group.protocol` other than `classic` (any case), which the stages cannot
    /// work under
    /// ([`SetupError::UnsupportedGroupProtocol`](crate::SetupError::UnsupportedGroupProtocol) says
    /// why). Not set, or `classic`: `Ok`.
    ///
    /// # Errors
    /// [`SetupError::UnsupportedGroupProtocol`](crate::SetupError::UnsupportedGroupProtocol) naming
    /// the value.
    pub(crate) fn check_group_protocol(&self) -> crate::Result<()> {
        match self.clients.get(ClientRole::Consumer, "group.protocol") {
            Some(p) if !p.trim().eq_ignore_ascii_case("classic") => Err(crate::Error::Setup(
                crate::SetupError::UnsupportedGroupProtocol {
                    protocol: p.to_string(),
                },
            )),
            _ => Ok(()),
        }
    }

    /// The producer's `transaction.timeout.ms` as the user set it, else librdkafka's default
    /// (60 s): the coordinator aborts a transaction open longer than this.
    pub(crate) fn transaction_timeout(&self) -> Duration {
        self.clients
            .get(ClientRole::Producer, "transaction.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(Duration::from_secs(60), Duration::from_millis)
    }

    /// Sets a librdkafka property on every client the runtime creates (consumer, producer,
    /// admin, changelog restore): security settings go here.
    pub fn client_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.clients = self.clients.set(key, value);
        self
    }

    /// Replaces the user's client settings.
    pub fn client_settings(mut self, clients: ClientSettings) -> Self {
        self.clients = clients;
        self
    }

    /// Sets a librdkafka property on each stage's consumer of its sources.
    pub fn consumer_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.clients = self.clients.set_for(ClientRole::Consumer, key, value);
        self
    }

    /// Sets a librdkafka property on each stage's transactional producer.
    pub fn producer_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.clients = self.clients.set_for(ClientRole::Producer, key, value);
        self
    }

    /// Sends librdkafka's statistics of every stage's consumer and transactional producer to
    /// `sink` every `interval` (at least 1 ms: librdkafka counts it in milliseconds).
    pub fn statistics(mut self, interval: Duration, sink: StatisticsSink) -> Self {
        self.statistics = Some((interval.max(Duration::from_millis(1)), sink));
        self
    }

    /// Serves the stages' metrics and health over HTTP at `address` (off by default):
    ///
    /// - `GET /metrics`: every stage and task metric the runtime keeps, and librdkafka's
    ///   consumer lag, request round-trip times and transaction state, in the Prometheus text
    ///   format (version 0.0.4; names `parsley_…`, listed in the book's operations chapter);
    /// - `GET /health/live`: 200 while the endpoint runs;
    /// - `GET /health/ready`: 200 once every stage has its assignment and every task is
    ///   restored; 503 with a plain-text reason while a stage waits for its assignment,
    ///   restores a task, is stopping, or has ended (failed, panicked or stopped);
    /// - `GET /explain`: why each stage's records wait, as JSON
    ///   ([`Running::explain`](crate::Running::explain)'s [`Explanation`](crate::Explanation)).
    ///
    /// [`Runtime::start`](crate::Runtime::start) and
    /// [`Runtime::start_stages`](crate::Runtime::start_stages) bind it (each call its own listener,
    /// for the stages it starts: with a fixed port, stop one group before starting another; port 0
    /// picks a free port), [`Running::metrics_address`](crate::Running::metrics_address) reports
    /// it, and [`Running::stop`](crate::Running::stop) closes it once every stage has stopped (so
    /// does dropping the [`Running`](crate::Running)). An address that cannot be bound makes the
    /// start fail with [`SetupError::MetricsListener`](crate::SetupError::MetricsListener) before
    /// any stage starts. [`Runtime::run_stage`](crate::Runtime::run_stage) serves nothing.
    ///
    /// With the endpoint on, each stage's consumer and producer report librdkafka's statistics
    /// every 5 s, or at the interval of [`RuntimeConfig::statistics`], whose sink still gets
    /// every document; without a sink they are not logged.
    ///
    /// The endpoint has neither authentication nor TLS, and its metrics name the stages and
    /// topics: bind it to an address only trusted clients reach (a wildcard address such as
    /// `0.0.0.0` serves every interface).
    pub fn metrics_address(mut self, address: impl Into<SocketAddr>) -> Self {
        self.metrics_address = Some(address.into());
        self
    }

    /// Advertises `endpoint` (`host:port`, the address at which this instance serves its
    /// application — its own API, or the metrics endpoint's `/store` route) to the other
    /// instances of its stages, as Kafka Streams' `application.server`:
    /// [`Running::key_owner`](crate::Running::key_owner) names it as the owner of the keys
    /// of the tasks this instance holds. It travels in the client id of each stage's consumer,
    /// `{group}-consumer|{instance_id}|{endpoint}`, which the group coordinator lists with each
    /// member (`DescribeGroups`): no topic and no extra request. Neither
    /// [`RuntimeConfig::instance_id`] nor `endpoint` may contain `|`.
    pub fn application_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.application_endpoint = Some(endpoint.into());
        self
    }

    /// Keeps every stage's fold state on disk under `dir` instead of on the heap: one embedded
    /// store per stage at `dir/{group id}` (a log-structured merge tree, the crate `fjall`),
    /// one keyspace per task. The changelog stays the source of truth; the store is its local
    /// copy up to a checkpoint written with each commit, so a restart or a task coming back
    /// reads only the changelog's tail (as Kafka Streams' `state.dir` with RocksDB). Choose it
    /// for state larger than memory; the heap (the default) is faster. Two instances of a stage
    /// on one machine need different directories: a store is held by one process at a time
    /// (the second fails with [`ProcessingError::StateStore`](crate::ProcessingError::StateStore)).
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Sets topic config `key` to `value` on every changelog the runtime creates from now on
    /// (as Kafka Streams' `topic.`-prefixed settings): it wins over
    /// [`CHANGELOG_DEFAULTS`](crate::CHANGELOG_DEFAULTS) and the broker's defaults. A changelog
    /// that exists already keeps its configs (change them with the cluster's tools).
    /// `cleanup.policy` stays `compact` unless set here.
    pub fn changelog_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.changelog.push((key.into(), value.into()));
        self
    }

    /// Keeps warm copies of tasks this instance does not own — standbys, as Kafka Streams'
    /// `num.standby.replicas` — so that a task assigned here after its owner died or left
    /// restores only the changelog's tail. After each assignment every stage warms the
    /// `n × owned` tasks it does not own nearest its own in partition order (with the range
    /// assignor those that move to it when a neighbouring member leaves; `n` copies per task
    /// on average), each by reading its changelog partition `read_committed`: in memory, or
    /// with [`RuntimeConfig::state_dir`] into the state store, up to a checkpoint. Costs: the
    /// memory (or disk) of those tasks' state, and one consumer per stage reading their
    /// changelogs. `0` (the default): none. Figures per standby:
    /// [`Running::standby_metrics`](crate::Running::standby_metrics).
    pub fn standby_replicas(mut self, n: usize) -> Self {
        self.standby_replicas = n;
        self
    }

    /// Bounds the memory of the state of every stage of the process to `bytes` (Kafka Streams'
    /// `statestore.cache.max.bytes`, shared by all stream threads, with RocksDB's bounded
    /// memory): the state stores' block caches and write buffers (sized from it), the fold
    /// state on the heap (on disk: the changes not in the store yet), standbys held in memory,
    /// and the records fetched and not delivered yet. At the bound a stage stops reading what it
    /// may stop reading and spills the held records of what it must read on, until commits
    /// bring use back under ⅞ of it; nothing is dropped. Every stage run with this
    /// configuration or a clone of it shares the one bound. The book's operations chapter
    /// ("One memory bound") says what counts and what happens at the bound. Use:
    /// [`Running::state_memory`](crate::Running::state_memory), and the `parsley_state_memory_…`
    /// metrics. Default: no bound.
    ///
    /// # Panics
    /// When `bytes` is 0.
    pub fn state_memory_bytes(mut self, bytes: u64) -> Self {
        assert!(bytes > 0, "state_memory_bytes must be above 0");
        self.state_memory = Some(parsley_task::memory::MemoryBudget::new(bytes));
        self
    }

    /// This configuration for the stage whose metrics are `metrics`, served on the metrics
    /// endpoint: its clients' statistics documents are also digested into `metrics` (at the
    /// interval set, else every [`ENDPOINT_STATISTICS_INTERVAL`]).
    pub(crate) fn digesting_statistics(
        mut self,
        metrics: Arc<parsley_task::metrics::StageMetrics>,
    ) -> Self {
        let (interval, user) = match self.statistics.take() {
            Some((interval, sink)) => (interval, Some(sink)),
            None => (ENDPOINT_STATISTICS_INTERVAL, None),
        };
        let sink = StatisticsSink::new(move |json| {
            metrics.record_statistics(json);
            if let Some(user) = &user {
                user.receive(json);
            }
        });
        self.statistics = Some((interval, sink));
        self
    }

    /// The configuration of a client of `role` for the stage whose consumer group is `group`
    /// (`client.id` `{group}-{role}`, `{group}-{role}-{i}` for stream thread `i > 0`), with the runtime's own settings `own`; the stage's
    /// consumer and producer also report statistics when a sink is set, and its consumer gets
    /// its `group.instance.id` with static membership. The one place a stage's clients are
    /// configured (see [`ClientSettings`] for the order).
    pub(crate) fn client_config(
        &self,
        group: &str,
        role: ClientRole,
        own: &[(&str, &str)],
    ) -> ClientConfig {
        // Thread 0's clients keep the names of a stage with one thread.
        let role_name = match self.thread {
            0 => role.name().to_string(),
            i => format!("{}-{i}", role.name()),
        };
        let id = match (&self.application_endpoint, role) {
            (Some(endpoint), ClientRole::Consumer) => {
                format!("{group}-{role_name}|{}|{endpoint}", self.instance_id)
            }
            _ => format!("{group}-{role_name}"),
        };
        let interval = self
            .statistics
            .as_ref()
            .filter(|_| matches!(role, ClientRole::Consumer | ClientRole::Producer))
            .map(|(interval, _)| interval.as_millis().to_string());
        let instance = (role == ClientRole::Consumer)
            .then(|| self.group_instance_id(group))
            .flatten();
        let mut settings = own.to_vec();
        if let Some(ms) = &interval {
            settings.push(("statistics.interval.ms", ms));
        }
        if let Some(instance) = &instance {
            settings.push(("group.instance.id", instance));
        }
        self.clients.config(&self.bootstrap, role, &id, &settings)
    }

    /// The configuration of a consumer the runtime keeps beside a stage's own — the progress
    /// reader of a stage's group (`caught_up`) — named `{name}-consumer`, with `own`: the
    /// user's client settings as every consumer gets them, but never statistics (nothing
    /// would read them: librdkafka queues a statistics event every interval on a client that
    /// is polled now and then, and rdkafka's default context logs each one at INFO when it is)
    /// and never a `group.instance.id` (it never joins the group).
    pub(crate) fn internal_consumer_config(
        &self,
        name: &str,
        own: &[(&str, &str)],
    ) -> ClientConfig {
        let id = format!("{name}-{}", ClientRole::Consumer.name());
        self.clients
            .config(&self.bootstrap, ClientRole::Consumer, &id, own)
    }

    /// The statistics sink, when one is set.
    pub(crate) fn statistics_sink(&self) -> Option<StatisticsSink> {
        self.statistics.as_ref().map(|(_, sink)| sink.clone())
    }
}

/// How often a stage's clients report librdkafka's statistics for the metrics endpoint when
/// [`RuntimeConfig::statistics`] sets no interval.
const ENDPOINT_STATISTICS_INTERVAL: Duration = Duration::from_secs(5);

/// Hands librdkafka's statistics to `sink`; without one (statistics enabled through a raw
/// client property), logs them as rdkafka's default context does.
pub(crate) fn forward_statistics(sink: Option<&StatisticsSink>, json: &[u8]) {
    match sink {
        Some(sink) => sink.receive(json),
        None => {
            tracing::info!(statistics = %String::from_utf8_lossy(json), "librdkafka statistics")
        }
    }
}

fn uuid_like() -> String {
    parsley_clock::SenderId::random().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_classic_group_protocol_is_accepted() {
        let base = || RuntimeConfig::new("127.0.0.1:9092");
        assert!(base().check_group_protocol().is_ok());
        for ok in ["classic", "CLASSIC", " Classic "] {
            assert!(
                base()
                    .consumer_property("group.protocol", ok)
                    .check_group_protocol()
                    .is_ok(),
                "{ok}"
            );
        }
        // The producer has no group: the setting there is not the stages' consumer's.
        assert!(
            base()
                .producer_property("group.protocol", "consumer")
                .check_group_protocol()
                .is_ok()
        );
        let refused = base()
            .consumer_property("group.protocol", "consumer")
            .check_group_protocol()
            .unwrap_err();
        assert!(
            matches!(&refused, crate::Error::Setup(crate::SetupError::UnsupportedGroupProtocol { protocol }) if protocol == "consumer"),
            "{refused:?}"
        );
        let message = refused.to_string();
        assert!(message.contains("group.protocol=consumer"), "{message}");
        assert!(message.contains("co-partitioned"), "{message}");
    }

    #[test]
    fn the_transaction_timeout_is_the_last_one_set_else_librdkafkas_default() {
        let c = RuntimeConfig::new("b:9092");
        assert_eq!(c.transaction_timeout(), Duration::from_secs(60));
        let c = c
            .producer_property("transaction.timeout.ms", "5000")
            .producer_property("linger.ms", "1")
            .producer_property("transaction.timeout.ms", "7000");
        assert_eq!(c.transaction_timeout(), Duration::from_millis(7000));
    }

    #[test]
    fn only_a_static_members_consumer_gets_a_group_instance_id() {
        let c = RuntimeConfig::new("b:9092").instance_id("i7");
        assert_eq!(c.group_instance_id("app.stage"), None);
        let consumer = c.client_config("app.stage", ClientRole::Consumer, &[]);
        assert_eq!(consumer.get("group.instance.id"), None);
        let c = c.static_membership(true);
        assert_eq!(
            c.group_instance_id("app.stage").as_deref(),
            Some("app.stage-i7")
        );
        let consumer = c.client_config("app.stage", ClientRole::Consumer, &[]);
        assert_eq!(consumer.get("group.instance.id"), Some("app.stage-i7"));
        for role in [ClientRole::Producer, ClientRole::Admin, ClientRole::Restore] {
            let other = c.client_config("app.stage", role, &[]);
            assert_eq!(other.get("group.instance.id"), None, "{role:?}");
        }
        // The user's own setting for the consumer wins, as every user setting does.
        let c = c.consumer_property("group.instance.id", "mine");
        let consumer = c.client_config("app.stage", ClientRole::Consumer, &[]);
        assert_eq!(consumer.get("group.instance.id"), Some("mine"));
    }

    #[test]
    fn an_internal_consumer_never_reports_statistics_nor_joins_as_a_static_member() {
        let sink = StatisticsSink::new(|_| {});
        let c = RuntimeConfig::new("b:9092")
            .statistics(Duration::from_secs(1), sink)
            .instance_id("i7")
            .static_membership(true)
            .consumer_property("security.protocol", "SSL");
        let stage = c.client_config("app.stage", ClientRole::Consumer, &[]);
        assert_eq!(stage.get("statistics.interval.ms"), Some("1000"));
        let progress = c.internal_consumer_config("app.stage.progress", &[("group.id", "g")]);
        assert_eq!(progress.get("statistics.interval.ms"), None);
        assert_eq!(progress.get("group.instance.id"), None);
        assert_eq!(
            progress.get("client.id"),
            Some("app.stage.progress-consumer")
        );
        assert_eq!(
            progress.get("security.protocol"),
            Some("SSL"),
            "the user's consumer settings still apply"
        );
    }

    #[test]
    fn each_stream_thread_has_client_ids_and_a_member_of_its_own() {
        let c = RuntimeConfig::new("b:9092")
            .instance_id("i7")
            .static_membership(true)
            .application_endpoint("h:1")
            .stream_threads(2);
        assert_eq!(c.stream_threads, 2);
        let first = c.clone().for_thread(0);
        let second = c.clone().for_thread(1);
        let id = |c: &RuntimeConfig, role| {
            c.client_config("app.s", role, &[])
                .get("client.id")
                .map(str::to_string)
        };
        // The first thread keeps the names of a stage with one thread.
        assert_eq!(
            id(&first, ClientRole::Consumer).as_deref(),
            Some("app.s-consumer|i7|h:1")
        );
        assert_eq!(
            id(&second, ClientRole::Consumer).as_deref(),
            Some("app.s-consumer-1|i7|h:1")
        );
        assert_eq!(
            id(&first, ClientRole::Producer).as_deref(),
            Some("app.s-producer")
        );
        assert_eq!(
            id(&second, ClientRole::Producer).as_deref(),
            Some("app.s-producer-1")
        );
        // Both name the instance for the owners' listing.
        for c in [&first, &second] {
            let client = id(c, ClientRole::Consumer).unwrap();
            assert_eq!(
                crate::stage::advertised_for_tests(&client),
                Some(("i7", "h:1"))
            );
        }
        assert_eq!(
            first.group_instance_id("app.s").as_deref(),
            Some("app.s-i7")
        );
        assert_eq!(
            second.group_instance_id("app.s").as_deref(),
            Some("app.s-i7-1")
        );
        assert_eq!(RuntimeConfig::new("b").stream_threads(0).stream_threads, 1);
    }

    #[test]
    fn the_session_timeout_is_the_users_else_librdkafkas_default() {
        let c = RuntimeConfig::new("b:9092");
        assert_eq!(c.session_timeout(), Duration::from_secs(45));
        let c = c.consumer_property("session.timeout.ms", "60000");
        assert_eq!(c.session_timeout(), Duration::from_secs(60));
    }

    #[test]
    fn the_transactional_id_names_the_group_and_the_instance() {
        let mut c = RuntimeConfig::new("b:9092");
        c.instance_id = "i7".into();
        assert_eq!(c.transactional_id("app.stage"), "app.stage-i7-0");
        let t = c.clone().for_thread(3);
        assert_eq!(t.transactional_id("app.stage"), "app.stage-i7-3");
        assert_eq!(c.thread_transactional_id("app.stage", 1), "app.stage-i7-1");
    }
}
