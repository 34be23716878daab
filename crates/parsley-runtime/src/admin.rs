//! Topic administration and topic identity: the admin calls Parsley needs.
//!
//! [`Admin::describe_topics`] resolves topic names to their Kafka topic UUIDs (KIP-516) with
//! the admin `DescribeTopics` call (`rd_kafka_DescribeTopics`, reached through `rdkafka-sys`,
//! which `rdkafka` does not wrap). A topic deleted and recreated under the same name returns a
//! new id, so it becomes a new [`Channel`](parsley_clock::Channel).
//!
//! Creation and deletion wait for evidence: [`Admin::create_topics`] returns once
//! `DescribeTopics` reports every new topic with its partitions, and [`Admin::delete_topics`]
//! once it reports them gone — no fixed sleep.

use std::ffi::CString;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use parsley_clock::TopicId;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use tracing::{debug, warn};

use crate::authorization::refused;
use crate::clients::{ClientRole, ClientSettings};
use crate::librdkafka::admin::{
    AdminCall, DescribedGroup, Event, Isolation, MainEvent, OffsetSpec, Request, TopicNames,
};
use crate::security::{Endpoint, SecurityWatch, WATCH_STEP};
use parsley_task::error;
use parsley_task::error::{Error, Result};
use parsley_task::error::{Operation, SetupError};
use parsley_task::topic::TopicInfo;

/// The pause before an admin request whose broker dropped the connection is sent again.
const TRANSPORT_RETRY: Duration = Duration::from_millis(100);

pub(crate) mod acl;
mod groups;
mod offsets;

/// A topic to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    /// The topic name.
    pub name: String,
    /// The partition count.
    pub partitions: i32,
    /// Topic configs (`cleanup.policy`, `retention.ms`, …).
    pub config: Vec<(String, String)>,
}

impl TopicSpec {
    /// A topic with `partitions` partitions and default configs.
    pub fn new(name: impl Into<String>, partitions: i32) -> Self {
        TopicSpec {
            name: name.into(),
            partitions,
            config: Vec::new(),
        }
    }

    /// Adds a topic config.
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }
}

/// An admin client for one cluster.
pub struct Admin {
    client: AdminClient<AdminContext>,
    timeout: Duration,
}

/// The admin client's context: records a failure to authenticate or to set up TLS
/// (`security`), which its requests report instead of waiting out their timeout.
///
/// rdkafka's admin client polls only its results queue: the error events of librdkafka's main
/// queue reach this context because [`Admin::serve_main_queue`] serves them while a request
/// waits.
struct AdminContext {
    watch: SecurityWatch,
}

