//! `GET /api/v1/openapi.json`: the REST and agent APIs described as OpenAPI 3.1. Each
//! operation's security and required role (`x-required-role`) come from the route table
//! itself ([`crate::api::routes`]), so the document cannot disagree with what is enforced.

use crate::auth::Access;
use axum::Json;
use serde_json::{Value, json};

fn ok(description: &str, schema: Value) -> Value {
    json!({ "description": description, "content": { "application/json": { "schema": schema } } })
}

fn body(schema: Value) -> Value {
    json!({ "required": true, "content": { "application/json": { "schema": schema } } })
}

fn r(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn errors() -> Value {
    json!({
        "400": ok("Body is not JSON of the expected shape", r("Error")),
        "404": ok("Not found", r("Error")),
        "409": ok("Conflicts with the current state", r("Error")),
        "422": ok("Invalid input: every error names its field", r("ValidationError")),
        "500": ok("Internal error (details in the server log)", r("Error"))
    })
}

fn with_errors(mut responses: Value) -> Value {
    if let (Some(map), Some(errs)) = (responses.as_object_mut(), errors().as_object()) {
        for (k, v) in errs {
            map.entry(k.clone()).or_insert(v.clone());
        }
    }
    responses
}

fn path_param(name: &str, description: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": { "type": "string" } })
}

fn query(name: &str, description: &str) -> Value {
    json!({ "name": name, "in": "query", "required": false, "description": description, "schema": { "type": "string" } })
}

/// The document.
pub async fn spec() -> Json<Value> {
    static DOC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    Json(DOC.get_or_init(document).clone())
}

/// The hand-written descriptions, with each route's access from the route table.
pub fn document() -> Value {
    let mut doc = described();
    for rule in crate::api::routes().rules() {
        let method = rule.method.as_str().to_ascii_lowercase();
        let op = &mut doc["paths"][rule.path][method.as_str()];
        if !op.is_object() {
            *op = json!({ "summary": "(undocumented)", "responses": errors() });
        }
        let (security, role) = match rule.access {
            Access::Public => (json!([]), "none"),
            Access::Agent => (json!([{"agentToken": []}]), "agent"),
            Access::Role(r) => (json!([{"apiToken": []}, {"session": []}]), r.as_str()),
        };
        op["security"] = security;
        op["x-required-role"] = json!(role);
        if let Access::Role(_) = rule.access {
            op["responses"]["401"] = ok("No or bad credentials", r("Error"));
            op["responses"]["403"] = ok("Role too low, or a cross-site request", r("Error"));
        }
    }
    doc
}

fn described() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tessera API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "GPU-sharing control plane: task definitions, pools, services, placement previews, tasks, events, hosts, and the agent protocol."
        },
        "paths": {
            "/healthz": { "get": { "summary": "Liveness and store check", "responses": { "200": ok("Healthy", json!({"type": "object"})) } } },
            "/api/v1/hosts": { "get": { "summary": "Hosts with their GPUs", "responses": with_errors(json!({ "200": ok("Hosts", json!({"type": "object", "properties": {"hosts": {"type": "array", "items": r("Host")}}})) })) } },
            "/api/v1/hosts/{id}": {
                "get": { "summary": "One host, its GPUs and the tasks it holds", "parameters": [path_param("id", "host id")], "responses": with_errors(json!({ "200": ok("Host", r("Host")) })) },
                "delete": { "summary": "Delete a host that runs nothing, freeing its GPU UUIDs", "parameters": [path_param("id", "host id")], "responses": with_errors(json!({ "204": { "description": "Deleted" } })) }
            },
            "/api/v1/hosts/{id}/drain": { "post": { "summary": "Drain: no new tasks; its tasks move elsewhere, replacements first", "parameters": [path_param("id", "host id")], "responses": with_errors(json!({ "200": ok("Host", r("Host")) })) } },
            "/api/v1/hosts/{id}/activate": { "post": { "summary": "Take new tasks again", "parameters": [path_param("id", "host id")], "responses": with_errors(json!({ "200": ok("Host", r("Host")) })) } },
            "/api/v1/pools": {
                "get": { "summary": "Pools", "responses": with_errors(json!({ "200": ok("Pools", json!({"type": "object", "properties": {"pools": {"type": "array", "items": r("Pool")}}})) })) },
                "post": { "summary": "Create a pool", "requestBody": body(r("PoolInput")), "responses": with_errors(json!({ "201": ok("Created", r("Pool")) })) }
            },
            "/api/v1/task-definitions": {
                "get": { "summary": "Families with their latest revision", "responses": with_errors(json!({ "200": ok("Families", json!({"type": "object"})) })) },
                "post": { "summary": "Register a revision (Tessera or ECS JSON)", "requestBody": body(json!({"oneOf": [r("TaskDefinitionSpec"), r("EcsTaskDefinition")]})), "responses": with_errors(json!({ "201": ok("Registered", r("TaskDefinition")) })) }
            },
            "/api/v1/task-definitions/{id}": {
                "get": { "summary": "`family` lists its revisions; `family:revision` describes one", "parameters": [path_param("id", "family or family:revision"), query("format", "ecs: return ECS's shape")], "responses": with_errors(json!({ "200": ok("Definition or revisions", r("TaskDefinition")) })) },
                "delete": { "summary": "Deregister a revision: inactive, still describable", "parameters": [path_param("id", "family:revision")], "responses": with_errors(json!({ "200": ok("Deregistered", r("TaskDefinition")) })) }
            },
            "/api/v1/services": {
                "get": { "summary": "Services with deployments and counts", "responses": with_errors(json!({ "200": ok("Services", json!({"type": "object"})) })) },
                "post": { "summary": "Create a service", "requestBody": body(r("ServiceInput")), "responses": with_errors(json!({ "201": ok("Created", r("Service")) })) }
            },
            "/api/v1/services/{name}": {
                "get": { "summary": "Service with deployments (desired, pending, running) and recent events", "parameters": [path_param("name", "service name")], "responses": with_errors(json!({ "200": ok("Service", r("ServiceDetail")) })) },
                "patch": { "summary": "Scale, or roll out a new revision", "parameters": [path_param("name", "service name")], "requestBody": body(r("ServicePatch")), "responses": with_errors(json!({ "200": ok("Updated", r("Service")) })) },
                "delete": { "summary": "Drain to 0 tasks, then remove", "parameters": [path_param("name", "service name")], "responses": with_errors(json!({ "202": { "description": "Deletion started" } })) }
            },
            "/api/v1/placement-preview": { "post": { "summary": "Where tasks would go now, without committing", "requestBody": body(r("PreviewInput")), "responses": with_errors(json!({ "200": ok("Preview", r("PreviewResult")) })) } },
            "/api/v1/tasks": { "get": { "summary": "Tasks", "parameters": [query("service", "service name"), query("host", "host id"), query("state", "comma-separated states"), query("limit", "at most this many (default 1000)")], "responses": with_errors(json!({ "200": ok("Tasks", json!({"type": "object", "properties": {"tasks": {"type": "array", "items": r("Task")}}})) })) } },
            "/api/v1/openapi.json": { "get": { "summary": "This document", "responses": { "200": ok("OpenAPI 3.1", json!({"type": "object"})) } } },
            "/api/v1/session": {
                "post": { "summary": "Sign in with a password: sets the session cookie (JSON answers with the user; the console's form gets a redirect)", "requestBody": body(json!({"type": "object", "required": ["username", "password"], "properties": {"username": {"type": "string"}, "password": {"type": "string"}}})), "responses": with_errors(json!({ "200": ok("Signed in", r("User")), "401": ok("Wrong username or password", r("Error")), "429": ok("Too many failed sign-ins (Retry-After)", r("Error")) })) },
                "get": { "summary": "Who is calling", "responses": with_errors(json!({ "200": ok("Caller", json!({"type": "object", "properties": {"name": {"type": "string"}, "kind": {"enum": ["session", "token"]}, "role": r("Role"), "on_behalf_of": {"type": ["string", "null"]}}})) })) },
                "delete": { "summary": "Sign out", "responses": { "204": { "description": "Signed out" } } }
            },
            "/api/v1/session/end": { "post": { "summary": "Sign out from an HTML form (redirects to the sign-in page)", "responses": { "303": { "description": "To the sign-in page" } } } },
            "/api/v1/tokens": {
                "get": { "summary": "API tokens (never their values)", "responses": with_errors(json!({ "200": ok("Tokens", json!({"type": "object", "properties": {"tokens": {"type": "array", "items": r("ApiToken")}}})) })) },
                "post": { "summary": "Make an API token; its value is in this answer only", "requestBody": body(json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "role": r("Role"), "expires_in_days": {"type": "integer", "minimum": 1, "maximum": 3650}}})), "responses": with_errors(json!({ "201": ok("Made", json!({"allOf": [r("ApiToken"), {"type": "object", "properties": {"token": {"type": "string"}}}]})) })) }
            },
            "/api/v1/tokens/{id}": { "delete": { "summary": "Delete an API token: it stops working at once", "parameters": [path_param("id", "token id")], "responses": with_errors(json!({ "204": { "description": "Deleted" } })) } },
            "/api/v1/users": {
                "get": { "summary": "Operators' accounts", "responses": with_errors(json!({ "200": ok("Users", json!({"type": "object", "properties": {"users": {"type": "array", "items": r("User")}}})) })) },
                "post": { "summary": "Add a user", "requestBody": body(json!({"type": "object", "required": ["username", "password"], "properties": {"username": {"type": "string"}, "password": {"type": "string", "minLength": 12}, "role": r("Role")}})), "responses": with_errors(json!({ "201": ok("Added", r("User")) })) }
            },
            "/api/v1/users/{username}": { "patch": { "summary": "Change a user's role, password or disabled flag (the last enabled admin stays)", "parameters": [path_param("username", "user")], "requestBody": body(json!({"type": "object", "properties": {"role": r("Role"), "disabled": {"type": "boolean"}, "password": {"type": "string"}}})), "responses": with_errors(json!({ "200": ok("Changed", r("User")) })) } },
            "/api/v1/audit": { "get": { "summary": "Accepted changes, newest first", "parameters": [query("actor", "who (substring)"), query("q", "action or target (substring)"), query("before", "ids below this"), query("limit", "default 100")], "responses": with_errors(json!({ "200": ok("Entries", json!({"type": "object", "properties": {"entries": {"type": "array", "items": r("AuditEntry")}}})) })) } },
            "/api/v1/hosts/{id}/revoke": { "post": { "summary": "Revoke the host's agent token: the agent must register again", "parameters": [path_param("id", "host id")], "responses": with_errors(json!({ "200": ok("Host", r("Host")) })) } },
            "/api/v1/join-token": { "post": { "summary": "A new join token, shown once; the old one stops working", "responses": with_errors(json!({ "200": ok("Join token", json!({"type": "object", "properties": {"join_token": {"type": "string"}}})) })) } },
            "/api/v1/live": { "get": { "summary": "Server-sent events: `change` whenever the fleet changed", "responses": { "200": { "description": "text/event-stream" } } } },
            "/api/v1/events": { "get": { "summary": "Recent events, newest first", "parameters": [query("service", "service name"), query("host", "host id"), query("after", "only ids above this"), query("limit", "default 100")], "responses": with_errors(json!({ "200": ok("Events", json!({"type": "object"})) })) } },
            "/agent/v1/register": { "post": { "summary": "Register a host with the join token", "requestBody": body(r("RegisterRequest")), "responses": with_errors(json!({ "201": ok("Registered", r("RegisterResponse")), "401": ok("Bad join token", r("Error")) })) } },
            "/agent/v1/sync": { "post": { "summary": "Report state, receive the tasks to run", "security": [{"agentToken": []}], "requestBody": body(r("SyncRequest")), "responses": with_errors(json!({ "200": ok("Wanted tasks", r("SyncResponse")), "401": ok("Bad agent token", r("Error")) })) } }
        },
        "components": {
            "securitySchemes": {
                "agentToken": { "type": "http", "scheme": "bearer", "description": "An agent's token from registration" },
                "apiToken": { "type": "http", "scheme": "bearer", "description": "An API token (tsr_...)" },
                "session": { "type": "apiKey", "in": "cookie", "name": "tessera_session", "description": "A console session; changes must come from the console's origin" }
            },
            "schemas": {
                "Role": { "enum": ["viewer", "operator", "admin"] },
                "User": { "type": "object", "properties": { "username": {"type": "string"}, "role": r("Role"), "disabled": {"type": "boolean"}, "created_at": {"type": "string"} } },
                "ApiToken": { "type": "object", "properties": { "id": {"type": "string"}, "name": {"type": "string"}, "role": r("Role"), "created_by": {"type": "string"}, "created_at": {"type": "string"}, "expires_at": {"type": ["string", "null"]} } },
                "AuditEntry": { "type": "object", "properties": { "id": {"type": "integer"}, "at": {"type": "string"}, "actor": {"type": "string"}, "action": {"type": "string"}, "target": {"type": ["string", "null"]}, "address": {"type": ["string", "null"]} } },
                "Error": { "type": "object", "required": ["error"], "properties": { "error": {"type": "string"} } },
                "ValidationError": { "type": "object", "properties": { "error": {"type": "string"}, "errors": { "type": "array", "items": { "type": "object", "properties": { "field": {"type": "string"}, "message": {"type": "string"} } } } } },
                "Gpu": { "type": "object", "properties": { "uuid": {"type": "string"}, "index": {"type": "integer"}, "model": {"type": "string"}, "memory": {"type": "integer", "description": "MiB"}, "mps_client_limit": {"type": "integer"}, "health": {"enum": ["healthy", "unhealthy"]}, "sharing_mode": {"enum": ["idle", "mps", "dedicated"]} } },
                "Host": { "type": "object", "properties": { "id": {"type": "string"}, "pool": {"type": "string"}, "status": {"enum": ["active", "draining", "impaired", "lost"]}, "simulated": {"type": "boolean"}, "cpu": {"type": "integer", "description": "milli-CPU"}, "memory": {"type": "integer", "description": "MiB"}, "labels": {"type": "object"}, "gpus": {"type": "array", "items": r("Gpu")} } },
                "Pool": { "type": "object", "properties": { "name": {"type": "string"}, "policy": r("Policy"), "compute_overcommit": {"type": "number"}, "mps_client_limit": {"type": ["integer", "null"]} } },
                "PoolInput": { "type": "object", "required": ["name"], "properties": { "name": {"type": "string"}, "policy": r("Policy"), "compute_overcommit": {"type": "number", "minimum": 1, "maximum": 10}, "mps_client_limit": {"type": "integer", "minimum": 1, "maximum": 48} } },
                "Policy": { "enum": ["fragmentation", "binpack", "spread_host", "spread_gpu"] },
                "Container": { "type": "object", "required": ["name", "command", "cpu_milli", "memory_mib"], "properties": { "name": {"type": "string"}, "command": {"type": "array", "items": {"type": "string"}}, "env": {"type": "object", "additionalProperties": {"type": "string"}}, "secrets": {"type": "object", "description": "write-only: a value (string) on input; shown as {\"set\": true}, which keeps the value when sent back", "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {"set": {"const": true}}}]}}, "cpu_milli": {"type": "integer", "minimum": 1}, "memory_mib": {"type": "integer", "minimum": 1}, "gpu": { "oneOf": [ { "type": "object", "properties": { "gpus": {"type": "integer", "minimum": 1, "maximum": 16} } }, { "type": "object", "properties": { "mps": { "type": "object", "required": ["memory_mib"], "properties": { "memory_mib": {"type": "integer", "minimum": 1}, "max_compute_percent": {"type": "integer", "minimum": 1, "maximum": 100} } } } } ] } } },
                "TaskDefinitionSpec": { "type": "object", "required": ["family", "containers"], "properties": { "family": {"type": "string"}, "containers": {"type": "array", "items": r("Container")} } },
                "EcsTaskDefinition": { "type": "object", "required": ["family", "containerDefinitions"], "properties": { "family": {"type": "string"}, "containerDefinitions": {"type": "array", "items": {"type": "object", "description": "name, command, cpu (1/1024 vCPU), memory (MiB), environment [{name, value}], resourceRequirements [{type: GPU, value, sharingStrategy: {nvidiaMps: {memory, maxComputePercent}}}]"}} } },
                "TaskDefinition": { "type": "object", "properties": { "family": {"type": "string"}, "revision": {"type": "integer"}, "active": {"type": "boolean"}, "spec": r("TaskDefinitionSpec"), "registered_at": {"type": "string"} } },
                "Constraints": { "type": "object", "properties": { "gpu_models": {"type": "array", "items": {"type": "string"}}, "labels": {"type": "object", "additionalProperties": {"type": "string"}}, "distinct_hosts": {"type": "boolean"} } },
                "DeploymentConfig": { "type": "object", "properties": { "minimum_healthy_percent": {"type": "integer", "minimum": 0, "maximum": 100}, "maximum_percent": {"type": "integer", "minimum": 100, "maximum": 200} } },
                "ServiceInput": { "type": "object", "required": ["name", "task_definition", "pool"], "properties": { "name": {"type": "string"}, "task_definition": {"type": "string", "description": "family:revision"}, "pool": {"type": "string"}, "desired_count": {"type": "integer", "default": 1}, "strategy": r("Policy"), "constraints": r("Constraints"), "deployment": r("DeploymentConfig"), "stop_timeout_secs": {"type": "integer", "default": 30} } },
                "ServicePatch": { "type": "object", "properties": { "desired_count": {"type": "integer"}, "task_definition": {"type": "string"} } },
                "Service": { "type": "object", "properties": { "name": {"type": "string"}, "task_definition": {"type": "string"}, "pool": {"type": "string"}, "desired_count": {"type": "integer"}, "strategy": r("Policy"), "constraints": r("Constraints"), "deployment": r("DeploymentConfig"), "stop_timeout_secs": {"type": "integer"}, "deleting": {"type": "boolean"}, "created_at": {"type": "string"} } },
                "Deployment": { "type": "object", "properties": { "id": {"type": "integer"}, "task_definition": {"type": "string"}, "status": {"enum": ["primary", "active", "completed", "rolled_back"]}, "pending": {"type": "integer"}, "running": {"type": "integer"}, "failed_tasks": {"type": "integer"} } },
                "ServiceDetail": { "allOf": [r("Service"), { "type": "object", "properties": { "running": {"type": "integer"}, "pending": {"type": "integer"}, "deployments": {"type": "array", "items": r("Deployment")}, "events": {"type": "array", "items": r("Event")} } }] },
                "Event": { "type": "object", "properties": { "id": {"type": "integer"}, "at": {"type": "string"}, "service": {"type": ["string", "null"]}, "host": {"type": ["string", "null"]}, "message": {"type": "string"} } },
                "Task": { "type": "object", "properties": { "id": {"type": "string"}, "service": {"type": "string"}, "task_definition": {"type": "string"}, "state": {"enum": ["pending", "assigned", "running", "stopping", "stopped"]}, "host": {"type": ["string", "null"]}, "allocations": {"type": "array", "items": {"type": "object"}}, "placement_message": {"type": ["string", "null"]}, "stop_reason": {"type": ["string", "null"]}, "exit_code": {"type": ["integer", "null"]} } },
                "PreviewInput": { "type": "object", "required": ["task_definition", "pool", "count"], "properties": { "task_definition": {"type": "string"}, "pool": {"type": "string"}, "count": {"type": "integer", "minimum": 1, "maximum": 1000}, "strategy": r("Policy"), "constraints": r("Constraints") } },
                "PreviewResult": { "type": "object", "properties": { "placed": {"type": "integer"}, "unplaced": {"type": "integer"}, "tasks": {"type": "array", "items": { "type": "object", "properties": { "index": {"type": "integer"}, "host": {"type": ["string", "null"]}, "gpus": {"type": "array", "items": {"type": "integer"}}, "message": {"type": ["string", "null"]} } } }, "density_before": {"type": "object"}, "density_after": {"type": "object"} } },
                "RegisterRequest": { "type": "object", "required": ["join_token", "pool", "cpu_milli", "memory_mib", "gpus"], "properties": { "join_token": {"type": "string"}, "pool": {"type": "string"}, "name": {"type": "string"}, "cpu_milli": {"type": "integer"}, "memory_mib": {"type": "integer"}, "simulated": {"type": "boolean"}, "labels": {"type": "object"}, "gpus": {"type": "array", "items": {"type": "object"}} } },
                "RegisterResponse": { "type": "object", "properties": { "host_id": {"type": "string"}, "agent_token": {"type": "string"}, "sync_interval_secs": {"type": "integer"} } },
                "SyncRequest": { "type": "object", "required": ["gpus", "mps"], "properties": { "gpus": {"type": "array", "items": {"type": "object"}}, "mps": { "type": "object", "properties": { "healthy": {"type": "boolean"}, "reason": {"type": "string"} } }, "tasks": { "type": "array", "items": { "type": "object", "properties": { "task_id": {"type": "string"}, "running": {"type": "boolean"}, "exit_code": {"type": "integer"}, "gpu_memory_peak_mib": {"type": "integer"}, "sm_percent": {"type": "integer"} } } } } },
                "SyncResponse": { "type": "object", "properties": { "host_id": {"type": "string"}, "sync_interval_secs": {"type": "integer"}, "tasks": { "type": "array", "items": { "type": "object", "properties": { "task_id": {"type": "string"}, "mps": {"type": "boolean"}, "stop_timeout_secs": {"type": "integer"}, "containers": { "type": "array", "items": { "type": "object", "properties": { "name": {"type": "string"}, "command": {"type": "array"}, "env": {"type": "object"} } } } } } } } }
            }
        }
    })
}
