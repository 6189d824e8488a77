//! Capacity providers through the control plane: a pool that grows when tasks wait for
//! room (by the hosts a what-if placement says place them, machines asked for counted as
//! coming capacity), gives up on machines that never join, backs off when its provider
//! refuses, and shrinks when hosts stay empty; every decision an event.

use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tessera_control::Control;
use tessera_control::providers::Machines;
use tessera_control::testkit::*;
use tessera_model::PoolName;
use tessera_model::api::{PoolPatch, ServicePatch};
use tessera_model::provider::{HostShape, MachineState, Provider, ProviderInput, ProviderKind};
use tessera_model::service::{DeploymentConfig, TaskState};

/// A provider that records what it is asked, and refuses launches while told to.
#[derive(Default)]
struct Recorder {
    launched: Mutex<Vec<String>>,
    terminated: Mutex<Vec<String>>,
    refuse: Mutex<Option<String>>,
}

#[async_trait]
impl Machines for Recorder {
    async fn launch(
        &self,
        _pool: &PoolName,
        _provider: &Provider,
        names: &[String],
    ) -> Result<BTreeMap<String, String>, String> {
        if let Some(why) = self.refuse.lock().clone() {
            return Err(why);
        }
        self.launched.lock().extend(names.iter().cloned());
        // The provider's id of each: `i-<name>`, as a cloud names its instances.
        Ok(names
            .iter()
            .map(|n| (n.clone(), format!("i-{n}")))
            .collect())
    }

    async fn terminate(
        &self,
        _pool: &PoolName,
        _provider: &Provider,
        name: &str,
        _provider_id: Option<&str>,
    ) -> Result<(), String> {
        self.terminated.lock().push(name.to_owned());
        Ok(())
    }
}

fn gpu() -> PoolName {
    PoolName::new("gpu").expect("valid")
}

