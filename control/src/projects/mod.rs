//! Projects and their quotas: creating and changing them (a guarantee the pool cannot give
//! is refused), members, what each project uses per pool now and over time. What a
//! project holds and is owed, as the scheduler reads it too, is `shares`.

use crate::auth::Accounts;
use crate::error::ControlError;
use crate::parts::Core;
use crate::store::ProjectsStore;
use crate::views::Views;

pub(crate) mod shares;

pub(crate) use shares::project_of;
pub use shares::{HISTORY_KEPT_SECS, pool_capacity, reserved, task_usage};
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_model::project::{
    self, DEFAULT_PROJECT, PoolShare, Project, ProjectInput, ProjectSettings, ProjectView, Usage,
};
use tessera_model::service::TaskState;
use tessera_model::validate::Errors;

/// Projects: creating and changing them (a guarantee the pools cannot give is refused),
/// their members' roles, what each uses now and over time, and the preemptions that
/// concerned them. The limits the scheduler holds placements to are the scheduler's
/// (`scheduler::limits`); this component is what operators change and read.
#[derive(Clone)]
pub struct Projects {
    store: Arc<dyn ProjectsStore>,
    core: Core,
    /// Asked whether a user given a role exists.
    accounts: Accounts,
    /// Read for what each project holds now.
    views: Views,
}

impl Projects {
    pub(crate) fn new(
        store: Arc<dyn ProjectsStore>,
        core: Core,
        accounts: Accounts,
        views: Views,
    ) -> Projects {
        Projects {
            store,
            core,
            accounts,
            views,
        }
    }

    /// The same component writing through `store` (a pass's fenced store).
    pub(crate) fn with_store(
        &self,
        store: Arc<dyn ProjectsStore>,
        core: Core,
        accounts: Accounts,
        views: Views,
    ) -> Projects {
        Projects {
            store,
            core,
            accounts,
            views,
        }
    }
}

impl Projects {
    /// Projects' use over the last `range` (`hour`, `day` or `week`): one project's or
    /// every project's, with each pool's capacity now.
    pub async fn project_usage_history(
        &self,
        project: Option<&str>,
        range: &str,
    ) -> Result<tessera_model::project::UsageHistory, ControlError> {
        let secs = tessera_model::range::Range::parse(range, &tessera_model::range::Range::PROJECT)
            .map_err(|m| ControlError::invalid("range", m))?
            .secs();
        if let Some(p) = project {
            self.store.get_project(p).await?;
        }
        let to = self.core.unix_now();
        let mut samples = self.store.project_usage(to - secs, None).await?;
        if let Some(p) = project {
            samples.retain(|s| s.project == p);
        }
        let hosts = self.store.list_hosts().await?;
        let mut pools: Vec<String> = samples.iter().map(|s| s.pool.clone()).collect();
        pools.sort();
        pools.dedup();
        let capacity = pools
            .into_iter()
            .map(|pool| tessera_model::project::PoolCapacity {
                capacity: pool_capacity(hosts.iter().filter(|h| h.pool.as_str() == pool)),
                pool,
            })
            .collect();
        Ok(tessera_model::project::UsageHistory {
            from: to - secs,
            to,
            samples,
            capacity,
        })
    }

    pub async fn list_projects(&self) -> Result<Vec<ProjectView>, ControlError> {
        let fleet = self.views.fleet().await?;
        self.list_projects_in(&fleet).await
    }

