//! Capacity providers: what makes and removes a pool's machines (a cloud's scaling group,
//! an operator's command, the demo's simulated hosts), and how many the pool may have. The
//! scheduler decides how many hosts are needed; a provider only makes and removes them.

use crate::taskdef::{FieldError, ValidationErrors};
use crate::units::{MiB, MilliCpu};
use serde::{Deserialize, Serialize};

/// Who makes a pool's machines.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProviderKind {
    /// An AWS Auto Scaling group, through its own API.
    #[serde(rename = "aws-asg")]
    AwsAsg,
    /// An operator's executable: one JSON request on stdin, one JSON answer on stdout.
    #[serde(rename = "command")]
    Command,
    /// Simulated hosts started and stopped by the server (the demo).
    #[serde(rename = "demo")]
    Demo,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 3] = [
        ProviderKind::AwsAsg,
        ProviderKind::Command,
        ProviderKind::Demo,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::AwsAsg => "aws-asg",
            ProviderKind::Command => "command",
            ProviderKind::Demo => "demo",
        }
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The hosts a provider makes: what the scheduler sizes with.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostShape {
    /// The GPU model as NVML names it (`NVIDIA L4`).
    #[cfg_attr(
        feature = "openapi",
        schema(min_length = 1, max_length = 256, pattern = "^\\S")
    )]
    pub gpu_model: String,
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 64))]
    pub gpus: u32,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 16_777_216))]
    pub gpu_memory_mib: u64,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100_000_000))]
    pub cpu_milli: u64,
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 1_099_511_627_776_u64)
    )]
    pub memory_mib: u64,
}

impl HostShape {
    pub fn cpu(&self) -> MilliCpu {
        MilliCpu(self.cpu_milli)
    }

    pub fn memory(&self) -> MiB {
        MiB(self.memory_mib)
    }

    pub fn gpu_memory(&self) -> MiB {
        MiB(self.gpu_memory_mib)
    }

    /// "4 × NVIDIA L4 (24 GiB)".
    pub fn describe(&self) -> String {
        format!(
            "{} × {} ({} GiB)",
            self.gpus,
            self.gpu_model,
            self.gpu_memory_mib / 1024
        )
    }
}

/// A pool's capacity provider, as stored and shown.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provider {
    pub kind: ProviderKind,
    /// `aws-asg`: the Auto Scaling group's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `aws-asg`: its region (absent: the usual AWS way, `AWS_REGION` or the profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// `command`: the executable's absolute path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub min_hosts: u32,
    pub max_hosts: u32,
    /// How full the pool may run before it grows (ECS's target capacity): 100 keeps no
    /// spare room; 80 keeps a fifth of the hosts it needs spare.
    pub target_capacity_percent: u32,
    /// The least time between two scale-outs.
    pub scale_out_cooldown_secs: u32,
    /// How long a host stays empty before it is terminated.
    pub scale_in_cooldown_secs: u32,
    /// How long a machine asked for may take to join before it counts as a failed launch.
    pub boot_timeout_secs: u32,
    /// How long a host it made may stay impaired (its MPS daemon failed for good, a GPU
    /// fault), its tasks moved off, before it is replaced.
    #[serde(default = "default_repair_delay")]
    pub repair_delay_secs: u32,
    /// How long a host it made may stay lost before its machine is terminated and the
    /// host deregistered (its tasks were replaced when it was declared lost).
    #[serde(default = "default_lost_delay")]
    pub lost_delay_secs: u32,
    /// The hosts it makes (absent: learnt from the pool's hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<HostShape>,
}

/// `provider` of `POST /api/v1/pools` and `PATCH /api/v1/pools/{name}`: what is not given
/// takes its default.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderInput {
    /// `aws-asg`, `command` or `demo`.
    #[cfg_attr(feature = "openapi", schema(schema_with = kind_schema))]
    pub kind: String,
    /// `aws-asg` (required there): the Auto Scaling group's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._-]{1,255}$"))]
    pub group: Option<String>,
    /// `aws-asg`: its region (absent: the usual AWS way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9-]{1,32}$"))]
    pub region: Option<String>,
    /// `command` (required there): the executable's absolute path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^/[^\\u0000]{0,4095}$"))]
    pub path: Option<String>,
    /// Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 10_000))]
    pub min_hosts: Option<u32>,
    /// The most hosts the provider may keep.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10_000))]
    pub max_hosts: u32,
    /// Default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    pub target_capacity_percent: Option<u32>,
    /// Default 0: machines booting already count as coming capacity, so the same tasks
    /// never ask twice; a cooldown only slows a pool that keeps needing more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 86_400))]
    pub scale_out_cooldown_secs: Option<u32>,
    /// Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 86_400))]
    pub scale_in_cooldown_secs: Option<u32>,
    /// Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 10, maximum = 86_400))]
    pub boot_timeout_secs: Option<u32>,
    /// Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 86_400))]
    pub repair_delay_secs: Option<u32>,
    /// Default 900.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 86_400))]
    pub lost_delay_secs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<HostShape>,
}

