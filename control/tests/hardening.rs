//! Holes an attacker or a careless restart would find, each written as the attack first.

mod common;

use common::*;
use tessera_model::auth::Role;

const CONFIGURED: &str = "configured-admin-password";

/// An admin disables the `admin` account (another admin remains); the server restarts
/// with `TESSERA_ADMIN_PASSWORD` still set. The account stays disabled and keeps its role:
/// the configured password is a password, not a way back in.
#[tokio::test]
async fn the_configured_admin_password_never_enables_a_disabled_admin() {
    let env = env(fast()).await;
    let c = &env.control;
    c.ensure_admin(Some(CONFIGURED), false)
        .await
        .expect("admin");
    c.add_user("ops", "another-long-password", Role::Admin)
        .await
        .expect("second admin");
    c.update_user("admin", Some(Role::Viewer), Some(true), None)
        .await
        .expect("demoted and disabled");
    // The restart.
    c.ensure_admin(Some(CONFIGURED), false)
        .await
        .expect("start");
    let admin = c
        .list_users()
        .await
        .expect("users")
        .into_iter()
        .find(|u| u.username == "admin")
        .expect("admin");
    assert!(admin.disabled, "the configured password enabled it again");
    assert_eq!(
        admin.role,
        Role::Viewer,
        "the configured password restored its role"
    );
    assert!(
        c.sign_in("admin", CONFIGURED, None).await.is_err(),
        "a disabled account signs in"
    );
}

fn register_request(token: &str) -> tessera_model::agent::RegisterRequest {
    tessera_model::agent::RegisterRequest {
        address: None,
        join_token: token.into(),
        pool: tessera_model::PoolName::new("gpu").expect("valid"),
        cpu_milli: tessera_model::MilliCpu(8000),
        memory_mib: tessera_model::MiB(16 * 1024),
        simulated: true,
        labels: Default::default(),
        gpus: gpus("joiner", 1, 24),
        name: Some("joiner".into()),
    }
}

/// An admin rotates the join token (the old one leaked); the server restarts with the old
/// one still configured. It stays rotated: the leaked token admits nobody. A token the
/// operator changes in the configuration does replace it.
#[tokio::test]
async fn a_rotated_join_token_stays_rotated_across_a_restart() {
    let env = env(fast()).await;
    let c = &env.control;
    // `env` configured JOIN; an admin rotates it.
    let rotated = c.rotate_join_token().await.expect("rotated");
    // The restart, with the old token still in the configuration.
    let restarted = env.restart(fast()).await;
    restarted
        .ensure_join_token(Some(JOIN))
        .await
        .expect("starts");
    let err = restarted
        .register_agent(&register_request(JOIN))
        .await
        .expect_err("the leaked token admits a host");
    assert!(err.to_string().contains("join token"), "{err}");
    restarted
        .register_agent(&register_request(&rotated))
        .await
        .expect("the rotated token admits");
    // A new token in the configuration is the operator's own rotation.
    let chosen = "a-new-configured-join-token";
    restarted
        .ensure_join_token(Some(chosen))
        .await
        .expect("starts");
    let mut r = register_request(chosen);
    r.name = Some("joiner-2".into());
    r.gpus = gpus("joiner-2", 1, 24);
    restarted
        .register_agent(&r)
        .await
        .expect("the new configured token admits");
    assert!(
        restarted
            .register_agent(&register_request(&rotated))
            .await
            .is_err()
    );
}

/// The database holds password hashes, token hashes and task secrets: another local user
/// reads none of it. A directory the server creates for it is 0700, its file 0600.
#[tokio::test]
async fn the_database_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp");
    let data = dir.path().join("data");
    let file = data.join("tessera.db");
    let _store = tessera_control::open(&format!("sqlite://{}", file.display()))
        .await
        .expect("opened");
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "the data directory");
    assert_eq!(mode(&file), 0o600, "the database file");
}

/// Nothing grows forever: the audit log past its own retention, servers long gone and
/// finished consolidation plans past the retention are pruned with the rest.
#[tokio::test]
async fn the_audit_log_servers_and_finished_plans_are_pruned() {
    let env = env(tessera_control::ControlConfig {
        retention: std::time::Duration::from_secs(3600),
        audit_retention: std::time::Duration::from_secs(7200),
        ..fast()
    })
    .await;
    let c = &env.control;
    c.audit(tessera_control::store::NewAuditEntry {
        actor: "admin".into(),
        action: "POST /api/v1/users".into(),
        target: Some("old".into()),
        address: None,
    })
    .await;
    c.tick().await.expect("this server announced");
    let plan = c
        .plan_consolidation(&tessera_model::consolidation::PlanInput {
            pool: "gpu".into(),
            goal: "gpus".into(),
        })
        .await
        .expect("a plan");
    c.cancel_consolidation_plan(&plan.id)
        .await
        .expect("cancelled");
    // An hour and a half later: past the retention, within the audit's.
    env.clock.advance(std::time::Duration::from_secs(5400));
    let pruned = c.prune().await.expect("prune");
    assert_eq!(
        pruned.audit, 0,
        "the audit log keeps its own, longer retention"
    );
    assert_eq!(pruned.plans, 1, "{pruned:?}");
    assert_eq!(pruned.servers, 1, "{pruned:?}");
    env.clock.advance(std::time::Duration::from_secs(3600));
    let pruned = c.prune().await.expect("prune");
    assert_eq!(pruned.audit, 1, "{pruned:?}");
}
