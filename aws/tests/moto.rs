//! The `aws-asg` provider against a local AWS-compatible endpoint (`moto_server`, from
//! PyPI's `moto[server]`; `scripts/setup.sh --test` installs it): the control plane grows
//! an Auto Scaling group when tasks wait for room, matches the instances that boot to the
//! hosts that join as them, protects instances running tasks from the group's own
//! scale-in, gives up on an instance that never joins, and shrinks the group when hosts
//! stay empty. The test plays the machines booting: for each instance the group launches,
//! a simulated agent joins with the join token and the instance's id.

use aws_sdk_autoscaling::Client;
use aws_sdk_autoscaling::config::{BehaviorVersion, Credentials, Region};
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tessera_aws::AsgMachines;
use tessera_control::Control;
use tessera_control::testkit::*;
use tessera_model::PoolName;
use tessera_model::api::{PoolPatch, ServicePatch};
use tessera_model::provider::{HostShape, MachineState, ProviderInput, ProviderKind};
use tessera_model::service::{DeploymentConfig, TaskState};

/// `moto_server` on a free port, stopped when dropped.
struct Moto {
    child: Child,
    url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn moto() -> Moto {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server (pip install 'moto[server]'; scripts/setup.sh --test installs it)");
    let url = format!("http://127.0.0.1:{port}");
    let moto = Moto { child, url };
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return moto;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("moto_server did not listen on {}", moto.url);
}

/// The test's own client of the endpoint (what an operator sees in the AWS console).
fn client(url: &str) -> Client {
    let config = aws_sdk_autoscaling::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(url)
        .http_client(tessera_aws::http_client())
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .build();
    Client::from_conf(config)
}

/// Group `name` of `desired` instances, at most `max`.
async fn create_group(aws: &Client, name: &str, desired: i32, max: i32) {
    aws.create_launch_configuration()
        .launch_configuration_name(format!("{name}-lc"))
        .image_id("ami-12c6146b")
        .instance_type("g6.12xlarge")
        .send()
        .await
        .expect("launch configuration");
    aws.create_auto_scaling_group()
        .auto_scaling_group_name(name)
        .launch_configuration_name(format!("{name}-lc"))
        .min_size(0)
        .max_size(max)
        .desired_capacity(desired)
        .availability_zones("us-east-1a")
        .send()
        .await
        .expect("group");
}

/// The group's desired capacity, and its instances with whether each is protected.
async fn group(aws: &Client, name: &str) -> (i32, BTreeMap<String, bool>) {
    let out = aws
        .describe_auto_scaling_groups()
        .auto_scaling_group_names(name)
        .send()
        .await
        .expect("describe");
    let g = &out.auto_scaling_groups()[0];
    (
        g.desired_capacity().unwrap_or(-1),
        g.instances()
            .iter()
            .map(|i| {
                (
                    i.instance_id().unwrap_or_default().to_owned(),
                    i.protected_from_scale_in().unwrap_or(false),
                )
            })
            .collect(),
    )
}

fn gpu() -> PoolName {
    PoolName::new("gpu").expect("valid")
}

/// Pool `gpu` made by group `g`: 1 to 4 hosts of 2 × 24 GiB L4s.
async fn with_group(c: &Control, url: &str, group: &str) {
    c.deployments()
        .update_pool(
            &gpu(),
            &PoolPatch {
                provider: Some(Some(ProviderInput {
                    kind: "aws-asg".into(),
                    group: Some(group.into()),
                    region: Some("us-east-1".into()),
                    min_hosts: Some(1),
                    max_hosts: 4,
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
    c.providers().register(
        ProviderKind::AwsAsg,
        Arc::new(AsgMachines::for_local_endpoint(url)),
    );
}

/// Instance `instance` boots: its agent joins as host `host` with the instance's id.
async fn boot(c: &Control, instance: &str, host: &str) -> Host {
    let gpus = gpus(host, 2, 24);
    let mut reg = registration(JOIN, "gpu", host, gpus.clone());
    reg.provider_id = Some(instance.to_owned());
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

async fn scale(c: &Control, count: u32) {
    c.deployments()
        .update_service(
            "chat",
            &ServicePatch {
                desired_count: Some(count),
                ..Default::default()
            },
        )
        .await
        .expect("scale");
}

async fn sync_all(c: &Control, hosts: &BTreeMap<String, Host>) {
    for h in hosts.values() {
        sync(c, h).await;
    }
}

#[tokio::test]
async fn an_auto_scaling_group_grows_protects_and_shrinks_with_the_pool() {
    let m = moto().await;
    let aws = client(&m.url);
    create_group(&aws, "g", 1, 4).await;
    let e = env(fast()).await;
    let c = &e.control;
    with_group(c, &m.url, "g").await;

    // The group's first instance joins without being asked for: one of the pool's
    // machines from then on.
    let (_, first) = group(&aws, "g").await;
    let i0 = first.keys().next().expect("an instance").clone();
    let mut hosts = BTreeMap::new();
    hosts.insert(i0.clone(), boot(c, &i0, "h0").await);
    let machines = c
        .providers()
        .machines(Some(&gpu()), false)
        .await
        .expect("machines");
    assert_eq!(machines.len(), 1);
    assert_eq!(machines[0].provider_id.as_deref(), Some(i0.as_str()));
    assert_eq!(machines[0].state, MachineState::Active);

    // Five tasks of 20 GiB: h0 holds two, three wait: two more hosts.
    let def = register_def(c, "chat", 20, 25).await;
    service(c, "chat", &def, 5, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    sync_all(c, &hosts).await;
    c.reconcile_once().await.expect("pass");
    let (desired, instances) = group(&aws, "g").await;
    assert_eq!(desired, 3, "{:?}", said(c).await);
    assert_eq!(instances.len(), 3);
    // Asked for and not joined: coming capacity, not asked for twice.
    c.reconcile_once().await.expect("pass");
    assert_eq!(group(&aws, "g").await.0, 3);

    // The instances boot; the hosts that join as them are the machines asked for.
    for (n, id) in instances.keys().filter(|id| **id != i0).enumerate() {
        let h = boot(c, id, &format!("h{}", n + 1)).await;
        hosts.insert(id.clone(), h);
    }
    let machines = c
        .providers()
        .machines(Some(&gpu()), false)
        .await
        .expect("machines");
    assert_eq!(machines.len(), 3);
    assert!(
        machines.iter().all(|m| m.state == MachineState::Active
            && m.provider_id
                .as_ref()
                .is_some_and(|id| instances.contains_key(id))),
        "{machines:?}"
    );
    for _ in 0..2 {
        c.reconcile_once().await.expect("pass");
        sync_all(c, &hosts).await;
    }
    assert_eq!(tasks(c, "chat", &[TaskState::Running]).await.len(), 5);
    c.reconcile_once().await.expect("pass");
    let (_, instances) = group(&aws, "g").await;
    assert!(
        instances.values().all(|p| *p),
        "every instance runs tasks: protected from the group's scale-in: {instances:?}"
    );

    // Down to one task: the empty hosts lose their protection, and go after the
    // scale-in cooldown; the one running the task stays.
    scale(c, 1).await;
    for _ in 0..3 {
        c.reconcile_once().await.expect("pass");
        sync_all(c, &hosts).await;
    }
    let running = tasks(c, "chat", &[TaskState::Running]).await;
    assert_eq!(running.len(), 1);
    let busy = running[0].host.clone().expect("placed");
    let (_, instances) = group(&aws, "g").await;
    for (id, protected) in &instances {
        assert_eq!(
            *protected,
            hosts[id].id == busy,
            "only the host running a task is protected: {instances:?}"
        );
    }
    e.clock.advance(Duration::from_secs(121));
    sync_all(c, &hosts).await;
    c.reconcile_once().await.expect("pass");
    let (desired, instances) = group(&aws, "g").await;
    assert_eq!(desired, 1, "{:?}", said(c).await);
    assert_eq!(instances.len(), 1);
    let kept = instances.keys().next().expect("one");
    assert_eq!(hosts[kept].id, busy, "the host running the task is kept");
    assert_eq!(tasks(c, "chat", &[TaskState::Running]).await.len(), 1);
    hosts.retain(|id, _| id == kept);

    // Two more tasks: one host more; its instance never joins and is given up on.
    scale(c, 3).await;
    c.reconcile_once().await.expect("pass");
    sync_all(c, &hosts).await;
    c.reconcile_once().await.expect("pass");
    let (desired, instances) = group(&aws, "g").await;
    assert_eq!((desired, instances.len()), (2, 2), "{:?}", said(c).await);
    e.clock.advance(Duration::from_secs(61));
    sync_all(c, &hosts).await;
    c.reconcile_once().await.expect("pass");
    let (desired, instances) = group(&aws, "g").await;
    assert!(
        instances.contains_key(kept),
        "the running host's instance stays: {instances:?}"
    );
    let events = said(c).await;
    assert!(
        events
            .iter()
            .any(|m| m.contains("did not join within its boot timeout of 60 s")),
        "{events:?}"
    );
    // Given up on, then asked for again after the launch back-off (the tasks still wait).
    assert!(desired <= 2, "{desired} {instances:?}");
    assert_eq!(tasks(c, "chat", &[TaskState::Running]).await.len(), 2);
}

#[tokio::test]
async fn a_group_that_does_not_exist_or_is_full_is_said_in_words() {
    let m = moto().await;
    let aws = client(&m.url);
    create_group(&aws, "small", 0, 2).await;
    let e = env(fast()).await;
    let c = &e.control;
    with_group(c, &m.url, "nosuch").await;
    c.reconcile_once().await.expect("a pass goes on");
    let events = said(c).await;
    assert!(
        events
            .iter()
            .any(|m| m.contains("no Auto Scaling group named nosuch")),
        "{events:?}"
    );
    // A group whose own maximum (2) is below what the pool asks for: refused whole.
    with_group(c, &m.url, "small").await;
    let def = register_def(c, "chat", 20, 25).await;
    service(c, "chat", &def, 10, DeploymentConfig::default()).await;
    e.clock.advance(Duration::from_secs(3600));
    c.reconcile_once().await.expect("pass");
    let events = said(c).await;
    assert!(
        events
            .iter()
            .any(|m| m.contains("group small allows at most 2 instances")),
        "{events:?}"
    );
    assert_eq!(
        group(&aws, "small").await.0,
        0,
        "nothing asked of a full group"
    );
}
