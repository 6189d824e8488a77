//! Carrying out a plan, one move at a time from the reconcile pass, start before stop; and
//! undoing a moved service's moves when its alarm fires after them.

use super::{corrupt, from_stored, plan_body};
use crate::control::Control;
use crate::error::ControlError;
use crate::store::{NewTask, PlacementCommit};
use std::collections::BTreeSet;
use tessera_model::HostId;
use tessera_model::consolidation::{ConsolidationPlan, MoveState, PlanStatus, PlannedMove};
use tessera_model::service::{GpuAllocation, TaskState};

impl Control {
    /// One step of every executing plan (from the reconcile pass): start the next move,
    /// or see whether the move under way finished.
    pub(crate) async fn advance_consolidation(&self) -> Result<(), ControlError> {
        for stored in self.store.list_plans(20).await? {
            let executing = stored.status == PlanStatus::Executing.as_str();
            if !executing && stored.status != PlanStatus::Done.as_str() {
                continue;
            }
            let mut plan = from_stored(&stored)?;
            let before = plan.clone();
            // A moved service whose alarm fires after its move: its moves are undone (while
            // the plan executes, and for the service's bake time after it is done).
            let undone = self.undo_on_alarm(&mut plan).await?;
            if executing && !undone {
                self.advance_plan(&mut plan).await?;
            }
            if plan != before
                && !self
                    .store
                    .update_plan(&plan_body(&plan)?, &stored.status)
                    .await?
            {
                // Cancelled meanwhile: the cancel stands (a move it started finishes).
                tracing::info!(plan = %plan.id, "consolidation plan changed meanwhile; its step is not recorded");
            }
        }
        Ok(())
    }

