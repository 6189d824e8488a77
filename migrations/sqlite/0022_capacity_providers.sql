-- Capacity providers (issue 40). A pool's provider: a JSON object (kind, its settings,
-- min/max hosts, target capacity, cooldowns, boot timeout, host shape); NULL: none.
ALTER TABLE pools ADD COLUMN provider TEXT;
-- The provider's id of the machine a host runs on (an EC2 instance id), as its agent
-- says when it joins; NULL: not made by a provider, or not said.
ALTER TABLE hosts ADD COLUMN provider_id TEXT;
-- Machines a pool's provider was asked for and what became of each: requests in flight
-- are state here, written by the scheduler lease's holder (fenced), so a restart or a
-- handover neither asks twice nor forgets a machine it asked for.
CREATE TABLE machines (
    -- Tessera's name for it, given to the provider (m-<pool>-<n>).
    id TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    -- The provider's id for it, once the provider said (the demo's: the host's name).
    provider_id TEXT,
    -- The host it joined as.
    host_id TEXT,
    -- booting | active | terminating | terminated | failed
    state TEXT NOT NULL,
    -- Why it was asked for; then why it ended.
    reason TEXT NOT NULL,
    asked_at TEXT NOT NULL,
    joined_at TEXT,
    ended_at TEXT
);
CREATE INDEX machines_pool_state ON machines (pool, state);
