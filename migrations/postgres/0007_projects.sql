-- Projects: the teams that share a fleet. Every service belongs to one; `default` holds
-- every service from before projects and those that name none. `quotas` is a JSON array of
-- per-pool quotas (guaranteed amounts and a limit above them).
CREATE TABLE projects (
    name        TEXT PRIMARY KEY,
    weight      BIGINT NOT NULL DEFAULT 1 CHECK (weight >= 1),
    quotas      TEXT NOT NULL DEFAULT '[]',
    created_at  TEXT NOT NULL DEFAULT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
);

INSERT INTO projects (name) VALUES ('default');

ALTER TABLE services ADD COLUMN project TEXT NOT NULL DEFAULT 'default' REFERENCES projects (name);
CREATE INDEX services_project ON services (project);

-- A service's priority class: a waiting task of a higher class may have tasks of a lower
-- class that use borrowed capacity stopped to make room.
ALTER TABLE services ADD COLUMN priority TEXT NOT NULL DEFAULT 'default' CHECK (priority IN ('batch', 'default', 'production'));
