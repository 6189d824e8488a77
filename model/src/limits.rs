//! Every limit on what requests, reports and tasks may hold, each declared once: those of
//! services and pools here, the others in a module each (`report`, `task_definition`,
//! `project`, `accounts`, `http`, `work`). The
//! validators (`agent.rs`, `taskdef`, `validate`), the hand-written JSON Schemas
//! (`schema.rs`) and the agent read these constants. utoipa's attributes take literals
//! only: `derived_schemas_carry_these_bounds` checks that the derived schemas' bounds agree.

/// An MPS server's most clients (`nvidia-cuda-mps-control`): what a GPU reports by default,
/// the most a pool may set, and the most tasks of one service on one GPU.
pub const MPS_CLIENT_LIMIT_MAX: u32 = 48;

/// A service's stop timeout (seconds between the stop signal and the kill): its bounds and
/// its default.
pub const STOP_TIMEOUT_MIN_SECS: u32 = 1;
pub const STOP_TIMEOUT_MAX_SECS: u32 = 600;
pub const STOP_TIMEOUT_DEFAULT_SECS: u32 = 30;

/// How long a task stopped on purpose may stay out of the endpoint list before its stop
/// signal (seconds).
pub const DEREGISTRATION_DELAY_MAX_SECS: u32 = 3600;

/// The longest an alarm's metric must stay past its threshold before it fires (seconds).
pub const ALARM_FOR_MAX_SECS: u32 = 3600;

/// Most tasks one service may ask for.
pub const MAX_DESIRED: u32 = 100_000;

/// The highest per-host cap a service may set (`constraints.max_per_host`).
pub const MAX_PER_HOST_MAX: u32 = 10_000;

/// The most characters of a free-text field of a task definition: a container's image, an
/// ECS port mapping's name.
pub const MAX_TEXT_CHARS: usize = 1024;

/// How far a pool's MPS compute caps may be overcommitted (1.0: reserved, never
/// overcommitted).
pub const COMPUTE_OVERCOMMIT_MAX: f64 = 10.0;

/// What one agent's sync report may hold: an item past a bound is dropped or cut
/// ([`crate::bounds`]), never the whole report.
pub mod report {
    /// Most GPUs one host may report.
    pub const MAX_GPUS: usize = 64;
    /// Highest GPU index.
    pub const MAX_GPU_INDEX: u32 = 1023;
    /// Largest GPU memory a report may claim (16 TiB).
    pub const MAX_GPU_MEMORY_MIB: u64 = 16 * 1024 * 1024;
    /// Most task reports in one sync.
    pub const MAX_TASKS: usize = 10_000;
    /// Most ports one task may report.
    pub const MAX_PORTS: usize = 100;
    /// Names: a task id, a GPU model, a port's container and name, labels.
    pub const MAX_NAME_CHARS: usize = 256;
    /// A failing health check's output.
    pub const MAX_HEALTH_OUTPUT_CHARS: usize = 1024;
    /// The image a task is pulling.
    pub const MAX_PULLING_CHARS: usize = 512;
    /// Why a task could not start or ended.
    pub const MAX_ERROR_CHARS: usize = 2048;
    /// The last lines a task wrote, sent with its stop report.
    pub const MAX_LAST_OUTPUT_CHARS: usize = 4096;
    /// Why the MPS daemon is unhealthy.
    pub const MAX_MPS_REASON_CHARS: usize = 4096;
    /// What one of a host's capabilities says of itself.
    pub const MAX_CAPABILITY_CHARS: usize = 1024;
    /// Why a task's work is unknown.
    pub const MAX_WORK_REASON_CHARS: usize = 512;
    /// Most latency buckets of one work sample.
    pub const MAX_LATENCY_BUCKETS: usize = 64;
    /// Most failed allocations counted in one sync window.
    pub const MAX_MEMORY_ERRORS: u32 = 1_000_000;
}

/// What a task definition may ask for.
pub mod task_definition {
    /// Most containers in one task.
    pub const MAX_CONTAINERS: usize = 10;
    /// Most whole GPUs one task may ask for (what fits on one host).
    pub const MAX_GPUS: u64 = 16;
    /// Largest memory (host or GPU) a container may ask for: 16 TiB.
    pub const MAX_MEMORY_MIB: u64 = 16 * 1024 * 1024;
    /// Longest secret value.
    pub const MAX_SECRET_BYTES: usize = 64 * 1024;
}

/// Streams to tasks: logs and exec.
pub mod streams {
    /// Most lines a log read's `tail` may ask for.
    pub const MAX_LOG_TAIL: u32 = 100_000;
    /// Most words in an exec's command.
    pub const MAX_EXEC_ARGS: usize = 256;
    /// Longest word of an exec's command.
    pub const MAX_EXEC_ARG_CHARS: usize = 4096;
    /// Largest piece of output an agent sends in one request.
    pub const MAX_CHUNK_BYTES: usize = 64 * 1024;
}

