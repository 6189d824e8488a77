//! What a service needs next, decided without I/O: from its live tasks and deployments,
//! which tasks to stop and why, how many to start, whether to roll back, which old
//! deployments are done, and how far a rollout has come. The reconcile pass carries the
//! plan out; these rules are table-tested here without a database.

use tessera_model::service::{
    Deployment, DeploymentStatus, Service, Task, TaskDefRef, TaskHealth, TaskState,
};

use tessera_model::service::StopReason;

/// What to do for one service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ServicePlan {
    /// The service is being deleted: stop these; once nothing is live, delete it.
    Delete {
        stop: Vec<String>,
        gone: bool,
    },
    /// The service has no primary deployment (a bug or a hand edit): nothing to do.
    NoPrimary,
    /// The primary deployment `from` (of revision `failing`) failed too often: roll back
    /// to revision `to`.
    RollBack {
        from: i64,
        failing: TaskDefRef,
        failed: u32,
        to: TaskDefRef,
    },
    Converge(Actions),
}

/// How a service converges on its desired state in this pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Actions {
    /// The primary deployment, whose revision new tasks run.
    pub primary: i64,
    /// Tasks to stop, with the reason.
    pub stop: Vec<(String, StopReason)>,
    /// New tasks to start.
    pub start: usize,
    /// Whether an earlier revision exists to roll back to (then failures are answered by
    /// the circuit breaker; without one, restarts back off).
    pub can_roll_back: bool,
    /// Active deployments with no live task left: completed.
    pub completed: Vec<i64>,
    /// While old tasks remain: (running tasks of the primary, old tasks left).
    pub progress: Option<(usize, usize)>,
    /// Every desired task runs the primary revision and nothing is moving.
    pub steady: bool,
    /// Stopped tasks whose stop counts as a failure of their deployment.
    pub failures: Vec<String>,
}

/// Orders tasks for stopping: ones not serving first, then the newest.
fn stop_order(tasks: &mut [&Task]) {
    tasks.sort_by_key(|t| (t.ready(), std::cmp::Reverse(t.created_at)));
}

/// A running task whose health check fails: replaced, start before stop.
fn unhealthy(t: &Task) -> bool {
    t.state == TaskState::Running && t.health == Some(TaskHealth::Unhealthy)
}

/// How long new tasks of a deployment wait after its `failed`-th failed task: 2^(n-1) s, at
/// most `max`, so a revision that crashes at once is not restarted in a tight loop.
pub(crate) fn restart_delay(failed: u32, max: std::time::Duration) -> std::time::Duration {
    if failed == 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::from_secs(1u64 << (failed - 1).min(16)).min(max)
}

/// The plan for `service`, given its live tasks (not stopped) and its deployments (newest
/// first); a primary deployment with `failure_threshold` failed tasks rolls back when an
/// earlier revision exists.
pub(crate) fn plan_service(
    service: &Service,
    tasks: &[Task],
    deployments: &[Deployment],
    failure_threshold: u32,
) -> ServicePlan {
    if service.deleting {
        return ServicePlan::Delete {
            stop: tasks
                .iter()
                .filter(|t| t.state != TaskState::Stopping)
                .map(|t| t.id.clone())
                .collect(),
            gone: tasks.is_empty(),
        };
    }
    let Some(primary) = deployments
        .iter()
        .find(|d| d.status == DeploymentStatus::Primary)
    else {
        return ServicePlan::NoPrimary;
    };
    // Circuit breaker: a deployment whose tasks keep failing rolls back to the last
    // revision that ran.
    let previous = deployments.iter().find(|d| {
        d.id != primary.id
            && d.status != DeploymentStatus::RolledBack
            && d.task_definition != primary.task_definition
    });
    if primary.failed_tasks >= failure_threshold
        && let Some(prev) = previous
    {
        return ServicePlan::RollBack {
            from: primary.id,
            failing: primary.task_definition.clone(),
            failed: primary.failed_tasks,
            to: prev.task_definition.clone(),
        };
    }
    ServicePlan::Converge(converge(
        service,
        tasks,
        deployments,
        primary,
        previous.is_some(),
    ))
}

