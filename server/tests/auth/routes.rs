//! Deny by default: every route and every server function has its declaration, and refuses
//! a caller without credentials (401), with a bad token (401) or without the role (403),
//! in the project its scope names, with nothing changed.

use super::*;
use tessera_model::operations::Scope;
use tessera_server::api;
use tessera_server::auth::{Access, server_fn_rules};

/// The rules every declaration keeps, read from the declarations themselves: who may change
/// accounts, admission, pools and projects; that a change to a service is checked in its
/// project; that nothing is anyone's but signing in and the API's own description.
#[test]
fn declarations_keep_the_rules_of_who_may_do_what() {
    let routes = api::routes();
    assert!(routes.rules().len() >= 60, "the walk covers the API");
    for r in routes.rules() {
        let (path, d) = (r.path.as_str(), &r.declared);
        let at = format!("{} {path}", r.method);
        let changes = r.method != Method::GET;
        d.check().unwrap_or_else(|e| panic!("{at}: {e}"));
        // Anyone: health, the description, signing in and out (whose handlers need no role);
        // who am I is a signed-in caller's question.
        let public = path == "/healthz"
            || path == "/api/v1/openapi.json"
            || (path.starts_with("/api/v1/session") && changes);
        assert_eq!(d.access == Access::Public, public, "{at}: {d:?}");
        assert_eq!(
            d.access == Access::Agent,
            path.starts_with("/agent/v1/"),
            "{at}: agents' routes and only they check agents' tokens"
        );
        // Accounts, admission and the audit log are the admin's to read; they, pools and
        // projects the admin's to change.
        let admins_to_read = ["/api/v1/users", "/api/v1/join-token", "/api/v1/audit"]
            .iter()
            .any(|p| path.starts_with(p))
            || (path == "/api/v1/tokens" && !changes);
        let admins_to_change = [
            "/api/v1/pools",
            "/api/v1/projects",
            "/api/v1/hosts/{id}/revoke",
        ]
        .iter()
        .any(|p| path.starts_with(p))
            || (path == "/api/v1/tokens" && changes)
            || (path == "/api/v1/hosts/{id}" && r.method == Method::DELETE);
        if admins_to_read || (admins_to_change && changes) {
            assert_eq!(d.access, Access::ADMIN, "{at}");
        }
        // A change to a service is checked in its project (and in the one it is put into);
        // right-sizing registers a revision of a task definition family, which is the
        // fleet's, so it stays with fleet-wide operators.
        let right_size = path.ends_with("/right-size");
        if changes && path.starts_with("/api/v1/services") && !right_size {
            assert!(
                matches!(d.access, Access::InProject(Role::Operator)),
                "{at}: {d:?}"
            );
            let names_it = d.scope.iter().any(|s| match s {
                Scope::Service(a) => a == "{name}",
                Scope::Into(a) => path == "/api/v1/services" && a == "project",
                Scope::MovedInto(_) | Scope::Task(_) => false,
            });
            assert!(
                names_it,
                "{at}: its scope names the service acted on: {d:?}"
            );
        }
        // Every other change needs an operator, but deleting one's own token (its handler
        // checks whose it is).
        if changes && !public && d.access != Access::Agent {
            let own_token = path == "/api/v1/tokens/{id}";
            let needed = d.access.role().expect("a role");
            assert!(
                own_token || needed >= Role::Operator,
                "{at}: a change needs at least an operator, not {needed}"
            );
        }
    }
}

/// A console control and its REST operation are one operation: the server function names
/// the declaration the REST handler names, so the two cannot drift apart.
#[test]
fn a_console_twin_names_its_rest_operations_declaration() {
    use tessera_app::access::Guarded;
    use tessera_app::pages::{service::*, service_new::*};
    let rest = api::routes();
    let declared = |method: Method, path: &str| {
        rest.rules()
            .iter()
            .find(|r| r.method == method && r.path == path)
            .map(|r| r.declared.clone())
            .unwrap_or_else(|| panic!("{method} {path} is routed"))
    };
    for (console, method, path) in [
        (CreateService::DECLARED, Method::POST, "/api/v1/services"),
        (
            PatchService::DECLARED,
            Method::PATCH,
            "/api/v1/services/{name}",
        ),
        (
            DeleteService::DECLARED,
            Method::DELETE,
            "/api/v1/services/{name}",
        ),
        (
            tessera_app::fit::ApplyRightSize::DECLARED,
            Method::POST,
            "/api/v1/services/{name}/right-size",
        ),
        (
            tessera_app::pages::host::SetHostDraining::DECLARED,
            Method::POST,
            "/api/v1/hosts/{id}/drain",
        ),
    ] {
        assert_eq!(console, declared(method.clone(), path), "{method} {path}");
    }
    // And every server function in a project is such a twin.
    for (path, (name, rule)) in server_fn_rules() {
        if !rule.declared.scope.is_empty() {
            assert!(
                rest.rules().iter().any(|r| r.declared == rule.declared),
                "{name} ({path}) acts in a project; name its REST operation's declaration"
            );
        }
    }
}

