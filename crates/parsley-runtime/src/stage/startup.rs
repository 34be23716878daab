//! Startup: resolving a stage's topics, checking co-partitioning, and creating its clients.
//!
//! What takes round trips runs side by side: the transactional producer's `InitProducerId`
//! (which fences an earlier incarnation of the stage's transactional id) needs nothing from
//! the topics, so it runs on a helper thread while the sources, sinks and dead-letter topic are
//! described, the consumer subscribes (its group join goes on meanwhile; the assignment waits
//! for the first poll) and the changelog topic is made ready.
//!
//! Invariant: a stage starts only with every topic it names resolved to a topic id and its
//! sources co-partitioned (equal partition counts); the changelog has as many partitions.

use std::sync::Arc;
use std::time::Instant;

use parsley_stage::{BadRecordPolicy, ImpossiblePolicy, StageSpec};
use tracing::{debug, warn};

use super::coordinator::Coordinators;
use super::evidence::Evidence;
use super::intake::Intake;
use super::tasks::Tasks;
use super::transaction::{OwnWrites, Transaction};
use super::waits::JoinWait;
use crate::admin::{Admin, TopicSpec};
use crate::changelog;
use crate::clients::ClientRole;
use crate::config::RuntimeConfig;
use parsley_task::context::TaskContext;
use parsley_task::error::SetupError;
use parsley_task::error::{Error, Result};
use parsley_task::metrics::StageMetrics;
use parsley_task::state_store::{self, StateStores};
use parsley_task::topic::TopicInfo;

/// The topics of a stage, resolved.
struct Resolved {
    sources: Vec<TopicInfo>,
    sinks: Vec<TopicInfo>,
    /// The dead-letter topics of impossible stamps and of bad records.
    dead_letters: DeadLetters,
    changelog: TopicInfo,
}

/// The dead-letter topics of impossible stamps and of bad records, resolved.
type DeadLetters = (Option<TopicInfo>, Option<TopicInfo>);

/// The owners of a stream thread's state, built.
pub(super) struct Started {
    pub ctx: TaskContext,
    pub intake: Intake,
    pub evidence: Evidence,
    pub txn: Transaction,
    pub tasks: Tasks,
    pub join_wait: JoinWait,
}

