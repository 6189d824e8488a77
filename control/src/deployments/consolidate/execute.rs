//! Carrying out a plan, one move at a time from the reconcile pass, start before stop; and
//! undoing a moved service's moves when its alarm fires after them.

use super::{corrupt, from_stored, plan_body};
use crate::deployments::Deployments;
use crate::error::ControlError;
use crate::store::{NewTask, PlacementCommit};
use std::collections::BTreeSet;
use tessera_model::HostId;
use tessera_model::consolidation::{ConsolidationPlan, MoveState, PlanStatus, PlannedMove};
use tessera_model::service::StopReason;
use tessera_model::service::{GpuAllocation, TaskState};

impl Deployments {
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

    /// Takes the plan's first move not done one step: a pending move starts its
    /// replacement, a starting one is done once its original stopped (or fails when its
    /// replacement did); with every move done, the plan is.
    async fn advance_plan(&self, plan: &mut ConsolidationPlan) -> Result<(), ControlError> {
        let Some(i) = plan.moves.iter().position(|m| m.state != MoveState::Done) else {
            plan.status = PlanStatus::Done;
            plan.finished_at = Some(self.core.unix_now());
            let freed = if plan.goal == "hosts" {
                format!("{} host(s)", plan.frees_hosts.len())
            } else {
                format!("{} GPU(s)", plan.frees_gpus.len())
            };
            let said = format!(
                "consolidation plan {} done: {} move(s); freed {freed}",
                plan.id,
                plan.moves.len()
            );
            self.core.event(None, None, &said).await;
            return Ok(());
        };
        let m = plan.moves[i].clone();
        let failed = match m.state {
            MoveState::Pending => self.start_planned_move(plan, i).await?,
            MoveState::Starting => self.finish_planned_move(plan, i).await?,
            MoveState::Done | MoveState::Failed | MoveState::Undone => None,
        };
        if let Some(why) = failed {
            fail_move(plan, i, why);
            self.plan_event(plan, &m).await;
        }
        Ok(())
    }

