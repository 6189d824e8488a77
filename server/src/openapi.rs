//! `GET /api/v1/openapi.json`: the REST and agent APIs described as OpenAPI 3.1, generated
//! from the handlers' `#[utoipa::path]`s and the bodies' types (whose schemas carry the
//! validators' rules, see `tessera_model::schema`). Each operation's security, required
//! role (`x-required-role`) and the errors every route can answer come from the route table
//! itself ([`crate::api::routes`]), so the document cannot disagree with what is enforced.
//! The tests check both directions: every route is documented, every documented operation
//! is routed, and answers match their schemas.

use crate::api::{self, agents, bodies, evidence, fleet, workloads};
use crate::auth::Access;
use crate::session;
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
    paths(
        api::healthz, api::metrics, spec,
        session::sign_in, session::who_am_i, session::sign_out_api, session::sign_out_form, session::token_sign_in,
        session::create_token, session::list_tokens, session::delete_token,
        session::list_users, session::add_user, session::update_user, session::list_audit,
        fleet::list_hosts, fleet::get_host, fleet::drain_host, fleet::activate_host,
        fleet::revoke_host, fleet::delete_host, fleet::rotate_join_token, fleet::cluster,
        fleet::approve_host, fleet::list_join_tokens, fleet::mint_join_token, fleet::delete_join_token,
        fleet::list_pools, fleet::create_pool, fleet::update_pool,
        workloads::register_task_definition, workloads::list_families,
        workloads::get_task_definition, workloads::deregister_task_definition,
        workloads::list_services, workloads::create_service, workloads::get_service,
        workloads::update_service, workloads::delete_service, workloads::preview,
        workloads::list_tasks, workloads::list_events, workloads::live,
        workloads::service_endpoints, workloads::prometheus_discovery,
        evidence::service_fit, evidence::service_work, evidence::pool_fit, evidence::right_size_proposal,
        evidence::right_size, evidence::plan_consolidation, evidence::list_plans,
        evidence::get_plan, evidence::execute_plan, evidence::cancel_plan,
        agents::agent_register, agents::agent_sync,
    ),
    components(schemas(
        bodies::ErrorBody, bodies::EcsTaskDefinition, tessera_model::taskdef::Secret,
        tessera_model::schema::ServiceName, tessera_model::schema::Username,
        tessera_model::schema::FamilyOrRef, tessera_model::service::TaskDefRef,
        tessera_model::HostId, tessera_model::PoolName, workloads::Format, tessera_model::schema::TokenId,
        tessera_model::schema::PlanId, tessera_model::schema::JoinTokenId, tessera_model::work::Slo, tessera_model::work::Alarm,
        tessera_model::work::Autoscaling,
    )),
    tags(
        (name = "server", description = "Health and this document"),
        (name = "session", description = "Signing in, API tokens, users, the audit log"),
        (name = "fleet", description = "Hosts, pools, the join token"),
        (name = "workloads", description = "Task definitions, services, placement, tasks, events"),
        (name = "evidence", description = "Fit of measured use against budgets, right-sizing, consolidation plans"),
        (name = "agents", description = "What host agents call"),
    )
)]
struct ApiDoc;

/// This document
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "server",
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
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    doc["components"]["securitySchemes"] = json!({
        "agentToken": { "type": "http", "scheme": "bearer", "description": "An agent's token from registration" },
        "apiToken": { "type": "http", "scheme": "bearer", "description": "An API token (tsr_...)" },
        "session": { "type": "apiKey", "in": "cookie", "name": "tessera_session", "description": "A console session; changes must come from the console's origin" }
    });
    for rule in api::routes().rules() {
        let method = rule.method.as_str().to_ascii_lowercase();
        let op = &mut doc["paths"][rule.path][method.as_str()];
        if !op.is_object() {
            // Left for the test to name: a route without a `#[utoipa::path]`.
            continue;
        }
        let (security, role) = match rule.access {
            Access::Public => (json!([]), "none"),
            Access::Agent => (json!([{"agentToken": []}]), "agent"),
            Access::Role(r) => (json!([{"apiToken": []}, {"session": []}]), r.as_str()),
        };
        op["security"] = security;
        op["x-required-role"] = json!(role);
        let has_body = op.get("requestBody").is_some();
        let responses = op["responses"].as_object_mut().expect("responses");
        let mut add = |status: &str, v: Value| {
            responses.entry(status.to_owned()).or_insert(v);
        };
        add(
            "400",
            error("The Host header, a path segment, a query parameter or the body cannot be read"),
        );
        add(
            "408",
            json!({ "description": "No answer within the server's request timeout" }),
        );
        add(
            "500",
            error("Internal error (the server log has the cause)"),
        );
        if rule.method != axum::http::Method::GET {
            add("403", error("A cross-site request from a browser"));
        }
        match rule.access {
            Access::Public => {}
            Access::Agent => add("401", error("No or bad agent token")),
            Access::Role(_) => {
                add("401", error("No or bad credentials"));
                add(
                    "403",
                    error("The caller's role is too low, or a cross-site request"),
                );
            }
        }
        if has_body {
            add("413", error("The body is too large"));
            add(
                "422",
                error("Invalid input: `errors` names every broken rule with its field"),
            );
        }
    }
    doc
}
