//! The store interface. Callers hold an `Arc<dyn Store>` and never see which database is
//! behind it: embedded SQLite, or PostgreSQL for fleets that outgrow one machine.
//!
//! One trait per aggregate, each in its own file with the types it reads and writes (the
//! queries behind them are in `src/sql/`, by the same names): `auth`, `hosts`, `services`,
//! `projects`, `tasks`, `events`, `cluster`, `fleet` (what the fleet read model reads), and `usage` (measured use and consolidation plans).

mod auth;
mod cluster;
mod events;
mod fleet;
mod hosts;
mod machines;
mod projects;
mod services;
mod tasks;
mod usage;
mod webhooks;

pub use auth::{AuditFilter, AuthStore, NewAuditEntry, NewToken, UserChange, UserCredentials};
pub use cluster::{ClusterStore, Fence, Lease, ServerRow};
pub use events::{EventFilter, EventStore};
pub use fleet::{FLEET_FROM_START, FleetChanges, FleetStore};
pub use hosts::{
    GpuChange, HOST_ID_TAKEN, HostPage, HostPageQuery, HostReport, HostState, HostStore,
    JOIN_TOKEN_SPENT, JoinTokenUse,
};
pub use machines::{Joined, MachineStore};
pub use projects::{PREEMPTIONS_KEPT, ProjectStore};
pub use services::{ServiceStore, SettingsChange};
pub use tasks::{
    CommitContext, HeldCapacity, NewTask, PendingTask, PlacementCommit, Pruned, TaskFilter,
    TaskStore,
};
pub use usage::{
    PlanStore, StoredPlan, UsageGroup, UsageQuery, UsageRow, UsageStore, UsageSummary,
};
pub use webhooks::{Attempt, Target, WebhookStore};

/// Declares a bundle of store traits: what one component reads and writes, and nothing
/// more. Every bundle is a supertrait of [`Store`], so a component's `Arc<dyn Bundle>` is
/// the control plane's store upcast.
macro_rules! bundle {
    ($(#[$doc:meta])* $name:ident: $($part:ident)+) => {
        $(#[$doc])*
        pub trait $name: $($part +)+ {}
        impl<T: $($part +)+ ?Sized> $name for T {}
    };
}

bundle!(
    /// What every component shares: events, and the database's clock.
    CoreStore: EventStore ClusterStore
);
bundle!(
    /// What agent sync reads and writes: hosts and their credentials, their tasks, the
    /// task definitions tasks run, measured use and work, the fleet's join token (a setting),
    /// the machine a provider was asked for that a joining host is.
    AgentStore: HostStore ServiceStore TaskStore UsageStore EventStore MachineStore
);
bundle!(
    /// What the scheduler reads and writes: pools and hosts, services and their
    /// revisions, tasks and their placements, projects' limits, preemptions.
    SchedulerStore: HostStore ServiceStore TaskStore ProjectStore
);
bundle!(
    /// What interference estimates read: services' work history and where tasks run.
    InterferenceStore: UsageStore TaskStore
);
bundle!(
    /// What the read models read: hosts, pools, services, task definitions, tasks, events
    /// and measured use.
    ViewStore: HostStore ServiceStore TaskStore EventStore UsageStore
);
bundle!(
    /// What projects read and write: projects, their members and samples, the services
    /// and pools their use is counted from, preemptions; members are roles (accounts' rows).
    ProjectsStore: ProjectStore ServiceStore HostStore TaskStore AuthStore
);
bundle!(
    /// What deployments read and write: pools, task definitions, services and their
    /// deployments, tasks, hosts (lost and impaired ones' tasks move), projects (a
    /// service's), measured use (work figures, pruning), consolidation plans, settings.
    DeploymentStore: HostStore ServiceStore TaskStore ProjectStore UsageStore PlanStore EventStore
);

bundle!(
    /// What capacity providers read and write: pools and hosts, the machines asked for,
    /// tasks (a host's), events, projects (their guarantees in a pool bound scale-in).
    ProvidersStore: HostStore MachineStore TaskStore EventStore ProjectStore
);

bundle!(
    /// What notifications read and write: webhooks and their deliveries.
    NotifyStore: WebhookStore
);

bundle!(
    /// What logs and exec read: tasks (their hosts and stored last lines), hosts, pools
    /// (whether exec is allowed), services (their projects).
    StreamsStore: TaskStore HostStore ServiceStore
);

/// Everything the control plane persists, one trait per aggregate. Callers hold an `Arc<dyn Store>`;
/// a backend implements the parts and gets this for free.
pub trait Store:
    AuthStore
    + HostStore
    + ServiceStore
    + ProjectStore
    + TaskStore
    + EventStore
    + ClusterStore
    + UsageStore
    + PlanStore
    + FleetStore
    + MachineStore
    + AgentStore
    + SchedulerStore
    + InterferenceStore
    + ViewStore
    + ProjectsStore
    + DeploymentStore
    + ProvidersStore
    + NotifyStore
    + StreamsStore
    + CoreStore
{
}

impl<
    T: AuthStore
        + HostStore
        + ServiceStore
        + ProjectStore
        + TaskStore
        + EventStore
        + ClusterStore
        + UsageStore
        + PlanStore
        + FleetStore
        + MachineStore
        + WebhookStore,
> Store for T
{
}