impl ClientContext for AdminContext {
    fn error(&self, error: KafkaError, reason: &str) {
        self.watch.event(&error, reason);
    }
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Admin {
    /// Connects to the cluster at `bootstrap` (`host:port[,…]`). Requests time out after
    /// `timeout`.
    ///
    /// # Errors
    /// [`KafkaError::Client`](parsley_task::error::KafkaError::Client) when the client cannot be
    /// created.
    pub fn new(bootstrap: &str, timeout: Duration) -> Result<Self> {
        Self::connect(bootstrap, &ClientSettings::new(), timeout)
    }

    /// Connects to the cluster at `bootstrap` with the user's client settings (security and
    /// the rest, as every client of the runtime gets them: [`ClientSettings`]). Requests time
    /// out after `timeout`.
    ///
    /// # Errors
    /// [`KafkaError::Client`](parsley_task::error::KafkaError::Client) when the client cannot be
    /// created (an unknown or invalid property).
    pub fn connect(bootstrap: &str, settings: &ClientSettings, timeout: Duration) -> Result<Self> {
        Self::from_config(
            &settings.config(bootstrap, ClientRole::Admin, "parsley-admin", &[]),
            timeout,
        )
    }

    /// An admin client made from a complete client configuration.
    pub(crate) fn from_config(config: &ClientConfig, timeout: Duration) -> Result<Self> {
        let context = AdminContext {
            watch: SecurityWatch::new(Endpoint::of(config, ClientRole::Admin)),
        };
        // Errors as events in the main queue (`RD_KAFKA_EVENT_ERROR`), served while a request
        // waits; without them librdkafka only logs an error the client has no callback for.
        let mut config = config.clone();
        config.set("enabled_events", crate::librdkafka::admin::error_events());
        let client = config
            .create_with_context(context)
            .map_err(|e| crate::client_error::kafka(Operation::CreateAdminClient, e))?;
        Ok(Admin { client, timeout })
    }

    fn options(&self) -> AdminOptions {
        AdminOptions::new().request_timeout(Some(self.timeout))
    }

    /// Describes `names`: id and partition count of each, in the given order.
    ///
    /// # Errors
    /// [`SetupError::UnknownTopic`] naming the first topic the cluster does not know;
    /// [`KafkaError::Authorization`](parsley_task::error::KafkaError::Authorization) naming the
    /// first topic the principal may not describe (no ACL allows Describe, nor Read or Write,
    /// which imply it); [`KafkaError::Admin`](parsley_task::error::KafkaError::Admin) for any
    /// other failure.
    pub fn describe_topics(&self, names: &[&str]) -> Result<Vec<TopicInfo>> {
        self.describe_topics_within(names, self.timeout)
    }

    /// [`Admin::describe_topics`] with its own deadline `timeout`.
    pub(crate) fn describe_topics_within(
        &self,
        names: &[&str],
        timeout: Duration,
    ) -> Result<Vec<TopicInfo>> {
        let found = self.describe_raw(names, timeout)?;
        names
            .iter()
            .zip(found)
            .map(|(name, r)| {
                r.map_err(|(code, msg)| {
                    if let Some(refused) = refused(
                        Operation::DescribeTopic,
                        code,
                        Some(name),
                        ClientRole::Admin,
                        &msg,
                    ) {
                        refused
                    } else if code == RDKafkaErrorCode::UnknownTopicOrPartition {
                        Error::Setup(SetupError::UnknownTopic {
                            topic: name.to_string(),
                        })
                    } else {
                        Error::from(
                            error::KafkaError::admin(Operation::DescribeTopic, msg)
                                .with_topic(name),
                        )
                    }
                })
            })
            .collect()
    }

    /// One `DescribeTopics` request; a result per name, in order.
    #[allow(clippy::type_complexity)]
    fn describe_raw(
        &self,
        names: &[&str],
        timeout: Duration,
    ) -> Result<Vec<std::result::Result<TopicInfo, (RDKafkaErrorCode, String)>>> {
        let mut by_name = std::collections::HashMap::new();
        for described in self.describe_raw_authorized(names, timeout)? {
            let entry = described.result.map(|(id, partitions)| TopicInfo {
                name: described.name.clone(),
                id,
                partitions: partitions as i32,
            });
            by_name.insert(described.name, entry);
        }
        Ok(names
            .iter()
            .map(|n| {
                by_name.remove(*n).unwrap_or(Err((
                    RDKafkaErrorCode::UnknownTopicOrPartition,
                    "not in the answer".into(),
                )))
            })
            .collect())
    }

    /// One `DescribeTopics` request, as librdkafka answers it: with the operations the
    /// principal may do on each topic.
    fn describe_raw_authorized(
        &self,
        names: &[&str],
        timeout: Duration,
    ) -> Result<Vec<crate::librdkafka::admin::DescribedTopic>> {
        let collection = TopicNames::new(names).map_err(|e| {
            Error::admin(
                Operation::DescribeTopics,
                format!(
                    "topic name {:?} contains a NUL byte",
                    String::from_utf8_lossy(&e.into_vec())
                ),
            )
        })?;
        let event = self.request(
            Operation::DescribeTopics,
            None,
            timeout,
            AdminCall::DescribeTopics(&collection),
            None,
        )?;
        Ok(event.described_topics())
    }

    /// The names of the topics with the given ids, among all topics of the cluster (one
    /// metadata request and one `DescribeTopics`). Ids of topics that no longer exist are
    /// absent from the answer.
    ///
    /// # Errors
    /// [`KafkaError::Client`](parsley_task::error::KafkaError::Client) or
    /// [`KafkaError::Admin`](parsley_task::error::KafkaError::Admin) when a request fails.
    pub fn topic_names(
        &self,
        ids: &[TopicId],
    ) -> Result<std::collections::HashMap<TopicId, String>> {
        let metadata = self
            .client
            .inner()
            .fetch_metadata(None, self.timeout)
            .map_err(|e| crate::client_error::kafka(Operation::ListTopics, e))?;
        let names: Vec<String> = metadata
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        Ok(self
            .describe_raw(&refs, self.timeout)?
            .into_iter()
            .filter_map(|r| r.ok())
            .filter(|t| ids.contains(&t.id))
            .map(|t| (t.id, t.name))
            .collect())
    }

    /// Runs one native admin request: `call` with request timeout `timeout` (and isolation
    /// level `isolation`, if given) on a private queue, then waits for the result event and
    /// checks its error. A request whose broker dropped the connection (`_TRANSPORT`) is
    /// started again every [`TRANSPORT_RETRY`] until the deadline: the requests sent here only
    /// read. Returns the event, destroyed when dropped.
    fn request(
        &self,
        operation: Operation,
        group: Option<&str>,
        timeout: Duration,
        call: AdminCall<'_>,
        isolation: Option<Isolation>,
    ) -> Result<Event> {
        let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        let fail = |message: String| {
            let e = error::KafkaError::admin(operation, message);
            Error::from(match group {
                Some(g) => e.with_group(g),
                None => e,
            })
        };
        let describes_topics = matches!(call, AdminCall::DescribeTopics(_));
        let mut request = Request::new(self.client.inner(), call, timeout_ms);
        if let Some(isolation) = isolation {
            request.set_isolation(isolation).map_err(fail)?;
        }
        if describes_topics {
            // What the principal may do with each topic (KIP-430): which source a refused
            // fetch was about ([`Admin::unreadable`]).
            request.include_authorized_operations().map_err(fail)?;
        }
        // Waited for in short steps: a failure to authenticate or to set up TLS arrives as an
        // error event, not as the request's answer (module docs of `security`).
        let watch = &self.client.inner().context().watch;
        let deadline = std::time::Instant::now() + timeout + Duration::from_secs(5);
        let step = WATCH_STEP.as_millis() as i32;
        loop {
            request.start();
            let event = loop {
                if let Some(event) = request.poll(step) {
                    break event;
                }
                self.serve_main_queue();
                if let Some(e) = watch.error() {
                    return Err(e);
                }
                if std::time::Instant::now() >= deadline {
                    return Err(fail(format!("no answer within {timeout:?}")));
                }
            };
            let code = event.error();
            if code == RDKafkaErrorCode::NoError {
                return Ok(event);
            }
            // The broker the request went to dropped the connection (a node of the cluster
            // killed or restarting): every request here only reads, so it is sent again, to
            // whichever broker librdkafka picks, until the deadline.
            let retry = code == RDKafkaErrorCode::BrokerTransportFailure
                && std::time::Instant::now() + TRANSPORT_RETRY < deadline
                && watch.error().is_none();
            if !retry {
                let message = event.error_string();
                if let Some(refused) = refused(operation, code, group, ClientRole::Admin, &message)
                {
                    return Err(refused);
                }
                return Err(watch.explain(fail(message)));
            }
            debug!(
                operation = %operation,
                "admin request: transport failure, sending it again"
            );
            std::thread::sleep(TRANSPORT_RETRY);
        }
    }

    /// Serves the error and log events waiting in librdkafka's main queue of this client, which
    /// rdkafka's admin client never polls: errors go to the context's watch, logs to
    /// `tracing` (target `librdkafka`), other events are dropped.
    fn serve_main_queue(&self) {
        let client = self.client.inner();
        crate::librdkafka::admin::drain_main_queue(client, |event| match event {
            MainEvent::Error { code, reason } => client
                .context()
                .watch
                .event(&KafkaError::Global(code), &reason),
            MainEvent::Log {
                facility,
                text,
                level,
            } => {
                if level <= 4 {
                    tracing::warn!(target: "librdkafka", "librdkafka: {facility} {text}");
                } else {
                    debug!(target: "librdkafka", "librdkafka: {facility} {text}");
                }
            }
        });
    }

    /// Creates `topics` (replication factor 1 is not assumed: the broker default is used)
    /// and returns once `DescribeTopics` reports each of them with all its partitions and
    /// every partition's leader answers a `ListOffsets` for it (on a cluster of several
    /// brokers a leader learns of a new topic a moment after the controller describes it).
    /// A topic refused because the cluster has fewer live brokers than its replication factor
    /// (a node down or restarting) is asked for again, every half second, until the timeout.
    ///
    /// # Errors
    /// [`KafkaError::Security`](parsley_task::error::KafkaError::Security) as soon as the client
    /// fails to authenticate or to set up TLS;
    /// [`KafkaError::Authorization`](parsley_task::error::KafkaError::Authorization) naming a
    /// topic the principal may not create (no ACL allows Create on it or on the cluster);
    /// [`KafkaError::Admin`](parsley_task::error::KafkaError::Admin) naming the topic that could
    /// not be created (including one that exists already), or when the topics do not appear, or
    /// their leaders do not answer, within the timeout.
    pub fn create_topics(&self, topics: &[TopicSpec]) -> Result<Vec<TopicInfo>> {
        self.create(topics, false)
    }

    /// Creates `topic` unless it exists, and describes it: another process creating it at the
    /// same moment (two instances of a stage starting together) is not an error. The topic's
    /// actual partition count is returned, whatever `topic.partitions` asked for.
    ///
    /// # Errors
    /// [`KafkaError::Security`](parsley_task::error::KafkaError::Security) as soon as the client
    /// fails to authenticate or to set up TLS; admin errors other than "topic already exists";
    /// a topic not described within the timeout.
    pub fn create_topic_if_absent(&self, topic: &TopicSpec) -> Result<TopicInfo> {
        Ok(self.create(std::slice::from_ref(topic), true)?.remove(0))
    }

    fn create(&self, topics: &[TopicSpec], tolerate_existing: bool) -> Result<Vec<TopicInfo>> {
        // First a request that serves the client's error events (`request`): a failure to
        // authenticate or to set up TLS is then the typed `Security` error at once, where
        // `CreateTopics` below would wait out its timeout and say only that. What it finds
        // of the topics is not used (a principal may create a topic it cannot describe).
        let names: Vec<&str> = topics.iter().map(|t| t.name.as_str()).collect();
        self.describe_raw(&names, self.timeout)?;
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| {
                t.config.iter().fold(
                    NewTopic::new(&t.name, t.partitions, TopicReplication::Fixed(-1)),
                    |n, (k, v)| n.set(k, v),
                )
            })
            .collect();
        let deadline = Instant::now() + self.timeout;
        let mut pending: Vec<&NewTopic<'_>> = new.iter().collect();
        let mut existed = false;
        let mut said = false;
        while !pending.is_empty() {
            let results = block_on(
                self.client
                    .create_topics(pending.iter().copied(), &self.options()),
            )
            .map_err(|e| crate::client_error::kafka(Operation::CreateTopics, e))?;
            let mut again = Vec::new();
            for (r, topic) in results.into_iter().zip(pending) {
                let Err((name, code)) = r else { continue };
                if tolerate_existing && code == RDKafkaErrorCode::TopicAlreadyExists {
                    existed = true;
                    continue;
                }
                // Fewer live brokers than the replication factor (a node of the cluster down or
                // restarting): nothing was created; asked again until the deadline.
                if code == RDKafkaErrorCode::InvalidReplicationFactor && Instant::now() < deadline {
                    if !said {
                        said = true;
                        warn!(
                            topic = %name,
                            "creating the topic waits: the cluster has fewer live brokers than \
                             the replication factor; asking again until the admin's timeout"
                        );
                    }
                    again.push(topic);
                    continue;
                }
                return Err(refused(
                    Operation::CreateTopic,
                    code,
                    Some(&name),
                    ClientRole::Admin,
                    code,
                )
                .unwrap_or_else(|| {
                    Error::from(
                        error::KafkaError::admin(Operation::CreateTopic, code.to_string())
                            .with_topic(name),
                    )
                }));
            }
            pending = again;
            if !pending.is_empty() {
                // Waiting for a broker to come back: asked again every half second.
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        let names: Vec<&str> = topics.iter().map(|t| t.name.as_str()).collect();
        loop {
            let found = self.describe_raw(&names, self.timeout)?;
            if found.iter().zip(topics).all(|(r, t)| {
                r.as_ref()
                    .is_ok_and(|i| i.partitions == t.partitions || existed)
            }) {
                let infos: Vec<TopicInfo> =
                    found.into_iter().map(|r| r.expect("checked")).collect();
                // Described is not yet usable: on a cluster of several brokers a partition's
                // leader learns of a new topic a moment later, and answers for it only then.
                let partitions: Vec<(&str, i32)> = infos
                    .iter()
                    .flat_map(|i| (0..i.partitions).map(move |p| (i.name.as_str(), p)))
                    .collect();
                self.list_retrying(
                    &partitions,
                    OffsetSpec::Earliest,
                    Isolation::ReadUncommitted,
                    true,
                )?;
                return Ok(infos);
            }
            if Instant::now() > deadline {
                return Err(Error::from(
                    error::KafkaError::admin(
                        Operation::CreateTopics,
                        format!(
                            "not described with all partitions within {:?}",
                            self.timeout
                        ),
                    )
                    .with_topics(names.iter()),
                ));
            }
        }
    }

    /// Raises the partition count of `topic` to `total` and waits until the cluster's metadata
    /// shows it.
    ///
    /// # Errors
    /// [`KafkaError::Admin`](parsley_task::error::KafkaError::Admin) naming the topic when the
    /// broker refuses or the change does not show.
    pub fn add_partitions(&self, topic: &str, total: i32) -> Result<()> {
        let request = NewPartitions::new(topic, total as usize);
        let results = block_on(self.client.create_partitions([&request], &self.options()))
            .map_err(|e| {
                Error::from(
                    crate::client_error::client(Operation::AddPartitions, e).with_topic(topic),
                )
            })?;
        for r in results {
            if let Err((t, code)) = r {
                return Err(Error::from(
                    error::KafkaError::admin(Operation::AddPartitions, code.to_string())
                        .with_topic(t),
                ));
            }
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            if self.describe_topics(&[topic])?[0].partitions == total {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::from(
                    error::KafkaError::admin(
                        Operation::AddPartitions,
                        format!("{total} partitions not shown after {:?}", self.timeout),
                    )
                    .with_topic(topic),
                ));
            }
        }
    }

    /// Deletes the records of `topic`/`partition` below offset `before` (`DeleteRecords`, what
    /// retention does on its own); returns the partition's new log start offset.
    ///
    /// # Errors
    /// [`KafkaError::Admin`](parsley_task::error::KafkaError::Admin) naming the partition when the
    /// broker refuses.
    pub fn delete_records(&self, topic: &str, partition: i32, before: i64) -> Result<i64> {
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(before))
            .map_err(|e| crate::client_error::kafka(Operation::BuildRecordsToDelete, e))?;
        let result = block_on(self.client.delete_records(&tpl, &self.options())).map_err(|e| {
            Error::from(
                crate::client_error::client(Operation::DeleteRecords, e)
                    .with_partition(topic, partition),
            )
        })?;
        let e = result.find_partition(topic, partition).ok_or_else(|| {
            Error::from(
                error::KafkaError::admin(
                    Operation::DeleteRecords,
                    "no result for the partition".into(),
                )
                .with_partition(topic, partition),
            )
        })?;
        e.error().map_err(|err| {
            Error::from(
                error::KafkaError::admin(Operation::DeleteRecords, err.to_string())
                    .with_partition(topic, partition)
                    .with_offset(before),
            )
        })?;
        match e.offset() {
            rdkafka::Offset::Offset(low) => Ok(low),
            other => Err(Error::from(
                error::KafkaError::admin(
                    Operation::DeleteRecords,
                    format!("unexpected low watermark {other:?}"),
                )
                .with_partition(topic, partition),
            )),
        }
    }