#[tokio::test]
async fn every_route_refuses_callers_without_credentials_or_role() {
    let c = ctx().await;
    let before = snapshot(&c).await;
    let routes = api::routes();
    assert!(routes.rules().len() >= 30, "the walk covers the API");
    for rule in routes.rules() {
        let uri = concrete(&rule.path);
        let body = (rule.method != Method::GET && rule.method != Method::DELETE).then(|| json!({}));
        let anonymous = send(&c, rule.method.clone(), &uri, body.clone(), &[]).await;
        let viewer = send(
            &c,
            rule.method.clone(),
            &uri,
            body.clone(),
            &bearer(&c.viewer),
        )
        .await;
        let bad_token = send(
            &c,
            rule.method.clone(),
            &uri,
            body,
            &bearer("tsr_not-a-token"),
        )
        .await;
        match rule.access() {
            Access::Role(role) | Access::InProject(role) => {
                assert_eq!(
                    anonymous.status,
                    StatusCode::UNAUTHORIZED,
                    "{} {uri}",
                    rule.method
                );
                assert!(
                    anonymous.body["error"].is_string(),
                    "a JSON error: {}",
                    anonymous.body
                );
                assert_eq!(
                    bad_token.status,
                    StatusCode::UNAUTHORIZED,
                    "{} {uri}",
                    rule.method
                );
                if role > Role::Viewer {
                    assert_eq!(
                        viewer.status,
                        StatusCode::FORBIDDEN,
                        "{} {uri}",
                        rule.method
                    );
                    assert!(
                        viewer.body["error"]
                            .as_str()
                            .is_some_and(|e| e.contains(role.as_str()))
                    );
                } else {
                    // Let through: an answer, or one about the state of things (nothing to
                    // right-size yet), never a refusal.
                    assert!(
                        viewer.status.is_success()
                            || viewer.status == StatusCode::NOT_FOUND
                            || viewer.status == StatusCode::CONFLICT,
                        "{} {uri}: {}",
                        rule.method,
                        viewer.status
                    );
                }
            }
            Access::Public | Access::Agent => {
                // Open routes: never a role check (their handlers check what they need).
                assert_ne!(
                    anonymous.status,
                    StatusCode::FORBIDDEN,
                    "{} {uri}",
                    rule.method
                );
            }
        }
    }
    assert_eq!(
        snapshot(&c).await,
        before,
        "refused requests change nothing"
    );
}

#[tokio::test]
async fn every_server_function_has_a_rule_and_is_refused_without_it() {
    let c = ctx().await;
    let rules = server_fn_rules();
    let registered: Vec<(&str, Method)> = leptos::server_fn::axum::server_fn_paths().collect();
    assert!(
        registered.len() >= 17,
        "the console's server functions are registered"
    );
    let before = snapshot(&c).await;
    for (path, method) in &registered {
        let (name, rule) = rules
            .get(path)
            .unwrap_or_else(|| panic!("server function {path} has no access rule"));
        let access = &rule.declared.access;
        let anonymous = send(
            &c,
            method.clone(),
            path,
            None,
            &[("origin", ORIGIN.to_owned())],
        )
        .await;
        let viewer = send(&c, method.clone(), path, None, &bearer(&c.viewer)).await;
        match access {
            Access::Role(role) | Access::InProject(role) => {
                assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{name}");
                if *role > Role::Viewer {
                    assert_eq!(viewer.status, StatusCode::FORBIDDEN, "{name}");
                }
            }
            _ => assert_eq!(*name, "current_caller", "only who-am-I is open"),
        }
    }
    let unknown = send(
        &c,
        Method::POST,
        "/api/not_a_server_fn",
        None,
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::FORBIDDEN, "no rule, no entry");
    assert_eq!(snapshot(&c).await, before);

    // Signed in on the console's own page, a server function does its work.
    let cookie = sign_in(&c, "admin", ADMIN_PASSWORD).await;
    let req = Request::post(tessera_app::pages::host::SetHostDraining::PATH)
        .header("host", "127.0.0.1:3000")
        .header("cookie", &cookie)
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from("id=sim-l4-1&drain=true"))
        .expect("request");
    let a = app(c.app.clone()).oneshot(req).await.expect("answers");
    assert_eq!(a.status(), StatusCode::OK);
    assert_eq!(host_status(&c).await, "draining");
    // The audit log names the function as its source does.
    let audit = send(&c, Method::GET, "/api/v1/audit", None, &bearer(&c.admin)).await;
    let actions: Vec<&str> = audit.body["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert!(
        actions.contains(&"server function set_host_draining"),
        "{actions:?}"
    );
}

