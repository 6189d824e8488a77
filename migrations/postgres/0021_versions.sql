-- Versions (model/src/version.rs): what each host's agent says it is, what each server
-- is, and which servers the schema keeps.
--
-- The policy: migrations only add. A server of the previous minor version runs on the
-- schema a newer one wrote; `schema_meta` says which: `written_by` (the newest server
-- that migrated it) and `oldest_server` (the oldest version that may still run on it).
-- A server that finds migrations it does not know reads these before it writes anything.
-- (The hosts' fleet-mark trigger counts every column, this one included.)
ALTER TABLE hosts ADD COLUMN agent_version TEXT;
ALTER TABLE servers ADD COLUMN version TEXT;
CREATE TABLE schema_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
