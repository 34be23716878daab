//! Readiness: whether every stage of a [`Running`](crate::Running) is up with its tasks
//! restored, and if not, why — in a line an operator reads in a probe's failure.

use parsley_task::metrics::{Ownership, StageEnd, TaskMetrics, TaskPhase};

/// Where one stage stands, as the readiness check reads it.
#[derive(Debug, Clone)]
pub(crate) struct StageHealth {
    /// The stage's name.
    pub(crate) name: String,
    /// Its consumer holds an assignment.
    pub(crate) assigned: bool,
    /// How its stream thread ended, if it has.
    pub(crate) ended: Option<StageEnd>,
    /// Its tasks.
    pub(crate) tasks: Vec<TaskMetrics>,
    /// Its tasks no member of its group holds, at the last look (`None`: not known).
    pub(crate) ownership: Option<Ownership>,
    /// What a commit that has waited long waits on (a coordinator), if one does.
    pub(crate) commit_wait: Option<String>,
}

/// `" (3 of 4 tasks have no owner in its consumer group)"` when the stage's group has tasks
/// no member holds, else empty.
fn unowned_note(s: &StageHealth) -> String {
    match s.ownership {
        Some(Ownership { tasks, unowned }) if unowned > 0 => {
            format!(" ({unowned} of {tasks} tasks have no owner in its consumer group)")
        }
        _ => String::new(),
    }
}

/// The longest reason given for an error, in characters (a stage's error can name many
/// partitions).
const MAX_ERROR: usize = 300;

