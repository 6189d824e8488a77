//! The REST API's own response bodies: lists wrapped in an object (so fields can be added
//! later), and the error body. The server answers with them and the command line reads
//! them, so both agree by construction.

use crate::auth::{ApiTokenInfo, AuditEntry, UserInfo};
use crate::service::{Event, Task, TaskDefinition};
use crate::taskdef::FieldError;
use crate::{HostInfo, PoolInfo};
use serde::{Deserialize, Serialize};

/// `GET /healthz`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Serialize, Deserialize)]
pub struct Health {
    #[cfg_attr(feature = "openapi", schema(examples("ok")))]
    pub status: String,
}

/// Every error: what was wrong, and for invalid input each field with its rule.
/// One event of `GET /api/v1/live` as an event-stream client reads it (each event's
/// fields, as OpenAPI 3.2's `itemSchema` describes a stream): `data` is `change`, the event
/// name the default `message`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Serialize, Deserialize)]
pub struct LiveEvent {
    #[cfg_attr(feature = "openapi", schema(pattern = "^change$"))]
    pub data: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^message$"))]
    pub event: Option<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", schema(as = Error))]
pub struct ErrorBody {
    pub error: String,
    /// Present for `422` invalid input: every broken rule with its field path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub errors: Option<Vec<FieldError>>,
}

macro_rules! list {
    ($(#[$doc:meta])* $name:ident { $field:ident: $item:ty }) => {
        $(#[$doc])*
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Serialize, Deserialize)]
        pub struct $name {
            pub $field: Vec<$item>,
        }
    };
}

list!(/// `GET /api/v1/hosts`.
    HostList { hosts: HostInfo });
list!(/// `GET /api/v1/pools`.
    PoolList { pools: PoolInfo });
list!(/// `GET /api/v1/pools/{name}/machines`: the machines its capacity provider was asked
    /// for, newest first: those booting, active or terminating, then the last that ended.
    MachineList { machines: crate::provider::Machine });
list!(/// `GET /api/v1/projects`: each project with its quotas and what it uses per pool.
    ProjectList { projects: crate::project::ProjectView });
list!(/// `GET /api/v1/preemptions`, newest first.
    PreemptionList { preemptions: crate::project::Preemption });
list!(/// `GET /api/v1/task-definitions`: the newest revision of each family.
    FamilyList { task_definitions: TaskDefinition });
list!(/// `GET /api/v1/task-definitions/{family}`: every revision.
    RevisionList { revisions: TaskDefinition });
list!(/// `GET /api/v1/services`.
    ServiceList { services: crate::api::ServiceDetail });
list!(/// `GET /api/v1/tasks`.
    TaskList { tasks: Task });
list!(/// `GET /api/v1/events`, newest first.
    EventList { events: Event });
list!(/// `GET /api/v1/tokens` (never their values).
    TokenList { tokens: ApiTokenInfo });
list!(/// `GET /api/v1/users`.
    UserList { users: UserInfo });
list!(/// `GET /api/v1/audit`, newest first.
    AuditList { entries: AuditEntry });

/// `GET /api/v1/hosts/{id}`: the host and the tasks that hold capacity on it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Serialize, Deserialize)]
pub struct HostDetail {
    #[serde(flatten)]
    pub host: HostInfo,
    pub tasks: Vec<Task>,
}

/// `POST /api/v1/join-token`: shown this once.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Serialize, Deserialize)]
pub struct JoinToken {
    pub join_token: String,
}

/// `GET /api/v1/join-tokens`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Serialize, Deserialize)]
pub struct JoinTokenList {
    pub join_tokens: Vec<crate::auth::JoinTokenInfo>,
}

/// A task definition in ECS's shape (`?format=ecs`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EcsTaskDefinition(pub serde_json::Value);

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for EcsTaskDefinition {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::schema::ecs_task_definition().into()
    }
}
#[cfg(feature = "openapi")]
impl utoipa::ToSchema for EcsTaskDefinition {}

/// A task definition to register, in Tessera's shape or ECS's (told apart by
/// `containerDefinitions`); read by the task-definition parser, which names every
/// broken rule.
#[derive(Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskDefinitionInput(pub serde_json::Value);

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for TaskDefinitionInput {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::OneOfBuilder::new()
            .item(crate::schema::native_task_definition())
            .item(utoipa::openapi::Ref::from_schema_name("EcsTaskDefinition"))
            .into()
    }
}
#[cfg(feature = "openapi")]
impl utoipa::ToSchema for TaskDefinitionInput {}

/// `GET /api/v1/task-definitions/{id}`: one revision (`family:revision`, in either
/// shape), or a family's revisions (`family`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TaskDefinitionAnswer {
    Revision(Box<TaskDefinition>),
    Ecs(EcsTaskDefinition),
    Revisions(RevisionList),
}

list!(/// `GET /api/v1/consolidation-plans`, newest first.
    PlanList { plans: crate::consolidation::ConsolidationPlan });

/// `POST /api/v1/services/{name}/right-size`: the revision registered and what it changed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Serialize, Deserialize)]
pub struct RightSized {
    pub proposal: crate::fit::RightSize,
    pub task_definition: TaskDefinition,
}
