-- What happens to a task whose measured GPU memory stays above its budget past the grace
-- period: `enforce` (stopped) or `warn` (its service's events say so). Pools that exist
-- when this lands only warn, so an upgrade stops nothing that ran before; new pools
-- enforce (the server writes the setting of every pool it creates).
ALTER TABLE pools ADD COLUMN gpu_budget TEXT NOT NULL DEFAULT 'warn' CHECK (gpu_budget IN ('enforce', 'warn'));
