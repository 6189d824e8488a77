-- Commands in running tasks (tessera exec) belong to the pool: 1 lets operators of a
-- task's project run them; 0 (every pool until changed) refuses them.
ALTER TABLE pools ADD COLUMN exec BIGINT NOT NULL DEFAULT 0;
