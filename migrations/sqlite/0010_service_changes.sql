-- What changed, by service: a row per change to a service, its deployments, or one of its
-- tasks' state, host, migration, health, drain or stop reason, whoever made it (an API
-- call, an agent's sync, a pass, another server). The scheduler's pass reads the rows
-- added since its last one and reconciles those services only; a full pass now and then
-- is the safety net. Rows the scheduler has read are deleted by it.
CREATE TABLE service_changes (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    service TEXT NOT NULL,
    at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX service_changes_at ON service_changes (at);

CREATE TRIGGER services_changed_insert AFTER INSERT ON services
BEGIN
    INSERT INTO service_changes (service) VALUES (NEW.name);
END;
CREATE TRIGGER services_changed_update AFTER UPDATE ON services
BEGIN
    INSERT INTO service_changes (service) VALUES (NEW.name);
END;
CREATE TRIGGER deployments_changed_insert AFTER INSERT ON deployments
BEGIN
    INSERT INTO service_changes (service) VALUES (NEW.service);
END;
CREATE TRIGGER deployments_changed_update AFTER UPDATE ON deployments
BEGIN
    INSERT INTO service_changes (service) VALUES (NEW.service);
END;
CREATE TRIGGER tasks_changed_insert AFTER INSERT ON tasks
BEGIN
    INSERT INTO service_changes (service) VALUES (NEW.service);
END;
-- Only what a service's plan reads: measured use, work, ports and placement messages
-- change often and decide nothing there.
CREATE TRIGGER tasks_changed_update AFTER UPDATE ON tasks
WHEN OLD.state IS NOT NEW.state
  OR OLD.host_id IS NOT NEW.host_id
  OR OLD.migrating IS NOT NEW.migrating
  OR OLD.health IS NOT NEW.health
  OR OLD.drain_until IS NOT NEW.drain_until
  OR OLD.stop_reason IS NOT NEW.stop_reason
BEGIN
    INSERT INTO service_changes (service) VALUES (NEW.service);
END;

-- Draining, impaired and lost hosts are few: each pass finds them by this index.
CREATE INDEX hosts_status ON hosts (status);
-- Hosts silent past the lost timeout: each pass finds them by this index, not by reading
-- every host.
CREATE INDEX hosts_last_seen ON hosts (last_seen_at);
