-- A released scheduler lease expired at the Unix epoch, written as every other time is
-- (it was the empty string, which is not a time).
UPDATE scheduler_lease SET expires_at = '1970-01-01T00:00:00.000Z' WHERE expires_at = '';
