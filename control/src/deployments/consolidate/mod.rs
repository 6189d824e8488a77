//! Consolidation plans: moves computed by the placement engine
//! ([`tessera_placement::consolidate`]) that free whole GPUs or hosts of a pool, stored
//! without committing anything, and carried out on request by the scheduler's reconcile
//! pass one move at a time, start before stop: the replacement is placed on the planned
//! GPU (the commit re-checks capacity) and the original is marked as moving, so its service
//! stops it once the replacement runs. A move whose task no longer runs where the plan
//! found it, whose target has no room any more, or whose replacement fails halts the plan.
//!
//! - `planning`: a plan computed from a pool's tasks, with its predicted effects on work.
//! - `auto`: in pools with a capacity provider, plans made and carried out without an
//!   operator for the hosts not needed for the scale-in cooldown, so that they are scaled in.
//! - `execute`: the reconcile pass's step of each executing plan, and undoing moves after an
//!   alarm.

mod auto;
mod execute;
mod planning;

pub(crate) use auto::Freeable;

use crate::deployments::Deployments;
use crate::error::ControlError;
use crate::store::StoredPlan;
use tessera_model::consolidation::{ConsolidationPlan, PlanStatus};

fn corrupt(message: String) -> ControlError {
    ControlError::Store(crate::StoreError::Corrupt {
        what: "consolidation plan",
        message,
    })
}

fn plan_body(p: &ConsolidationPlan) -> Result<StoredPlan, ControlError> {
    Ok(StoredPlan {
        id: p.id.clone(),
        pool: p.pool.clone(),
        goal: p.goal.clone(),
        status: p.status.as_str().to_owned(),
        created_at: p.created_at.to_string(),
        body: serde_json::to_string(p).map_err(|e| corrupt(e.to_string()))?,
    })
}

fn from_stored(s: &StoredPlan) -> Result<ConsolidationPlan, ControlError> {
    serde_json::from_str(&s.body).map_err(|e| corrupt(format!("{}: {e}", s.id)))
}

impl Deployments {
    pub async fn consolidation_plan(&self, id: &str) -> Result<ConsolidationPlan, ControlError> {
        from_stored(&self.store.get_plan(id).await?)
    }

    /// The newest plans first.
    pub async fn consolidation_plans(&self) -> Result<Vec<ConsolidationPlan>, ControlError> {
        self.store
            .list_plans(20)
            .await?
            .iter()
            .map(from_stored)
            .collect()
    }

    /// Starts carrying out a planned plan (`Conflict` in any other status).
    pub async fn execute_consolidation_plan(
        &self,
        id: &str,
    ) -> Result<ConsolidationPlan, ControlError> {
        let mut plan = self.consolidation_plan(id).await?;
        if plan.status != PlanStatus::Planned {
            return Err(ControlError::Conflict(format!(
                "consolidation plan {id} is {}; only a planned plan can be executed",
                plan.status.as_str()
            )));
        }
        plan.status = PlanStatus::Executing;
        self.store_plan_if(&plan, PlanStatus::Planned).await?;
        self.core
            .event(
                None,
                None,
                &format!(
                    "consolidation plan {id} in pool {}: executing {} move(s), start before stop",
                    plan.pool,
                    plan.moves.len()
                ),
            )
            .await;
        self.core.wake();
        Ok(plan)
    }

    /// Stops a plan: no further move starts (one already started finishes).
    pub async fn cancel_consolidation_plan(
        &self,
        id: &str,
    ) -> Result<ConsolidationPlan, ControlError> {
        let mut plan = self.consolidation_plan(id).await?;
        if !matches!(plan.status, PlanStatus::Planned | PlanStatus::Executing) {
            return Err(ControlError::Conflict(format!(
                "consolidation plan {id} is {} already",
                plan.status.as_str()
            )));
        }
        let was = plan.status;
        plan.status = PlanStatus::Cancelled;
        plan.message = Some("cancelled by an operator".into());
        self.store_plan_if(&plan, was).await?;
        self.core
            .event(None, None, &format!("consolidation plan {id} cancelled"))
            .await;
        Ok(plan)
    }

    /// Stores `plan` if its stored status is still `expected` (`Conflict` otherwise: an
    /// execute, a cancel or a pass changed it meanwhile).
    async fn store_plan_if(
        &self,
        plan: &ConsolidationPlan,
        expected: PlanStatus,
    ) -> Result<(), ControlError> {
        if self
            .store
            .update_plan(&plan_body(plan)?, expected.as_str())
            .await?
        {
            Ok(())
        } else {
            Err(ControlError::Conflict(format!(
                "consolidation plan {} changed meanwhile; look again and retry",
                plan.id
            )))
        }
    }
}
