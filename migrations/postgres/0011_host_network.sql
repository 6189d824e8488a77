-- Network privileges belong to the pool: 1 lets its tasks share the host's network
-- (networkMode host) and add NET_RAW or NET_ADMIN; 0 (every pool until changed) refuses
-- them with the field named.
ALTER TABLE pools ADD COLUMN host_network BIGINT NOT NULL DEFAULT 0;