/// How `service` converges on its desired count under its deployment limits, with
/// `primary` the deployment whose revision new tasks run.
fn converge(
    service: &Service,
    tasks: &[Task],
    deployments: &[Deployment],
    primary: &Deployment,
    can_roll_back: bool,
) -> Actions {
    let desired = service.desired_count as usize;
    // Tasks being moved off a host, unhealthy ones and tasks already stopping do not
    // count; a task counts as serving (ready) once it runs and its health check, if it
    // has one, passes.
    let counted: Vec<&Task> = tasks
        .iter()
        .filter(|t| !t.migrating && t.state != TaskState::Stopping && !unhealthy(t))
        .collect();
    // A task of an earlier deployment that runs the primary's revision (after a rollback,
    // the tasks that were never replaced) is one of the new ones: it is not stopped only to
    // be started again.
    let current =
        |t: &Task| t.deployment_id == primary.id || t.task_definition == primary.task_definition;
    let (new, old): (Vec<&Task>, Vec<&Task>) = counted.iter().partition(|t| current(t));
    let running = |ts: &[&Task]| ts.iter().filter(|t| t.ready()).count();
    let running_total = running(&new) + running(&old);
    let max_total = (desired * service.deployment.maximum_percent as usize)
        .div_ceil(100)
        .max(desired);
    let min_healthy = (desired * service.deployment.minimum_healthy_percent as usize).div_ceil(100);
    let mut stop = replacing_stops(
        &new,
        &old,
        desired,
        running_total.saturating_sub(min_healthy),
    );
    // Start new tasks up to the desired count, within maximum_percent of live tasks
    // (unhealthy ones still hold their place until they stop).
    let sick: Vec<&Task> = tasks
        .iter()
        .filter(|t| !t.migrating && unhealthy(t))
        .collect();
    let live_after_stops = counted.len() + sick.len() - stop.len();
    let start = desired
        .saturating_sub(new.len())
        .min(max_total.saturating_sub(live_after_stops));
    let first_sick_stop = stop.len();
    stop.extend(sick_stops(&sick, &new, desired, running_total, start));
    // A task that turned unhealthy counts against the circuit breaker while a rollout is
    // under way (a revision that never becomes healthy is rolled back), or where there is
    // nothing to roll back to (restarts then slow down); a steady service whose task
    // fails its check for a while (a dependency down) is not rolled back for it.
    let failures: Vec<String> = if !old.is_empty() || !can_roll_back {
        stop[first_sick_stop..]
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    } else {
        Vec::new()
    };
    // Migrating tasks stop once the service has enough running tasks without them.
    let migrating = tasks
        .iter()
        .filter(|t| t.migrating && t.state != TaskState::Stopping);
    let any_migrating = migrating.clone().next().is_some();
    if running_total >= desired {
        stop.extend(migrating.map(|t| (t.id.clone(), StopReason::Moved)));
    }
    Actions {
        primary: primary.id,
        stop,
        start,
        can_roll_back,
        completed: completed_deployments(deployments, primary, tasks),
        progress: (!old.is_empty()).then(|| (running(&new), old.len())),
        steady: old.is_empty()
            && new.len() == desired
            && running(&new) == desired
            && !any_migrating
            && sick.is_empty(),
        failures,
    }
}