/// `Ok` with a line saying what runs when every stage runs with an assignment and every task
/// is restored; else `Err` with every reason, `; `-separated: a stop was asked for
/// (`stopping`), a stage ended (failed, panicked, stopped), cannot commit (a commit call has
/// waited longer than the runtime's notice on a coordinator: which one, where), waits for an
/// assignment, or restores tasks. Either line names the stages whose groups have tasks no member holds, with
/// how many: an instance whose own tasks run stays ready while another member's are without an
/// owner (it can do nothing about them), but says so.
pub(crate) fn readiness(stages: &[StageHealth], stopping: bool) -> Result<String, String> {
    let mut reasons = Vec::new();
    if stopping {
        reasons.push("stopping: a shutdown was requested".to_string());
    }
    for s in stages {
        match &s.ended {
            Some(StageEnd::Failed(error)) => {
                let first_line = error.lines().next().unwrap_or_default();
                let mut error: String = first_line.chars().take(MAX_ERROR).collect();
                if error.len() < first_line.len() {
                    error.push('…');
                }
                reasons.push(format!("stage {} failed: {error}", s.name));
                continue;
            }
            Some(StageEnd::Panicked) => {
                reasons.push(format!("stage {} panicked", s.name));
                continue;
            }
            Some(StageEnd::Stopped) => {
                reasons.push(format!("stage {} stopped", s.name));
                continue;
            }
            None => {}
        }
        if let Some(wait) = &s.commit_wait {
            reasons.push(format!("stage {} cannot commit: {wait}", s.name));
        }
        if !s.assigned {
            reasons.push(format!(
                "stage {} waits for an assignment from its consumer group{}",
                s.name,
                unowned_note(s)
            ));
            continue;
        }
        let restoring: Vec<&TaskMetrics> = s
            .tasks
            .iter()
            .filter(|t| t.phase == TaskPhase::Restoring)
            .collect();
        if !restoring.is_empty() {
            let partitions: Vec<String> =
                restoring.iter().map(|t| t.partition.to_string()).collect();
            let read: i64 = restoring.iter().map(|t| t.restore_position).sum();
            let end: i64 = restoring.iter().map(|t| t.restore_end).sum();
            reasons.push(format!(
                "stage {} is restoring task(s) {} ({read} of {end} changelog offsets read)",
                s.name,
                partitions.join(", ")
            ));
        }
    }
    if reasons.is_empty() {
        let tasks: usize = stages.iter().map(|s| s.tasks.len()).sum();
        let unowned: String = stages
            .iter()
            .filter(|s| !unowned_note(s).is_empty())
            .map(|s| format!("; stage {}{}", s.name, unowned_note(s)))
            .collect();
        Ok(format!(
            "ready: {} stage(s) running, {tasks} task(s) restored{unowned}",
            stages.len()
        ))
    } else {
        Err(format!("not ready: {}", reasons.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(partition: i32, phase: TaskPhase) -> TaskMetrics {
        let mut t = TaskMetrics::new(partition);
        t.phase = phase;
        t
    }

    fn stage(name: &str, assigned: bool, tasks: Vec<TaskMetrics>) -> StageHealth {
        StageHealth {
            name: name.into(),
            assigned,
            ended: None,
            tasks,
            ownership: None,
            commit_wait: None,
        }
    }

    #[test]
    fn ready_once_every_stage_is_assigned_and_every_task_restored() {
        let a = stage("a", true, vec![task(0, TaskPhase::Running)]);
        // An assignment of no partition (more instances than partitions) is ready too.
        let b = stage("b", true, Vec::new());
        assert_eq!(
            readiness(&[a.clone(), b], false),
            Ok("ready: 2 stage(s) running, 1 task(s) restored".into())
        );
        assert_eq!(
            readiness(&[a], true),
            Err("not ready: stopping: a shutdown was requested".into())
        );
    }

    #[test]
    fn not_ready_while_a_stage_waits_for_its_assignment_or_restores() {
        let waiting = stage("a", false, Vec::new());
        let mut restoring = task(2, TaskPhase::Restoring);
        (restoring.restore_position, restoring.restore_end) = (40, 100);
        let b = stage(
            "b",
            true,
            vec![
                task(0, TaskPhase::Running),
                restoring,
                task(3, TaskPhase::Restoring),
            ],
        );
        assert_eq!(
            readiness(&[waiting, b], false),
            Err(
                "not ready: stage a waits for an assignment from its consumer group; \
                 stage b is restoring task(s) 2, 3 (40 of 100 changelog offsets read)"
                    .into()
            )
        );
    }

    #[test]
    fn tasks_without_an_owner_are_named_ready_or_not() {
        let mut waiting = stage("a", false, Vec::new());
        waiting.ownership = Some(Ownership {
            tasks: 4,
            unowned: 4,
        });
        assert_eq!(
            readiness(&[waiting], false),
            Err(
                "not ready: stage a waits for an assignment from its consumer group (4 of 4 \
                 tasks have no owner in its consumer group)"
                    .into()
            )
        );
        let mut running = stage("b", true, vec![task(0, TaskPhase::Running)]);
        running.ownership = Some(Ownership {
            tasks: 2,
            unowned: 1,
        });
        let mut all_owned = stage("c", true, Vec::new());
        all_owned.ownership = Some(Ownership {
            tasks: 2,
            unowned: 0,
        });
        assert_eq!(
            readiness(&[running, all_owned], false),
            Ok(
                "ready: 2 stage(s) running, 1 task(s) restored; stage b (1 of 2 tasks have no \
                owner in its consumer group)"
                    .into()
            )
        );
    }

    #[test]
    fn not_ready_while_a_commit_waits_long_on_a_coordinator() {
        let mut waiting = stage("a", true, vec![task(0, TaskPhase::Running)]);
        waiting.commit_wait = Some(
            "sending the input offsets to the transaction (TxnOffsetCommit to the group \
             coordinator) has waited 5100 ms on the group coordinator of group app.a \
             (__consumer_offsets partition 3, no leader: unavailable)"
                .into(),
        );
        let reason = readiness(&[waiting.clone()], false).unwrap_err();
        assert!(
            reason.starts_with("not ready: stage a cannot commit: sending the input offsets"),
            "{reason}"
        );
        assert!(
            reason.contains("group app.a (__consumer_offsets partition 3, no leader"),
            "{reason}"
        );
        waiting.commit_wait = None;
        assert!(readiness(&[waiting], false).is_ok());
    }

    #[test]
    fn not_ready_after_a_refusal_for_want_of_an_acl_naming_the_resource() {
        use parsley_task::error::{AclResource, KafkaCode, KafkaError, Operation, ResourceType};
        let refused = KafkaError::authorization(
            Operation::Poll,
            AclResource::named(ResourceType::Group, "app.count"),
            "consumer",
            KafkaCode::new(30, "GroupAuthorizationFailed"),
            "Message consumption error: GroupAuthorizationFailed (Broker: Group authorization \
             failed)",
        );
        let mut failed = stage("count", true, vec![task(0, TaskPhase::Running)]);
        failed.ended = Some(StageEnd::Failed(refused.to_string()));
        let reason = readiness(&[failed], false).unwrap_err();
        assert!(
            reason.starts_with(
                "not ready: stage count failed: polling: the consumer client is not authorized \
                 on Group app.count (GroupAuthorizationFailed: "
            ),
            "{reason}"
        );
        assert!(
            reason.ends_with("no ACL allows this principal the operation"),
            "{reason}"
        );
    }

    #[test]
    fn not_ready_after_a_stage_ended_with_its_first_error_line_cut_short() {
        let mut failed = stage("a", true, vec![task(0, TaskPhase::Running)]);
        failed.ended = Some(StageEnd::Failed(format!(
            "stage a: handler: {}\nsecond line",
            "x".repeat(400)
        )));
        let mut panicked = stage("b", true, Vec::new());
        panicked.ended = Some(StageEnd::Panicked);
        let reason = readiness(&[failed, panicked], false).unwrap_err();
        assert!(
            reason.starts_with("not ready: stage a failed: stage a: handler: xxx"),
            "{reason}"
        );
        assert!(reason.ends_with("…; stage b panicked"), "{reason}");
        assert!(!reason.contains("second line"), "{reason}");
    }
}
