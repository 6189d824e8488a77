-- Notifications (issue 41): webhooks an admin registers, and each notification's delivery
-- to each of them, kept with its status (retried with backoff until delivered or given up).
CREATE TABLE webhooks (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL UNIQUE,
    url        TEXT NOT NULL,
    -- json | slack | alertmanager
    format     TEXT NOT NULL,
    -- The kinds it is sent, as ",host_lost,alarm_fired," (",": every kind).
    kinds      TEXT NOT NULL,
    project    TEXT,
    pool       TEXT,
    service    TEXT,
    -- Signs its deliveries (HMAC-SHA256); shown once, when made.
    secret     TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE webhook_deliveries (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id   INTEGER NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    kind         TEXT NOT NULL,
    at           TEXT NOT NULL,
    message      TEXT NOT NULL,
    service      TEXT,
    host_id      TEXT,
    pool         TEXT,
    -- pending | delivered | failed
    status       TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_at      TEXT,
    last_status  INTEGER,
    last_error   TEXT,
    delivered_at TEXT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_at);
CREATE INDEX webhook_deliveries_hook ON webhook_deliveries (webhook_id, id);