/// Pool `gpu` made by a demo provider of hosts with 2 × 24 GiB L4s, at most `max`.
async fn with_provider(c: &Control, max: u32) -> Arc<Recorder> {
    c.deployments()
        .update_pool(
            &gpu(),
            &PoolPatch {
                provider: Some(Some(ProviderInput {
                    kind: "demo".into(),
                    max_hosts: max,
                    scale_out_cooldown_secs: Some(0),
                    scale_in_cooldown_secs: Some(120),
                    boot_timeout_secs: Some(60),
                    shape: Some(HostShape {
                        gpu_model: "NVIDIA L4".into(),
                        gpus: 2,
                        gpu_memory_mib: 24 * 1024,
                        cpu_milli: 64_000,
                        memory_mib: 256 * 1024,
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            },
        )
        .await
        .expect("a provider");
    let recorder = Arc::new(Recorder::default());
    c.providers().register(ProviderKind::Demo, recorder.clone());
    recorder
}

/// The machine `name` boots: its agent joins with the provider's id of it.
async fn boot(c: &Control, name: &str, host: &str) -> Host {
    let gpus = gpus(host, 2, 24);
    let mut reg = registration(JOIN, "gpu", host, gpus.clone());
    reg.provider_id = Some(format!("i-{name}"));
    let resp = c.agents().register_agent(&reg).await.expect("register");
    Host {
        id: resp.host_id,
        token: resp.agent_token,
        gpus,
    }
}

async fn said(c: &Control) -> Vec<String> {
    c.store()
        .list_events(&tessera_control::store::EventFilter {
            limit: 200,
            ..Default::default()
        })
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.message)
        .collect()
}

#[tokio::test]
async fn waiting_tasks_grow_the_pool_by_what_places_them_and_empty_hosts_shrink_it() {
    let e = env(fast()).await;
    let c = &e.control;
    let recorder = with_provider(c, 4).await;
    // Three tasks of 20 GiB: one per 24 GiB GPU, two hosts of 2 GPUs.
    let def = register_def(c, "chat", 20, 25).await;
    service(c, "chat", &def, 3, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    let asked = recorder.launched.lock().clone();
    assert_eq!(asked.len(), 2, "{:?}", said(c).await);
    let events = said(c).await;
    assert!(
        events.iter().any(|m| m.contains(
            "3 task(s) of `chat` wait for 60 GiB of GPU memory; 2 more host(s) of 2 × NVIDIA L4 (24 GiB) place them"
        )),
        "{events:?}"
    );
    let machines = c
        .providers()
        .machines(Some(&gpu()), false)
        .await
        .expect("machines");
    assert_eq!(machines.len(), 2);
    assert!(machines.iter().all(|m| m.state == MachineState::Booting
        && m.provider_id.as_deref() == Some(&format!("i-{}", m.id))));
    // Asked for and not joined: coming capacity, not asked for again.
    c.reconcile_once().await.expect("pass");
    assert_eq!(recorder.launched.lock().len(), 2);

    // They boot; the tasks are placed on them.
    let a = boot(c, &asked[0], "a").await;
    let b = boot(c, &asked[1], "b").await;
    let machines = c
        .providers()
        .machines(Some(&gpu()), false)
        .await
        .expect("machines");
    assert!(
        machines.iter().all(|m| m.state == MachineState::Active),
        "{machines:?}"
    );
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    sync(c, &b).await;
    assert_eq!(tasks(c, "chat", &[TaskState::Running]).await.len(), 3);
    assert_eq!(recorder.launched.lock().len(), 2, "nothing waits: no more");

    // Scaled to nothing: the hosts go once empty for the scale-in cooldown.
    c.deployments()
        .update_service(
            "chat",
            &ServicePatch {
                desired_count: Some(0),
                ..Default::default()
            },
        )
        .await
        .expect("scale in");
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    sync(c, &b).await;
    assert!(
        tasks(c, "chat", &[TaskState::Running, TaskState::Stopping])
            .await
            .is_empty()
    );
    c.reconcile_once().await.expect("pass");
    assert!(
        recorder.terminated.lock().is_empty(),
        "not before the cooldown"
    );
    e.clock.advance(Duration::from_secs(121));
    // Their agents still sync: empty, not lost.
    sync(c, &a).await;
    sync(c, &b).await;
    c.reconcile_once().await.expect("pass");
    let mut gone = recorder.terminated.lock().clone();
    gone.sort();
    let mut expected = asked.clone();
    expected.sort();
    assert_eq!(gone, expected);
    let hosts = c.store().list_hosts().await.expect("hosts");
    assert!(
        !hosts.iter().any(|h| h.id == a.id || h.id == b.id),
        "deregistered: {hosts:?}"
    );
    let events = said(c).await;
    assert!(
        events
            .iter()
            .any(|m| m.contains("terminated and deregistered")
                && m.contains("has run no task for 121 s")),
        "{events:?}"
    );
    assert!(
        c.providers()
            .machines(Some(&gpu()), false)
            .await
            .expect("machines")
            .is_empty()
    );
}

#[tokio::test]
async fn a_machine_that_never_joins_is_given_up_on_and_a_refusing_provider_is_backed_off() {
    let e = env(fast()).await;
    let c = &e.control;
    let recorder = with_provider(c, 3).await;
    let def = register_def(c, "chat", 20, 25).await;
    service(c, "chat", &def, 1, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    let first = recorder.launched.lock().clone();
    assert_eq!(first.len(), 1);
    // It never joins: past its boot timeout it is terminated, failed, and asked for again.
    e.clock.advance(Duration::from_secs(61));
    c.reconcile_once().await.expect("pass");
    assert_eq!(recorder.terminated.lock().clone(), first);
    let ended = c
        .providers()
        .machines(Some(&gpu()), true)
        .await
        .expect("machines");
    let late = ended.iter().find(|m| m.id == first[0]).expect("kept");
    assert_eq!(late.state, MachineState::Failed);
    assert!(
        late.reason
            .contains("did not join within its boot timeout of 60 s"),
        "{late:?}"
    );
    // One failed launch: the next waits 30 s.
    assert_eq!(recorder.launched.lock().len(), 1, "backing off");
    e.clock.advance(Duration::from_secs(31));
    c.reconcile_once().await.expect("pass");
    assert_eq!(recorder.launched.lock().len(), 2);

    // The provider refuses: said, the machines failed, nothing else stops.
    *recorder.refuse.lock() = Some("no credentials".into());
    e.clock.advance(Duration::from_secs(61));
    c.reconcile_once().await.expect("pass");
    e.clock.advance(Duration::from_secs(121));
    c.reconcile_once().await.expect("pass");
    let events = said(c).await;
    assert!(
        events
            .iter()
            .any(|m| m.contains("the demo provider failed to launch: no credentials")),
        "{events:?}"
    );
    let machines = c
        .providers()
        .machines(Some(&gpu()), true)
        .await
        .expect("machines");
    assert!(
        machines
            .iter()
            .any(|m| m.state == MachineState::Failed && m.reason.contains("no credentials")),
        "{machines:?}"
    );
    assert!(
        machines.iter().filter(|m| m.state.live()).count() <= 3,
        "never past max_hosts: {machines:?}"
    );
}

#[tokio::test]
async fn a_provider_is_set_and_removed_through_the_pool_and_bad_settings_are_named() {
    let e = env(fast()).await;
    let c = &e.control;
    with_provider(c, 4).await;
    let pool = c.store().get_pool(&gpu()).await.expect("pool");
    let p = pool.provider.expect("kept");
    assert_eq!(
        (p.kind, p.max_hosts, p.boot_timeout_secs),
        (ProviderKind::Demo, 4, 60)
    );
    // A patch that changes something else keeps the provider.
    c.deployments()
        .update_pool(
            &gpu(),
            &PoolPatch {
                gpu_budget: Some("warn".into()),
                ..Default::default()
            },
        )
        .await
        .expect("patch");
    assert!(
        c.store()
            .get_pool(&gpu())
            .await
            .expect("pool")
            .provider
            .is_some()
    );
    let err = c
        .deployments()
        .update_pool(
            &gpu(),
            &PoolPatch {
                provider: Some(Some(ProviderInput {
                    kind: "aws-asg".into(),
                    max_hosts: 0,
                    ..Default::default()
                })),
                ..Default::default()
            },
        )
        .await
        .expect_err("refused");
    let text = format!("{err:?}");
    assert!(
        text.contains("provider.group") && text.contains("provider.max_hosts"),
        "{text}"
    );
    assert_eq!(
        c.store()
            .get_pool(&gpu())
            .await
            .expect("pool")
            .provider
            .map(|p| p.kind),
        Some(ProviderKind::Demo),
        "nothing stored"
    );
    c.deployments()
        .update_pool(
            &gpu(),
            &PoolPatch {
                provider: Some(None),
                ..Default::default()
            },
        )
        .await
        .expect("removed");
    assert_eq!(
        c.store().get_pool(&gpu()).await.expect("pool").provider,
        None
    );
}

/// A pool whose provider is an operator's command: the request it is given, the machines
/// it answers, a host joining as one of them, and a command that fails said in an event.
#[tokio::test]
async fn an_operators_command_makes_the_machines() {
    use std::os::unix::fs::PermissionsExt;
    use tessera_control::providers::command::CommandMachines;
    let e = env(fast()).await;
    let c = &e.control;
    let dir = tempfile::tempdir().expect("dir");
    let script = dir.path().join("make-hosts");
    let log = dir.path().join("requests");
    // Answers each name with the provider id `node-<name>`.
    std::fs::write(
        &script,
        format!(
            "#!/usr/bin/env python3\nimport json, sys\nreq = json.load(sys.stdin)\nopen({log:?}, 'a').write(json.dumps(req) + '\\n')\nprint(json.dumps({{'machines': [{{'name': n, 'provider_id': 'node-' + n}} for n in req.get('names', [])]}}))\n",
            log = log.display().to_string()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    c.deployments()
        .update_pool(
            &gpu(),
            &PoolPatch {
                provider: Some(Some(ProviderInput {
                    kind: "command".into(),
                    path: Some(script.display().to_string()),
                    max_hosts: 2,
                    scale_out_cooldown_secs: Some(0),
                    shape: Some(HostShape {
                        gpu_model: "NVIDIA L4".into(),
                        gpus: 2,
                        gpu_memory_mib: 24 * 1024,
                        cpu_milli: 64_000,
                        memory_mib: 256 * 1024,
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            },
        )
        .await
        .expect("a provider");
    c.providers().register(
        ProviderKind::Command,
        Arc::new(CommandMachines::with(Duration::from_secs(10), 1)),
    );
    let def = register_def(c, "chat", 20, 25).await;
    service(c, "chat", &def, 2, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    let machines = c
        .providers()
        .machines(Some(&gpu()), false)
        .await
        .expect("machines");
    assert_eq!(machines.len(), 1, "{:?}", said(c).await);
    let m = &machines[0];
    assert_eq!(
        m.provider_id.as_deref(),
        Some(format!("node-{}", m.id).as_str())
    );
    let request: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&log)
            .expect("asked")
            .lines()
            .next()
            .expect("one"),
    )
    .expect("JSON");
    assert_eq!(request["action"], "create");
    assert_eq!(request["pool"], "gpu");
    assert_eq!(request["names"], serde_json::json!([m.id]));
    assert_eq!(request["shape"]["gpus"], 2);
    // Its host joins with the id the command gave.
    let gpus = gpus("n17", 2, 24);
    let mut reg = registration(JOIN, "gpu", "n17", gpus);
    reg.provider_id = m.provider_id.clone();
    c.agents().register_agent(&reg).await.expect("register");
    let active = c
        .providers()
        .machines(Some(&gpu()), false)
        .await
        .expect("machines");
    assert_eq!(active[0].state, MachineState::Active);
    assert_eq!(active[0].host_id.as_ref().map(|h| h.as_str()), Some("n17"));
    // A command that fails: said with its words, the machines recorded failed.
    std::fs::write(
        &script,
        "#!/bin/sh\necho 'rack 4 has no power' >&2\nexit 3\n",
    )
    .expect("script");
    c.deployments()
        .update_service(
            "chat",
            &ServicePatch {
                desired_count: Some(6),
                ..Default::default()
            },
        )
        .await
        .expect("scale out");
    c.reconcile_once().await.expect("pass");
    let events = said(c).await;
    assert!(
        events
            .iter()
            .any(|m| m.contains("the command provider failed to launch")
                && m.contains("rack 4 has no power")),
        "{events:?}"
    );
}

/// A host the provider made that is lost: its task is replaced on a new machine asked for
/// first, and past the lost delay the old machine is terminated and the host deregistered.
#[tokio::test]
async fn a_lost_host_is_replaced_new_machine_first() {
    let e = env(fast()).await;
    let c = &e.control;
    let recorder = with_provider(c, 4).await;
    let def = register_def(c, "chat", 20, 25).await;
    service(c, "chat", &def, 1, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    let first = recorder.launched.lock().clone();
    assert_eq!(first.len(), 1);
    let a = boot(c, &first[0], "a").await;
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    assert_eq!(tasks(c, "chat", &[TaskState::Running]).await.len(), 1);
    // Host a falls silent: lost, its task stopped and waiting again: a new machine.
    e.clock.advance(Duration::from_secs(3));
    c.reconcile_once().await.expect("pass");
    let asked = recorder.launched.lock().clone();
    assert_eq!(asked.len(), 2, "{:?}", said(c).await);
    assert!(
        recorder.terminated.lock().is_empty(),
        "not before the lost delay"
    );
    let b = boot(c, &asked[1], "b").await;
    c.reconcile_once().await.expect("pass");
    sync(c, &b).await;
    assert_eq!(tasks(c, "chat", &[TaskState::Running]).await.len(), 1);
    // Past the lost delay: the lost machine goes, and only it.
    e.clock.advance(Duration::from_secs(901));
    sync(c, &b).await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(recorder.terminated.lock().clone(), vec![first[0].clone()]);
    let hosts = c.store().list_hosts().await.expect("hosts");
    assert!(!hosts.iter().any(|h| h.id == a.id), "deregistered");
    assert!(hosts.iter().any(|h| h.id == b.id));
    let events = said(c).await;
    assert!(
        events
            .iter()
            .any(|m| m.contains("host a has been lost for") && m.contains("replaced")),
        "{events:?}"
    );
    assert_eq!(tasks(c, "chat", &[TaskState::Running]).await.len(), 1);
}

/// A provider whose launches hang until released.
#[derive(Default)]
struct Hanging {
    calls: Mutex<u32>,
    release: tokio::sync::Notify,
}

#[async_trait]
impl Machines for Hanging {
    async fn launch(
        &self,
        _pool: &PoolName,
        _provider: &Provider,
        names: &[String],
    ) -> Result<BTreeMap<String, String>, String> {
        *self.calls.lock() += 1;
        self.release.notified().await;
        Ok(names
            .iter()
            .map(|n| (n.clone(), format!("i-{n}")))
            .collect())
    }

    async fn terminate(
        &self,
        _pool: &PoolName,
        _provider: &Provider,
        _name: &str,
        _provider_id: Option<&str>,
    ) -> Result<(), String> {
        Ok(())
    }
}

#[tokio::test]
async fn a_hung_provider_holds_up_its_own_pool_only_and_is_not_asked_twice() {
    let e = env(fast()).await;
    let c = &e.control;
    with_provider(c, 4).await;
    let hanging = Arc::new(Hanging::default());
    c.providers().register(ProviderKind::Demo, hanging.clone());
    let def = register_def(c, "chat", 20, 25).await;
    service(c, "chat", &def, 3, DeploymentConfig::default()).await;
    // The pass ends while the launch still hangs (a pass that waited for it would not).
    c.reconcile_once().await.expect("pass");
    assert_eq!(*hanging.calls.lock(), 1);
    let machines = c
        .providers()
        .machines(Some(&gpu()), false)
        .await
        .expect("machines");
    assert_eq!(machines.len(), 2, "asked for and recorded before the call");
    assert!(machines.iter().all(|m| m.provider_id.is_none()));
    // The next passes neither wait for it nor ask again.
    c.reconcile_once().await.expect("pass");
    assert_eq!(*hanging.calls.lock(), 1);
    // Released: what it answers is written.
    hanging.release.notify_one();
    for _ in 0..100 {
        let machines = c
            .providers()
            .machines(Some(&gpu()), false)
            .await
            .expect("machines");
        if machines.iter().all(|m| m.provider_id.is_some()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the answer of the released call was not written");
}

/// Syncs the hosts still registered (a deregistered host's agent is gone).
async fn sync_live(c: &Control, hosts: &[&Host]) {
    let live = c.store().list_hosts().await.expect("hosts");
    for h in hosts {
        if live.iter().any(|l| l.id == h.id) {
            sync(c, h).await;
        }
    }
}

#[tokio::test]
async fn a_host_not_needed_for_the_cooldown_is_emptied_by_consolidation_and_scaled_in() {
    let e = env(fast()).await;
    let c = &e.control;
    let recorder = with_provider(c, 4).await;
    // chat's two tasks fill host a; embed's one task, arriving after, gets host b.
    let chat = register_def(c, "chat", 20, 25).await;
    service(c, "chat", &chat, 2, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    let first = recorder.launched.lock().clone();
    assert_eq!(first.len(), 1);
    let a = boot(c, &first[0], "a").await;
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    let embed = register_def(c, "embed", 20, 25).await;
    service(c, "embed", &embed, 1, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    let asked = recorder.launched.lock().clone();
    assert_eq!(asked.len(), 2, "{:?}", said(c).await);
    let b = boot(c, &asked[1], "b").await;
    c.reconcile_once().await.expect("pass");
    sync_live(c, &[&a, &b]).await;
    // chat scaled to one: a and b run one task each, and one host would hold both.
    c.deployments()
        .update_service(
            "chat",
            &ServicePatch {
                desired_count: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("scale in");
    for _ in 0..3 {
        c.reconcile_once().await.expect("pass");
        sync_live(c, &[&a, &b]).await;
    }
    let running = |c: &Control| {
        let c = c.clone();
        async move {
            let mut all = tasks(&c, "chat", &[TaskState::Running]).await;
            all.extend(tasks(&c, "embed", &[TaskState::Running]).await);
            all
        }
    };
    let now = running(c).await;
    assert_eq!(now.len(), 2);
    let on: std::collections::BTreeSet<_> = now.iter().filter_map(|t| t.host.clone()).collect();
    assert_eq!(on.len(), 2, "one task on each host: {now:?}");
    // Not before the cooldown (freeable from the next look on): nothing moves, nothing
    // goes.
    for secs in [16, 100] {
        e.clock.advance(Duration::from_secs(secs));
        sync_live(c, &[&a, &b]).await;
        c.reconcile_once().await.expect("pass");
    }
    assert!(recorder.terminated.lock().is_empty());
    assert!(
        c.deployments()
            .consolidation_plans()
            .await
            .expect("plans")
            .is_empty()
    );
    // Freeable for the cooldown: a plan moves one host's task (start before stop), and
    // the emptied host is scaled in at once (its cooldown was spent while freeable).
    e.clock.advance(Duration::from_secs(21));
    for _ in 0..8 {
        sync_live(c, &[&a, &b]).await;
        c.reconcile_once().await.expect("pass");
        // Every task running throughout: the service never below its count.
        assert!(running(c).await.len() >= 2);
        if !recorder.terminated.lock().is_empty() {
            break;
        }
    }
    let gone = recorder.terminated.lock().clone();
    assert_eq!(gone.len(), 1, "{:?}", said(c).await);
    let plans = c.deployments().consolidation_plans().await.expect("plans");
    assert_eq!(plans.len(), 1, "{plans:?}");
    assert_eq!(plans[0].moves.len(), 1);
    let events = said(c).await;
    assert!(
        events.iter().any(|m| m.contains("consolidation plan")
            && m.contains("moves 1 task(s), start before stop")
            && m.contains("for the demo provider to scale in")),
        "{events:?}"
    );
    let now = running(c).await;
    assert_eq!(now.len(), 2);
    let on: std::collections::BTreeSet<_> = now.iter().filter_map(|t| t.host.clone()).collect();
    assert_eq!(on.len(), 1, "both on the host that stays: {now:?}");
    let hosts = c.store().list_hosts().await.expect("hosts");
    assert_eq!(hosts.iter().filter(|h| h.pool == gpu()).count(), 1);
}
