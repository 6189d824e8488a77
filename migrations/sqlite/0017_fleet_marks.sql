-- Change marks for the fleet read model (control/src/parts/fleet.rs): every write that
-- changes what the model shows of a task or a host gives its row a mark greater than any
-- before, so the model reads only the rows changed since its last reading.
--
-- SQLite has one writer at a time. The triggers mark a row with the counter's value
-- (`fleet_clock`); a reading first moves the counter on (a write, so it falls between two
-- writers' transactions, never inside one) to m, then reads the rows marked >= m' (where
-- its last reading moved it to). Every transaction before the move marked below m and is
-- visible to the reads that follow; every one after marks m or more and is read next time.
-- A row marked once per transaction costs one statement, not two.
--
-- Columns left out on purpose: a task's `work` (the application's figures, read by the
-- work pages, not the model), a host's `last_seen_at` and `agent_token_hash` (written on
-- every sync; the model shows neither), and a task's measured `gpu_memory_peak_mib` and
-- `sm_percent` (they move with nearly every sync: the model reads them for every task on
-- a period of its own instead). A column added to `tasks` or `hosts` that the model shows
-- must be added to its trigger's WHEN clause here (a store test compares these lists
-- with the tables' columns).
CREATE TABLE fleet_clock (
    one  INTEGER PRIMARY KEY NOT NULL CHECK (one = 1),
    mark INTEGER NOT NULL
);
INSERT INTO fleet_clock (one, mark) VALUES (1, 1);

ALTER TABLE tasks ADD COLUMN fleet_mark INTEGER NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN fleet_mark INTEGER NOT NULL DEFAULT 0;
CREATE INDEX tasks_fleet_mark ON tasks (fleet_mark);
CREATE INDEX hosts_fleet_mark ON hosts (fleet_mark);

CREATE TRIGGER tasks_mark_insert AFTER INSERT ON tasks BEGIN
    UPDATE tasks SET fleet_mark = (SELECT mark FROM fleet_clock) WHERE id = NEW.id;
END;

CREATE TRIGGER tasks_mark_update AFTER UPDATE ON tasks
WHEN NEW.fleet_mark = OLD.fleet_mark AND (
    NEW.state IS NOT OLD.state OR NEW.host_id IS NOT OLD.host_id
    OR NEW.placement_message IS NOT OLD.placement_message
    OR NEW.stop_reason IS NOT OLD.stop_reason OR NEW.exit_code IS NOT OLD.exit_code
    OR NEW.migrating IS NOT OLD.migrating
    OR NEW.ports IS NOT OLD.ports OR NEW.health IS NOT OLD.health
    OR NEW.health_output IS NOT OLD.health_output OR NEW.drain_until IS NOT OLD.drain_until
    OR NEW.started_at IS NOT OLD.started_at OR NEW.stopped_at IS NOT OLD.stopped_at
    OR NEW.service IS NOT OLD.service OR NEW.deployment_id IS NOT OLD.deployment_id
    OR NEW.family IS NOT OLD.family OR NEW.revision IS NOT OLD.revision
    OR NEW.pool IS NOT OLD.pool OR NEW.cpu_milli IS NOT OLD.cpu_milli
    OR NEW.memory_mib IS NOT OLD.memory_mib)
BEGIN
    UPDATE tasks SET fleet_mark = (SELECT mark FROM fleet_clock) WHERE id = NEW.id;
END;

-- What a task holds is part of the task.
CREATE TRIGGER task_gpus_mark_insert AFTER INSERT ON task_gpus BEGIN
    UPDATE tasks SET fleet_mark = (SELECT mark FROM fleet_clock)
     WHERE id = NEW.task_id AND fleet_mark <> (SELECT mark FROM fleet_clock);
END;
CREATE TRIGGER task_gpus_mark_delete AFTER DELETE ON task_gpus BEGIN
    UPDATE tasks SET fleet_mark = (SELECT mark FROM fleet_clock)
     WHERE id = OLD.task_id AND fleet_mark <> (SELECT mark FROM fleet_clock);
END;

CREATE TRIGGER hosts_mark_insert AFTER INSERT ON hosts BEGIN
    UPDATE hosts SET fleet_mark = (SELECT mark FROM fleet_clock) WHERE id = NEW.id;
END;

CREATE TRIGGER hosts_mark_update AFTER UPDATE ON hosts
WHEN NEW.fleet_mark = OLD.fleet_mark AND (
    NEW.pool IS NOT OLD.pool OR NEW.status IS NOT OLD.status
    OR NEW.simulated IS NOT OLD.simulated OR NEW.cpu_milli IS NOT OLD.cpu_milli
    OR NEW.memory_mib IS NOT OLD.memory_mib OR NEW.labels IS NOT OLD.labels
    OR NEW.status_reason IS NOT OLD.status_reason OR NEW.mps_restarts IS NOT OLD.mps_restarts
    OR NEW.address IS NOT OLD.address OR NEW.dynamic_ports_free IS NOT OLD.dynamic_ports_free
    OR NEW.held IS NOT OLD.held OR NEW.pending_gpus IS NOT OLD.pending_gpus)
BEGIN
    UPDATE hosts SET fleet_mark = (SELECT mark FROM fleet_clock) WHERE id = NEW.id;
END;

-- A host's GPUs are part of the host.
CREATE TRIGGER gpus_mark_insert AFTER INSERT ON gpus BEGIN
    UPDATE hosts SET fleet_mark = (SELECT mark FROM fleet_clock)
     WHERE id = NEW.host_id AND fleet_mark <> (SELECT mark FROM fleet_clock);
END;
-- Every sync writes each GPU it reports again: only a change counts.
CREATE TRIGGER gpus_mark_update AFTER UPDATE ON gpus
WHEN NEW.host_id IS NOT OLD.host_id OR NEW.idx IS NOT OLD.idx OR NEW.model IS NOT OLD.model
    OR NEW.memory_mib IS NOT OLD.memory_mib OR NEW.mps_client_limit IS NOT OLD.mps_client_limit
    OR NEW.health IS NOT OLD.health OR NEW.sharing_mode IS NOT OLD.sharing_mode
BEGIN
    UPDATE hosts SET fleet_mark = (SELECT mark FROM fleet_clock)
     WHERE id IN (NEW.host_id, OLD.host_id);
END;
CREATE TRIGGER gpus_mark_delete AFTER DELETE ON gpus BEGIN
    UPDATE hosts SET fleet_mark = (SELECT mark FROM fleet_clock)
     WHERE id = OLD.host_id AND fleet_mark <> (SELECT mark FROM fleet_clock);
END;
