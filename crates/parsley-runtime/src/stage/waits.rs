//! Startup waits: the group join, said once when it is slow.
//!
//! A stage's consumer subscribes during startup and gets its first assignment from the group
//! coordinator. That join can wait, for reasons no client error reports:
//! - members the coordinator still counts that do not rejoin — the consumer of a process that
//!   died (it sent no `LeaveGroup`), or a static member that stopped (static members never
//!   send one: [`RuntimeConfig::static_membership`](crate::RuntimeConfig::static_membership)):
//!   the coordinator waits until each rejoins or its session times out, at most
//!   `session.timeout.ms` after it was last heard from;
//! - a coordinator still loading the group's state after a broker restart or a coordinator
//!   move (`COORDINATOR_LOAD_IN_PROGRESS`): librdkafka retries the join until it is loaded.
//!
//! When the first assignment has not come [`JOIN_NOTICE`] after the subscription, the stream
//! thread describes the group once (`DescribeConsumerGroups`) and logs, at INFO, what it
//! waits for — the group's state and members, or the loading coordinator — and the longest
//! the wait can take. When the assignment then comes, the `assigned` line says how long the
//! join took.
//!
//! Invariant: the notice is logged at most once per stage start, and only by the stream
//! thread between two turns (one admin request, bounded by the runtime's `timeout`).

use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::admin::{Admin, GroupView};
use crate::config::RuntimeConfig;
use parsley_stage::StageSpec;

/// How long a join may take before the stream thread says what it waits for: a join that
/// waits for no one takes well under a second.
pub(crate) const JOIN_NOTICE: Duration = Duration::from_secs(3);

/// A stage's wait for its first assignment.
#[derive(Debug)]
pub(crate) struct JoinWait {
    /// When the consumer subscribed.
    since: Instant,
    /// The notice was logged.
    noticed: bool,
}

impl JoinWait {
    /// The wait of a consumer that subscribed just now.
    pub(crate) fn new() -> Self {
        JoinWait {
            since: Instant::now(),
            noticed: false,
        }
    }

    /// How long the join has taken so far.
    pub(crate) fn waited(&self) -> Duration {
        self.since.elapsed()
    }
}

/// The notice for a join that has not brought an assignment yet, from what the group
/// coordinator says of the group: what is awaited, and the longest it can take.
pub(crate) fn join_notice(view: &GroupView, session_timeout: Duration) -> String {
    let session_ms = session_timeout.as_millis();
    match view {
        GroupView::Loading => "waiting for the first assignment: the group coordinator is still \
             loading the group's state (COORDINATOR_LOAD_IN_PROGRESS, after a broker restart or \
             a coordinator move); librdkafka retries the join until it is loaded"
            .to_string(),
        GroupView::Described { state, members } => {
            let members = if members.is_empty() {
                "none yet".to_string()
            } else {
                members
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            format!(
                "waiting for the first assignment: the group is {state}, its members {members}; \
                 the coordinator waits for every member it counts to rejoin — one of a process \
                 that died, or a static member that stopped (static members do not leave the \
                 group), rejoins never and is dropped when its session times out, at most \
                 session.timeout.ms ({session_ms} ms for this stage's consumer) after it was last \
                 heard from"
            )
        }
    }
}

impl JoinWait {
    /// Once per turn until the first assignment: after [`JOIN_NOTICE`] without one, logs once
    /// what the join of the group of `spec` in application `app` waits for (module docs),
    /// described with `admin`.
    pub(crate) fn watch(
        &mut self,
        admin: &Admin,
        app: &str,
        spec: &StageSpec,
        config: &RuntimeConfig,
    ) {
        if self.noticed || self.waited() < JOIN_NOTICE {
            return;
        }
        self.noticed = true;
        let waited_ms = self.waited().as_millis() as u64;
        let group = spec.group_id(app);
        let session_timeout = config.session_timeout();
        let instance = config.group_instance_id(&group);
        match admin.describe_group(&group) {
            Ok(view) => info!(
                group,
                group_instance_id = instance.as_deref().unwrap_or("none (dynamic member)"),
                waited_ms,
                session_timeout_ms = session_timeout.as_millis() as u64,
                "{}",
                join_notice(&view, session_timeout)
            ),
            Err(e) => warn!(
                group,
                waited_ms,
                session_timeout_ms = session_timeout.as_millis() as u64,
                error = %e,
                "waiting for the first assignment; the group cannot be described"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::GroupMember;

    #[test]
    fn the_notice_names_the_members_awaited_and_the_session_timeout() {
        let view = GroupView::Described {
            state: "PreparingRebalance".into(),
            members: vec![
                GroupMember {
                    client_id: "app.s-consumer".into(),
                    host: "/10.0.0.7".into(),
                    instance_id: Some("app.s-i1".into()),
                    member_id: "m-1".into(),
                    assignment: Vec::new(),
                },
                GroupMember {
                    client_id: "app.s-consumer".into(),
                    host: "/10.0.0.8".into(),
                    instance_id: None,
                    member_id: "m-2".into(),
                    assignment: Vec::new(),
                },
            ],
        };
        let notice = join_notice(&view, Duration::from_secs(60));
        assert!(
            notice.contains(
                "the group is PreparingRebalance, its members app.s-consumer at 10.0.0.7 \
                 (static, group.instance.id app.s-i1); app.s-consumer at 10.0.0.8 (member m-2)"
            ),
            "{notice}"
        );
        assert!(
            notice.contains("session.timeout.ms (60000 ms for this stage's consumer)"),
            "{notice}"
        );
        let loading = join_notice(&GroupView::Loading, Duration::from_secs(45));
        assert!(
            loading.contains("COORDINATOR_LOAD_IN_PROGRESS"),
            "{loading}"
        );
    }
}