/// `kind`'s schema: one of the kinds' names.
#[cfg(feature = "openapi")]
fn kind_schema() -> utoipa::openapi::schema::Schema {
    let names: Vec<serde_json::Value> = ProviderKind::ALL
        .iter()
        .map(|k| serde_json::json!(k.as_str()))
        .collect();
    serde_json::from_value(serde_json::json!({ "type": "string", "enum": names }))
        .expect("a schema utoipa can read")
}

impl From<&Provider> for ProviderInput {
    fn from(p: &Provider) -> ProviderInput {
        ProviderInput {
            kind: p.kind.as_str().to_owned(),
            group: p.group.clone(),
            region: p.region.clone(),
            path: p.path.clone(),
            min_hosts: Some(p.min_hosts),
            max_hosts: p.max_hosts,
            target_capacity_percent: Some(p.target_capacity_percent),
            scale_out_cooldown_secs: Some(p.scale_out_cooldown_secs),
            scale_in_cooldown_secs: Some(p.scale_in_cooldown_secs),
            boot_timeout_secs: Some(p.boot_timeout_secs),
            repair_delay_secs: Some(p.repair_delay_secs),
            lost_delay_secs: Some(p.lost_delay_secs),
            shape: p.shape.clone(),
        }
    }
}

/// The least time between two scale-outs, unless the provider says: none, since the
/// machines asked for count as coming capacity until they join or time out (the
/// autoscaling benchmark's waiting p99 is the boot delay with 0, a minute more with 60).
pub const SCALE_OUT_COOLDOWN_SECS: u32 = 0;
/// How long a host a provider made may stay impaired, unless the provider says.
pub const REPAIR_DELAY_SECS: u32 = 300;
/// How long a host a provider made may stay lost, unless the provider says.
pub const LOST_DELAY_SECS: u32 = 900;

fn default_repair_delay() -> u32 {
    REPAIR_DELAY_SECS
}

fn default_lost_delay() -> u32 {
    LOST_DELAY_SECS
}

/// The most hosts a provider may keep in one pool.
pub const MAX_HOSTS: u32 = 10_000;
/// The longest cooldown or boot timeout: a day.
pub const MAX_SECS: u32 = 86_400;

