-- What happens to a task whose measured GPU memory stays above its budget past the grace
-- period: `enforce` (stopped) or `warn` (its service's events say so).
ALTER TABLE pools ADD COLUMN gpu_budget TEXT NOT NULL DEFAULT 'enforce' CHECK (gpu_budget IN ('enforce', 'warn'));
