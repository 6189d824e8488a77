//! Bounds that requests and reports are checked against, each declared once. The
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
