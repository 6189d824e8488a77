//! Admins' power over agents: revoking, deleting idle hosts, rotating the join token.

use super::*;

#[tokio::test]
async fn admins_revoke_agents_delete_idle_hosts_and_rotate_the_join_token() {
    let c = ctx().await;
    let host = HostId::new("sim-l4-2").expect("valid");
    let token = c.agents[host.as_str()].clone();
    let body = common::sync_body(&c.control, &host).await;
    let ok = send(
        &c,
        Method::POST,
        "/agent/v1/sync",
        Some(body.clone()),
        &bearer(&token),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    let revoked = send(
        &c,
        Method::POST,
        "/api/v1/hosts/sim-l4-2/revoke",
        None,
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(revoked.status, StatusCode::OK, "{}", revoked.body);
    let refused = send(
        &c,
        Method::POST,
        "/agent/v1/sync",
        Some(body),
        &bearer(&token),
    )
    .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);

    let gone = send(
        &c,
        Method::DELETE,
        "/api/v1/hosts/sim-l4-2",
        None,
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT, "{}", gone.body);
    // The same machine (same GPU UUIDs) joins again.
    common::register_hosts(&c.control, JOIN, &common::DEMO_HOSTS[3..]).await;

    let rotated = send(
        &c,
        Method::POST,
        "/api/v1/join-token",
        None,
        &bearer(&c.admin),
    )
    .await;
    let new = rotated.body["join_token"]
        .as_str()
        .expect("shown once")
        .to_owned();
    let old = send(
        &c,
        Method::POST,
        "/agent/v1/register",
        Some(common::register_body(JOIN, "late")),
        &[],
    )
    .await;
    assert_eq!(old.status, StatusCode::UNAUTHORIZED);
    let fresh = send(
        &c,
        Method::POST,
        "/agent/v1/register",
        Some(common::register_body(&new, "late")),
        &[],
    )
    .await;
    assert_eq!(fresh.status, StatusCode::CREATED, "{}", fresh.body);
}
