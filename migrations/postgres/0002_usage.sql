-- Measured use per task, in buckets of two widths (minutes for a day, hours for a month by
-- default): the evidence behind fit verdicts and the service page's charts. Written by the
-- server that received the agents' syncs; merged (maximum of each figure) when two servers
-- write the same bucket.
CREATE TABLE task_usage (
    task_id          TEXT NOT NULL,
    width_secs       BIGINT NOT NULL,
    bucket_start     BIGINT NOT NULL,
    service          TEXT NOT NULL,
    family           TEXT NOT NULL,
    revision         BIGINT NOT NULL,
    host_id          TEXT,
    memory_max_mib   BIGINT NOT NULL,
    memory_last_mib  BIGINT NOT NULL,
    sm_p50           BIGINT,
    sm_p95           BIGINT,
    sm_max           BIGINT,
    samples          BIGINT NOT NULL,
    memory_errors    BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, width_secs, bucket_start)
);
CREATE INDEX task_usage_by_service ON task_usage (service, width_secs, bucket_start);
CREATE INDEX task_usage_by_age ON task_usage (width_secs, bucket_start);

-- Consolidation plans: the moves computed, and how far their execution got.
CREATE TABLE consolidation_plans (
    id          TEXT PRIMARY KEY,
    pool        TEXT NOT NULL,
    goal        TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    body        TEXT NOT NULL
);

-- How often each host's agent restarted its MPS control daemon (since the agent started):
-- the host page shows it beside each GPU's MPS clients.
ALTER TABLE hosts ADD COLUMN mps_restarts BIGINT NOT NULL DEFAULT 0;
