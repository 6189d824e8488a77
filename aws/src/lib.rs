//! The `aws-asg` capacity provider: a pool's machines are the instances of an AWS Auto
//! Scaling group, made and removed through the group's own API (the AWS SDK for Rust),
//! with credentials and region found the usual AWS way (environment, profile, instance
//! role; the provider's `region` first). The scheduler decides how many hosts the pool
//! needs; this only moves the group's desired capacity, terminates the instance of a host
//! that goes, keeps instances running tasks protected from the group's own scale-in (as
//! ECS's managed termination protection) and reads the group's instances back.
//!
//! A host is matched to its instance by the id its agent says (`tessera-agent
//! --provider-id`, on EC2 the instance id of its identity document). The group names its
//! instances only once they run, so a machine asked for has no id until a host joins as
//! one of the group's instances.

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_autoscaling::Client;
use aws_sdk_autoscaling::error::DisplayErrorContext;
use aws_sdk_autoscaling::types::AutoScalingGroup;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tessera_control::providers::{Fleet, Instance, Machines};
use tessera_model::PoolName;
use tessera_model::provider::Provider;
use tokio::sync::Mutex;

/// The longest one call to the Auto Scaling API may take, retries included.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Auto Scaling groups as a pool's machines (see the crate's documentation).
#[derive(Default)]
pub struct AsgMachines {
    /// Where the Auto Scaling API is (`None`: AWS's own, or `AWS_ENDPOINT_URL`).
    endpoint: Option<String>,
    /// The fixed credentials of a local AWS-compatible endpoint (`testing`), not the usual
    /// AWS way's.
    local: bool,
    /// One client per region asked for (`None`: the usual AWS way's region).
    clients: Mutex<HashMap<Option<String>, Client>>,
    /// Changes to a group's desired capacity read it first: one at a time.
    changing: Mutex<()>,
}

impl AsgMachines {
    /// Talks to AWS itself (or to `AWS_ENDPOINT_URL` when set).
    pub fn new() -> Self {
        Self::default()
    }

    /// Talks to the Auto Scaling API at `endpoint` (a VPC endpoint, say), with the usual
    /// AWS credentials.
    pub fn with_endpoint(endpoint: impl Into<String>) -> Self {
        AsgMachines {
            endpoint: Some(endpoint.into()),
            ..Self::default()
        }
    }

    /// Talks to a local AWS-compatible endpoint (`moto_server`, LocalStack) with the fixed
    /// credentials such endpoints accept (`testing`): tests and drills, never an account.
    pub fn for_local_endpoint(endpoint: impl Into<String>) -> Self {
        AsgMachines {
            local: true,
            ..Self::with_endpoint(endpoint)
        }
    }

    async fn client(&self, provider: &Provider) -> Result<Client, String> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(&provider.region) {
            return Ok(c.clone());
        }
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http_client())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_timeout(CALL_TIMEOUT)
                    .build(),
            );
        if let Some(region) = &provider.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some(endpoint) = &self.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if self.local {
            loader = loader.credentials_provider(aws_sdk_autoscaling::config::Credentials::new(
                "testing", "testing", None, None, "local",
            ));
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(
                "no AWS region: give the provider's region, or set AWS_REGION or a profile's region"
                    .into(),
            );
        }
        let client = Client::new(&config);
        clients.insert(provider.region.clone(), client.clone());
        Ok(client)
    }

    /// The provider's group, as the API describes it now.
    async fn group(
        &self,
        client: &Client,
        provider: &Provider,
    ) -> Result<AutoScalingGroup, String> {
        let name = group_name(provider)?;
        let out = client
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(name)
            .send()
            .await
            .map_err(|e| format!("describing group {name}: {}", DisplayErrorContext(&e)))?;
        out.auto_scaling_groups()
            .iter()
            .find(|g| g.auto_scaling_group_name() == Some(name))
            .cloned()
            .ok_or_else(|| format!("no Auto Scaling group named {name} in this account and region"))
    }

    async fn set_desired(
        &self,
        client: &Client,
        provider: &Provider,
        desired: i32,
    ) -> Result<(), String> {
        let name = group_name(provider)?;
        client
            .set_desired_capacity()
            .auto_scaling_group_name(name)
            .desired_capacity(desired)
            .honor_cooldown(false)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "setting group {name}'s desired capacity to {desired}: {}",
                    DisplayErrorContext(&e)
                )
            })?;
        Ok(())
    }
}

/// The HTTP client of every call: HTTPS through rustls with ring (plain HTTP to a local
/// endpoint).
pub fn http_client() -> aws_sdk_autoscaling::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