    /// The configuration of `topic` (`DescribeConfigs`): every entry with a value, as name and
    /// value, the broker's defaults included (`max.message.bytes`,
    /// `message.timestamp.after.max.ms`, `cleanup.policy`, …).
    ///
    /// # Errors
    /// [`KafkaError::Admin`](parsley_task::error::KafkaError::Admin) naming the topic when the
    /// broker refuses (an unknown topic).
    pub fn topic_config(&self, topic: &str) -> Result<Vec<(String, String)>> {
        let resource = rdkafka::admin::ResourceSpecifier::Topic(topic);
        let results = block_on(self.client.describe_configs([&resource], &self.options()))
            .map_err(|e| {
                Error::from(
                    crate::client_error::client(Operation::DescribeConfig, e).with_topic(topic),
                )
            })?;
        let described = results.into_iter().next().ok_or_else(|| {
            Error::from(
                error::KafkaError::admin(Operation::DescribeConfig, "no result".into())
                    .with_topic(topic),
            )
        })?;
        let resource = described.map_err(|code| {
            refused(
                Operation::DescribeConfig,
                code,
                Some(topic),
                ClientRole::Admin,
                code,
            )
            .unwrap_or_else(|| {
                Error::from(
                    error::KafkaError::admin(Operation::DescribeConfig, code.to_string())
                        .with_topic(topic),
                )
            })
        })?;
        Ok(resource
            .entries
            .into_iter()
            .filter_map(|e| Some((e.name, e.value?)))
            .collect())
    }

