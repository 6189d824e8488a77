//! API tokens: shown once, gone when deleted, bounded by their role and their user's;
//! secrets in no answer but the agent's sync.

use super::*;

#[tokio::test]
async fn api_tokens_are_shown_once_and_stop_working_when_deleted() {
    let c = ctx().await;
    let made = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "ci", "role": "operator", "expires_in_days": 30})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let token = made.body["token"].as_str().expect("shown once").to_owned();
    assert!(token.starts_with("tsr_"));
    assert!(made.body["expires_at"].is_string());
    let list = send(&c, Method::GET, "/api/v1/tokens", None, &bearer(&c.admin)).await;
    let text = list.body.to_string();
    assert!(!text.contains(&token) && !text.contains("hash"), "{text}");
    let scaled = send(
        &c,
        Method::PATCH,
        "/api/v1/services/embeddings",
        Some(json!({"desired_count": 1})),
        &bearer(&token),
    )
    .await;
    assert_eq!(scaled.status, StatusCode::OK, "{}", scaled.body);
    let bad = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "x", "expires_in_days": 0})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    let id = made.body["id"].as_str().expect("id");
    let gone = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{id}"),
        None,
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    let after = send(&c, Method::GET, "/api/v1/hosts", None, &bearer(&token)).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);

    // The audit log names who did what, on what; admins only.
    let audit = send(
        &c,
        Method::GET,
        "/api/v1/audit?q=services",
        None,
        &bearer(&c.admin),
    )
    .await;
    let entries = audit.body["entries"].as_array().expect("entries");
    let scale = entries
        .iter()
        .find(|e| e["action"] == "PATCH /api/v1/services/embeddings")
        .expect("recorded");
    assert_eq!(scale["actor"], "token ci (by bench-admin)");
    assert_eq!(scale["target"], "embeddings");
    let viewer = send(&c, Method::GET, "/api/v1/audit", None, &bearer(&c.viewer)).await;
    assert_eq!(viewer.status, StatusCode::FORBIDDEN);
}

