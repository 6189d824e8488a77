//! `GET /api/v1/openapi.json`: the REST and agent APIs described as OpenAPI 3.1, generated
//! from the handlers' `#[utoipa::path]`s and the bodies' types (whose schemas carry the
//! validators' rules, see `tessera_model::schema`). The operations are the router's own
//! ([`crate::api::routes`]): each handler's `#[utoipa::path]` names its declaration
//! (`x-access`: role, project scope, audit), which the router enforces and from which this document's security
//! and the errors every route can answer are derived, so the document cannot disagree with
//! what is enforced. The tests check that answers match their schemas.

use crate::api::{self, bodies, workloads};
use crate::auth::Access;
use crate::auth::Declaration;
use axum::Json;
use serde_json::{Value, json};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tessera",
        description = "GPU-sharing control plane: hosts and their GPUs, task definitions with MPS memory and compute budgets, services placed onto GPUs, and the agents' protocol.",
        license(name = "Apache-2.0"),
    ),
    components(schemas(
        bodies::ErrorBody, bodies::EcsTaskDefinition, tessera_model::taskdef::Secret,
        tessera_model::schema::ServiceName, tessera_model::schema::ProjectName, tessera_model::schema::Username,
        tessera_model::schema::FamilyOrRef, tessera_model::service::TaskDefRef,
        tessera_model::HostId, tessera_model::PoolName, workloads::Format, tessera_model::schema::TokenId,
        tessera_model::schema::PlanId, tessera_model::schema::TaskId, tessera_model::schema::JoinTokenId, tessera_model::work::Slo, tessera_model::work::Alarm,
        tessera_model::work::Autoscaling,
    )),
    tags(
        (name = "server", description = "Health and this document"),
        (name = "session", description = "Signing in, API tokens, users, the audit log"),
        (name = "fleet", description = "Hosts, pools, the join token"),
        (name = "projects", description = "Projects (teams), their quotas per pool and what they use"),
        (name = "workloads", description = "Task definitions, services, placement, tasks, events"),
        (name = "evidence", description = "Fit of measured use against budgets, right-sizing, consolidation plans"),
        (name = "notifications", description = "Webhooks for what on-call people must hear, and their deliveries"),
        (name = "agents", description = "What host agents call"),
    )
)]
struct ApiDoc;

/// This document
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "server",
    extensions(("x-access" = json!(Declaration::PUBLIC))),
    responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
pub async fn spec() -> Json<Value> {
    static DOC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    Json(DOC.get_or_init(document).clone())
}

fn error(description: &str) -> Value {
    json!({ "description": description, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } })
}

/// The generated description, with each route's access and the errors the layers in front
/// of every handler can answer.
pub fn document() -> Value {
    let routes = api::routes();
    let rules = routes.rules().to_vec();
    let (_, operations) = routes.split();
    let mut doc = serde_json::to_value(ApiDoc::openapi().merge_from(operations))
        .expect("the document serializes");
    doc["components"]["securitySchemes"] = json!({
        "agentToken": { "type": "http", "scheme": "bearer", "description": "An agent's token from registration" },
        "apiToken": { "type": "http", "scheme": "bearer", "description": "An API token (tsr_...)" },
        "session": { "type": "apiKey", "in": "cookie", "name": "tessera_session", "description": "A console session; changes must come from the console's origin" }
    });
    for rule in &rules {
        let method = rule.method.as_str().to_ascii_lowercase();
        let op = &mut doc["paths"][rule.path.as_str()][method.as_str()];
        op["security"] = match rule.access() {
            Access::Public => json!([]),
            Access::Agent => json!([{"agentToken": []}]),
            Access::Role(_) | Access::InProject(_) => json!([{"apiToken": []}, {"session": []}]),
        };
        let has_body = op.get("requestBody").is_some();
        let has_query = op["parameters"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["in"] == "query"));
        let responses = op["responses"].as_object_mut().expect("responses");
        let mut add = |status: &str, v: Value| {
            responses.entry(status.to_owned()).or_insert(v);
        };
        add(
            "400",
            error("The Host header, a path segment, a query parameter or the body cannot be read"),
        );
        add(
            "503",
            json!({ "description": "No answer within the server's request timeout, or the server is busy: try again" }),
        );
        add(
            "500",
            error("Internal error (the server log has the cause)"),
        );
        if rule.method != axum::http::Method::GET {
            add("403", error("A cross-site request from a browser"));
        }
        match rule.access() {
            Access::Public => {}
            Access::Agent => add("401", error("No or bad agent token")),
            Access::Role(_) => {
                add("401", error("No or bad credentials"));
                add(
                    "403",
                    error("The caller's role is too low, or a cross-site request"),
                );
            }
            Access::InProject(_) => {
                add("401", error("No or bad credentials"));
                add(
                    "403",
                    error(
                        "The caller's role in the project acted on is too low, or a cross-site request",
                    ),
                );
            }
        }
        if has_body {
            add("413", error("The body is too large"));
        }
        if has_body || has_query {
            add(
                "422",
                error("Invalid input: `errors` names every broken rule with its field"),
            );
        }
    }
    doc
}
