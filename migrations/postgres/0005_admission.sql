-- Host admission: scoped join tokens, pools that hold new hosts for approval, and what a
-- pool lets its tasks ask of a host's security.

-- Join tokens an admin minted (the fleet-wide token stays in settings): only the hash is
-- kept. NULL pool: any pool; host_id: the token rejoins that revoked host and nothing
-- else; NULL expires_at / uses_left: no limit.
CREATE TABLE join_tokens (
    id            TEXT PRIMARY KEY,
    token_sha256  TEXT NOT NULL UNIQUE,
    description   TEXT NOT NULL DEFAULT '',
    pool          TEXT REFERENCES pools (name) ON DELETE CASCADE,
    host_id       TEXT,
    expires_at    TEXT,
    uses_left     BIGINT CHECK (uses_left IS NULL OR uses_left >= 0),
    uses          BIGINT NOT NULL DEFAULT 0,
    -- 1: hosts it registers are admitted even where the pool holds new hosts for approval.
    preapproved   BIGINT NOT NULL DEFAULT 0,
    created_by    TEXT NOT NULL,
    created_at    TEXT NOT NULL DEFAULT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
);

-- auto: a host that registers gets tasks at once; manual: it is held until an admin
-- approves it.
ALTER TABLE pools ADD COLUMN admission TEXT NOT NULL DEFAULT 'auto' CHECK (admission IN ('auto', 'manual'));
-- 1: task definitions may name the user their containers run as (otherwise each task runs
-- as a uid of its own).
ALTER TABLE pools ADD COLUMN task_users BIGINT NOT NULL DEFAULT 0;
-- 1: containers may be privileged.
ALTER TABLE pools ADD COLUMN privileged BIGINT NOT NULL DEFAULT 0;

-- 1: registered, held for an admin's approval (gets no tasks, so no secrets).
ALTER TABLE hosts ADD COLUMN held BIGINT NOT NULL DEFAULT 0;

-- Sign-in attempts per user and per client address in the current window, shared by every
-- server (checked and counted in one statement, before the password is hashed).
CREATE TABLE sign_in_attempts (
    key           TEXT PRIMARY KEY,
    window_start  TEXT NOT NULL,
    attempts      BIGINT NOT NULL
);