    async fn advance_plan(&self, plan: &mut ConsolidationPlan) -> Result<(), ControlError> {
        let id = plan.id.clone();
        let Some(i) = plan.moves.iter().position(|m| m.state != MoveState::Done) else {
            plan.status = PlanStatus::Done;
            plan.finished_at = Some(self.unix_now());
            self.event(
                None,
                None,
                &format!(
                    "consolidation plan {id} done: {} move(s); freed {}",
                    plan.moves.len(),
                    if plan.goal == "hosts" {
                        format!("{} host(s)", plan.frees_hosts.len())
                    } else {
                        format!("{} GPU(s)", plan.frees_gpus.len())
                    }
                ),
            )
            .await;
            return Ok(());
        };
        let m = plan.moves[i].clone();
        let fail = |plan: &mut ConsolidationPlan, why: String| {
            plan.moves[i].state = MoveState::Failed;
            plan.moves[i].message = Some(why.clone());
            plan.status = PlanStatus::Failed;
            plan.message = Some(format!(
                "halted at move {} of {}: {why}",
                i + 1,
                plan.moves.len()
            ));
        };
        match m.state {
            MoveState::Pending => {
                let task = match self.store.get_task(&m.task_id).await {
                    Ok(t) => Some(t),
                    Err(crate::StoreError::NotFound { .. }) => None,
                    Err(e) => return Err(e.into()),
                };
                let Some(t) = task.filter(|t| {
                    t.state == TaskState::Running
                        && !t.migrating
                        && t.host.as_ref().map(HostId::as_str) == Some(m.from_host.as_str())
                }) else {
                    fail(
                        plan,
                        format!(
                            "task {} no longer runs on {} as planned",
                            m.task_id, m.from_host
                        ),
                    );
                    self.plan_event(plan, &m).await;
                    return Ok(());
                };
                let to = HostId::new(m.to_host.clone()).map_err(|e| corrupt(e.to_string()))?;
                let replacement = uuid::Uuid::new_v4().to_string();
                // One transaction: the replacement placed on the target and the original
                // marked as moving, or nothing (a crash between them would leave the
                // service a task over, and a restarted plan would start a second one).
                let started = self
                    .store
                    .start_move(
                        &t.id,
                        t.host.as_ref().expect("a running task has a host"),
                        &NewTask::of(
                            replacement.clone(),
                            &t.service,
                            t.deployment_id,
                            &t.task_definition,
                            &t.pool,
                            &*self.spec_of(&t.task_definition).await?,
                        ),
                        &PlacementCommit {
                            task_id: replacement.clone(),
                            host: to.clone(),
                            allocations: m.allocations.clone(),
                        },
                    )
                    .await?;
                if !started {
                    fail(
                        plan,
                        format!(
                            "{}/GPU {:?} no longer has room for task {} (or the task changed meanwhile)",
                            m.to_host, m.to_gpus, m.task_id
                        ),
                    );
                    self.plan_event(plan, &m).await;
                    return Ok(());
                }
                self.capacity_changed();
                let mv = &mut plan.moves[i];
                mv.state = MoveState::Starting;
                mv.replacement = Some(replacement.clone());
                mv.started_at = Some(self.unix_now());
                self.event(
                    Some(&t.service),
                    Some(&to),
                    &format!(
                        "consolidation plan {id}: moving task {} from {}/GPU {:?} to {}/GPU {:?}; replacement {replacement} starts first",
                        t.id, m.from_host, m.from_gpus, m.to_host, m.to_gpus
                    ),
                )
                .await;
            }
            MoveState::Starting => {
                let Some(rid) = m.replacement.clone() else {
                    fail(plan, "a started move has no replacement".into());
                    return Ok(());
                };
                let replacement = self.store.get_task(&rid).await?;
                let original = self.store.get_task(&m.task_id).await.ok();
                if replacement.state == TaskState::Stopped {
                    if let Some(o) = original.as_ref().filter(|o| o.state.is_live()) {
                        self.store.set_task_migrating(&o.id, false).await?;
                    }
                    fail(
                        plan,
                        format!(
                            "replacement {rid} stopped: {}",
                            replacement
                                .stop_reason
                                .as_deref()
                                .unwrap_or("unknown reason")
                        ),
                    );
                    self.plan_event(plan, &m).await;
                } else if original.is_none_or(|o| o.state == TaskState::Stopped) {
                    plan.moves[i].state = MoveState::Done;
                    self.event(
                        Some(&m.service),
                        None,
                        &format!(
                            "consolidation plan {id}: task {} moved to {}/GPU {:?} as {rid} ({} of {})",
                            m.task_id,
                            m.to_host,
                            m.to_gpus,
                            i + 1,
                            plan.moves.len()
                        ),
                    )
                    .await;
                }
            }
            MoveState::Done | MoveState::Failed | MoveState::Undone => {}
        }
        Ok(())
    }

