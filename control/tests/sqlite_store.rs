//! The SQLite store on a temporary database file.

use std::collections::BTreeMap;
use tessera_control::{StoreError, open};
use tessera_model::{
    GpuHealth, GpuInfo, GpuUuid, HostId, HostInfo, HostStatus, MiB, MilliCpu, PlacementPolicy,
    PoolInfo, PoolName, SharingMode,
};

fn pool(name: &str) -> PoolInfo {
    PoolInfo {
        name: PoolName::new(name).expect("valid"),
        policy: PlacementPolicy::Fragmentation,
        compute_overcommit: 1.0,
        mps_client_limit: None,
    }
}

fn host(id: &str, pool: &str, gpus: u32) -> HostInfo {
    HostInfo {
        id: HostId::new(id).expect("valid"),
        pool: PoolName::new(pool).expect("valid"),
        status: HostStatus::Active,
        simulated: true,
        cpu: MilliCpu(32_000),
        memory: MiB(128 * 1024),
        labels: BTreeMap::from([("zone".to_owned(), "a".to_owned())]),
        gpus: (0..gpus)
            .map(|i| GpuInfo {
                uuid: GpuUuid::new(format!("GPU-{id}-{i}")).expect("valid"),
                index: i,
                model: "NVIDIA L4".into(),
                memory: MiB(24 * 1024),
                mps_client_limit: 48,
                health: GpuHealth::Healthy,
                sharing_mode: SharingMode::Idle,
            })
            .collect(),
        status_reason: None,
        last_seen: None,
    }
}

#[tokio::test]
async fn hosts_round_trip_and_survive_reopening_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/nested/tessera.db", dir.path().display());
    {
        let store = open(&url).await.expect("opens and creates the file");
        store.upsert_pool(&pool("gpu-a")).await.expect("pool");
        store
            .upsert_host(&host("host-2", "gpu-a", 4))
            .await
            .expect("host");
        store
            .upsert_host(&host("host-1", "gpu-a", 2))
            .await
            .expect("host");
    }
    let store = open(&url).await.expect("reopens");
    let hosts = store.list_hosts().await.expect("list");
    assert_eq!(
        hosts.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(),
        ["host-1", "host-2"]
    );
    assert_eq!(hosts[1], host("host-2", "gpu-a", 4));
    assert_eq!(hosts[1].gpus[3].index, 3);

    store
        .set_host_status(
            &HostId::new("host-1").expect("valid"),
            HostStatus::Draining,
            Some("test"),
        )
        .await
        .expect("status");
    let h1 = store
        .get_host(&HostId::new("host-1").expect("valid"))
        .await
        .expect("get");
    assert_eq!(h1.status, HostStatus::Draining);
}

#[tokio::test]
async fn host_in_unknown_pool_is_refused_and_nothing_is_stored() {
    let store = open("sqlite::memory:").await.expect("opens");
    let err = store
        .upsert_host(&host("host-1", "nope", 1))
        .await
        .expect_err("no such pool");
    assert!(
        matches!(err, StoreError::NotFound { what: "pool", .. }),
        "{err}"
    );
    assert!(store.list_hosts().await.expect("list").is_empty());
}

#[tokio::test]
async fn a_gpu_uuid_cannot_belong_to_two_hosts() {
    let store = open("sqlite::memory:").await.expect("opens");
    store.upsert_pool(&pool("gpu-a")).await.expect("pool");
    store
        .upsert_host(&host("host-1", "gpu-a", 1))
        .await
        .expect("host");
    let mut twin = host("host-2", "gpu-a", 1);
    twin.gpus[0].uuid = GpuUuid::new("GPU-host-1-0").expect("valid");
    let err = store.upsert_host(&twin).await.expect_err("duplicate UUID");
    assert!(err.to_string().contains("already registered"), "{err}");
    let ids: Vec<String> = store
        .list_hosts()
        .await
        .expect("list")
        .iter()
        .map(|h| h.id.to_string())
        .collect();
    assert_eq!(ids, ["host-1"], "the failed host was rolled back");
}

#[tokio::test]
async fn postgres_urls_get_a_clear_error() {
    let err = open("postgres://localhost/tessera")
        .await
        .err()
        .expect("not built");
    assert!(
        err.to_string().contains("only the embedded SQLite backend"),
        "{err}"
    );
}
