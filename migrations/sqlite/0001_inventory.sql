-- Inventory: pools, GPU hosts and their GPUs.

-- A named group of hosts (ECS: capacity provider) with its packing policy and limits.
CREATE TABLE pools (
    -- The operator's name for the pool; a DNS label.
    name               TEXT PRIMARY KEY NOT NULL,
    -- How tasks are packed: fragmentation | binpack | spread_host | spread_gpu.
    policy             TEXT NOT NULL DEFAULT 'fragmentation'
                       CHECK (policy IN ('fragmentation', 'binpack', 'spread_host', 'spread_gpu')),
    -- 1.0: MPS compute caps are reserved (sum <= 100% per GPU); above 1.0 they may be overcommitted by that factor.
    compute_overcommit REAL NOT NULL DEFAULT 1.0 CHECK (compute_overcommit >= 1.0),
    -- When set, replaces every GPU's MPS client limit in the pool.
    mps_client_limit   INTEGER CHECK (mps_client_limit IS NULL OR mps_client_limit BETWEEN 1 AND 48),
    -- RFC 3339 UTC.
    created_at         TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- A machine with GPUs, run by one agent.
CREATE TABLE hosts (
    -- Assigned by the control plane at registration; a DNS label.
    id           TEXT PRIMARY KEY NOT NULL,
    -- The pool the host belongs to.
    pool         TEXT NOT NULL REFERENCES pools (name),
    -- active | draining | impaired (MPS daemon or GPU unhealthy) | lost (agent silent).
    status       TEXT NOT NULL DEFAULT 'active'
                 CHECK (status IN ('active', 'draining', 'impaired', 'lost')),
    -- 1 when the GPUs are simulated (demo fleet); shown as such everywhere.
    simulated    INTEGER NOT NULL DEFAULT 0 CHECK (simulated IN (0, 1)),
    -- Allocatable CPU in thousandths of a core.
    cpu_milli    INTEGER NOT NULL CHECK (cpu_milli >= 0),
    -- Allocatable host memory in MiB.
    memory_mib   INTEGER NOT NULL CHECK (memory_mib >= 0),
    -- JSON object of string keys to string values, used by placement constraints.
    labels       TEXT NOT NULL DEFAULT '{}',
    -- When the agent last synced (RFC 3339 UTC); NULL before its first sync.
    last_seen_at TEXT,
    created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX hosts_pool ON hosts (pool);

-- One GPU of a host, as its agent reports it.
CREATE TABLE gpus (
    -- NVML's UUID (GPU-...), stable across reboots and PCI slots.
    uuid             TEXT PRIMARY KEY NOT NULL,
    host_id          TEXT NOT NULL REFERENCES hosts (id) ON DELETE CASCADE,
    -- Device index on the host (nvidia-smi order).
    idx              INTEGER NOT NULL CHECK (idx >= 0),
    -- Marketing name, e.g. 'NVIDIA H100 80GB HBM3'.
    model            TEXT NOT NULL,
    -- Total device memory in MiB.
    memory_mib       INTEGER NOT NULL CHECK (memory_mib > 0),
    -- How many MPS clients the device accepts at once.
    mps_client_limit INTEGER NOT NULL DEFAULT 48 CHECK (mps_client_limit >= 1),
    -- healthy | unhealthy (e.g. uncorrectable ECC, Xid needing reset).
    health           TEXT NOT NULL DEFAULT 'healthy' CHECK (health IN ('healthy', 'unhealthy')),
    -- idle | mps (sharing tasks only) | dedicated (one whole-GPU task).
    sharing_mode     TEXT NOT NULL DEFAULT 'idle' CHECK (sharing_mode IN ('idle', 'mps', 'dedicated')),
    UNIQUE (host_id, idx)
);
