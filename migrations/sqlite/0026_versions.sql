-- Versions (model/src/version.rs): what each host's agent says it is, what each server
-- is, and which servers the schema keeps.
--
-- The policy: migrations only add. A server of the previous minor version runs on the
-- schema a newer one wrote; `schema_meta` says which: `written_by` (the newest server
-- that migrated it) and `oldest_server` (the oldest version that may still run on it).
-- A server that finds migrations it does not know reads these before it writes anything.
ALTER TABLE hosts ADD COLUMN agent_version TEXT;
ALTER TABLE servers ADD COLUMN version TEXT;
CREATE TABLE schema_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);

-- The version is shown with the host: its change marks the row for the fleet read model
-- (0017_fleet_marks.sql; 0021 last wrote this trigger).
DROP TRIGGER hosts_mark_update;
CREATE TRIGGER hosts_mark_update AFTER UPDATE ON hosts
WHEN NEW.fleet_mark = OLD.fleet_mark AND (
    NEW.pool IS NOT OLD.pool OR NEW.status IS NOT OLD.status
    OR NEW.simulated IS NOT OLD.simulated OR NEW.cpu_milli IS NOT OLD.cpu_milli
    OR NEW.memory_mib IS NOT OLD.memory_mib OR NEW.labels IS NOT OLD.labels
    OR NEW.status_reason IS NOT OLD.status_reason OR NEW.mps_restarts IS NOT OLD.mps_restarts
    OR NEW.address IS NOT OLD.address OR NEW.dynamic_ports_free IS NOT OLD.dynamic_ports_free
    OR NEW.held IS NOT OLD.held OR NEW.pending_gpus IS NOT OLD.pending_gpus
    OR NEW.capabilities IS NOT OLD.capabilities OR NEW.agent_version IS NOT OLD.agent_version)
BEGIN
    UPDATE hosts SET fleet_mark = (SELECT mark FROM fleet_clock) WHERE id = NEW.id;
END;