    /// The settings of `topic` that a refusal of one of its records is judged against.
    ///
    /// # Errors
    /// As [`Admin::topic_config`].
    pub(crate) fn topic_limits(&self, topic: &str) -> Result<crate::refusal::TopicLimits> {
        let config = self.topic_config(topic)?;
        Ok(crate::refusal::TopicLimits::from_entries(
            config.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        ))
    }

    /// Deletes `names` and returns once `DescribeTopics` no longer knows them.
    ///
    /// # Errors
    /// [`KafkaError::Admin`](parsley_task::error::KafkaError::Admin) naming a topic that could not
    /// be deleted or did not disappear.
    pub fn delete_topics(&self, names: &[&str]) -> Result<()> {
        let results = block_on(self.client.delete_topics(names, &self.options()))
            .map_err(|e| crate::client_error::kafka(Operation::DeleteTopics, e))?;
        for r in results {
            if let Err((topic, code)) = r {
                return Err(Error::from(
                    error::KafkaError::admin(Operation::DeleteTopic, code.to_string())
                        .with_topic(topic),
                ));
            }
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            let found = self.describe_raw(names, self.timeout)?;
            if found.iter().all(|r| {
                matches!(r, Err((code, _)) if *code == RDKafkaErrorCode::UnknownTopicOrPartition)
            }) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::from(
                    error::KafkaError::admin(
                        Operation::DeleteTopics,
                        format!("still described after {:?}", self.timeout),
                    )
                    .with_topics(names.iter()),
                ));
            }
        }
    }
}

