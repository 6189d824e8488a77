//! `docs/development.md`'s worked example of adding a REST operation, kept true: the handler
//! below is the one the guide shows (the test fails when the two differ), and routed with
//! one line it is documented, refused without credentials, refused to an operator of
//! another project, let through to an operator of the service's project, and audited, with
//! no other line of the server changed.

use super::*;
use axum::Json;
use axum::extract::State;
use tessera_model::operations as ops;
use tessera_model::schema::ServiceName;
use tessera_model::service::Service;
use tessera_server::api::bodies::ErrorBody;
use tessera_server::api::{self, Segment};
use tessera_server::error::ApiError;

// The guide's example, from here...
/// Poke a service (this line becomes the operation's summary)
#[utoipa::path(post, path = "/api/v1/services/{name}/poke", tag = "workloads",
    extensions(("x-access" = json!(ops::OPERATE_ON_SERVICE))),
    params(("name" = ServiceName, Path, description = "service name")),
    responses((status = 200, description = "Poked", body = Service),
              (status = 404, description = "No such service", body = ErrorBody)))]
pub async fn poke_service(
    State(state): State<AppState>,
    Segment(name): Segment,
) -> Result<Json<Service>, ApiError> {
    Ok(Json(
        state
            .control
            .deployments()
            .service_detail(&name)
            .await?
            .service,
    ))
}
// ...to here.

/// Text without its whitespace (rustfmt may lay the code out otherwise than the guide).
fn squeezed(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

#[test]
fn the_guide_shows_this_handler() {
    let me = include_str!("worked_example.rs");
    let from = me
        .find("// The guide's example, from here...\n")
        .expect("marker");
    let to = me.find("// ...to here.").expect("marker");
    let example = &me[from..to];
    let example = &example[example.find('\n').expect("a line") + 1..];
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/development.md"
    ))
    .expect("docs/development.md");
    assert!(
        squeezed(&guide).contains(&squeezed(example)),
        "docs/development.md's worked example is not this test's handler; change both:\n{example}"
    );
}

#[tokio::test]
async fn an_operation_added_as_the_guide_says_is_routed_enforced_documented_and_audited() {
    let c = ctx().await;
    let (rita, otto) = two_projects(&c).await;
    // The one line of `routes()`.
    let routes = || api::routes().route(utoipa_axum::routes!(poke_service));
    let rule = routes()
        .rules()
        .iter()
        .find(|r| r.path == "/api/v1/services/{name}/poke")
        .expect("routed")
        .clone();
    assert_eq!(rule.declared, ops::OPERATE_ON_SERVICE);
    let (_, doc) = routes().split();
    let doc = serde_json::to_value(doc).expect("serialises");
    let op = &doc["paths"]["/api/v1/services/{name}/poke"]["post"];
    assert_eq!(
        op["summary"],
        "Poke a service (this line becomes the operation's summary)"
    );
    assert_eq!(
        op["x-access"],
        json!({"role": "project-operator", "project": [{"service": "{name}"}], "audit": "changes"})
    );

    let app = tessera_server::app_with(c.app.clone(), routes());
    let poke = |headers: Vec<(&'static str, String)>| {
        let app = app.clone();
        async move {
            let mut req =
                Request::post("/api/v1/services/r1/poke").header("host", "127.0.0.1:3000");
            for (k, v) in headers {
                req = req.header(k, v);
            }
            let answer = app
                .oneshot(req.body(Body::empty()).expect("request"))
                .await
                .expect("answers");
            answer.status()
        }
    };
    let session = |cookie: &str| vec![("cookie", cookie.to_owned()), ("origin", ORIGIN.to_owned())];
    assert_eq!(poke(vec![]).await, StatusCode::UNAUTHORIZED);
    assert_eq!(poke(bearer(&c.viewer)).await, StatusCode::FORBIDDEN);
    assert_eq!(
        poke(session(&otto)).await,
        StatusCode::FORBIDDEN,
        "an operator of another project"
    );
    assert_eq!(poke(session(&rita)).await, StatusCode::OK);
    let audit = send(&c, Method::GET, "/api/v1/audit", None, &bearer(&c.admin)).await;
    let entries = audit.body["entries"].as_array().expect("entries");
    assert!(
        entries
            .iter()
            .any(|e| e["action"] == "POST /api/v1/services/r1/poke"
                && e["actor"] == "user rita"
                && e["target"] == "r1"),
        "audited: {entries:?}"
    );
}
