-- Preemptions carried out: who took the room, where, and which tasks it stopped (a JSON
-- array of {task, service, project, priority}). The newest 1000 are kept.
CREATE TABLE preemptions (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    pool      TEXT NOT NULL,
    host_id   TEXT NOT NULL,
    service   TEXT NOT NULL,
    project   TEXT NOT NULL,
    priority  TEXT NOT NULL,
    victims   TEXT NOT NULL
);