/// A consumer group as its coordinator describes it (`DescribeConsumerGroups`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupView {
    /// The coordinator is still loading the group's state (`COORDINATOR_LOAD_IN_PROGRESS`).
    Loading,
    /// The group's state (`Stable`, `PreparingRebalance`, …) and its members.
    Described {
        state: String,
        members: Vec<GroupMember>,
    },
}

/// A member of a consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupMember {
    pub client_id: String,
    pub host: String,
    /// The member's `group.instance.id`: a static member's.
    pub instance_id: Option<String>,
    pub member_id: String,
    /// The partitions of its assignment, (topic, partition); while the group rebalances, empty
    /// or the last generation's, as the coordinator describes it.
    pub assignment: Vec<(String, i32)>,
}

impl std::fmt::Display for GroupMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at {}",
            self.client_id,
            self.host.trim_start_matches('/')
        )?;
        match &self.instance_id {
            Some(id) => write!(f, " (static, group.instance.id {id})"),
            None => write!(f, " (member {})", self.member_id),
        }
    }
}

/// A failed description of group `group`: [`KafkaError::Admin`](error::KafkaError::Admin)
/// naming the group and saying `message`.
fn describe_group_failed(group: &str, message: String) -> Error {
    Error::from(error::KafkaError::admin(Operation::DescribeGroup, message).with_group(group))
}