/// A project's quotas and weight.
pub mod project {
    /// The most quotas one project may have (one per pool).
    pub const MAX_QUOTAS: usize = 64;
    /// The largest amount a quota may name of any quantity (what a signed 64-bit integer
    /// holds, as JSON clients read integers).
    pub const MAX_AMOUNT: u64 = i64::MAX as u64;
    /// The largest weight of a project (its share of borrowed capacity, against others').
    pub const MAX_WEIGHT: u32 = 1000;
}

/// Accounts, sign-in and tokens.
pub mod accounts {
    /// Passwords shorter than this (in characters) are refused.
    pub const MIN_PASSWORD_LEN: usize = 12;
    /// Sign-in attempts allowed per user and per client address within a minute: counted in
    /// the database before the password is checked, so the limit holds for a concurrent
    /// burst and across servers. A successful sign-in clears its user's count and gives its
    /// address's attempt back: failures are what use the allowance up.
    pub const MAX_ATTEMPTS: u64 = 5;
    /// An API token's longest life (days).
    pub const MAX_TOKEN_DAYS: u32 = 3650;
    /// A join token's longest life (seconds: 30 days).
    pub const MAX_JOIN_TOKEN_SECS: u64 = 30 * 24 * 3600;
    /// The most hosts one join token may admit.
    pub const MAX_JOIN_TOKEN_USES: u32 = 10_000;
}

/// Request bodies the server reads.
pub mod http {
    /// The largest body of a console or API request (axum's limit of JSON bodies, which the
    /// auth layer applies too when it reads a body for its scope or audit entry).
    pub const MAX_BODY: usize = 2 * 1024 * 1024;
    /// The largest agent request body (read first by the edge, within the agents' body
    /// deadline; the handler's extractor applies it too).
    pub const MAX_AGENT_BODY: usize = 2 * 1024 * 1024;
}

/// What the agent reads of a task's `/metrics` (its completed work).
pub mod work {
    /// The largest metrics answer read: a runaway label set must not fill the agent's memory.
    pub const MAX_SCRAPE_BYTES: usize = 4 * 1024 * 1024;
    /// Most samples of the configured metrics one scrape may have (series of the counters
    /// and bucket lines of the histogram together): past it the work is unknown, so a
    /// runaway label set costs one bounded pass over the text, nothing more.
    pub const MAX_SERIES: usize = 100_000;
}

#[cfg(all(test, feature = "openapi"))]
mod tests {
    use super::*;
    use serde_json::Value;
    use utoipa::PartialSchema;

    fn bound(schema: Value, field: &str, key: &str) -> f64 {
        schema["properties"][field][key]
            .as_f64()
            .unwrap_or_else(|| panic!("{field}.{key} in {schema}"))
    }

    fn json<T: PartialSchema>() -> Value {
        serde_json::to_value(T::schema()).expect("a schema serializes")
    }

    #[test]
    fn derived_schemas_carry_these_bounds() {
        let mps = f64::from(MPS_CLIENT_LIMIT_MAX);
        let pool = json::<crate::api::PoolInput>();
        assert_eq!(bound(pool.clone(), "mps_client_limit", "maximum"), mps);
        assert_eq!(
            bound(pool, "compute_overcommit", "maximum"),
            COMPUTE_OVERCOMMIT_MAX
        );
        let patch = json::<crate::api::PoolPatch>();
        assert_eq!(bound(patch.clone(), "mps_client_limit", "maximum"), mps);
        assert_eq!(
            bound(patch, "compute_overcommit", "maximum"),
            COMPUTE_OVERCOMMIT_MAX
        );
        let gpu = json::<crate::agent::GpuReport>();
        assert_eq!(bound(gpu.clone(), "mps_client_limit", "maximum"), mps);
        assert_eq!(bound(gpu, "mps_client_limit", "default"), mps);
        let constraints = json::<crate::service::ServiceConstraints>();
        assert_eq!(bound(constraints.clone(), "max_per_gpu", "maximum"), mps);
        assert_eq!(
            bound(constraints, "max_per_host", "maximum"),
            f64::from(MAX_PER_HOST_MAX)
        );
        let service = json::<crate::api::ServiceInput>();
        assert_eq!(
            bound(service.clone(), "stop_timeout_secs", "maximum"),
            f64::from(STOP_TIMEOUT_MAX_SECS)
        );
        assert_eq!(
            bound(service.clone(), "stop_timeout_secs", "minimum"),
            f64::from(STOP_TIMEOUT_MIN_SECS)
        );
        assert_eq!(
            bound(service.clone(), "stop_timeout_secs", "default"),
            f64::from(STOP_TIMEOUT_DEFAULT_SECS)
        );
        assert_eq!(
            bound(service, "desired_count", "maximum"),
            f64::from(MAX_DESIRED)
        );
    }
}
