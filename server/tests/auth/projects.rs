//! Roles per project, attacked from inside: a project's operator and a token scoped to a
//! project act there only.

use super::*;

/// Roles per project, attacked from inside: a user who is an operator in one project only,
/// and an API token scoped to that project, change that project's services and nothing
/// else (not another project's services, not the fleet's hosts, not tokens); what they
/// were given can be taken back.
#[tokio::test]
async fn a_project_operator_and_a_scoped_token_act_in_their_project_only() {
    let c = ctx().await;
    let admin = bearer(&c.admin);
    let ok = |a: &Answer, status: StatusCode| {
        assert_eq!(a.status, status, "{}", a.body);
    };
    let a = send(
        &c,
        Method::POST,
        "/api/v1/projects",
        Some(json!({"name": "research"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let a = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "rita", "password": "rita-password-123", "role": "viewer"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let a = send(
        &c,
        Method::PUT,
        "/api/v1/projects/research/members/rita",
        Some(json!({"role": "operator"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::OK);
    assert_eq!(
        a.body["members"],
        json!([{"username": "rita", "role": "operator"}])
    );
    let a = send(
        &c,
        Method::PUT,
        "/api/v1/projects/research/members/rita",
        Some(json!({"role": "admin"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::UNPROCESSABLE_ENTITY);

    let cookie = sign_in(&c, "rita", "rita-password-123").await;
    let rita = vec![("cookie", cookie), ("origin", ORIGIN.to_owned())];
    let service = |name: &str, project: &str| json!({"name": name, "task_definition": "embeddings:1", "pool": "inference", "desired_count": 0, "project": project});
    let before = snapshot(&c).await;
    // Outside research: refused, and nothing changes.
    for (method, uri, body) in [
        (
            Method::POST,
            "/api/v1/services",
            Some(service("r0", "default")),
        ),
        (
            Method::PATCH,
            "/api/v1/services/embeddings",
            Some(json!({"desired_count": 5})),
        ),
        (Method::DELETE, "/api/v1/services/embeddings", None),
        (Method::POST, "/api/v1/hosts/sim-l4-1/drain", None),
        (
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "mine", "role": "operator"})),
        ),
    ] {
        let a = send(&c, method.clone(), uri, body, &rita).await;
        ok(&a, StatusCode::FORBIDDEN);
        assert!(a.body["error"].is_string(), "{method} {uri}: {}", a.body);
    }
    assert_eq!(
        snapshot(&c).await,
        before,
        "refused requests change nothing"
    );
    // In research: its services are hers to make and change.
    let a = send(
        &c,
        Method::POST,
        "/api/v1/services",
        Some(service("r1", "research")),
        &rita,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &rita,
    )
    .await;
    ok(&a, StatusCode::OK);
    // Moving it out of research would put it in a project she has no role in.
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"project": "default"})),
        &rita,
    )
    .await;
    ok(&a, StatusCode::FORBIDDEN);

    // A token scoped to research, made by an admin.
    let a = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "research-ci", "role": "operator", "project": "research"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    assert_eq!(a.body["project"], "research");
    let ci = bearer(a.body["token"].as_str().expect("the token"));
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &ci,
    )
    .await;
    ok(&a, StatusCode::OK);
    let a = send(&c, Method::GET, "/api/v1/services", None, &ci).await;
    ok(&a, StatusCode::OK);
    let before = snapshot(&c).await;
    for (method, uri, body) in [
        (
            Method::PATCH,
            "/api/v1/services/embeddings",
            Some(json!({"desired_count": 5})),
        ),
        (Method::DELETE, "/api/v1/services/embeddings", None),
        (
            Method::POST,
            "/api/v1/services",
            Some(service("r2", "default")),
        ),
        (Method::POST, "/api/v1/hosts/sim-l4-1/drain", None),
        (
            Method::POST,
            "/api/v1/placement-preview",
            Some(json!({"task_definition": "embeddings:1", "pool": "inference", "count": 1})),
        ),
        (
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "wider", "role": "operator"})),
        ),
    ] {
        let a = send(&c, method.clone(), uri, body, &ci).await;
        ok(&a, StatusCode::FORBIDDEN);
    }
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/embeddings",
        Some(json!({"desired_count": 5})),
        &ci,
    )
    .await;
    assert!(
        a.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("project research only")),
        "{}",
        a.body
    );
    assert_eq!(
        snapshot(&c).await,
        before,
        "refused requests change nothing"
    );
    // Bad scopes are named.
    for (body, field) in [
        (
            json!({"name": "x", "role": "operator", "project": "nowhere"}),
            "project",
        ),
        (
            json!({"name": "x", "role": "admin", "project": "research"}),
            "role",
        ),
    ] {
        let a = send(&c, Method::POST, "/api/v1/tokens", Some(body), &admin).await;
        ok(&a, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(a.body.to_string().contains(field), "{}", a.body);
    }

    // In the console too: her service changes, others' are refused.
    for (service, ok_expected) in [("r1", true), ("embeddings", false)] {
        let mut req = Request::post(tessera_app::pages::service::PatchService::PATH)
            .header("host", "127.0.0.1:3000")
            .header("content-type", "application/json");
        for (k, v) in &rita {
            req = req.header(*k, v);
        }
        let req = req
            .body(Body::from(
                json!({"name": service, "patch": {"desired_count": 0}}).to_string(),
            ))
            .expect("request");
        let answer = app(c.app.clone()).oneshot(req).await.expect("answers");
        assert_eq!(answer.status().is_success(), ok_expected, "{service}");
    }
    let a = send(&c, Method::GET, "/api/v1/services/embeddings", None, &admin).await;
    assert_ne!(
        a.body["service"]["desired_count"],
        json!(0),
        "embeddings untouched"
    );

    // Her own command-line token, scoped to research at sign-in: an operator there.
    let a = send(
        &c,
        Method::POST,
        "/api/v1/session/token",
        Some(json!({"username": "rita", "password": "rita-password-123", "name": "cli rita", "project": "research"})),
        &[],
    )
    .await;
    ok(&a, StatusCode::CREATED);
    assert_eq!(
        (a.body["project"].as_str(), a.body["role"].as_str()),
        (Some("research"), Some("operator"))
    );
    let rita_cli = bearer(a.body["token"].as_str().expect("the token"));
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &rita_cli,
    )
    .await;
    ok(&a, StatusCode::OK);

    // The console's server functions keep the same rule: a fleet-wide operator puts no
    // service into research, and gives no production class.
    let operator = api_token(&c.control, Role::Operator).await.expect("token");
    for input in [
        service("r3", "research"),
        json!({"name": "r4", "task_definition": "embeddings:1", "pool": "inference", "desired_count": 0, "priority": "production"}),
    ] {
        let req = Request::post(tessera_app::pages::service_new::CreateService::PATH)
            .header("host", "127.0.0.1:3000")
            .header("authorization", format!("Bearer {operator}"))
            .header("content-type", "application/json")
            .body(Body::from(json!({"input": input}).to_string()))
            .expect("request");
        let answer = app(c.app.clone()).oneshot(req).await.expect("answers");
        assert!(!answer.status().is_success(), "{input}");
    }
    for name in ["r3", "r4"] {
        let a = send(
            &c,
            Method::GET,
            &format!("/api/v1/services/{name}"),
            None,
            &admin,
        )
        .await;
        ok(&a, StatusCode::NOT_FOUND);
    }

    // A scoped token made by an admin who is then demoted is worth no more than what its
    // maker was given in the project: nothing to act with.
    let a = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "ada", "password": "ada-password-1234", "role": "admin"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let a = send(
        &c,
        Method::POST,
        "/api/v1/session/token",
        Some(json!({"username": "ada", "password": "ada-password-1234", "name": "ada"})),
        &[],
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let ada = bearer(a.body["token"].as_str().expect("the token"));
    let a = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "ada-research", "role": "operator", "project": "research"})),
        &ada,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let ada_research = bearer(a.body["token"].as_str().expect("the token"));
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &ada_research,
    )
    .await;
    ok(&a, StatusCode::OK);
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/users/ada",
        Some(json!({"role": "operator"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::OK);
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &ada_research,
    )
    .await;
    ok(&a, StatusCode::FORBIDDEN);

    // Taken back: her role in research goes, and with it what it allowed.
    let a = send(
        &c,
        Method::DELETE,
        "/api/v1/projects/research/members/rita",
        None,
        &admin,
    )
    .await;
    ok(&a, StatusCode::NO_CONTENT);
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &rita,
    )
    .await;
    ok(&a, StatusCode::FORBIDDEN);
}