impl Admin {
    /// Describes consumer group `group` (one `DescribeConsumerGroups` request).
    ///
    /// # Errors
    /// [`KafkaError::Admin`](parsley_task::error::KafkaError::Admin) for a failed request or a
    /// group error other than a coordinator still loading.
    pub(crate) fn describe_group(&self, group: &str) -> Result<GroupView> {
        self.describe_group_within(group, self.timeout)
    }

    /// [`Admin::describe_group`], waiting at most `timeout` for the answer.
    ///
    /// # Errors
    /// As [`Admin::describe_group`].
    pub(crate) fn describe_group_within(
        &self,
        group: &str,
        timeout: Duration,
    ) -> Result<GroupView> {
        let fail = |message: String| describe_group_failed(group, message);
        let name =
            CString::new(group).map_err(|_| fail("the group id contains a NUL byte".into()))?;
        let event = self.request(
            Operation::DescribeGroup,
            Some(group),
            timeout,
            AdminCall::DescribeGroup(&name),
            None,
        )?;
        let Some(DescribedGroup { result }) = event.described_groups().into_iter().next() else {
            return Err(fail("no group in the answer".into()));
        };
        match result {
            Err((RDKafkaErrorCode::CoordinatorLoadInProgress, _)) => Ok(GroupView::Loading),
            Err((code, message)) => Err(refused(
                Operation::DescribeGroup,
                code,
                Some(group),
                ClientRole::Admin,
                &message,
            )
            .unwrap_or_else(|| fail(message))),
            Ok((state, members)) => Ok(GroupView::Described {
                state,
                members: members
                    .into_iter()
                    .map(|m| GroupMember {
                        client_id: m.client_id,
                        host: m.host,
                        instance_id: m.instance_id,
                        member_id: m.consumer_id,
                        assignment: m.assignment,
                    })
                    .collect(),
            }),
        }
    }
}