    /// Every project, its use counted from `fleet` (one reading of the fleet read model,
    /// so that they agree with the other figures read from it).
    pub async fn list_projects_in(
        &self,
        fleet: &crate::FleetSnapshot,
    ) -> Result<Vec<ProjectView>, ControlError> {
        let projects = self.store.list_projects().await?;
        let services = self.store.list_services().await?;
        let project_of = project_of(&services);
        // (project, pool) -> (used, pending)
        let mut by: BTreeMap<(String, String), (Usage, u32)> = BTreeMap::new();
        // (project, service, pool) -> (waiting tasks, the last reason given)
        let mut waiting: BTreeMap<(String, String, String), (u32, Option<String>)> =
            BTreeMap::new();
        for t in fleet.holding().chain(fleet.pending()) {
            let project = project_of
                .get(&t.service)
                .cloned()
                .unwrap_or_else(|| DEFAULT_PROJECT.to_owned());
            if t.state == TaskState::Pending {
                let w = waiting
                    .entry((project.clone(), t.service.clone(), t.pool.to_string()))
                    .or_default();
                w.0 += 1;
                if t.placement_message.is_some() {
                    w.1.clone_from(&t.placement_message);
                }
            }
            let e = by.entry((project, t.pool.to_string())).or_default();
            if t.state == TaskState::Pending {
                e.1 += 1;
            } else {
                e.0 = e.0.plus(&task_usage(t));
            }
        }
        let members = self.store.project_members().await?;
        Ok(projects
            .into_iter()
            .map(|p| {
                let mut pools: BTreeMap<String, PoolShare> = BTreeMap::new();
                for q in &p.quotas {
                    pools.insert(q.pool.clone(), share(&q.pool, &p, Usage::default(), 0));
                }
                for ((project, pool), (used, pending)) in &by {
                    if project == &p.name {
                        pools.insert(pool.clone(), share(pool, &p, *used, *pending));
                    }
                }
                ProjectView {
                    services: services.iter().filter(|s| s.project == p.name).count() as u32,
                    pools: pools.into_values().collect(),
                    waiting: waiting
                        .iter()
                        .filter(|((project, _, _), _)| project == &p.name)
                        .map(|((_, service, pool), (tasks, reason))| project::Waiting {
                            service: service.clone(),
                            pool: pool.clone(),
                            tasks: *tasks,
                            reason: reason.clone(),
                        })
                        .collect(),
                    members: members
                        .iter()
                        .filter(|(project, _, _)| project == &p.name)
                        .map(|(_, username, role)| project::Member {
                            username: username.clone(),
                            role: *role,
                        })
                        .collect(),
                    project: p,
                }
            })
            .collect())
    }

    /// The newest preemptions first (those `project` took room or lost it in, when given),
    /// at most `limit`, and every open one (proposed, approved, declined) besides.
    pub async fn list_preemptions(
        &self,
        project: Option<&str>,
        limit: u32,
    ) -> Result<Vec<tessera_model::project::Preemption>, ControlError> {
        // Read enough to fill `limit` after the filter (the store keeps a bounded number).
        let read = if project.is_some() {
            crate::store::PREEMPTIONS_KEPT as u32
        } else {
            limit
        };
        let mut all = self.store.list_preemptions(read).await?;
        if let Some(p) = project {
            all.retain(|x| x.involves(p));
        }
        all.truncate(limit as usize);
        for open in self.store.open_preemptions(None).await? {
            if project.is_none_or(|p| open.involves(p)) && !all.iter().any(|x| x.id == open.id) {
                all.push(open);
            }
        }
        all.sort_by_key(|p| std::cmp::Reverse(p.id));
        Ok(all)
    }

    /// The project service `name` belongs to (for checking a caller's role there).
    pub async fn project_of_service(&self, name: &str) -> Result<String, ControlError> {
        Ok(self.store.get_service(name).await?.project)
    }

    pub async fn get_project(&self, name: &str) -> Result<ProjectView, ControlError> {
        self.list_projects()
            .await?
            .into_iter()
            .find(|p| p.project.name == name)
            .ok_or_else(|| ControlError::NotFound(format!("no project named {name:?}")))
    }

    pub async fn create_project(&self, input: &ProjectInput) -> Result<Project, ControlError> {
        let project = project::validate(input)?;
        self.check_quotas(&project).await?;
        self.store.create_project(&project).await?;
        self.core
            .event(None, None, &format!("project {} created", project.name))
            .await;
        self.core.wake();
        Ok(self.store.get_project(&project.name).await?)
    }

    /// Replaces `name`'s weight and quotas with `settings`.
    pub async fn replace_project(
        &self,
        name: &str,
        settings: &ProjectSettings,
    ) -> Result<Project, ControlError> {
        // Its name is its identity: a project that is not there is not found, whatever
        // the body says.
        self.store.get_project(name).await?;
        let project = project::validate(&settings.named(name))?;
        self.check_quotas(&project).await?;
        self.store.replace_project(&project).await?;
        self.core
            .event(None, None, &format!("project {name}'s quotas changed"))
            .await;
        self.core.wake();
        Ok(self.store.get_project(name).await?)
    }

