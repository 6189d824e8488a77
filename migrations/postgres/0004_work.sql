-- Work: what the applications complete, as they publish it (Prometheus text), beside what
-- the GPU sees.

-- A service's latency target, alarms, bake time and autoscaling, as JSON
-- ({slo?, alarms?, bake_secs?, autoscaling?}).
ALTER TABLE services ADD COLUMN objectives TEXT NOT NULL DEFAULT '{}';

-- A task's work as its agent last measured it (JSON: rates, latency percentiles, or why it
-- is unknown); NULL when it publishes none.
ALTER TABLE tasks ADD COLUMN work TEXT;

-- Work per usage bucket: seconds measured, work completed and failed in them, latency
-- percentiles (merged from the intervals' histograms), and the services the task shared
-- its GPU with for the whole bucket (sorted, comma-separated; '' alone; NULL when they
-- changed within the bucket): the evidence behind interference estimates.
ALTER TABLE task_usage ADD COLUMN work_secs DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE task_usage ADD COLUMN completed DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE task_usage ADD COLUMN errors DOUBLE PRECISION;
ALTER TABLE task_usage ADD COLUMN latency_p50_ms DOUBLE PRECISION;
ALTER TABLE task_usage ADD COLUMN latency_p95_ms DOUBLE PRECISION;
ALTER TABLE task_usage ADD COLUMN latency_p99_ms DOUBLE PRECISION;
ALTER TABLE task_usage ADD COLUMN neighbours TEXT;
