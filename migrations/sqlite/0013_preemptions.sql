-- Preemptions: who took (or asks for) the room, where, and which tasks it stops (a JSON
-- array of {task, service, project, priority}). `state`: `done` (carried out), or in a
-- pool whose plans wait for approval, `proposed`, then `approved` and `done`, `declined`
-- or `expired`.
-- `task` is the waiting task the plan was made for. The newest 1000 decided ones are kept.
CREATE TABLE preemptions (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    pool      TEXT NOT NULL,
    host_id   TEXT NOT NULL,
    service   TEXT NOT NULL,
    project   TEXT NOT NULL,
    priority  TEXT NOT NULL,
    victims   TEXT NOT NULL,
    state     TEXT NOT NULL DEFAULT 'done' CHECK (state IN ('proposed', 'approved', 'done', 'declined', 'expired')),
    task      TEXT NOT NULL DEFAULT ''
);

-- How preemption runs in a pool: `automatic`, or `approve` (plans wait for an operator).
ALTER TABLE pools ADD COLUMN preemption TEXT NOT NULL DEFAULT 'automatic' CHECK (preemption IN ('automatic', 'approve'));
CREATE INDEX preemptions_open ON preemptions (pool, state);
