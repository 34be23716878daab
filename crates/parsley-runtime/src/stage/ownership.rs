//! Who holds the stage's tasks: the consumer group as its coordinator describes it, read while
//! the stage runs.
//!
//! An instance knows its own assignment; the rest of the group it learns only from the group
//! coordinator. Every [`CHECK_EVERY`] the stream thread describes its group (the classic
//! protocol's `ListGroups` and `DescribeGroups`, bounded by [`CHECK_TIMEOUT`]: not the admin
//! API's `DescribeConsumerGroups`, whose failures can end the process in librdkafka — module
//! `admin::groups`) and counts the stage's tasks —
//! partition `p` of every source — that no member's assignment holds
//! ([`unowned`]), published as [`Ownership`] (metric `parsley_stage_unowned_partitions`, and
//! the readiness answer). From the same answer it keeps who holds each task among the members
//! that advertise an application endpoint in their client id ([`owners`]), for
//! `Running::key_owner`.
//!
//! What that count can and cannot see:
//! - **a rebalance**: under the eager range assignor every member gives its partitions up when
//!   a rebalance starts and holds none until the group is `Stable` again, so in any other state
//!   every task counts (the coordinator may still describe the last generation's assignment
//!   meanwhile — Kafka 4's does —, which nobody holds any more). A rebalance that waits for a member that will not rejoin —
//!   the process that died and was restarted under a new member id, a static member that
//!   stopped — shows as every task unowned until that member's session times out
//!   (`session.timeout.ms`), then `0` once the group is stable again;
//! - **a member that died while the group was stable**: the coordinator still counts it, with
//!   its assignment, until its session times out. No client can tell a dead member from a slow
//!   one before then (only its silence differs), so its tasks count as owned; at the timeout
//!   the group rebalances and the survivors' `took over tasks` line names them.
//!
//! A change of the count is logged at INFO, with the group's state and members. A failed
//! request clears the published figure (`None`: unknown, not zero) and is logged at DEBUG; the
//! next check comes after [`AFTER_FAILURE`] (the coordinator is likely unreachable then), as it
//! does after the stage's consumer reports a node unreachable (a transport failure): while a
//! node is down, `ListGroups` waits for its answer until the check's bound, so a check then
//! would hold the stream thread for the whole bound and fail.
//!
//! Invariant: at most one request per [`CHECK_EVERY`] (per [`AFTER_FAILURE`] after a failure), made by the stream thread between two
//! phases, never holding it longer than [`CHECK_TIMEOUT`].

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tracing::{debug, info};

use crate::admin::{Admin, GroupView};
use parsley_task::context::TaskContext;
use parsley_task::metrics::{Ownership, StageMetrics, TaskOwner};

/// How often a running stage describes its group.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(2);

/// The longest a check waits for the coordinator's answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the checks pause after one failed: a failed check usually means a node is
/// unreachable (it died, or the group coordinator is moving), and every check until it is back
/// would hold the stream thread for [`CHECK_TIMEOUT`] and fail.
const AFTER_FAILURE: Duration = Duration::from_secs(30);

/// The stage's tasks that no member of `view` holds: `sources` are the stage's source topics
/// with their partition counts (co-partitioned: task `p` is partition `p` of each). A task
/// counts as held when the group is `Stable` and a member's assignment holds partition `p` of
/// any source (eager assignment: nobody holds anything while the group rebalances).
pub(crate) fn unowned(view: &GroupView, sources: &[(&str, i32)]) -> Ownership {
    let tasks = sources.iter().map(|(_, n)| *n).max().unwrap_or(0).max(0);
    let held: BTreeSet<i32> = match view {
        GroupView::Described { state, members } if state == "Stable" => members
            .iter()
            .flat_map(|m| &m.assignment)
            .filter(|(topic, p)| {
                sources.iter().any(|(name, _)| name == topic) && (0..tasks).contains(p)
            })
            .map(|(_, p)| *p)
            .collect(),
        _ => BTreeSet::new(),
    };
    Ownership {
        tasks: tasks as u64,
        unowned: (tasks as u64).saturating_sub(held.len() as u64),
    }
}