/// Checks `input`, naming each field that is wrong (`provider.max_hosts`); the provider to
/// store, defaults filled in.
pub fn validate(input: &ProviderInput) -> Result<Provider, ValidationErrors> {
    let mut errors = Vec::new();
    let mut add = |field: &str, message: String| {
        errors.push(FieldError {
            field: format!("provider.{field}"),
            message,
        })
    };
    let kind = ProviderKind::ALL
        .into_iter()
        .find(|k| k.as_str() == input.kind);
    if kind.is_none() {
        add(
            "kind",
            format!("must be aws-asg, command or demo, got {:?}", input.kind),
        );
    }
    // Each kind's own fields, and no other kind's.
    let wants: &[&str] = match kind {
        Some(ProviderKind::AwsAsg) => &["group", "region"],
        Some(ProviderKind::Command) => &["path"],
        _ => &[],
    };
    for (name, value) in [
        ("group", &input.group),
        ("region", &input.region),
        ("path", &input.path),
    ] {
        if value.is_some() && kind.is_some() && !wants.contains(&name) {
            add(
                name,
                format!("is not a setting of a {} provider", input.kind),
            );
        }
    }
    if kind == Some(ProviderKind::AwsAsg) {
        match &input.group {
            None => add(
                "group",
                "an aws-asg provider needs its Auto Scaling group's name".into(),
            ),
            Some(g)
                if !(1..=255).contains(&g.len())
                    || !g
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) =>
            {
                add(
                    "group",
                    "must be an Auto Scaling group name: 1 to 255 letters, digits, '.', '_' and '-'"
                        .into(),
                )
            }
            Some(_) => {}
        }
        if let Some(r) = &input.region
            && !(r.len() <= 32
                && !r.is_empty()
                && r.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        {
            add(
                "region",
                format!("must be an AWS region such as us-east-1, got {r:?}"),
            );
        }
    }
    if kind == Some(ProviderKind::Command) {
        match &input.path {
            None => add(
                "path",
                "a command provider needs its executable's path".into(),
            ),
            Some(p) if !p.starts_with('/') || p.chars().count() > 4096 || p.contains('\0') => {
                add("path", "must be an absolute path".into())
            }
            Some(_) => {}
        }
    }
    let min_hosts = input.min_hosts.unwrap_or(0);
    let max_hosts = input.max_hosts;
    if max_hosts == 0 || max_hosts > MAX_HOSTS {
        add(
            "max_hosts",
            format!("must be between 1 and {MAX_HOSTS}, got {max_hosts}"),
        );
    }
    if min_hosts > MAX_HOSTS {
        add(
            "min_hosts",
            format!("must be between 0 and {MAX_HOSTS}, got {min_hosts}"),
        );
    } else if min_hosts > max_hosts {
        add(
            "min_hosts",
            format!("must be at most max_hosts ({max_hosts}), got {min_hosts}"),
        );
    }
    let target = input.target_capacity_percent.unwrap_or(100);
    if !(1..=100).contains(&target) {
        add(
            "target_capacity_percent",
            format!("must be between 1 and 100, got {target}"),
        );
    }
    let mut secs = |field: &str, value: Option<u32>, default: u32, least: u32| {
        let v = value.unwrap_or(default);
        if !(least..=MAX_SECS).contains(&v) {
            add(
                field,
                format!("must be between {least} and {MAX_SECS} seconds, got {v}"),
            );
        }
        v
    };
    let scale_out_cooldown_secs = secs(
        "scale_out_cooldown_secs",
        input.scale_out_cooldown_secs,
        SCALE_OUT_COOLDOWN_SECS,
        0,
    );
    let scale_in_cooldown_secs = secs(
        "scale_in_cooldown_secs",
        input.scale_in_cooldown_secs,
        600,
        0,
    );
    let boot_timeout_secs = secs("boot_timeout_secs", input.boot_timeout_secs, 600, 10);
    let repair_delay_secs = secs(
        "repair_delay_secs",
        input.repair_delay_secs,
        REPAIR_DELAY_SECS,
        0,
    );
    let lost_delay_secs = secs("lost_delay_secs", input.lost_delay_secs, LOST_DELAY_SECS, 0);
    if let Some(s) = &input.shape {
        if s.gpu_model.trim().is_empty()
            || s.gpu_model.starts_with(char::is_whitespace)
            || s.gpu_model.chars().count() > 256
        {
            add(
                "shape.gpu_model",
                "must be 1 to 256 characters, the first not a space".into(),
            );
        }
        if s.gpus > 64 {
            add("shape.gpus", format!("must be at most 64, got {}", s.gpus));
        }
        if s.gpu_memory_mib == 0 || s.gpu_memory_mib > 16 * 1024 * 1024 {
            add(
                "shape.gpu_memory_mib",
                "must be between 1 and 16777216".into(),
            );
        }
        if s.cpu_milli == 0 || s.cpu_milli > 100_000_000 {
            add("shape.cpu_milli", "must be between 1 and 100000000".into());
        }
        if s.memory_mib == 0 || s.memory_mib > 1 << 40 {
            add(
                "shape.memory_mib",
                "must be between 1 and 1099511627776".into(),
            );
        }
    }
    if !errors.is_empty() {
        return Err(ValidationErrors { errors });
    }
    Ok(Provider {
        kind: kind.expect("checked above"),
        group: input.group.clone(),
        region: input.region.clone(),
        path: input.path.clone(),
        min_hosts,
        max_hosts,
        target_capacity_percent: target,
        scale_out_cooldown_secs,
        scale_in_cooldown_secs,
        boot_timeout_secs,
        repair_delay_secs,
        lost_delay_secs,
        shape: input.shape.clone(),
    })
}

/// What became of a machine a provider was asked for.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MachineState {
    /// Asked for; its host has not joined yet (coming capacity).
    Booting,
    /// Its host joined.
    Active,
    /// Asked to go (empty, replaced, or it never joined).
    Terminating,
    /// Gone.
    Terminated,
    /// Never joined within the boot timeout, or the provider refused it.
    Failed,
}