/// Resolves the topics of the stage of `spec` in application `app`, checks co-partitioning,
/// creates the clients and initialises transactions (module docs).
///
/// # Errors
/// [`SetupError::UnknownTopic`], [`SetupError::NotCoPartitioned`],
/// [`SetupError::ChangelogPartitions`], [`SetupError::InternalTopicPartitions`], client and admin
/// errors.
///
/// `feeding` names, per source that other stages of the topology write, those stages
/// ([`super::feeding_stages`]).
pub(super) fn start(
    app: &str,
    spec: &StageSpec,
    feeding: &[(String, Vec<StageSpec>)],
    config: &RuntimeConfig,
    (metrics, siblings): (&Arc<StageMetrics>, &super::Siblings),
) -> Result<Started> {
    let started = Instant::now();
    let group = spec.group_id(app);
    let admin = Arc::new(Admin::from_config(
        &config.client_config(&group, ClientRole::Admin, &[]),
        config.timeout,
    )?);
    let transactional_id = config.transactional_id(&group);
    let pc = config.client_config(
        &group,
        ClientRole::Producer,
        &[
            ("transactional.id", &transactional_id),
            ("linger.ms", "5"),
            ("partitioner", "murmur2_random"),
        ],
    );
    let (resolved, outbox) = std::thread::scope(|scope| {
        let producing =
            scope.spawn(|| Transaction::producer(&pc, config.statistics_sink(), config.timeout));
        let resolved = (|| -> Result<_> {
            ensure_internal_topics(&admin, spec)?;
            let (sources, sinks, dead_letters) = describe(&admin, spec)?;
            debug!(
                took_ms = started.elapsed().as_millis() as u64,
                "startup: topics described"
            );
            // The group join runs while the changelog is made ready and the producer
            // initialises (the assignment waits for the first poll).
            let aligned = spec.event_time().is_some_and(|o| o.max_drift_ms.is_some());
            // The global sources are not the group's: each task reads them whole.
            let partitioned: Vec<String> = spec.partitioned_sources().cloned().collect();
            let intake = Intake::subscribe(config, &group, &admin, &partitioned, aligned)?;
            let join_wait = JoinWait::new();
            let changelog = changelog::ensure_topic(
                &admin,
                &changelog::changelog_topic(&group),
                sources
                    .iter()
                    .find(|t| !spec.is_global(&t.name))
                    .unwrap_or(&sources[0])
                    .partitions,
                &config.changelog,
            )?;
            debug!(
                took_ms = started.elapsed().as_millis() as u64,
                "startup: changelog ready"
            );
            let resolved = Resolved {
                sources,
                sinks,
                dead_letters,
                changelog,
            };
            Ok((resolved, intake, join_wait))
        })();
        let outbox = match producing.join() {
            Ok(outbox) => outbox,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        (resolved, outbox)
    });
    let (resolved, intake, join_wait) = resolved?;
    let outbox = outbox?;
    debug!(
        took_ms = started.elapsed().as_millis() as u64,
        "startup: transactions initialised"
    );
    let Resolved {
        sources,
        sinks,
        dead_letters: (dead_letter, bad_record_dead_letter),
        changelog,
    } = resolved;
    let looped = sinks
        .iter()
        .filter(|k| sources.iter().any(|s| s.id == k.id))
        .map(|k| k.id)
        .collect();
    let stores = match &config.state_dir {
        // One store per stage and process, whichever of its stream threads opens it (module
        // `siblings`).
        Some(dir) => Some(siblings.stores(|| {
            open_stores(
                &admin,
                dir,
                &group,
                &changelog.name,
                config.state_memory.as_ref(),
            )
        })?),
        None => None,
    };
    let evidence = Evidence::new(admin, sources.iter().chain(&sinks));
    let txn = Transaction::new(
        outbox,
        pc,
        config.statistics_sink(),
        changelog,
        OwnWrites::new(looped),
        config.timeout,
        Coordinators::new(
            group.clone(),
            config.transactional_id(&group),
            metrics.clone(),
        ),
    );
    let mut ctx = TaskContext::new(
        spec,
        sources,
        sinks,
        (dead_letter, bad_record_dead_letter),
        config.gate,
        config.max_queued_per_channel,
        metrics.clone(),
    );
    // Only an event-time stage waits for the stages that write its sources.
    let feeding = if spec.event_time().is_some() {
        feeding
    } else {
        &[]
    };
    let upstreams = super::upstream::Upstreams::new(app, feeding, config)?;
    ctx.fed_by_stages = ctx.sources.iter().map(|t| upstreams.fed(&t.name)).collect();
    let tasks = Tasks::new(
        app,
        spec,
        config,
        upstreams,
        (stores, siblings),
        txn.changelog().clone(),
        metrics,
    );
    Ok(Started {
        ctx,
        intake,
        evidence,
        txn,
        tasks,
        join_wait,
    })
}

/// The stage's state store under `dir`, knowing how long its changelog topic keeps tombstones
/// (`delete.retention.ms`; the broker's default when it cannot be read).
///
/// # Errors
/// [`ProcessingError::StateStore`](parsley_task::error::ProcessingError::StateStore).
fn open_stores(
    admin: &Admin,
    dir: &std::path::Path,
    group: &str,
    changelog: &str,
    bound: Option<&parsley_task::memory::MemoryBudget>,
) -> Result<StateStores> {
    let retention = match admin.topic_config(changelog) {
        Ok(entries) => entries
            .iter()
            .find(|(k, _)| k == "delete.retention.ms")
            .and_then(|(_, v)| v.parse().ok()),
        Err(e) => {
            warn!(error = %e, changelog, "cannot read the changelog's delete.retention.ms");
            None
        }
    };
    StateStores::open_sized(
        dir,
        group,
        retention.unwrap_or(state_store::DEFAULT_DELETE_RETENTION_MS),
        bound.map_or(parsley_task::memory::StoreMemory::DEFAULT, |b| {
            b.store_memory()
        }),
    )
}

/// Describes the stage's sources, sinks and dead-letter topics, and checks that its sources
/// are co-partitioned.
/// Creates each internal topic of the stage that is absent, with as many partitions as the
/// largest of the topics it takes its count from, and checks the count of those that exist.
/// Every stage touching an internal topic computes the same count, so whichever starts first
/// creates it.
///
/// # Errors
/// [`SetupError::InternalTopicPartitions`]; [`SetupError::UnknownTopic`] when a topic it takes its
/// count from does not exist; admin errors.
fn ensure_internal_topics(admin: &Admin, spec: &StageSpec) -> Result<()> {
    for topic in spec.internal_topics() {
        let of: Vec<&str> = topic.partitions_of.iter().map(String::as_str).collect();
        let expected = admin
            .describe_topics(&of)?
            .iter()
            .map(|t| t.partitions)
            .max()
            .unwrap_or(1);
        let info = match admin.describe_topics(&[topic.name.as_str()]) {
            Ok(mut t) => t.remove(0),
            Err(Error::Setup(SetupError::UnknownTopic { .. })) => {
                let mut new = TopicSpec::new(topic.name.clone(), expected);
                for (k, v) in &topic.config {
                    new = new.config(k.clone(), v.clone());
                }
                // Another stage or instance may create it at the same moment.
                admin.create_topic_if_absent(&new)?
            }
            Err(e) => return Err(e),
        };
        if info.partitions != expected {
            return Err(Error::Setup(SetupError::InternalTopicPartitions {
                topic: topic.name.clone(),
                partitions: info.partitions,
                expected,
            }));
        }
        debug!(topic = %topic.name, partitions = expected, "startup: internal topic ready");
    }
    Ok(())
}

fn describe(
    admin: &Admin,
    spec: &StageSpec,
) -> Result<(Vec<TopicInfo>, Vec<TopicInfo>, DeadLetters)> {
    let source_names: Vec<&str> = spec.sources().iter().map(String::as_str).collect();
    let sources = admin.describe_topics(&source_names)?;
    // A global source is read whole by every task: it may have any count.
    let partitioned: Vec<&TopicInfo> = sources
        .iter()
        .filter(|t| !spec.is_global(&t.name))
        .collect();
    if partitioned
        .iter()
        .any(|t| t.partitions != partitioned[0].partitions)
    {
        return Err(Error::Setup(SetupError::NotCoPartitioned {
            stage: spec.name().to_string(),
            partitions: partitioned
                .iter()
                .map(|t| (t.name.clone(), t.partitions))
                .collect(),
        }));
    }
    let sink_names: Vec<&str> = spec.sinks().iter().map(String::as_str).collect();
    let sinks = if sink_names.is_empty() {
        Vec::new()
    } else {
        admin.describe_topics(&sink_names)?
    };
    let dead_letter = match spec.impossible_policy() {
        ImpossiblePolicy::DeadLetter { topic } => {
            Some(admin.describe_topics(&[topic.as_str()])?.remove(0))
        }
        _ => None,
    };
    let bad_record_dead_letter = match spec.bad_record_policy() {
        BadRecordPolicy::DeadLetter { topic } => {
            Some(admin.describe_topics(&[topic.as_str()])?.remove(0))
        }
        _ => None,
    };
    Ok((sources, sinks, (dead_letter, bad_record_dead_letter)))
}