/// Who holds each of the stage's tasks in `view`, among the members that advertise an
/// application endpoint in their client id ([`advertised`]), by task; empty unless the group
/// is `Stable` (nobody holds anything while it rebalances).
pub(crate) fn owners(view: &GroupView, sources: &[(&str, i32)]) -> Vec<TaskOwner> {
    let GroupView::Described { state, members } = view else {
        return Vec::new();
    };
    if state != "Stable" {
        return Vec::new();
    }
    let mut owners: Vec<TaskOwner> = members
        .iter()
        .filter_map(|m| advertised(&m.client_id).map(|a| (m, a)))
        .flat_map(|(m, (instance_id, endpoint))| {
            m.assignment
                .iter()
                .filter(|(topic, _)| sources.iter().any(|(name, _)| name == topic))
                .map(move |(_, partition)| TaskOwner {
                    partition: *partition,
                    instance_id: instance_id.to_string(),
                    endpoint: endpoint.to_string(),
                })
        })
        .collect();
    owners.sort_by_key(|o| o.partition);
    owners.dedup_by_key(|o| o.partition);
    owners
}

/// The instance id and application endpoint a stage consumer's client id advertises: a client
/// id ending `|{instance_id}|{host:port}` ([`RuntimeConfig::application_endpoint`]); `None`
/// for any other.
///
/// [`RuntimeConfig::application_endpoint`]: crate::RuntimeConfig::application_endpoint
pub(crate) fn advertised(client_id: &str) -> Option<(&str, &str)> {
    let mut parts = client_id.rsplitn(3, '|');
    let endpoint = parts.next()?;
    let instance = parts.next()?;
    parts.next()?;
    (!endpoint.is_empty() && !instance.is_empty()).then_some((instance, endpoint))
}

/// When the group was last described, and the count published then.
#[derive(Debug)]
pub(crate) struct OwnershipCheck {
    last: Option<Instant>,
    unowned: Option<u64>,
    /// The last check failed: the next waits [`AFTER_FAILURE`].
    failed: bool,
}

impl OwnershipCheck {
    /// A check that describes the group at its first call.
    pub(crate) fn new() -> Self {
        OwnershipCheck {
            last: None,
            unowned: None,
            failed: false,
        }
    }

    /// The consumer reported a node unreachable (a transport failure): the checks pause for
    /// [`AFTER_FAILURE`] from now, since the node may be the group coordinator's.
    pub(crate) fn transport_failed(&mut self) {
        self.failed = true;
        self.last = Some(Instant::now());
    }