    /// Gives `username` `role` in project `name` (viewer or operator: admins are admins
    /// everywhere).
    pub async fn set_project_member(
        &self,
        name: &str,
        username: &str,
        role: tessera_model::auth::Role,
    ) -> Result<(), ControlError> {
        if role == tessera_model::auth::Role::Admin {
            let mut e = Errors::default();
            e.add(
                "role",
                "admins are admins in every project: give viewer or operator here, or make the user an admin",
            );
            e.finish()?;
        }
        self.store.get_project(name).await?;
        self.accounts.get_user(username).await?;
        self.store.set_project_member(name, username, role).await?;
        self.core
            .event(
                None,
                None,
                &format!("user {username} is {role} in project {name}"),
            )
            .await;
        Ok(())
    }

    /// Takes `username`'s role in project `name` away.
    pub async fn remove_project_member(
        &self,
        name: &str,
        username: &str,
    ) -> Result<(), ControlError> {
        self.store.get_project(name).await?;
        self.store.remove_project_member(name, username).await?;
        self.core
            .event(
                None,
                None,
                &format!("user {username} has no role in project {name} any more"),
            )
            .await;
        Ok(())
    }

    pub async fn delete_project(&self, name: &str) -> Result<(), ControlError> {
        if name == DEFAULT_PROJECT {
            return Err(ControlError::Conflict(
                "the default project cannot be deleted: services that name no project belong to it"
                    .into(),
            ));
        }
        self.store.delete_project(name).await?;
        self.core
            .event(None, None, &format!("project {name} deleted"))
            .await;
        Ok(())
    }

    /// A quota's pool exists, and the guarantees of every project in it, this one's
    /// included, fit in what its hosts offer. Limits may add up to more (that is what
    /// borrowing is).
    async fn check_quotas(&self, project: &Project) -> Result<(), ControlError> {
        let pools: Vec<String> = self
            .store
            .list_pools()
            .await?
            .into_iter()
            .map(|p| p.name.to_string())
            .collect();
        let (before, others): (Vec<Project>, Vec<Project>) = self
            .store
            .list_projects()
            .await?
            .into_iter()
            .partition(|p| p.name == project.name);
        let hosts = self.store.list_hosts().await?;
        let mut e = Errors::default();
        for (i, q) in project.quotas.iter().enumerate() {
            if !pools.contains(&q.pool) {
                e.add(
                    &format!("quotas[{i}].pool"),
                    format!("no pool named {:?}", q.pool),
                );
                continue;
            }
            let guaranteed = others
                .iter()
                .filter_map(|o| o.quota(&q.pool))
                .fold(q.guaranteed.or_zero(), |sum, o| {
                    sum.plus(&o.guaranteed.or_zero())
                });
            let capacity = pool_capacity(hosts.iter().filter(|h| h.pool.as_str() == q.pool));
            // A guarantee that does not grow is never refused (the pool may have shrunk
            // under guarantees given before: lowering one must stay possible).
            let old = before
                .first()
                .and_then(|b| b.quota(&q.pool))
                .map(|b| b.guaranteed.or_zero())
                .unwrap_or_default();
            let grows: Vec<&str> = q
                .guaranteed
                .or_zero()
                .named()
                .into_iter()
                .zip(old.named())
                .filter(|((_, new), (_, old))| new > old)
                .map(|((field, _), _)| field)
                .collect();
            for (field, shortfall) in capacity.shortfalls(&guaranteed) {
                if !grows.contains(&field) {
                    continue;
                }
                e.add(
                    &format!("quotas[{i}].guaranteed.{field}"),
                    format!("pool {}: {shortfall}", q.pool),
                );
            }
        }
        Ok(e.finish()?)
    }
}

fn share(pool: &str, p: &Project, used: Usage, pending: u32) -> PoolShare {
    let (guaranteed, limit) = p
        .quota(pool)
        .map(|q| (q.guaranteed, q.limit))
        .unwrap_or_default();
    PoolShare {
        pool: pool.to_owned(),
        guaranteed,
        limit,
        borrowed: used.above(&guaranteed.or_zero()),
        used,
        pending,
    }
}