/// A server function's request as the console sends it: JSON when its declaration names a
/// body argument (those functions take `input = Json`), else a form.
async fn call_fn(c: &Ctx, path: &str, args: Value, json: bool, cookie: &str) -> StatusCode {
    let (content_type, body) = if json {
        ("application/json", args.to_string())
    } else {
        let form = args
            .as_object()
            .expect("arguments")
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().expect("text")))
            .collect::<Vec<_>>()
            .join("&");
        ("application/x-www-form-urlencoded", form)
    };
    post_fn(c, path, Some(content_type), body, cookie).await.0
}

/// A request to a server function with any content type and body; its status and body.
async fn post_fn(
    c: &Ctx,
    path: &str,
    content_type: Option<&str>,
    body: String,
    cookie: &str,
) -> (StatusCode, String) {
    use http_body_util::BodyExt;
    let mut req = Request::post(path)
        .header("host", "127.0.0.1:3000")
        .header("cookie", cookie)
        .header("origin", ORIGIN);
    if let Some(t) = content_type {
        req = req.header("content-type", t);
    }
    let answer = app(c.app.clone())
        .oneshot(req.body(Body::from(body)).expect("request"))
        .await
        .expect("answers");
    let status = answer.status();
    let bytes = answer
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// A server function's arguments are checked as the function decodes them, whatever the
/// request's content type claims: a body the layer could read one way and the function
/// another (a form hidden in JSON, JSON sent as a form, a struct sent as an array) never
/// gets an operator of another project past the check. Refusals read as the console's
/// client reads a server function's error.
#[tokio::test]
async fn server_functions_are_checked_on_the_arguments_they_decode() {
    use tessera_app::pages::{service::*, service_new::*};
    let c = ctx().await;
    let (_, otto) = two_projects(&c).await;
    let a = send(
        &c,
        Method::POST,
        "/api/v1/services",
        Some(
            json!({"name": "o1", "task_definition": "embeddings:1", "pool": "inference",
            "desired_count": 0, "project": "other"}),
        ),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let before = snapshot(&c).await;
    for (path, content_type, body) in [
        // JSON the function reads, with a form the layer might have read instead.
        (
            PatchService::PATH,
            None,
            r#"{"name":"r1","patch":{"desired_count":0},"_&name=o1&_":0}"#,
        ),
        (
            PatchService::PATH,
            Some("application/x-www-form-urlencoded"),
            r#"{"name":"r1","patch":{"project":"other"},"_&name=o1&_":0}"#,
        ),
        (
            CreateService::PATH,
            Some("text/plain"),
            r#"{"input":{"name":"x","task_definition":"embeddings:1","pool":"inference","project":"research"},"_&input[project]=other&_":0}"#,
        ),
        // A form the function reads, sent as JSON.
        (
            DeleteService::PATH,
            Some("application/json"),
            r#"{"name":"o1","_":"&name=r1&"}"#,
        ),
        // A struct written as an array of its fields.
        (
            PatchService::PATH,
            Some("application/json"),
            r#"{"name":"o1","patch":[0,"embeddings:1","research"]}"#,
        ),
        (
            CreateService::PATH,
            Some("application/json"),
            r#"{"input":["x","embeddings:1","inference","research"]}"#,
        ),
    ] {
        let (status, said) = post_fn(&c, path, content_type, body.to_owned(), &otto).await;
        assert!(
            status == StatusCode::FORBIDDEN || status == StatusCode::BAD_REQUEST,
            "{path} {body}: {status} {said}"
        );
        assert!(
            said.starts_with("ServerError|")
                || said.starts_with("Args|")
                || said.starts_with("Deserialization|"),
            "a server function's error the console reads: {said}"
        );
    }
    assert_eq!(
        snapshot(&c).await,
        before,
        "refused requests change nothing"
    );
    // What the console itself sends, for a service of another project: refused, saying why.
    let (status, said) = post_fn(
        &c,
        DeleteService::PATH,
        Some("application/x-www-form-urlencoded"),
        "name=r1".into(),
        &otto,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        said.starts_with("ServerError|") && said.contains("research"),
        "{said}"
    );
}

/// Every operation in a project, REST and console alike, read from the declarations: an
/// operator of another project is refused (403) with nothing changed, whatever the handler
/// would do; an operator of the project acted on gets past the layer. A new operation in a
/// project is walked here without a line changed.
#[tokio::test]
async fn every_operation_in_a_project_is_checked_in_the_project_it_names() {
    let c = ctx().await;
    let (rita, otto) = two_projects(&c).await;
    let session = |cookie: &str| vec![("cookie", cookie.to_owned()), ("origin", ORIGIN.to_owned())];

    // The arguments each scope reads, naming research and its service r1.
    let rest: Vec<_> = api::routes()
        .rules()
        .iter()
        .filter(|r| !r.declared.scope.is_empty())
        .cloned()
        .collect();
    assert!(rest.len() >= 3, "services' changes are in their project");
    // A task of r1, for the operations on a task (`{id}`: its logs, exec).
    c.control
        .deployments()
        .update_service(
            "r1",
            &tessera_model::api::ServicePatch {
                desired_count: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("scaled");
    c.control.reconcile_once().await.expect("a pass");
    let r1_task = c
        .control
        .store()
        .list_tasks(&tessera_control::store::TaskFilter {
            service: Some("r1".into()),
            ..Default::default()
        })
        .await
        .expect("tasks")
        .first()
        .expect("a task of r1")
        .id
        .clone();
    let rest_request = |r: &tessera_server::auth::RouteRule| {
        let uri = r.path.replace("{name}", "r1").replace("{id}", &r1_task);
        let mut body = serde_json::Map::new();
        for s in r.declared.scope.iter() {
            if s.path_parameter().is_none() {
                body.insert(s.argument().to_owned(), json!("research"));
            }
        }
        (r.method.clone(), uri, Value::Object(body))
    };
    let fns: Vec<_> = server_fn_rules()
        .iter()
        .filter(|(_, (_, r))| !r.declared.scope.is_empty())
        .map(|(path, (name, r))| (*path, name.clone(), *r))
        .collect();
    assert!(fns.len() >= 3, "the console's twins are walked too");
    // A body argument is decoded whole by the layer, as the function would: the fields a
    // body needs besides the ones its scope reads (a body that does not decode is a 400).
    let whole_body = |r: &tessera_server::auth::ServerFnRule| match (r.name, r.body) {
        (_, None) => serde_json::Map::new(),
        ("CreateService", Some(_)) => json!({
            "name": "probe", "task_definition": "embeddings:1", "pool": "inference",
            "desired_count": 0,
        })
        .as_object()
        .cloned()
        .expect("object"),
        ("PatchService", Some(_)) => serde_json::Map::new(),
        (name, Some(body)) => panic!("say here what a whole `{body}` of {name} holds"),
    };
    // Arguments a function needs besides those its scope reads.
    let other_args = |r: &tessera_server::auth::ServerFnRule| match r.name {
        "ReadLastOutput" => json!({"task": "some-task"})
            .as_object()
            .cloned()
            .expect("object"),
        _ => serde_json::Map::new(),
    };
    let fn_request = |r: &tessera_server::auth::ServerFnRule| {
        let mut args = other_args(r);
        let mut fields = whole_body(r);
        for s in r.declared.scope.iter() {
            match s.path_parameter() {
                Some(p) => {
                    args.insert(p.to_owned(), json!("r1"));
                }
                None => {
                    fields.insert(s.argument().to_owned(), json!("research"));
                }
            }
        }
        match r.body {
            Some(b) => {
                args.insert(b.to_owned(), Value::Object(fields));
            }
            None => args.extend(fields),
        }
        (Value::Object(args), r.body.is_some())
    };

    let before = snapshot(&c).await;
    for r in &rest {
        let (method, uri, body) = rest_request(r);
        let a = send(&c, method.clone(), &uri, Some(body), &session(&otto)).await;
        assert_eq!(
            a.status,
            StatusCode::FORBIDDEN,
            "{method} {uri}: {}",
            a.body
        );
        assert!(
            a.body["error"]
                .as_str()
                .is_some_and(|e| e.contains("research")),
            "{method} {uri} names the project: {}",
            a.body
        );
    }
    for (path, name, r) in &fns {
        let (args, json) = fn_request(r);
        let status = call_fn(&c, path, args, json, &otto).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{name}");
    }
    assert_eq!(
        snapshot(&c).await,
        before,
        "refused requests change nothing"
    );

    // Rita, an operator in research, gets past the layer: whatever the handler says of the
    // request (a half-filled body, nothing to right-size), it is not a refusal.
    for (path, name, r) in &fns {
        let (args, json) = fn_request(r);
        let status = call_fn(&c, path, args, json, &rita).await;
        assert!(
            status != StatusCode::FORBIDDEN && status != StatusCode::UNAUTHORIZED,
            "{name}: {status}"
        );
    }
    for r in &rest {
        let (method, uri, body) = rest_request(r);
        let a = send(&c, method.clone(), &uri, Some(body), &session(&rita)).await;
        assert!(
            a.status != StatusCode::FORBIDDEN && a.status != StatusCode::UNAUTHORIZED,
            "{method} {uri}: {} {}",
            a.status,
            a.body
        );
    }
}