    /// Once per turn: every [`CHECK_EVERY`], describes `group` with `admin`, publishes the
    /// count of tasks no member holds to `metrics` and logs a change of it (module docs).
    pub(crate) fn check(
        &mut self,
        admin: &Admin,
        group: &str,
        ctx: &TaskContext,
        session_timeout: Duration,
        metrics: &StageMetrics,
    ) {
        let every = if self.failed {
            AFTER_FAILURE
        } else {
            CHECK_EVERY
        };
        if self.last.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.last = Some(Instant::now());
        let view = match admin.describe_group_classic(group, CHECK_TIMEOUT) {
            Ok(view) => view,
            Err(e) => {
                debug!(group, error = %e, pause_ms = AFTER_FAILURE.as_millis() as u64, "the group cannot be described now");
                metrics.set_ownership(None);
                metrics.set_owners(Vec::new());
                self.failed = true;
                return;
            }
        };
        self.failed = false;
        let sources: Vec<(&str, i32)> = ctx
            .sources
            .iter()
            .filter(|t| !ctx.is_global_topic(t.id))
            .map(|t| (t.name.as_str(), t.partitions))
            .collect();
        let now = unowned(&view, &sources);
        metrics.set_ownership(Some(now));
        metrics.set_owners(owners(&view, &sources));
        if self.unowned == Some(now.unowned) {
            return;
        }
        let before = self.unowned.replace(now.unowned);
        if now.unowned == 0 && before.is_none() {
            return;
        }
        let (state, members) = match &view {
            GroupView::Loading => ("loading".to_string(), "unknown".to_string()),
            GroupView::Described { state, members } => (
                state.clone(),
                members
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        };
        if now.unowned == 0 {
            info!(
                group,
                tasks = now.tasks,
                state,
                members,
                "every task of the stage has an owner again"
            );
        } else {
            info!(
                group,
                unowned = now.unowned,
                tasks = now.tasks,
                state,
                members,
                session_timeout_ms = session_timeout.as_millis() as u64,
                "tasks of the stage have no owner in its consumer group: it rebalances, and waits \
                 for every member it counts to rejoin — one that died or a static member that \
                 stopped rejoins never and is dropped when its session times out"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::GroupMember;

    fn member(id: &str, assignment: &[(&str, i32)]) -> GroupMember {
        GroupMember {
            client_id: "app.s-consumer".into(),
            host: "/10.0.0.7".into(),
            instance_id: None,
            member_id: id.into(),
            assignment: assignment
                .iter()
                .map(|(t, p)| (t.to_string(), *p))
                .collect(),
        }
    }

    #[test]
    fn an_endpoint_is_read_from_a_client_id_that_advertises_one() {
        assert_eq!(
            advertised("app.s-consumer|i-1|10.0.0.7:8080"),
            Some(("i-1", "10.0.0.7:8080"))
        );
        // A user's client id prefix may hold anything but the two last fields.
        assert_eq!(advertised("team|app.s-consumer|i|h:1"), Some(("i", "h:1")));
        assert_eq!(advertised("app.s-consumer"), None);
        assert_eq!(advertised("i|h:1"), None, "no client id before them");
        assert_eq!(advertised("app.s-consumer||h:1"), None);
    }

    #[test]
    fn each_task_is_owned_by_the_member_of_a_stable_group_whose_assignment_holds_it() {
        let mut a = member("m-a", &[("in", 0), ("other", 1)]);
        a.client_id = "g-consumer|a|h:1".into();
        let mut b = member("m-b", &[("in", 1)]);
        b.client_id = "g-consumer|b|h:2".into();
        let c = member("m-c", &[("in", 2)]); // advertises nothing
        let view = GroupView::Described {
            state: "Stable".into(),
            members: vec![b.clone(), a.clone(), c],
        };
        let owner = |partition: i32, id: &str, endpoint: &str| TaskOwner {
            partition,
            instance_id: id.into(),
            endpoint: endpoint.into(),
        };
        assert_eq!(
            owners(&view, &[("in", 3)]),
            vec![owner(0, "a", "h:1"), owner(1, "b", "h:2")]
        );
        let rebalancing = GroupView::Described {
            state: "PreparingRebalance".into(),
            members: vec![a, b],
        };
        assert!(owners(&rebalancing, &[("in", 3)]).is_empty());
    }

    #[test]
    fn a_task_is_unowned_when_no_member_holds_a_partition_of_it() {
        let sources = [("orders", 4), ("payments", 4)];
        let stable = GroupView::Described {
            state: "Stable".into(),
            members: vec![
                member(
                    "a",
                    &[
                        ("orders", 0),
                        ("payments", 0),
                        ("orders", 1),
                        ("payments", 1),
                    ],
                ),
                member("b", &[("orders", 2), ("payments", 2)]),
            ],
        };
        assert_eq!(
            unowned(&stable, &sources),
            Ownership {
                tasks: 4,
                unowned: 1
            },
            "task 3 has no owner"
        );
        // While the group rebalances nobody holds a task, whatever assignment is described.
        let rebalancing = GroupView::Described {
            state: "PreparingRebalance".into(),
            members: vec![
                member("a", &[("orders", 0), ("orders", 1)]),
                member("b", &[]),
            ],
        };
        assert_eq!(unowned(&rebalancing, &sources).unowned, 4);
        assert_eq!(unowned(&GroupView::Loading, &sources).unowned, 4);
        // Partitions of other topics, or beyond the stage's, hold nothing of it.
        let other = GroupView::Described {
            state: "Stable".into(),
            members: vec![member("a", &[("other", 0), ("orders", 7), ("orders", 0)])],
        };
        assert_eq!(unowned(&other, &sources).unowned, 3);
        let all = GroupView::Described {
            state: "Stable".into(),
            members: vec![member(
                "a",
                &[("orders", 0), ("orders", 1), ("orders", 2), ("orders", 3)],
            )],
        };
        assert_eq!(unowned(&all, &sources).unowned, 0);
    }
}