/// New tasks past the desired count (scaled down), and old tasks: those not running go at
/// once, running ones only `may_stop_running` of them (so that minimum_healthy_percent of
/// the desired count stays running).
fn replacing_stops(
    new: &[&Task],
    old: &[&Task],
    desired: usize,
    mut may_stop_running: usize,
) -> Vec<(String, StopReason)> {
    let mut stop: Vec<(String, StopReason)> = Vec::new();
    if new.len() > desired {
        let mut surplus = new.to_vec();
        stop_order(&mut surplus);
        stop.extend(
            surplus
                .iter()
                .take(new.len() - desired)
                .map(|t| (t.id.clone(), StopReason::ScaledDown)),
        );
    }
    let mut old_sorted = old.to_vec();
    stop_order(&mut old_sorted);
    for t in old_sorted {
        if t.ready() {
            if may_stop_running == 0 {
                break;
            }
            may_stop_running -= 1;
        }
        stop.push((t.id.clone(), StopReason::Replaced));
    }
    stop
}

/// Which unhealthy tasks stop, oldest first. They serve nothing, so stopping one never
/// lowers what serves: they stop once enough others serve, or once a replacement could not
/// be placed (it may need what they hold: a fixed port, GPU memory); when they hold the
/// room replacements need (maximum_percent, nothing `start`s), only as many as make that
/// room.
fn sick_stops(
    sick: &[&Task],
    new: &[&Task],
    desired: usize,
    running_total: usize,
    start: usize,
) -> Vec<(String, StopReason)> {
    let replacement_waits = new.iter().any(|t| t.state == TaskState::Pending);
    let mut sick_sorted = sick.to_vec();
    sick_sorted.sort_by_key(|t| t.created_at);
    let n = if running_total >= desired || replacement_waits {
        sick_sorted.len()
    } else if start == 0 && new.len() < desired {
        (desired - new.len()).min(sick_sorted.len())
    } else {
        0
    };
    sick_sorted
        .iter()
        .take(n)
        .map(|t| (t.id.clone(), StopReason::Unhealthy))
        .collect()
}

