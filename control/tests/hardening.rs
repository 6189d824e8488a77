//! Holes an attacker or a careless restart would find, each written as the attack first.

use tessera_control::testkit::*;
use tessera_model::auth::Role;

const CONFIGURED: &str = "configured-admin-password";

/// An admin disables the `admin` account (another admin remains); the server restarts
/// with `TESSERA_ADMIN_PASSWORD` still set. The account stays disabled and keeps its role:
/// the configured password is a password, not a way back in.
#[tokio::test]
async fn the_configured_admin_password_never_enables_a_disabled_admin() {
    let env = env(fast()).await;
    let c = &env.control;
    c.accounts()
        .ensure_admin(Some(CONFIGURED), false)
        .await
        .expect("admin");
    c.accounts()
        .add_user("ops", "another-long-password", Role::Admin)
        .await
        .expect("second admin");
    c.accounts()
        .update_user("admin", Some(Role::Viewer), Some(true), None)
        .await
        .expect("demoted and disabled");
    // The restart.
    c.accounts()
        .ensure_admin(Some(CONFIGURED), false)
        .await
        .expect("start");
    let admin = c
        .accounts()
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
        c.accounts()
            .sign_in("admin", CONFIGURED, None)
            .await
            .is_err(),
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
        provider_id: None,
        agent_version: None,
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
    let rotated = c.agents().rotate_join_token().await.expect("rotated");
    // The restart, with the old token still in the configuration.
    let restarted = env.restart(fast()).await;
    restarted
        .agents()
        .ensure_join_token(Some(JOIN))
        .await
        .expect("starts");
    let err = restarted
        .agents()
        .register_agent(&register_request(JOIN))
        .await
        .expect_err("the leaked token admits a host");
    assert!(err.to_string().contains("join token"), "{err}");
    restarted
        .agents()
        .register_agent(&register_request(&rotated))
        .await
        .expect("the rotated token admits");
    // A new token in the configuration is the operator's own rotation.
    let chosen = "a-new-configured-join-token";
    restarted
        .agents()
        .ensure_join_token(Some(chosen))
        .await
        .expect("starts");
    let mut r = register_request(chosen);
    r.name = Some("joiner-2".into());
    r.gpus = gpus("joiner-2", 1, 24);
    restarted
        .agents()
        .register_agent(&r)
        .await
        .expect("the new configured token admits");
    assert!(
        restarted
            .agents()
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
    c.accounts()
        .audit(tessera_control::store::NewAuditEntry {
            actor: "admin".into(),
            action: "POST /api/v1/users".into(),
            target: Some("old".into()),
            address: None,
        })
        .await;
    c.tick().await.expect("this server announced");
    let plan = c
        .deployments()
        .plan_consolidation(&tessera_model::consolidation::PlanInput {
            pool: "gpu".into(),
            goal: "gpus".into(),
        })
        .await
        .expect("a plan");
    c.deployments()
        .cancel_consolidation_plan(&plan.id)
        .await
        .expect("cancelled");
    // An hour and a half later: past the retention, within the audit's.
    env.clock.advance(std::time::Duration::from_secs(5400));
    let pruned = c.deployments().prune().await.expect("prune");
    assert_eq!(
        pruned.audit, 0,
        "the audit log keeps its own, longer retention"
    );
    assert_eq!(pruned.plans, 1, "{pruned:?}");
    assert_eq!(pruned.servers, 1, "{pruned:?}");
    env.clock.advance(std::time::Duration::from_secs(3600));
    let pruned = c.deployments().prune().await.expect("prune");
    assert_eq!(pruned.audit, 1, "{pruned:?}");
}

fn minted(pool: Option<&str>, uses: u32, secs: u64) -> tessera_model::auth::JoinTokenInput {
    tessera_model::auth::JoinTokenInput {
        description: "rollout".into(),
        pool: pool.map(str::to_owned),
        expires_in_secs: Some(secs),
        uses: Some(uses),
        ..Default::default()
    }
}

fn admin() -> tessera_model::auth::Caller {
    tessera_model::auth::Caller {
        name: "admin".into(),
        on_behalf_of: None,
        kind: tessera_model::auth::CallerKind::Session,
        role: Role::Admin,
        token_id: None,
        projects: Default::default(),
        project: None,
    }
}

fn joiner(token: &str, name: &str, pool: &str) -> tessera_model::agent::RegisterRequest {
    tessera_model::agent::RegisterRequest {
        name: Some(name.into()),
        gpus: gpus(name, 1, 24),
        pool: tessera_model::PoolName::new(pool).expect("valid"),
        ..register_request(token)
    }
}

/// A rogue registration with a minted token that is used up, expired, scoped to another
/// pool, or raced for its last use: none registers a host.
#[tokio::test]
async fn join_tokens_register_nothing_past_their_scope() {
    let env = env(fast()).await;
    let c = &env.control;
    c.deployments()
        .create_pool(&tessera_control::inputs::PoolInput::named("other"))
        .await
        .expect("pool");
    let one = c
        .agents()
        .mint_join_token(&admin(), &minted(Some("gpu"), 1, 3600))
        .await
        .expect("minted");
    c.agents()
        .register_agent(&joiner(&one.token, "first", "gpu"))
        .await
        .expect("the token's one use");
    let used = c
        .agents()
        .register_agent(&joiner(&one.token, "second", "gpu"))
        .await
        .expect_err("a used-up token registered a host");
    println!("used-up token: refused ({used})");
    assert!(used.to_string().contains("used up"), "{used}");

    let scoped = c
        .agents()
        .mint_join_token(&admin(), &minted(Some("gpu"), 5, 3600))
        .await
        .expect("minted");
    let other_pool = c
        .agents()
        .register_agent(&joiner(&scoped.token, "elsewhere", "other"))
        .await
        .expect_err("a token for pool gpu registered a host in pool other");
    println!("token for another pool: refused ({other_pool})");

    let short = c
        .agents()
        .mint_join_token(&admin(), &minted(None, 5, 60))
        .await
        .expect("minted");
    env.clock.advance(std::time::Duration::from_secs(61));
    let expired = c
        .agents()
        .register_agent(&joiner(&short.token, "late", "gpu"))
        .await
        .expect_err("an expired token registered a host");
    println!("expired token: refused ({expired})");
    assert!(expired.to_string().contains("expired"), "{expired}");

    // Ten registrations race for one use: exactly one host is written.
    let last = c
        .agents()
        .mint_join_token(&admin(), &minted(None, 1, 3600))
        .await
        .expect("minted");
    let mut racing = tokio::task::JoinSet::new();
    for i in 0..10 {
        let (c, token) = (c.clone(), last.token.clone());
        racing.spawn(async move {
            c.agents()
                .register_agent(&joiner(&token, &format!("racer-{i}"), "gpu"))
                .await
        });
    }
    let won = racing
        .join_all()
        .await
        .into_iter()
        .filter(Result::is_ok)
        .count();
    println!("10 registrations racing for a token's last use: {won} registered");
    assert_eq!(won, 1);
    let hosts = c.views().list_hosts().await.expect("hosts");
    assert_eq!(hosts.len(), 2, "{hosts:?}");
    let listed = c.agents().list_join_tokens().await.expect("tokens");
    assert!(
        listed
            .iter()
            .all(|t| t.uses_left == 0 || t.id != last.info.id)
    );
}

/// The join token printed at first start is for the first hosts, not forever: a day
/// later it registers nothing.
#[tokio::test]
async fn the_token_printed_at_first_start_expires() {
    let db = TestDb::new().await;
    let clock = std::sync::Arc::new(tessera_control::clock::ManualClock::default());
    let c = tessera_control::Control::new(
        db.open().await,
        tessera_control::ControlConfig {
            clock: clock.clone(),
            ..fast()
        },
    );
    let token = c
        .agents()
        .ensure_join_token(None)
        .await
        .expect("start")
        .expect("printed once");
    c.deployments()
        .create_pool(&tessera_control::inputs::PoolInput::named("gpu"))
        .await
        .expect("pool");
    c.agents()
        .register_agent(&joiner(&token, "day-one", "gpu"))
        .await
        .expect("registers on day one");
    clock.advance(
        tessera_control::admission::BOOTSTRAP_TOKEN_TTL + std::time::Duration::from_secs(1),
    );
    let err = c
        .agents()
        .register_agent(&joiner(&token, "day-two", "gpu"))
        .await
        .expect_err("the bootstrap token still registers a day later");
    println!("bootstrap token a day later: refused ({err})");
    assert!(err.to_string().contains("expired"), "{err}");
}

/// A pool with manual admission: a host that registers (with any valid token) is held,
/// gets no task and so no secret, until an admin approves it; a pre-approved token's
/// host is not held.
#[tokio::test]
async fn a_manual_pool_holds_new_hosts_and_their_tasks_until_approved() {
    let env = env(fast()).await;
    let c = &env.control;
    c.deployments()
        .create_pool(&tessera_control::inputs::PoolInput::named("secure"))
        .await
        .expect("pool");
    // An existing pool turned manual.
    let pool = c
        .deployments()
        .update_pool(
            &tessera_model::PoolName::new("secure").expect("name"),
            &tessera_model::api::PoolPatch {
                admission: Some("manual".into()),
                ..Default::default()
            },
        )
        .await
        .expect("patched");
    assert_eq!(pool.admission, tessera_model::Admission::Manual);
    assert!(
        c.deployments()
            .update_pool(
                &tessera_model::PoolName::new("secure").expect("name"),
                &tessera_model::api::PoolPatch {
                    admission: Some("sometimes".into()),
                    ..Default::default()
                },
            )
            .await
            .is_err(),
        "an admission that is not one"
    );
    let resp = c
        .agents()
        .register_agent(&joiner(JOIN, "newcomer", "secure"))
        .await
        .expect("registers");
    let host = c.views().get_host(&resp.host_id).await.expect("host");
    assert!(host.held, "not held");
    let def = c
        .deployments().register_task_definition(&serde_json::json!({
            "family": "secretive",
            "containers": [{"name": "main", "command": ["sleep", "infinity"], "cpu_milli": 100, "memory_mib": 64,
                "secrets": {"API_KEY": "s3cret-value"},
                "gpu": {"mps": {"memory_mib": 1024}}}]
        }))
        .await
        .expect("def");
    c.deployments()
        .create_service(
            &serde_json::from_value(serde_json::json!({
                "name": "secretive", "pool": "secure",
                "task_definition": format!("{}:{}", def.family, def.revision),
            }))
            .expect("service input"),
        )
        .await
        .expect("service");
    c.reconcile_once().await.expect("pass");
    let h = Host {
        id: resp.host_id.clone(),
        token: resp.agent_token.clone(),
        gpus: gpus("newcomer", 1, 24),
    };
    let answer = sync(c, &h).await;
    println!("held host's sync answer: {} task(s)", answer.tasks.len());
    assert!(answer.tasks.is_empty(), "a held host was sent tasks");
    c.agents()
        .approve_host(&admin(), &resp.host_id)
        .await
        .expect("approved");
    c.reconcile_once().await.expect("pass");
    let answer = sync(c, &h).await;
    assert_eq!(answer.tasks.len(), 1, "the approved host runs the task");
    assert!(
        c.agents()
            .approve_host(&admin(), &resp.host_id)
            .await
            .is_err(),
        "approved twice"
    );
    let pre = c
        .agents()
        .mint_join_token(
            &admin(),
            &tessera_model::auth::JoinTokenInput {
                preapproved: true,
                ..minted(Some("secure"), 1, 3600)
            },
        )
        .await
        .expect("minted");
    let resp = c
        .agents()
        .register_agent(&joiner(&pre.token, "trusted", "secure"))
        .await
        .expect("registers");
    assert!(!c.views().get_host(&resp.host_id).await.expect("host").held);
}

/// A revoked host's GPU UUIDs are visible to viewers and tasks: presenting them with the
/// fleet's join token does not take the host over. Only a token minted for that host does.
#[tokio::test]
async fn a_revoked_host_rejoins_only_with_a_token_minted_for_it() {
    let env = env(fast()).await;
    let c = &env.control;
    let h = host(c, "victim", 1, 24).await;
    c.agents().revoke_host(&h.id).await.expect("revoked");
    let mut impostor = joiner(JOIN, "impostor", "gpu");
    impostor.gpus = h.gpus.clone();
    let err = c
        .agents()
        .register_agent(&impostor)
        .await
        .expect_err("GPU UUIDs took a revoked host over");
    println!("rejoin by GPU UUIDs: refused ({err})");
    let t = c
        .agents()
        .mint_join_token(
            &admin(),
            &tessera_model::auth::JoinTokenInput {
                host: Some(h.id.to_string()),
                ..minted(None, 1, 3600)
            },
        )
        .await
        .expect("minted");
    let mut back = joiner(&t.token, "victim", "gpu");
    back.gpus = h.gpus.clone();
    let resp = c.agents().register_agent(&back).await.expect("rejoins");
    assert_eq!(resp.host_id, h.id);
    assert!(
        c.agents()
            .mint_join_token(
                &admin(),
                &tessera_model::auth::JoinTokenInput {
                    host: Some(h.id.to_string()),
                    ..minted(None, 1, 3600)
                },
            )
            .await
            .is_err(),
        "a token minted for a host that is registered"
    );
}

/// A burst of concurrent wrong passwords for one user, through two servers on one
/// database: at most the limit are checked; the rest are refused before any hashing.
#[tokio::test]
async fn a_burst_of_wrong_passwords_gets_at_most_the_limit_checked() {
    let env = env(fast()).await;
    let a = env.control.clone();
    let b = env.restart(fast()).await;
    a.accounts()
        .add_user("ops", "the-right-password-1", Role::Operator)
        .await
        .expect("user");
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..200 {
        let c = if i % 2 == 0 { a.clone() } else { b.clone() };
        burst.spawn(async move {
            c.accounts()
                .sign_in("ops", &format!("guess-{i}"), None)
                .await
        });
    }
    let results = burst.join_all().await;
    let checked = results
        .iter()
        .filter(|r| {
            matches!(
                r,
                Err(tessera_control::error::ControlError::Unauthorized(_))
            )
        })
        .count();
    let limited = results
        .iter()
        .filter(|r| {
            matches!(
                r,
                Err(tessera_control::error::ControlError::TooManyAttempts { .. })
            )
        })
        .count();
    println!(
        "200 concurrent wrong passwords through 2 servers: {checked} checked, {limited} refused unchecked"
    );
    assert!(
        checked as u64 <= tessera_control::auth::MAX_ATTEMPTS,
        "{checked} checked"
    );
    assert_eq!(checked + limited, 200);
    // The window holds for the right password too, on either server, until it passes.
    assert!(
        b.accounts()
            .sign_in("ops", "the-right-password-1", None)
            .await
            .is_err()
    );
    env.clock
        .advance(tessera_control::auth::ATTEMPT_WINDOW + std::time::Duration::from_secs(1));
    a.accounts()
        .sign_in("ops", "the-right-password-1", None)
        .await
        .expect("signs in once the window passed");
}

/// Two servers on one database, one whose clock runs 30 s ahead, while a host syncs
/// through the other: the skewed one neither takes the live lease nor declares the host
/// lost (liveness and the lease run on the database's clock).
#[tokio::test]
async fn a_server_with_a_skewed_clock_loses_no_host_and_takes_no_live_lease() {
    let config = || tessera_control::ControlConfig {
        lease_ttl: std::time::Duration::from_secs(10),
        ..fast()
    };
    let env = env(config()).await;
    let a = env.control.clone();
    let skewed = tessera_control::Control::new(
        tessera_control::open(&env.url()).await.expect("store"),
        tessera_control::ControlConfig {
            clock: std::sync::Arc::new(tessera_control::clock::SkewedClock(
                chrono::Duration::seconds(30),
            )),
            ..config()
        },
    );
    let h = host(&a, "steady", 1, 24).await;
    assert_eq!(a.tick().await, Ok(true));
    let started = std::time::Instant::now();
    let mut took = 0;
    while started.elapsed() < std::time::Duration::from_secs(4) {
        sync(&a, &h).await;
        assert_eq!(a.tick().await, Ok(true), "the holder lost its lease");
        if skewed.tick().await == Ok(true) {
            took += 1;
        }
        // Absence cannot be awaited: this proves that nothing goes wrong over 4 s of the
        // database's clock, which the test does not move, so it paces its rounds in real time.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let host = a.views().get_host(&h.id).await.expect("host");
    println!(
        "30 s of clock skew for 4 s: lease taken by the skewed server {took} time(s); host {}",
        host.status
    );
    assert_eq!(took, 0);
    assert_eq!(host.status, tessera_model::HostStatus::Active);
}

/// A definition that asks for a privileged container or a user of its choosing is
/// refused in a pool that does not allow it, naming the field; never stored and ignored.
#[tokio::test]
async fn privileges_a_pool_does_not_allow_are_refused_with_the_field() {
    let env = env(fast()).await;
    let c = &env.control;
    let def = c
        .deployments()
        .register_task_definition(&serde_json::json!({
            "family": "escalator",
            "containerDefinitions": [{"name": "main", "image": "busybox", "memory": 64,
                "privileged": true, "user": "0",
                "linuxParameters": {"capabilities": {"add": ["SYS_ADMIN"]}}}]
        }))
        .await
        .expect("a definition may ask");
    let input = |pool: &str| -> tessera_control::inputs::ServiceInput {
        serde_json::from_value(serde_json::json!({
            "name": format!("esc-{pool}"), "pool": pool,
            "task_definition": format!("{}:{}", def.family, def.revision),
        }))
        .expect("input")
    };
    let err = c
        .deployments()
        .create_service(&input("gpu"))
        .await
        .expect_err("a privileged container in a pool that does not allow it");
    println!("privileged container, user 0 in pool gpu: refused ({err})");
    let tessera_control::error::ControlError::Invalid(v) = err else {
        panic!("not a validation error: {err}")
    };
    let fields: Vec<_> = v.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "task_definition.containers[0].user",
            "task_definition.containers[0].privileged",
            "task_definition.containers[0].linuxParameters.capabilities.add"
        ],
        "{v:?}"
    );
    c.deployments()
        .create_pool(&tessera_control::inputs::PoolInput {
            task_users: Some(true),
            privileged: Some(true),
            ..tessera_control::inputs::PoolInput::named("trusted")
        })
        .await
        .expect("pool");
    c.deployments()
        .create_service(&input("trusted"))
        .await
        .expect("a pool that allows both");
    // The pool made stricter afterwards: a sync no longer sends the task (the last gate,
    // as for a rollback to such a revision or a definition stored before the check).
    let resp = c
        .agents()
        .register_agent(&joiner(JOIN, "trusted-host", "trusted"))
        .await
        .expect("registers");
    let h = Host {
        id: resp.host_id.clone(),
        token: resp.agent_token.clone(),
        gpus: gpus("trusted-host", 1, 24),
    };
    c.reconcile_once().await.expect("pass");
    assert_eq!(sync(c, &h).await.tasks.len(), 1, "allowed: sent");
    c.deployments()
        .update_pool(
            &tessera_model::PoolName::new("trusted").expect("name"),
            &tessera_model::api::PoolPatch {
                privileged: Some(false),
                ..Default::default()
            },
        )
        .await
        .expect("stricter");
    let answer = sync(c, &h).await;
    println!(
        "pool made stricter: the sync sends {} task(s)",
        answer.tasks.len()
    );
    assert!(answer.tasks.is_empty(), "a refused task was sent");
    // An unknown capability never reaches a pool: the definition is refused.
    let bad = c
        .deployments()
        .register_task_definition(&serde_json::json!({
            "family": "typo",
            "containerDefinitions": [{"name": "main", "image": "busybox", "memory": 64,
                "linuxParameters": {"capabilities": {"add": ["SYS_ADMN"]}}}]
        }))
        .await
        .expect_err("an unknown capability");
    assert!(
        bad.to_string().contains("is not a Linux capability"),
        "{bad}"
    );
    // MPS serves one Linux user at a time: a container sharing a GPU names none.
    let mps = c
        .deployments().register_task_definition(&serde_json::json!({
            "family": "mps-user",
            "containers": [{"name": "main", "command": ["sleep", "1"], "cpu_milli": 100, "memory_mib": 64,
                "gpu": {"mps": {"memory_mib": 1024}}, "ecs": {"user": "1000"}}]
        }))
        .await
        .expect_err("a user for an MPS container");
    assert!(
        mps.to_string().contains("one Linux user at a time"),
        "{mps}"
    );
}

