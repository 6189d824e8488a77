-- Task definitions, services, deployments, tasks and their GPU allocations, events, and
-- agent credentials.

-- SHA-256 (hex) of the host's agent token; the token itself is shown once, at registration.
ALTER TABLE hosts ADD COLUMN agent_token_hash TEXT;
-- Why the host is impaired or lost, in words; NULL when active.
ALTER TABLE hosts ADD COLUMN status_reason TEXT;
CREATE UNIQUE INDEX hosts_agent_token ON hosts (agent_token_hash);

-- Process-wide settings, e.g. the hash of the join token.
CREATE TABLE settings (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);

-- A revision of a task definition family; immutable except for `active`.
CREATE TABLE task_definitions (
    family        TEXT NOT NULL,
    -- 1, 2, 3, ... per family, never reused.
    revision      INTEGER NOT NULL CHECK (revision >= 1),
    -- 0 once deregistered: still describable, no new tasks.
    active        INTEGER NOT NULL DEFAULT 1 CHECK (active IN (0, 1)),
    -- The validated TaskDefinitionSpec as JSON.
    spec          TEXT NOT NULL,
    registered_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (family, revision)
);

-- Keeps desired_count tasks of a task definition running in a pool.
CREATE TABLE services (
    name                    TEXT PRIMARY KEY NOT NULL,
    -- The task definition new tasks use (the primary deployment's).
    family                  TEXT NOT NULL,
    revision                INTEGER NOT NULL,
    pool                    TEXT NOT NULL REFERENCES pools (name),
    desired_count           INTEGER NOT NULL CHECK (desired_count >= 0),
    -- Overrides the pool's placement policy when set.
    strategy                TEXT CHECK (strategy IS NULL OR strategy IN ('fragmentation', 'binpack', 'spread_host', 'spread_gpu')),
    -- JSON ServiceConstraints: gpu_models, labels, distinct_hosts.
    constraints             TEXT NOT NULL DEFAULT '{}',
    minimum_healthy_percent INTEGER NOT NULL CHECK (minimum_healthy_percent BETWEEN 0 AND 100),
    maximum_percent         INTEGER NOT NULL CHECK (maximum_percent BETWEEN 100 AND 200),
    -- Seconds between SIGTERM and SIGKILL when a task is stopped.
    stop_timeout_secs       INTEGER NOT NULL CHECK (stop_timeout_secs BETWEEN 1 AND 600),
    -- 1 after DELETE: drains to zero tasks, then the row is removed.
    deleting                INTEGER NOT NULL DEFAULT 0 CHECK (deleting IN (0, 1)),
    created_at              TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    FOREIGN KEY (family, revision) REFERENCES task_definitions (family, revision)
);

-- One revision being rolled out for a service.
CREATE TABLE deployments (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    service      TEXT NOT NULL REFERENCES services (name) ON DELETE CASCADE,
    family       TEXT NOT NULL,
    revision     INTEGER NOT NULL,
    -- primary (the target) | active (old, still has tasks) | completed | rolled_back.
    status       TEXT NOT NULL CHECK (status IN ('primary', 'active', 'completed', 'rolled_back')),
    -- Tasks of this deployment that exited on their own with a non-zero code.
    failed_tasks INTEGER NOT NULL DEFAULT 0,
    created_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX deployments_service ON deployments (service, status);

-- One running copy of a task definition. Rows stay after the task stops, as history.
CREATE TABLE tasks (
    -- UUID.
    id                  TEXT PRIMARY KEY NOT NULL,
    -- No foreign key: tasks outlive their service as history.
    service             TEXT NOT NULL,
    deployment_id       INTEGER NOT NULL,
    family              TEXT NOT NULL,
    revision            INTEGER NOT NULL,
    pool                TEXT NOT NULL,
    -- Host CPU (thousandths of a core) and host memory (MiB) the task reserves.
    cpu_milli           INTEGER NOT NULL CHECK (cpu_milli >= 0),
    memory_mib          INTEGER NOT NULL CHECK (memory_mib >= 0),
    -- pending | assigned | running | stopping | stopped.
    state               TEXT NOT NULL CHECK (state IN ('pending', 'assigned', 'running', 'stopping', 'stopped')),
    -- Set once placed.
    host_id             TEXT REFERENCES hosts (id),
    -- For a pending task: why it could not be placed yet.
    placement_message   TEXT,
    stop_reason         TEXT,
    exit_code           INTEGER,
    -- Measured by the agent: peak GPU memory (MiB) and streaming-multiprocessor use (%).
    gpu_memory_peak_mib INTEGER,
    sm_percent          INTEGER,
    -- 1 while the task is being moved off a draining or impaired host (its replacement
    -- starts first).
    migrating           INTEGER NOT NULL DEFAULT 0 CHECK (migrating IN (0, 1)),
    created_at          TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    started_at          TEXT,
    stopped_at          TEXT
);
CREATE INDEX tasks_service_state ON tasks (service, state);
CREATE INDEX tasks_state ON tasks (state);
CREATE INDEX tasks_host ON tasks (host_id, state);

-- What a placed task holds on each GPU; deleted when the task stops. For every GPU the
-- sum of memory_mib never exceeds its memory: checked in the transaction that inserts.
CREATE TABLE task_gpus (
    task_id       TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    gpu_uuid      TEXT NOT NULL,
    -- Device index on the host, for CUDA_VISIBLE_DEVICES and display.
    idx           INTEGER NOT NULL,
    memory_mib    INTEGER NOT NULL CHECK (memory_mib >= 0),
    -- Reserved compute in thousandths of the GPU.
    compute_milli INTEGER NOT NULL CHECK (compute_milli >= 0),
    -- 1 when the task holds the whole GPU.
    dedicated     INTEGER NOT NULL CHECK (dedicated IN (0, 1)),
    PRIMARY KEY (task_id, gpu_uuid)
);
CREATE INDEX task_gpus_gpu ON task_gpus (gpu_uuid);

-- Timestamped, human-readable records on services and hosts.
CREATE TABLE events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    service TEXT,
    host_id TEXT,
    message TEXT NOT NULL
);
CREATE INDEX events_service ON events (service, id);
CREATE INDEX events_host ON events (host_id, id);
