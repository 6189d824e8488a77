-- What a host's agent can enforce is shown with the host: a change of it marks the host's
-- row for the fleet read model, as its other shown columns do (0017_fleet_marks.sql).
DROP TRIGGER hosts_mark_update;
CREATE TRIGGER hosts_mark_update AFTER UPDATE ON hosts
WHEN NEW.fleet_mark = OLD.fleet_mark AND (
    NEW.pool IS NOT OLD.pool OR NEW.status IS NOT OLD.status
    OR NEW.simulated IS NOT OLD.simulated OR NEW.cpu_milli IS NOT OLD.cpu_milli
    OR NEW.memory_mib IS NOT OLD.memory_mib OR NEW.labels IS NOT OLD.labels
    OR NEW.status_reason IS NOT OLD.status_reason OR NEW.mps_restarts IS NOT OLD.mps_restarts
    OR NEW.address IS NOT OLD.address OR NEW.dynamic_ports_free IS NOT OLD.dynamic_ports_free
    OR NEW.held IS NOT OLD.held OR NEW.pending_gpus IS NOT OLD.pending_gpus
    OR NEW.capabilities IS NOT OLD.capabilities)
BEGIN
    UPDATE hosts SET fleet_mark = (SELECT mark FROM fleet_clock) WHERE id = NEW.id;
END;