/// Operators behind one address sign in as often as they like: only failures use up the
/// address's allowance (each attempt counted before the check, given back on success).
#[tokio::test]
async fn successful_sign_ins_use_up_no_allowance_and_failures_do() {
    let env = env(fast()).await;
    let c = &env.control;
    c.accounts()
        .add_user("ops", "the-right-password-1", Role::Operator)
        .await
        .expect("user");
    let here: std::net::IpAddr = "10.1.2.3".parse().expect("ip");
    for _ in 0..12 {
        c.accounts()
            .sign_in("ops", "the-right-password-1", Some(here))
            .await
            .expect("a good sign-in is never limited");
    }
    for i in 0..tessera_control::auth::MAX_ATTEMPTS {
        assert!(matches!(
            c.accounts()
                .sign_in("nobody", &format!("guess-{i}"), Some(here))
                .await,
            Err(tessera_control::error::ControlError::Unauthorized(_))
        ));
    }
    let limited = c
        .accounts()
        .sign_in("ops", "the-right-password-1", Some(here))
        .await;
    println!("after 5 failures from one address, its next sign-in: {limited:?}");
    assert!(matches!(
        limited,
        Err(tessera_control::error::ControlError::TooManyAttempts { .. })
    ));
}

/// An agent the compatibility policy does not serve (too old, newer than the server, or
/// saying something that is not a version) is refused at registration and at every sync,
/// with the versions and what to upgrade, and nothing it said is taken. One it serves has
/// its version recorded, and a change of it is an event.
#[tokio::test]
async fn an_agent_out_of_the_version_policy_is_refused_naming_what_to_upgrade() {
    use tessera_model::version::VERSION;
    let env = env(fast()).await;
    let c = &env.control;
    let mut old = registration(JOIN, "gpu", "old", gpus("old", 1, 24));
    old.agent_version = Some("0.0.9".into());
    let err = c.agents().register_agent(&old).await.expect_err("too old");
    let said = err.to_string();
    assert!(
        said.contains("tessera-agent 0.0.9 is not served by this server")
            && said.contains(&format!("(tessera {VERSION})"))
            && said.contains("upgrade tessera-agent on this host"),
        "{said}"
    );
    old.agent_version = Some("banana".into());
    let err = c
        .agents()
        .register_agent(&old)
        .await
        .expect_err("no version");
    assert!(err.to_string().contains("agent_version"), "{err}");
    let hosts = c.views().list_hosts().await.expect("hosts");
    assert!(hosts.is_empty(), "nothing registered: {hosts:?}");

    let h = host(c, "a", 1, 24).await;
    let shown = |c: &tessera_control::Control, id| {
        let c = c.clone();
        async move { c.views().host_view(&id).await.expect("host").0.host }
    };
    assert_eq!(
        shown(c, h.id.clone()).await.agent_version.as_deref(),
        Some(VERSION)
    );

    let newer = tessera_model::version::Version::current();
    let newer = format!("{}.{}.0", newer.major, newer.minor + 1);
    let mut r = report(&h, vec![]);
    r.agent_version = Some(newer.clone());
    r.address = Some("10.9.9.9".into());
    let err = c.agents().sync_agent(&h.id, &r).await.expect_err("newer");
    assert!(
        err.to_string()
            .contains(&format!("tessera-agent {newer} is newer than this server"))
            && err.to_string().contains("upgrade the servers first"),
        "{err}"
    );
    let host = shown(c, h.id.clone()).await;
    assert_eq!(
        host.agent_version.as_deref(),
        Some(VERSION),
        "nothing taken"
    );
    assert_eq!(host.address, None, "nothing taken");

    // An agent before 0.2 (no version) is served while this server is 0.2.
    let mut r = report(&h, vec![]);
    r.agent_version = None;
    c.agents().sync_agent(&h.id, &r).await.expect("served");
    assert_eq!(shown(c, h.id.clone()).await.agent_version, None);
    let (_, events) = c.views().host_view(&h.id).await.expect("host");
    let expected = format!("host {}: agent {VERSION} -> unknown (before 0.2)", h.id);
    assert!(
        events.iter().any(|e| e.message == expected),
        "{expected:?} in {:?}",
        events.iter().map(|e| &e.message).collect::<Vec<_>>()
    );
}
