//! Console sessions: cross-site requests, unknown hosts and fixed session ids refused;
//! guessed passwords limited; disabled users out at once; login tokens.

use super::*;

#[tokio::test]
async fn cross_site_requests_with_a_session_are_refused() {
    let c = ctx().await;
    let cookie = sign_in(&c, "admin", ADMIN_PASSWORD).await;
    let who = send(
        &c,
        Method::GET,
        "/api/v1/session",
        None,
        &[("cookie", cookie.clone())],
    )
    .await;
    assert_eq!(who.body["name"], "admin");
    assert_eq!(who.body["role"], "admin");

    // REST, body-less POST, from another site.
    let evil = send(
        &c,
        Method::POST,
        "/api/v1/hosts/sim-l4-1/drain",
        None,
        &[
            ("cookie", cookie.clone()),
            ("origin", "http://evil.example".into()),
        ],
    )
    .await;
    assert_eq!(evil.status, StatusCode::FORBIDDEN, "{}", evil.body);
    // A WebSocket opened by another site's page (exec in a task), with the admin's
    // cookie: a GET, yet refused before anything runs.
    let hijack = send(
        &c,
        Method::GET,
        "/api/v1/tasks/some-task/exec?command=%5B%22sh%22%5D",
        None,
        &[
            ("cookie", cookie.clone()),
            ("origin", "http://evil.example".into()),
            ("upgrade", "websocket".into()),
            ("connection", "upgrade".into()),
            ("sec-websocket-version", "13".into()),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==".into()),
        ],
    )
    .await;
    assert_eq!(hijack.status, StatusCode::FORBIDDEN, "{}", hijack.body);
    // A server function, by a browser that says the request is cross-site.
    let path = tessera_app::pages::host::SetHostDraining::PATH;
    let req = Request::post(path)
        .header("host", "127.0.0.1:3000")
        .header("cookie", &cookie)
        .header("sec-fetch-site", "cross-site")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from("id=sim-l4-1&drain=true"))
        .expect("request");
    let a = app(c.app.clone()).oneshot(req).await.expect("answers");
    assert_eq!(a.status(), StatusCode::FORBIDDEN);
    // With the cookie but no Origin at all (not a browser on our page).
    let bare = send(
        &c,
        Method::POST,
        "/api/v1/hosts/sim-l4-1/drain",
        None,
        &[("cookie", cookie.clone())],
    )
    .await;
    assert_eq!(bare.status, StatusCode::FORBIDDEN);
    assert_eq!(host_status(&c).await, "active", "nothing changed");

    // From the console's own page it works.
    let ok = send(
        &c,
        Method::POST,
        "/api/v1/hosts/sim-l4-1/drain",
        None,
        &[("cookie", cookie.clone()), ("origin", ORIGIN.into())],
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(host_status(&c).await, "draining");
    // (A server function called from the console's own page: in the server function test,
    // the one test here that runs server functions.)

    // Signed out, the cookie is worth nothing.
    let out = send(
        &c,
        Method::DELETE,
        "/api/v1/session",
        None,
        &[("cookie", cookie.clone()), ("origin", ORIGIN.into())],
    )
    .await;
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    let who = send(
        &c,
        Method::GET,
        "/api/v1/session",
        None,
        &[("cookie", cookie)],
    )
    .await;
    assert_eq!(who.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn unknown_hosts_and_fixed_session_ids_are_refused() {
    let c = ctx().await;
    let req = Request::get("/api/v1/hosts")
        .header("host", "evil.example")
        .header("authorization", format!("Bearer {}", c.admin))
        .body(Body::empty())
        .expect("request");
    let a = app(c.app.clone()).oneshot(req).await.expect("answers");
    assert_eq!(
        a.status(),
        StatusCode::BAD_REQUEST,
        "DNS rebinding: unknown Host"
    );
    // A session id planted before sign-in is not the one signed in.
    let planted = "tessera_session=AAAAAAAAAAAAAAAAAAAAAA";
    let a = send(
        &c,
        Method::POST,
        "/api/v1/session",
        Some(json!({"username": "admin", "password": ADMIN_PASSWORD})),
        &[("cookie", planted.into())],
    )
    .await;
    let set = a
        .headers
        .get("set-cookie")
        .expect("cookie")
        .to_str()
        .expect("text");
    assert!(
        !set.starts_with(planted),
        "a new session id at sign-in: {set}"
    );
}

#[tokio::test]
async fn failed_sign_ins_are_limited_and_disabled_users_are_out_at_once() {
    let c = ctx().await;
    for _ in 0..5 {
        let a = send(
            &c,
            Method::POST,
            "/api/v1/session",
            Some(json!({"username": "admin", "password": "guess-guess-guess"})),
            &[],
        )
        .await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    }
    let a = send(
        &c,
        Method::POST,
        "/api/v1/session",
        Some(json!({"username": "admin", "password": ADMIN_PASSWORD})),
        &[],
    )
    .await;
    assert_eq!(
        a.status,
        StatusCode::TOO_MANY_REQUESTS,
        "even the right password waits"
    );
    assert!(a.headers.contains_key("retry-after"));

    // An operator made by the admin signs in, works, and is out once disabled.
    let made = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "olga", "password": "olga-password-1", "role": "operator"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert!(made.body.get("password_hash").is_none());
    let short = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "bob", "password": "short"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(short.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(short.body["errors"][0]["field"], "password");
    let cookie = sign_in(&c, "olga", "olga-password-1").await;
    let scaled = send(
        &c,
        Method::PATCH,
        "/api/v1/services/embeddings",
        Some(json!({"desired_count": 2})),
        &[("cookie", cookie.clone()), ("origin", ORIGIN.into())],
    )
    .await;
    assert_eq!(scaled.status, StatusCode::OK, "{}", scaled.body);
    let pool = send(
        &c,
        Method::POST,
        "/api/v1/pools",
        Some(json!({"name": "x"})),
        &[("cookie", cookie.clone()), ("origin", ORIGIN.into())],
    )
    .await;
    assert_eq!(pool.status, StatusCode::FORBIDDEN, "pools are the admin's");
    let off = send(
        &c,
        Method::PATCH,
        "/api/v1/users/olga",
        Some(json!({"disabled": true})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(off.status, StatusCode::OK, "{}", off.body);
    let after = send(
        &c,
        Method::GET,
        "/api/v1/hosts",
        None,
        &[("cookie", cookie)],
    )
    .await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
    // The last enabled admin cannot be disabled or demoted.
    let one = send(
        &c,
        Method::PATCH,
        "/api/v1/users/admin",
        Some(json!({"disabled": true})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(
        one.status,
        StatusCode::OK,
        "another admin is left: {}",
        one.body
    );
    let last = send(
        &c,
        Method::PATCH,
        "/api/v1/users/bench-admin",
        Some(json!({"role": "viewer"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(last.status, StatusCode::CONFLICT, "{}", last.body);
}

#[tokio::test]
async fn a_login_token_has_its_users_role_and_only_its_owner_or_an_admin_deletes_it() {
    let c = ctx().await;
    let made = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "olga", "password": "olga-operator-pw", "role": "operator"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let wrong = send(
        &c,
        Method::POST,
        "/api/v1/session/token",
        Some(json!({"username": "olga", "password": "not-it", "name": "cli olga@laptop"})),
        &[],
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(!wrong.body.to_string().contains("tsr_"));
    let login = send(
        &c,
        Method::POST,
        "/api/v1/session/token",
        Some(json!({"username": "olga", "password": "olga-operator-pw", "name": "cli olga@laptop", "expires_in_days": 90})),
        &[],
    )
    .await;
    assert_eq!(login.status, StatusCode::CREATED, "{}", login.body);
    assert_eq!(login.body["role"], "operator");
    assert_eq!(login.body["created_by"], "olga");
    let token = login.body["token"].as_str().expect("shown once").to_owned();
    let id = login.body["id"].as_str().expect("id").to_owned();
    let me = send(&c, Method::GET, "/api/v1/session", None, &bearer(&token)).await;
    assert_eq!(me.body["role"], "operator");
    // Someone else's token: only an admin may delete it.
    let other = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{id}"),
        None,
        &bearer(&c.viewer),
    )
    .await;
    assert_eq!(other.status, StatusCode::FORBIDDEN, "{}", other.body);
    // Its own: `tessera logout`.
    let own = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{id}"),
        None,
        &bearer(&token),
    )
    .await;
    assert_eq!(own.status, StatusCode::NO_CONTENT, "{}", own.body);
    let after = send(&c, Method::GET, "/api/v1/hosts", None, &bearer(&token)).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
}

/// Behind a trusted load balancer each client has its own failed sign-in limit, not the
/// balancer's one for everyone; a peer that is not trusted cannot pick its address with a
/// header.
#[tokio::test]
async fn behind_a_trusted_proxy_each_client_has_its_own_sign_in_limit() {
    use tessera_server::forwarded::TrustedProxies;
    let mut c = ctx().await;
    c.app.trusted_proxies = TrustedProxies::new(vec!["10.0.0.0/8".parse().expect("network")]);
    // Failures count per user too: each guess names a user of its own, so only the
    // address's count can refuse the admin's right password.
    let sign_in_from = |peer: &str, forwarded: &str, username: &str, password: &str| {
        let mut req = Request::post("/api/v1/session")
            .header("host", "127.0.0.1:3000")
            .header("content-type", "application/json")
            .header("x-forwarded-for", forwarded)
            .body(Body::from(
                json!({"username": username, "password": password}).to_string(),
            ))
            .expect("request");
        let peer: std::net::SocketAddr = format!("{peer}:40000").parse().expect("peer");
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        let app = app(c.app.clone());
        async move { app.oneshot(req).await.expect("answers").status() }
    };
    for i in 0..5 {
        let who = format!("nobody-{i}");
        assert_eq!(
            sign_in_from("10.0.0.2", "203.0.113.5", &who, "guess-guess-guess").await,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        sign_in_from("10.0.0.2", "203.0.113.5", "admin", ADMIN_PASSWORD).await,
        StatusCode::TOO_MANY_REQUESTS,
        "the client that guessed waits"
    );
    assert!(
        sign_in_from("10.0.0.2", "203.0.113.6", "admin", ADMIN_PASSWORD)
            .await
            .is_success(),
        "another client behind the same balancer does not"
    );
    // Not a trusted proxy: its header is not believed, so a new one each time helps not.
    for i in 0..5 {
        let (forged, who) = (format!("203.0.113.{}", 10 + i), format!("ghost-{i}"));
        assert_eq!(
            sign_in_from("198.51.100.9", &forged, &who, "guess-guess-guess").await,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        sign_in_from("198.51.100.9", "203.0.113.99", "admin", ADMIN_PASSWORD).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}