impl MachineState {
    pub const ALL: [MachineState; 5] = [
        MachineState::Booting,
        MachineState::Active,
        MachineState::Terminating,
        MachineState::Terminated,
        MachineState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MachineState::Booting => "booting",
            MachineState::Active => "active",
            MachineState::Terminating => "terminating",
            MachineState::Terminated => "terminated",
            MachineState::Failed => "failed",
        }
    }

    /// Booting, active or terminating: it may still cost money.
    pub fn live(self) -> bool {
        matches!(
            self,
            MachineState::Booting | MachineState::Active | MachineState::Terminating
        )
    }
}

impl std::str::FromStr for MachineState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        MachineState::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| format!("not a machine state: {s:?}"))
    }
}

/// A machine a pool's provider was asked for.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// Tessera's name for it, given to the provider.
    pub id: String,
    pub pool: crate::ids::PoolName,
    /// The provider's id for it (an EC2 instance id), once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The host it joined as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<crate::ids::HostId>,
    pub state: MachineState,
    /// Why it was asked for; then why it ended.
    pub reason: String,
    pub asked_at: crate::time::Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_at: Option<crate::time::Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<crate::time::Timestamp>,
}

/// A pool's machines at one instant, as [`machine_history`] counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineCounts {
    /// Unix seconds.
    pub t: i64,
    /// Asked for, not joined (coming capacity).
    pub booting: u32,
    /// Joined and not ended (terminating ones among them until they end).
    pub active: u32,
}

impl MachineCounts {
    /// What the provider was asked to keep: booting and active.
    pub fn desired(&self) -> u32 {
        self.booting + self.active
    }
}

/// How many of `machines` were booting and active over `[from, to]` (unix seconds), from
/// their own times (asked, joined, ended): the counts at `from`, then after each change,
/// then at `to`. A machine's row is all it takes, so the history is as long as the rows
/// kept.
pub fn machine_history(machines: &[Machine], from: i64, to: i64) -> Vec<MachineCounts> {
    let secs = |t: crate::time::Timestamp| t.millis().div_euclid(1000);
    let at = |t: i64| {
        let mut c = MachineCounts {
            t,
            booting: 0,
            active: 0,
        };
        for m in machines {
            let ended = m.ended_at.map(secs).is_some_and(|e| e <= t);
            if secs(m.asked_at) > t || ended {
                continue;
            }
            match m.joined_at.map(secs) {
                Some(j) if j <= t => c.active += 1,
                Some(_) => c.booting += 1,
                // Ended without joining: booting until then; never ended: booting still,
                // unless its row says it went by another road (terminated, failed).
                None if m.ended_at.is_some() || m.state == MachineState::Booting => c.booting += 1,
                None => {}
            }
        }
        c
    };
    let mut times: Vec<i64> = machines
        .iter()
        .flat_map(|m| [Some(m.asked_at), m.joined_at, m.ended_at])
        .flatten()
        .map(secs)
        .filter(|t| *t > from && *t < to)
        .collect();
    times.push(from);
    times.push(to);
    times.sort_unstable();
    times.dedup();
    let mut out: Vec<MachineCounts> = Vec::with_capacity(times.len());
    for t in times {
        let c = at(t);
        if out
            .last()
            .is_none_or(|l| (l.booting, l.active) != (c.booting, c.active))
            || t == to
        {
            out.push(c);
        }
    }
    out
}