    /// Starts move `i` (pending): its replacement placed on the target and the original
    /// marked as moving, in one transaction. Why it failed, if it did.
    async fn start_planned_move(
        &self,
        plan: &mut ConsolidationPlan,
        i: usize,
    ) -> Result<Option<String>, ControlError> {
        let m = plan.moves[i].clone();
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
            return Ok(Some(format!(
                "task {} no longer runs on {} as planned",
                m.task_id, m.from_host
            )));
        };
        let to = HostId::new(m.to_host.clone()).map_err(|e| corrupt(e.to_string()))?;
        let replacement = uuid::Uuid::new_v4().to_string();
        // One transaction: a crash between the two would leave the service a task over,
        // and a restarted plan would start a second one.
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
                    &*self.scheduler.spec_of(&t.task_definition).await?,
                ),
                &PlacementCommit {
                    task_id: replacement.clone(),
                    host: to.clone(),
                    allocations: m.allocations.clone(),
                },
            )
            .await?;
        if !started {
            return Ok(Some(format!(
                "{}/GPU {:?} no longer has room for task {} (or the task changed meanwhile)",
                m.to_host, m.to_gpus, m.task_id
            )));
        }
        self.scheduler.capacity_changed();
        let mv = &mut plan.moves[i];
        mv.state = MoveState::Starting;
        mv.replacement = Some(replacement.clone());
        mv.started_at = Some(self.core.unix_now());
        let said = format!(
            "consolidation plan {}: moving task {} from {}/GPU {:?} to {}/GPU {:?}; replacement {replacement} starts first",
            plan.id, t.id, m.from_host, m.from_gpus, m.to_host, m.to_gpus
        );
        self.core.event(Some(&t.service), Some(&to), &said).await;
        Ok(None)
    }

    /// Move `i` (starting) is done once its original stopped; it fails when its
    /// replacement stopped (the original serves on). Why it failed, if it did.
    async fn finish_planned_move(
        &self,
        plan: &mut ConsolidationPlan,
        i: usize,
    ) -> Result<Option<String>, ControlError> {
        let m = plan.moves[i].clone();
        let Some(rid) = m.replacement.clone() else {
            return Ok(Some("a started move has no replacement".into()));
        };
        let replacement = self.store.get_task(&rid).await?;
        let original = self.store.get_task(&m.task_id).await.ok();
        if replacement.state == TaskState::Stopped {
            if let Some(o) = original.as_ref().filter(|o| o.state.is_live()) {
                self.store.set_task_migrating(&o.id, false).await?;
            }
            let why = replacement
                .stop_reason
                .as_deref()
                .unwrap_or("unknown reason");
            return Ok(Some(format!("replacement {rid} stopped: {why}")));
        }
        if original.is_none_or(|o| o.state == TaskState::Stopped) {
            plan.moves[i].state = MoveState::Done;
            let said = format!(
                "consolidation plan {}: task {} moved to {}/GPU {:?} as {rid} ({} of {})",
                plan.id,
                m.task_id,
                m.to_host,
                m.to_gpus,
                i + 1,
                plan.moves.len()
            );
            self.core.event(Some(&m.service), None, &said).await;
        }
        Ok(None)
    }

    /// Undoes the moves of a moved service whose alarm fired after its first move started,
    /// while the plan is watched (executing, or done less than the service's bake time
    /// ago): done moves are moved back to their original GPUs (replacement first, as any
    /// move), a starting move's replacement is stopped, and an executing plan halts.
    /// Whether anything was undone.
    async fn undo_on_alarm(&self, plan: &mut ConsolidationPlan) -> Result<bool, ControlError> {
        let services: BTreeSet<String> = plan
            .moves
            .iter()
            .filter(|m| matches!(m.state, MoveState::Starting | MoveState::Done))
            .map(|m| m.service.clone())
            .collect();
        let mut undone = false;
        for name in services {
            let Some(why) = self.alarm_after_moves(plan, &name).await else {
                continue;
            };
            let mut back = 0;
            for i in 0..plan.moves.len() {
                if plan.moves[i].service == name {
                    back += usize::from(self.undo_move(plan, i, &why).await?);
                }
            }
            if plan.status == PlanStatus::Executing {
                plan.status = PlanStatus::Failed;
            }
            plan.message = Some(format!("halted: {why}; {back} move(s) moved back"));
            let said = format!(
                "consolidation plan {}: {why}: {back} of its task(s) moved back",
                plan.id
            );
            self.core.event(Some(&name), None, &said).await;
            self.scheduler.capacity_changed();
            self.core.wake();
            undone = true;
        }
        Ok(undone)
    }

    /// Why the moves of service `name` are undone: an alarm of it that fired after its
    /// first move started, while the plan is watched (executing, or done less than the
    /// service's bake time ago).
    async fn alarm_after_moves(&self, plan: &ConsolidationPlan, name: &str) -> Option<String> {
        let now = self.core.unix_now();
        let service = self.store.get_service(name).await.ok()?;
        if service.objectives.alarms.is_empty() {
            return None;
        }
        if plan.status == PlanStatus::Done
            && plan
                .finished_at
                .is_none_or(|f| now - f > i64::from(service.objectives.bake_secs))
        {
            return None;
        }
        let first = plan
            .moves
            .iter()
            .filter(|m| m.service == name)
            .filter_map(|m| m.started_at)
            .min()
            .unwrap_or(now);
        let (alarm, value) = {
            let watches = self.passes.watches.lock();
            service
                .objectives
                .alarms
                .iter()
                .enumerate()
                .find_map(|(i, a)| {
                    let w = watches.alarms.get(&(name.to_owned(), i))?;
                    w.fired_at.filter(|&at| at >= first)?;
                    Some((a.describe(), w.value))
                })?
        };
        let value = value
            .map(|v| {
                format!(
                    " ({})",
                    tessera_model::work::trim_float((v * 10.0).round() / 10.0)
                )
            })
            .unwrap_or_default();
        Some(format!(
            "alarm `{alarm}` of {name} fired after its tasks moved{value}"
        ))
    }

    /// Undoes move `i` for `why`: a done move is moved back where its original GPU has
    /// room, a starting move's replacement is stopped. Whether a task moved back.
    async fn undo_move(
        &self,
        plan: &mut ConsolidationPlan,
        i: usize,
        why: &str,
    ) -> Result<bool, ControlError> {
        let m = plan.moves[i].clone();
        match m.state {
            MoveState::Done => {
                if self.move_back(&m).await? {
                    plan.moves[i].state = MoveState::Undone;
                    plan.moves[i].message = Some(format!("moved back: {why}"));
                    return Ok(true);
                }
                plan.moves[i].message = Some(format!(
                    "{why}; not moved back: its original GPU has no room now"
                ));
            }
            MoveState::Starting => {
                if let Some(rid) = &m.replacement {
                    self.store
                        .request_task_stop(rid, &StopReason::MoveUndone, None, false)
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
        Ok(false)
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
                    &*self.scheduler.spec_of(&moved.task_definition).await?,
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
        self.core.event(Some(&m.service), None, &message).await;
    }
}

/// Marks move `i` failed for `why`, and the plan halted there.
fn fail_move(plan: &mut ConsolidationPlan, i: usize, why: String) {
    plan.moves[i].state = MoveState::Failed;
    plan.moves[i].message = Some(why.clone());
    plan.status = PlanStatus::Failed;
    plan.message = Some(format!(
        "halted at move {} of {}: {why}",
        i + 1,
        plan.moves.len()
    ));
}
