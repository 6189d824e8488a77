-- Several servers on one database: who they are, and the lease that lets exactly one of
-- them run the reconcile and scheduling loop. The epoch grows with every new holder; the
-- scheduler's writes carry it and are refused once a newer holder exists (fencing).
CREATE TABLE servers (
    id            TEXT PRIMARY KEY,
    address       TEXT NOT NULL,
    started_at    TEXT NOT NULL,
    last_seen_at  TEXT NOT NULL
);

CREATE TABLE scheduler_lease (
    one           INTEGER PRIMARY KEY CHECK (one = 1),
    holder        TEXT NOT NULL,
    epoch         INTEGER NOT NULL,
    since         TEXT NOT NULL,
    expires_at    TEXT NOT NULL
);