    /// Undoes the moves of a moved service whose alarm fired after its first move started,
    /// while the plan is watched (executing, or done less than the service's bake time
    /// ago): done moves are moved back to their original GPUs (replacement first, as any
    /// move), a starting move's replacement is stopped, and an executing plan halts.
    /// Whether anything was undone.
    async fn undo_on_alarm(&self, plan: &mut ConsolidationPlan) -> Result<bool, ControlError> {
        let now = self.unix_now();
        let services: BTreeSet<String> = plan
            .moves
            .iter()
            .filter(|m| matches!(m.state, MoveState::Starting | MoveState::Done))
            .map(|m| m.service.clone())
            .collect();
        let mut undone = false;
        for name in services {
            let Ok(service) = self.store.get_service(&name).await else {
                continue;
            };
            if service.objectives.alarms.is_empty() {
                continue;
            }
            if plan.status == PlanStatus::Done
                && plan
                    .finished_at
                    .is_none_or(|f| now - f > i64::from(service.objectives.bake_secs))
            {
                continue;
            }
            let first = plan
                .moves
                .iter()
                .filter(|m| m.service == name)
                .filter_map(|m| m.started_at)
                .min()
                .unwrap_or(now);
            let fired = {
                let watches = self.passes.watches.lock();
                service
                    .objectives
                    .alarms
                    .iter()
                    .enumerate()
                    .find_map(|(i, a)| {
                        let w = watches.alarms.get(&(name.clone(), i))?;
                        let at = w.fired_at.filter(|&at| at >= first)?;
                        Some((a.describe(), w.value, at))
                    })
            };
            let Some((alarm, value, _)) = fired else {
                continue;
            };
            let why = format!(
                "alarm `{alarm}` of {name} fired after its tasks moved{}",
                value
                    .map(|v| format!(
                        " ({})",
                        tessera_model::work::trim_float((v * 10.0).round() / 10.0)
                    ))
                    .unwrap_or_default()
            );
            let mut back = 0;
            for i in 0..plan.moves.len() {
                let m = plan.moves[i].clone();
                if m.service != name {
                    continue;
                }
                match m.state {
                    MoveState::Done => {
                        if self.move_back(&m).await? {
                            back += 1;
                            plan.moves[i].state = MoveState::Undone;
                            plan.moves[i].message = Some(format!("moved back: {why}"));
                        } else {
                            plan.moves[i].message = Some(format!(
                                "{why}; not moved back: its original GPU has no room now"
                            ));
                        }
                    }
                    MoveState::Starting => {
                        if let Some(rid) = &m.replacement {
                            self.store
                                .request_task_stop(
                                    rid,
                                    "its move was undone: an alarm fired",
                                    None,
                                    false,
                                )
                                .await?;
                        }
                        if let Ok(o) = self.store.get_task(&m.task_id).await
                            && o.state.is_live()
                        {
                            self.store.set_task_migrating(&o.id, false).await?;
                        }
                        plan.moves[i].state = MoveState::Undone;
                        plan.moves[i].message = Some(format!("cancelled: {why}"));
                    }
                    _ => {}
                }
            }
            if plan.status == PlanStatus::Executing {
                plan.status = PlanStatus::Failed;
            }
            plan.message = Some(format!("halted: {why}; {back} move(s) moved back"));
            self.event(
                Some(&name),
                None,
                &format!(
                    "consolidation plan {}: {why}: {back} of its task(s) moved back",
                    plan.id
                ),
            )
            .await;
            self.capacity_changed();
            self.wake();
            undone = true;
        }
        Ok(undone)
    }

    /// Starts the moved task of `m` again on the GPUs it left (its replacement there
    /// starts first). False when they no longer have room.
    async fn move_back(&self, m: &PlannedMove) -> Result<bool, ControlError> {
        let Some(rid) = &m.replacement else {
            return Ok(false);
        };
        let Ok(moved) = self.store.get_task(rid).await else {
            return Ok(false);
        };
        let from = HostId::new(m.from_host.clone()).map_err(|e| corrupt(e.to_string()))?;
        let to = HostId::new(m.to_host.clone()).map_err(|e| corrupt(e.to_string()))?;
        let host = self.store.get_host(&from).await?;
        let allocations: Vec<GpuAllocation> = m
            .from_gpus
            .iter()
            .zip(&m.allocations)
            .filter_map(|(&index, a)| {
                let gpu = host.gpus.iter().find(|g| g.index == index)?;
                Some(GpuAllocation {
                    gpu: gpu.uuid.clone(),
                    index,
                    memory: a.memory,
                    compute: a.compute,
                    dedicated: a.dedicated,
                })
            })
            .collect();
        if allocations.len() != m.allocations.len() {
            return Ok(false);
        }
        let back = uuid::Uuid::new_v4().to_string();
        Ok(self
            .store
            .start_move(
                &moved.id,
                &to,
                &NewTask::of(
                    back.clone(),
                    &moved.service,
                    moved.deployment_id,
                    &moved.task_definition,
                    &moved.pool,
                    &*self.spec_of(&moved.task_definition).await?,
                ),
                &PlacementCommit {
                    task_id: back,
                    host: from,
                    allocations,
                },
            )
            .await?)
    }

    async fn plan_event(&self, plan: &ConsolidationPlan, m: &PlannedMove) {
        let message = format!(
            "consolidation plan {} {}",
            plan.id,
            plan.message.as_deref().unwrap_or("failed")
        );
        self.event(Some(&m.service), None, &message).await;
    }
}
