-- Roles in projects: a user given `operator` in a project manages its services whatever
-- their fleet-wide role (admins are admins everywhere).
CREATE TABLE project_members (
    project   TEXT NOT NULL REFERENCES projects (name) ON DELETE CASCADE,
    username  TEXT NOT NULL REFERENCES users (username) ON DELETE CASCADE,
    role      TEXT NOT NULL CHECK (role IN ('viewer', 'operator')),
    PRIMARY KEY (project, username)
);
CREATE INDEX project_members_user ON project_members (username);

-- A token scoped to a project acts only there; it goes with its project.
ALTER TABLE api_tokens ADD COLUMN project TEXT REFERENCES projects (name) ON DELETE CASCADE;
