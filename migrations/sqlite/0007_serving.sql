-- Serving: where a task is reached, whether it answers, and how it leaves.

-- Its ports as JSON: [{container, name?, container_port, host_port?, protocol}]; fixed host
-- ports are written at creation (from the definition), dynamic ones when its agent reports
-- them. Placement reads the host ports of live tasks to keep fixed ones apart.
ALTER TABLE tasks ADD COLUMN ports TEXT NOT NULL DEFAULT '[]';
-- NULL when its definition has no health check; else 'unknown', 'healthy' or 'unhealthy'
-- as its agent last reported.
ALTER TABLE tasks ADD COLUMN health TEXT CHECK (health IS NULL OR health IN ('unknown', 'healthy', 'unhealthy'));
-- The last failing check's output.
ALTER TABLE tasks ADD COLUMN health_output TEXT;
-- For a task stopped on purpose: until when it keeps running out of the endpoint list (its
-- service's deregistration delay) before its agent is told to stop it.
ALTER TABLE tasks ADD COLUMN drain_until TEXT;

-- The address the host's tasks are reached at (what its agent advertises).
ALTER TABLE hosts ADD COLUMN address TEXT;
-- How many ports of its agent's dynamic range are free, as it last reported: placement sends
-- a task that needs dynamic ports only to a host with enough.
ALTER TABLE hosts ADD COLUMN dynamic_ports_free INTEGER;

-- How long a task stopped on purpose stays out of the endpoint list before its stop signal.
ALTER TABLE services ADD COLUMN deregistration_delay_secs INTEGER NOT NULL DEFAULT 5
    CHECK (deregistration_delay_secs BETWEEN 0 AND 3600);