/// Active deployments that are done: of the primary's revision, or with no live task left.
fn completed_deployments(
    deployments: &[Deployment],
    primary: &Deployment,
    tasks: &[Task],
) -> Vec<i64> {
    deployments
        .iter()
        .filter(|d| d.status == DeploymentStatus::Active)
        .filter(|d| {
            d.task_definition == primary.task_definition
                || !tasks.iter().any(|t| t.deployment_id == d.id)
        })
        .map(|d| d.id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::service::DeploymentConfig;

    fn rev(n: u32) -> TaskDefRef {
        TaskDefRef {
            family: "web".into(),
            revision: n,
        }
    }

    fn service(desired: u32, min_healthy: u32, max: u32) -> Service {
        Service {
            task_definition: rev(2),
            desired_count: desired,
            deployment: DeploymentConfig {
                minimum_healthy_percent: min_healthy,
                maximum_percent: max,
            },
            ..crate::test_values::service("web")
        }
    }

    fn deployment(id: i64, r: u32, status: DeploymentStatus, failed: u32) -> Deployment {
        Deployment {
            id,
            service: "web".into(),
            task_definition: rev(r),
            status,
            pending: 0,
            running: 0,
            failed_tasks: failed,
            created_at: tessera_model::time::Timestamp::EPOCH,
        }
    }

    /// Task `id` of deployment `d` in `state`, created at second `at`.
    fn task(id: &str, d: i64, state: TaskState, at: u32) -> Task {
        Task {
            deployment_id: d,
            task_definition: rev(if d == 2 { 2 } else { 1 }),
            state,
            created_at: format!("2026-11-30T12:00:{at:02}.000Z")
                .parse()
                .expect("a time"),
            ..crate::test_values::task(id, "web")
        }
    }

    fn actions(p: ServicePlan) -> Actions {
        match p {
            ServicePlan::Converge(a) => a,
            other => panic!("expected actions, got {other:?}"),
        }
    }

    fn stopped(a: &Actions) -> Vec<(&str, StopReason)> {
        a.stop
            .iter()
            .map(|(id, why)| (id.as_str(), why.clone()))
            .collect()
    }

    use TaskState::{Pending, Running, Stopping};

    #[test]
    fn the_plan_for_each_situation() {
        let primary_only = [deployment(2, 2, DeploymentStatus::Primary, 0)];
        let rolling = [
            deployment(2, 2, DeploymentStatus::Primary, 0),
            deployment(1, 1, DeploymentStatus::Active, 0),
        ];
        // (what, service, tasks, deployments, stops, starts, steady)
        type Case<'a> = (
            &'a str,
            Service,
            Vec<Task>,
            &'a [Deployment],
            Vec<(&'a str, StopReason)>,
            usize,
            bool,
        );
        let cases: Vec<Case> = vec![
            (
                "a new service starts its count",
                service(3, 100, 200),
                vec![],
                &primary_only,
                vec![],
                3,
                false,
            ),
            (
                "a running service at its count is steady",
                service(2, 100, 200),
                vec![task("a", 2, Running, 1), task("b", 2, Running, 2)],
                &primary_only,
                vec![],
                0,
                true,
            ),
            (
                "scaled down: pending tasks go first, then the newest",
                service(1, 100, 200),
                vec![
                    task("a", 2, Running, 1),
                    task("b", 2, Running, 3),
                    task("c", 2, Pending, 2),
                ],
                &primary_only,
                vec![("c", StopReason::ScaledDown), ("b", StopReason::ScaledDown)],
                0,
                false,
            ),
            (
                "rolling at 100 % healthy: start new ones first, stop no running old one",
                service(2, 100, 200),
                vec![task("o1", 1, Running, 1), task("o2", 1, Running, 2)],
                &rolling,
                vec![],
                2,
                false,
            ),
            (
                "rolling at 50 % healthy and 100 % max: stop one old, start one new",
                service(2, 50, 100),
                vec![task("o1", 1, Running, 1), task("o2", 1, Running, 2)],
                &rolling,
                vec![("o2", StopReason::Replaced)],
                1,
                false,
            ),
            (
                "old tasks that never ran go at once",
                service(2, 100, 200),
                vec![
                    task("n1", 2, Running, 3),
                    task("n2", 2, Running, 4),
                    task("o1", 1, Pending, 1),
                ],
                &rolling,
                vec![("o1", StopReason::Replaced)],
                0,
                false,
            ),
            (
                "tasks already stopping do not count",
                service(1, 100, 200),
                vec![task("a", 2, Stopping, 1)],
                &primary_only,
                vec![],
                1,
                false,
            ),
        ];
        for (what, s, tasks, deployments, stops, starts, steady) in cases {
            let a = actions(plan_service(&s, &tasks, deployments, 3));
            assert_eq!(stopped(&a), stops, "{what}: stops");
            assert_eq!(a.start, starts, "{what}: starts");
            assert_eq!(a.steady, steady, "{what}: steady");
        }
    }

    #[test]
    fn health_gates_rollouts_and_unhealthy_tasks_are_replaced_start_before_stop() {
        let rolling = [
            deployment(2, 2, DeploymentStatus::Primary, 0),
            deployment(1, 1, DeploymentStatus::Active, 0),
        ];
        let checked = |id: &str, d: i64, health: TaskHealth, at: u32| {
            let mut t = task(id, d, Running, at);
            t.health = Some(health);
            t
        };
        // New tasks running but not yet healthy do not let an old one go at 100 %.
        let a = actions(plan_service(
            &service(2, 100, 200),
            &[
                checked("o1", 1, TaskHealth::Healthy, 1),
                checked("o2", 1, TaskHealth::Healthy, 2),
                checked("n1", 2, TaskHealth::Unknown, 3),
                checked("n2", 2, TaskHealth::Unknown, 4),
            ],
            &rolling,
            3,
        ));
        assert_eq!(
            stopped(&a),
            [],
            "no old task stops before a new one is healthy"
        );
        assert_eq!(a.progress, Some((0, 2)));
        // Once one is healthy, one old task may go.
        let a = actions(plan_service(
            &service(2, 100, 200),
            &[
                checked("o1", 1, TaskHealth::Healthy, 1),
                checked("o2", 1, TaskHealth::Healthy, 2),
                checked("n1", 2, TaskHealth::Healthy, 3),
                checked("n2", 2, TaskHealth::Unknown, 4),
            ],
            &rolling,
            3,
        ));
        assert_eq!(stopped(&a), [("o2", StopReason::Replaced)]);
        // Unhealthy new tasks while the old ones serve: they stop (and count as failures).
        let a = actions(plan_service(
            &service(2, 100, 200),
            &[
                checked("o1", 1, TaskHealth::Healthy, 1),
                checked("o2", 1, TaskHealth::Healthy, 2),
                checked("n1", 2, TaskHealth::Unhealthy, 3),
                checked("n2", 2, TaskHealth::Unknown, 4),
            ],
            &rolling,
            3,
        ));
        assert_eq!(stopped(&a), [("n1", StopReason::Unhealthy)]);
        // A steady service with one unhealthy task: a replacement starts first.
        let primary_only = [deployment(2, 2, DeploymentStatus::Primary, 0)];
        let a = actions(plan_service(
            &service(2, 100, 200),
            &[
                checked("a", 2, TaskHealth::Healthy, 1),
                checked("b", 2, TaskHealth::Unhealthy, 2),
            ],
            &primary_only,
            3,
        ));
        assert_eq!((a.start, stopped(&a)), (1, vec![]));
        assert!(!a.steady);
        // ...and the unhealthy one stops once the replacement serves.
        let a = actions(plan_service(
            &service(2, 100, 200),
            &[
                checked("a", 2, TaskHealth::Healthy, 1),
                checked("b", 2, TaskHealth::Unhealthy, 2),
                checked("c", 2, TaskHealth::Healthy, 3),
            ],
            &primary_only,
            3,
        ));
        assert_eq!(
            (a.start, stopped(&a)),
            (0, vec![("b", StopReason::Unhealthy)])
        );
        // With no room for a replacement (maximum 100 %), it stops first.
        let a = actions(plan_service(
            &service(2, 50, 100),
            &[
                checked("a", 2, TaskHealth::Healthy, 1),
                checked("b", 2, TaskHealth::Unhealthy, 2),
            ],
            &primary_only,
            3,
        ));
        assert_eq!(stopped(&a), [("b", StopReason::Unhealthy)]);
        // A replacement that cannot be placed (pending) lets the unhealthy task go: it may
        // hold what the replacement needs, and it serves nothing.
        let a = actions(plan_service(
            &service(1, 100, 200),
            &[
                checked("a", 2, TaskHealth::Unhealthy, 1),
                task("b", 2, Pending, 2),
            ],
            &primary_only,
            3,
        ));
        assert_eq!(stopped(&a), [("a", StopReason::Unhealthy)]);
        assert_eq!(
            a.failures,
            ["a"],
            "nothing to roll back to: it counts (restarts slow down)"
        );
        // A steady service with a revision to roll back to: an unhealthy task is replaced
        // without counting against the circuit breaker (a dependency may be down).
        let steady_after_rollout = [
            deployment(2, 2, DeploymentStatus::Primary, 0),
            deployment(1, 1, DeploymentStatus::Completed, 0),
        ];
        let a = actions(plan_service(
            &service(1, 100, 200),
            &[
                checked("a", 2, TaskHealth::Unhealthy, 1),
                task("b", 2, Pending, 2),
            ],
            &steady_after_rollout,
            3,
        ));
        assert_eq!(stopped(&a), [("a", StopReason::Unhealthy)]);
        assert!(a.failures.is_empty());
        // Draining tasks are out of every count.
        let mut draining = task("d", 2, Stopping, 1);
        draining.drain_until = Some("2026-11-30T12:00:09.000Z".parse().expect("a time"));
        let a = actions(plan_service(
            &service(1, 100, 200),
            &[draining],
            &primary_only,
            3,
        ));
        assert_eq!(a.start, 1);
    }

    #[test]
    fn a_rollback_keeps_the_tasks_that_already_run_its_revision() {
        // Deployment 3 rolled back to revision 1; deployment 1's tasks run revision 1.
        let mut rollback = deployment(3, 1, DeploymentStatus::Primary, 0);
        rollback.task_definition = rev(1);
        let deployments = [
            rollback,
            deployment(2, 2, DeploymentStatus::RolledBack, 3),
            deployment(1, 1, DeploymentStatus::Active, 0),
        ];
        let mut s = service(2, 100, 200);
        s.task_definition = rev(1);
        let a = actions(plan_service(
            &s,
            &[task("o1", 1, Running, 1), task("o2", 1, Running, 2)],
            &deployments,
            3,
        ));
        assert_eq!((a.start, stopped(&a)), (0, vec![]), "nothing is replaced");
        assert!(a.steady);
        assert_eq!(
            a.completed,
            [1],
            "the earlier deployment of that revision is done"
        );
    }

    #[test]
    fn migrating_tasks_stop_once_their_replacements_run() {
        let deployments = [deployment(2, 2, DeploymentStatus::Primary, 0)];
        let mut moving = task("m", 2, Running, 1);
        moving.migrating = true;
        let a = actions(plan_service(
            &service(1, 100, 200),
            &[moving.clone()],
            &deployments,
            3,
        ));
        assert_eq!((a.start, a.stop.len()), (1, 0), "a replacement first");
        let a = actions(plan_service(
            &service(1, 100, 200),
            &[moving, task("r", 2, Running, 2)],
            &deployments,
            3,
        ));
        assert_eq!(stopped(&a), [("m", StopReason::Moved)]);
        assert!(!a.steady, "not steady while one is still moving");
    }

    #[test]
    fn failures_roll_back_when_there_is_a_revision_to_go_back_to() {
        let failing = [
            deployment(2, 2, DeploymentStatus::Primary, 3),
            deployment(1, 1, DeploymentStatus::Active, 0),
        ];
        assert_eq!(
            plan_service(&service(2, 100, 200), &[], &failing, 3),
            ServicePlan::RollBack {
                from: 2,
                failing: rev(2),
                failed: 3,
                to: rev(1)
            }
        );
        // Below the threshold, or with nothing to go back to, it keeps converging.
        assert!(matches!(
            plan_service(&service(2, 100, 200), &[], &failing, 4),
            ServicePlan::Converge(_)
        ));
        let alone = [deployment(2, 2, DeploymentStatus::Primary, 9)];
        let a = actions(plan_service(&service(2, 100, 200), &[], &alone, 3));
        assert!(!a.can_roll_back);
        assert_eq!(a.start, 2);
    }

    #[test]
    fn drained_deployments_complete_and_deletion_stops_everything() {
        let deployments = [
            deployment(2, 2, DeploymentStatus::Primary, 0),
            deployment(1, 1, DeploymentStatus::Active, 0),
        ];
        let a = actions(plan_service(
            &service(1, 100, 200),
            &[task("n", 2, Running, 1)],
            &deployments,
            3,
        ));
        assert_eq!(a.completed, [1]);
        assert_eq!(a.progress, None);
        let mut deleting = service(1, 100, 200);
        deleting.deleting = true;
        assert_eq!(
            plan_service(
                &deleting,
                &[task("n", 2, Running, 1), task("s", 2, Stopping, 2)],
                &deployments,
                3
            ),
            ServicePlan::Delete {
                stop: vec!["n".into()],
                gone: false
            }
        );
        assert_eq!(
            plan_service(&deleting, &[], &deployments, 3),
            ServicePlan::Delete {
                stop: vec![],
                gone: true
            }
        );
    }
}
