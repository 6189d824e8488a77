//! Values the control plane's unit tests build from: a task and a service with every field
//! set to something plain, changed where a test cares with struct update syntax
//! (`Task { state: TaskState::Stopping, ..task("t1", "web") }`).

use tessera_model::service::{Measured, Service, Task, TaskDefRef, TaskState};
use tessera_model::{MiB, MilliCpu, PoolName};

/// Task `id` of `service` (revision 1 of the family named after it), running in pool
/// `gpu` on no host, with 1 CPU and 1 GiB and no GPU.
pub(crate) fn task(id: &str, service: &str) -> Task {
    Task {
        id: id.into(),
        service: service.into(),
        deployment_id: 1,
        task_definition: TaskDefRef {
            family: service.into(),
            revision: 1,
        },
        pool: PoolName::new("gpu").expect("valid"),
        cpu: MilliCpu(1000),
        memory: MiB(1024),
        state: TaskState::Running,
        migrating: false,
        host: None,
        allocations: Vec::new(),
        placement_message: None,
        stop_reason: None,
        exit_code: None,
        measured: Measured::default(),
        ports: Vec::new(),
        health: None,
        health_output: None,
        drain_until: None,
        created_at: tessera_model::time::Timestamp::EPOCH,
        started_at: None,
        stopped_at: None,
    }
}

/// Service `name` (revision 1 of the family named after it) in pool `gpu`, the default
/// project and class, one task, deployed with the default limits.
pub(crate) fn service(name: &str) -> Service {
    Service {
        name: name.into(),
        task_definition: TaskDefRef {
            family: name.into(),
            revision: 1,
        },
        pool: PoolName::new("gpu").expect("valid"),
        project: tessera_model::project::DEFAULT_PROJECT.into(),
        priority: Default::default(),
        desired_count: 1,
        strategy: None,
        constraints: Default::default(),
        deployment: Default::default(),
        stop_timeout_secs: 10,
        deregistration_delay_secs: 0,
        objectives: Default::default(),
        deleting: false,
        created_at: tessera_model::time::Timestamp::EPOCH,
    }
}