/// Hosts to have for `needed` hosts' worth of tasks at `target_percent` full: ECS's target
/// capacity (`ceil(needed × 100 / target)`).
pub fn with_headroom(needed: u32, target_percent: u32) -> u32 {
    let t = u64::from(target_percent.clamp(1, 100));
    u32::try_from((u64::from(needed) * 100).div_ceil(t)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_history_counts_booting_and_active_from_the_rows_times() {
        let t = |s: i64| crate::time::Timestamp::from_millis(s * 1000).expect("valid");
        let machine = |asked: i64, joined: Option<i64>, ended: Option<i64>, state| Machine {
            id: format!("m-{asked}"),
            pool: crate::ids::PoolName::new("p").expect("valid"),
            provider_id: None,
            host_id: None,
            state,
            reason: String::new(),
            asked_at: t(asked),
            joined_at: joined.map(t),
            ended_at: ended.map(t),
        };
        let rows = vec![
            machine(100, Some(130), None, MachineState::Active),
            machine(200, Some(240), Some(400), MachineState::Terminated),
            machine(300, None, Some(350), MachineState::Failed),
            machine(500, None, None, MachineState::Booting),
        ];
        let h = machine_history(&rows, 0, 600);
        let seen: Vec<(i64, u32, u32)> = h.iter().map(|c| (c.t, c.booting, c.active)).collect();
        assert_eq!(
            seen,
            vec![
                (0, 0, 0),
                (100, 1, 0),
                (130, 0, 1),
                (200, 1, 1),
                (240, 0, 2),
                (300, 1, 2),
                (350, 0, 2),
                (400, 0, 1),
                (500, 1, 1),
                (600, 1, 1),
            ]
        );
        assert_eq!(h.last().map(MachineCounts::desired), Some(2));
        // A window inside: its first point is the counts then.
        let h = machine_history(&rows, 250, 320);
        assert_eq!(
            h.iter()
                .map(|c| (c.t, c.booting, c.active))
                .collect::<Vec<_>>(),
            vec![(250, 0, 2), (300, 1, 2), (320, 1, 2)]
        );
    }

    fn input(json: serde_json::Value) -> ProviderInput {
        serde_json::from_value(json).expect("the input's shape")
    }

    fn fields(r: Result<Provider, ValidationErrors>) -> Vec<String> {
        r.expect_err("refused")
            .errors
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn defaults_fill_what_is_not_given() {
        let p =
            validate(&input(serde_json::json!({"kind": "demo", "max_hosts": 4}))).expect("valid");
        assert_eq!(p.kind, ProviderKind::Demo);
        assert_eq!((p.min_hosts, p.max_hosts), (0, 4));
        assert_eq!(p.target_capacity_percent, 100);
        assert_eq!(
            (
                p.scale_out_cooldown_secs,
                p.scale_in_cooldown_secs,
                p.boot_timeout_secs
            ),
            (0, 600, 600)
        );
        // Stored and read back as it was written.
        let json = serde_json::to_value(&p).expect("json");
        assert_eq!(json["kind"], "demo");
        assert_eq!(serde_json::from_value::<Provider>(json).expect("back"), p);
    }

    #[test]
    fn each_kind_needs_its_own_fields_and_no_others() {
        let asg = validate(&input(serde_json::json!({
            "kind": "aws-asg", "group": "gpu-l4", "region": "eu-west-1", "min_hosts": 1, "max_hosts": 8
        })))
        .expect("valid");
        assert_eq!(asg.group.as_deref(), Some("gpu-l4"));
        assert_eq!(
            fields(validate(&input(
                serde_json::json!({"kind": "aws-asg", "max_hosts": 2})
            ))),
            vec!["provider.group"]
        );
        assert_eq!(
            fields(validate(&input(serde_json::json!({
                "kind": "command", "path": "bin/make-hosts", "group": "x", "max_hosts": 2
            })))),
            vec!["provider.group", "provider.path"]
        );
        assert_eq!(
            fields(validate(&input(
                serde_json::json!({"kind": "gcp-mig", "max_hosts": 2})
            ))),
            vec!["provider.kind"]
        );
    }

    #[test]
    fn bad_numbers_are_named() {
        let got = fields(validate(&input(serde_json::json!({
            "kind": "demo", "min_hosts": 5, "max_hosts": 3, "target_capacity_percent": 0,
            "boot_timeout_secs": 2,
            "shape": {"gpu_model": "", "gpus": 65, "gpu_memory_mib": 0, "cpu_milli": 1, "memory_mib": 1}
        }))));
        assert_eq!(
            got,
            vec![
                "provider.min_hosts",
                "provider.target_capacity_percent",
                "provider.boot_timeout_secs",
                "provider.shape.gpu_model",
                "provider.shape.gpus",
                "provider.shape.gpu_memory_mib",
            ]
        );
        assert!(
            serde_json::from_value::<ProviderInput>(serde_json::json!({"kind": "demo"})).is_err(),
            "max_hosts is required"
        );
        assert!(
            serde_json::from_value::<ProviderInput>(serde_json::json!({"kind": "demo", "max": 1}))
                .is_err(),
            "an unknown field is refused"
        );
    }

    #[test]
    fn headroom_is_ecs_target_capacity() {
        assert_eq!(with_headroom(4, 100), 4);
        assert_eq!(with_headroom(4, 80), 5);
        assert_eq!(with_headroom(3, 50), 6);
        assert_eq!(with_headroom(0, 80), 0);
    }
}