/// A read-only credential deletes nothing above its role: a viewer token an admin made
/// cannot delete that admin's admin token. And a token is worth no more than its user is
/// now: demoting the user demotes the token.
#[tokio::test]
async fn a_tokens_role_bounds_what_it_deletes_and_follows_its_users_role() {
    let c = ctx().await;
    let made = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "dora", "password": "dora-admin-password", "role": "admin"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let login = send(
        &c,
        Method::POST,
        "/api/v1/session/token",
        Some(json!({"username": "dora", "password": "dora-admin-password", "name": "cli dora"})),
        &[],
    )
    .await;
    assert_eq!(login.status, StatusCode::CREATED, "{}", login.body);
    let dora = login.body["token"].as_str().expect("token").to_owned();
    let dora_id = login.body["id"].as_str().expect("id").to_owned();
    let viewer = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "dashboards", "role": "viewer"})),
        &bearer(&dora),
    )
    .await;
    assert_eq!(viewer.status, StatusCode::CREATED, "{}", viewer.body);
    let viewer = viewer.body["token"].as_str().expect("token").to_owned();
    let attack = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{dora_id}"),
        None,
        &bearer(&viewer),
    )
    .await;
    assert_eq!(attack.status, StatusCode::FORBIDDEN, "{}", attack.body);
    let still = send(&c, Method::GET, "/api/v1/audit", None, &bearer(&dora)).await;
    assert_eq!(
        still.status,
        StatusCode::OK,
        "the admin's token still works"
    );
    // Not even a token of its own role: a read-only credential changes nothing but itself.
    let other = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "wallboard", "role": "viewer"})),
        &bearer(&dora),
    )
    .await;
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.body);
    let other_id = other.body["id"].as_str().expect("id").to_owned();
    let attack = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{other_id}"),
        None,
        &bearer(&viewer),
    )
    .await;
    assert_eq!(attack.status, StatusCode::FORBIDDEN, "{}", attack.body);
    // Itself: `tessera logout`.
    let mine = send(&c, Method::GET, "/api/v1/tokens", None, &bearer(&dora)).await;
    let own_id = mine.body["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .find(|t| t["name"] == "dashboards")
        .expect("the viewer token")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let logout = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{own_id}"),
        None,
        &bearer(&viewer),
    )
    .await;
    assert_eq!(logout.status, StatusCode::NO_CONTENT, "{}", logout.body);

    let demoted = send(
        &c,
        Method::PATCH,
        "/api/v1/users/dora",
        Some(json!({"role": "viewer"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(demoted.status, StatusCode::OK, "{}", demoted.body);
    let me = send(&c, Method::GET, "/api/v1/session", None, &bearer(&dora)).await;
    assert_eq!(me.body["role"], "viewer", "{}", me.body);
    let audit = send(&c, Method::GET, "/api/v1/audit", None, &bearer(&dora)).await;
    assert_eq!(audit.status, StatusCode::FORBIDDEN, "{}", audit.body);
    // Her password leaked: a new one, and every token she made goes with the old.
    let changed = send(
        &c,
        Method::PATCH,
        "/api/v1/users/dora",
        Some(json!({"password": "dora-new-password-2", "revoke_tokens": true})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.body);
    let me = send(&c, Method::GET, "/api/v1/session", None, &bearer(&dora)).await;
    assert_eq!(me.status, StatusCode::UNAUTHORIZED, "{}", me.body);
    let listed = send(&c, Method::GET, "/api/v1/tokens", None, &bearer(&c.admin)).await;
    assert!(
        listed.body["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .all(|t| t["created_by"] != "dora"),
        "{}",
        listed.body
    );
}

#[tokio::test]
async fn secrets_are_in_no_answer_but_the_agents_sync() {
    let c = ctx().await;
    let def = json!({"family": "vault", "containers": [{"name": "main", "command": ["sleep", "600"],
        "cpu_milli": 100, "memory_mib": 64, "env": {"MODE": "plain-value"},
        "secrets": {"DB_PASSWORD": "hunter2-secret"}, "gpu": {"mps": {"memory_mib": 1024}}}]});
    let made = send(
        &c,
        Method::POST,
        "/api/v1/task-definitions",
        Some(def),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    // Registering again what a description shows keeps the value.
    let shown = send(
        &c,
        Method::GET,
        "/api/v1/task-definitions/vault:1",
        None,
        &bearer(&c.viewer),
    )
    .await;
    assert_eq!(
        shown.body["spec"]["containers"][0]["secrets"]["DB_PASSWORD"],
        json!({"set": true})
    );
    assert_eq!(
        shown.body["spec"]["containers"][0]["env"]["MODE"],
        "plain-value"
    );
    let again = send(
        &c,
        Method::POST,
        "/api/v1/task-definitions",
        Some(shown.body["spec"].clone()),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
    let service = send(
        &c,
        Method::POST,
        "/api/v1/services",
        Some(json!({"name": "vault", "task_definition": "vault:2",
        "pool": "inference", "desired_count": 1})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(service.status, StatusCode::CREATED, "{}", service.body);
    c.control.reconcile_once().await.expect("pass");

    let mut everything = String::new();
    for uri in [
        "/api/v1/task-definitions",
        "/api/v1/task-definitions/vault",
        "/api/v1/task-definitions/vault:1",
        "/api/v1/task-definitions/vault:2?format=ecs",
        "/api/v1/services/vault",
        "/api/v1/tasks",
        "/api/v1/events",
        "/api/v1/audit",
        "/api/v1/hosts/sim-l4-1",
        "/api/v1/hosts/sim-l4-2",
    ] {
        let a = send(&c, Method::GET, uri, None, &bearer(&c.admin)).await;
        assert_eq!(a.status, StatusCode::OK, "{uri}");
        everything.push_str(&a.body.to_string());
    }
    // Console pages are checked in tests/ssr.rs (rendering wants a test binary of its own).
    assert!(
        !everything.contains("hunter2"),
        "a secret leaked into an answer"
    );
    assert!(everything.contains("plain-value"));

    // The host that runs the task gets it in its sync answer.
    let task = c
        .control
        .store()
        .list_tasks(&Default::default())
        .await
        .expect("tasks")
        .into_iter()
        .find(|t| t.service == "vault")
        .expect("the vault task");
    let host = task.host.expect("placed");
    let token = c.agents[host.as_str()].clone();
    let sync = send(
        &c,
        Method::POST,
        "/agent/v1/sync",
        Some(common::sync_body(&c.control, &host).await),
        &bearer(&token),
    )
    .await;
    assert_eq!(sync.status, StatusCode::OK, "{}", sync.body);
    let wanted = sync.body["tasks"].as_array().expect("tasks");
    let mine = wanted
        .iter()
        .find(|t| t["task_id"] == task.id)
        .expect("the vault task is wanted");
    assert_eq!(
        mine["containers"][0]["secrets"]["DB_PASSWORD"],
        "hunter2-secret"
    );
}
