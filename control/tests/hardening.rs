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