fn group_name(provider: &Provider) -> Result<&str, String> {
    provider
        .group
        .as_deref()
        .ok_or_else(|| "the provider names no Auto Scaling group (provider.group)".to_owned())
}

/// The group's instances that count (not on their way out).
fn live_instances(group: &AutoScalingGroup) -> usize {
    group
        .instances()
        .iter()
        .filter(|i| {
            !i.lifecycle_state()
                .is_some_and(|s| s.as_str().starts_with("Terminat"))
        })
        .count()
}

#[async_trait]
impl Machines for AsgMachines {
    /// Raises the group's desired capacity by one per machine asked for, within the
    /// group's own maximum (refused whole beyond it). Instances are named later, by the
    /// hosts that join as them.
    async fn launch(
        &self,
        _pool: &PoolName,
        provider: &Provider,
        names: &[String],
    ) -> Result<BTreeMap<String, String>, String> {
        let client = self.client(provider).await?;
        let _one = self.changing.lock().await;
        let group = self.group(&client, provider).await?;
        let desired = group.desired_capacity().unwrap_or(0);
        let max = group.max_size().unwrap_or(i32::MAX);
        let more = i32::try_from(names.len()).map_err(|_| "too many machines asked for")?;
        let want = desired.saturating_add(more);
        if want > max {
            return Err(format!(
                "group {} allows at most {max} instances; {want} would be needed (raise its maximum size, or lower the provider's max_hosts)",
                group_name(provider)?
            ));
        }
        self.set_desired(&client, provider, want).await?;
        Ok(BTreeMap::new())
    }

    /// Terminates instance `provider_id` and lowers the desired capacity with it. An
    /// instance the group no longer has is already gone. A machine whose instance was
    /// never named (it never joined) lowers the desired capacity only while the group
    /// still has instances to launch for it, so no running instance goes in its place.
    async fn terminate(
        &self,
        _pool: &PoolName,
        provider: &Provider,
        name: &str,
        provider_id: Option<&str>,
    ) -> Result<(), String> {
        let client = self.client(provider).await?;
        let _one = self.changing.lock().await;
        let group = self.group(&client, provider).await?;
        let Some(id) = provider_id else {
            let desired = group.desired_capacity().unwrap_or(0);
            if usize::try_from(desired).unwrap_or(0) > live_instances(&group) {
                tracing::info!(
                    machine = name,
                    "lowering the desired capacity for a machine never launched"
                );
                return self.set_desired(&client, provider, desired - 1).await;
            }
            return Ok(());
        };
        if !group
            .instances()
            .iter()
            .any(|i| i.instance_id() == Some(id))
        {
            tracing::info!(
                machine = name,
                instance = id,
                "the group no longer has the instance"
            );
            return Ok(());
        }
        client
            .terminate_instance_in_auto_scaling_group()
            .instance_id(id)
            .should_decrement_desired_capacity(true)
            .send()
            .await
            .map_err(|e| format!("terminating instance {id}: {}", DisplayErrorContext(&e)))?;
        Ok(())
    }

    async fn fleet(&self, _pool: &PoolName, provider: &Provider) -> Result<Option<Fleet>, String> {
        let client = self.client(provider).await?;
        let group = self.group(&client, provider).await?;
        let instances = group
            .instances()
            .iter()
            .filter_map(|i| {
                Some(Instance {
                    id: i.instance_id()?.to_owned(),
                    state: i
                        .lifecycle_state()
                        .map_or_else(String::new, |s| s.as_str().to_owned()),
                    protected: i.protected_from_scale_in().unwrap_or(false),
                })
            })
            .collect();
        Ok(Some(Fleet {
            desired: u32::try_from(group.desired_capacity().unwrap_or(0)).unwrap_or(0),
            instances,
        }))
    }

    async fn protect(
        &self,
        _pool: &PoolName,
        provider: &Provider,
        ids: &[String],
        protected: bool,
    ) -> Result<(), String> {
        let client = self.client(provider).await?;
        let name = group_name(provider)?;
        // The API takes at most 50 instances a call.
        for chunk in ids.chunks(50) {
            client
                .set_instance_protection()
                .auto_scaling_group_name(name)
                .set_instance_ids(Some(chunk.to_vec()))
                .protected_from_scale_in(protected)
                .send()
                .await
                .map_err(|e| {
                    format!(
                        "setting scale-in protection of {}: {}",
                        chunk.join(", "),
                        DisplayErrorContext(&e)
                    )
                })?;
        }
        Ok(())
    }
}
