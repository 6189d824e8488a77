-- Who may do what: operators' accounts, API tokens, console sessions and the audit log.

-- An operator who signs in to the console (or through POST /api/v1/session).
CREATE TABLE users (
    -- The sign-in name; lowercase letters, digits and '-'.
    username       TEXT PRIMARY KEY NOT NULL,
    -- Argon2id hash in PHC string form ($argon2id$v=19$...); never the password.
    password_hash  TEXT NOT NULL,
    -- viewer | operator | admin.
    role           TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    -- 1: may not sign in, and sessions and tokens it made stop working at once.
    disabled       INTEGER NOT NULL DEFAULT 0 CHECK (disabled IN (0, 1)),
    -- Unix seconds; sessions signed in before this are no longer valid (password changed).
    sessions_after INTEGER NOT NULL DEFAULT 0,
    created_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- A bearer token for scripts and the CLI. Shown once; only its hash is kept.
CREATE TABLE api_tokens (
    -- Random id, shown in lists and used to delete the token.
    id          TEXT PRIMARY KEY NOT NULL,
    -- The operator's name for it, e.g. 'ci-deploy'.
    name        TEXT NOT NULL,
    -- SHA-256 (hex) of the token; the token has 256 random bits, so no slow hash is needed.
    token_hash  TEXT NOT NULL UNIQUE,
    -- viewer | operator | admin; never above its creator's role when it was made.
    role        TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    -- The user who made it; the token stops working when that user is disabled.
    created_by  TEXT NOT NULL REFERENCES users (username),
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- RFC 3339 UTC; NULL: does not expire.
    expires_at  TEXT
);

-- Console sessions (tower-sessions records).
CREATE TABLE sessions (
    -- SHA-256 (hex) of the session id in the cookie, so a copy of the database holds no live session.
    id_hash    TEXT PRIMARY KEY NOT NULL,
    -- The session record as JSON (who signed in, when).
    data       TEXT NOT NULL,
    -- Unix seconds after which the session is gone (idle expiry; the absolute limit is in data).
    expires_at INTEGER NOT NULL
);
CREATE INDEX sessions_expires ON sessions (expires_at);

-- Every accepted mutation: who, what, on what, when, from where. Never a secret.
CREATE TABLE audit_log (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- 'user alice' or 'token ci-deploy (by alice)'.
    actor   TEXT NOT NULL,
    -- 'POST /api/v1/services' or 'server function create_service'.
    action  TEXT NOT NULL,
    -- What it acted on (a service, host, family:revision, user ...), when known.
    target  TEXT,
    -- The client's IP address.
    address TEXT
);
CREATE INDEX audit_log_actor ON audit_log (actor);

-- Secret values of a revision's containers as JSON ({"container": {"NAME": "value"}}), kept
-- apart from `spec` so that everything that describes a definition holds no secret value.
ALTER TABLE task_definitions ADD COLUMN secrets TEXT NOT NULL DEFAULT '{}';
