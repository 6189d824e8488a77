-- Change marks for the fleet read model (control/src/parts/fleet.rs): every write that
-- changes what the model shows of a task or a host gives its row its transaction's id, so
-- the model reads only the rows changed since its last reading.
--
-- PostgreSQL has many writers at once, so marks are not in commit order. A reader first
-- takes its snapshot's xmin (every transaction below it has ended), then reads the rows
-- marked >= its last xmin: every transaction below the new xmin that committed is visible
-- to it, and every one at or above it is read again next time (rows marked >= new xmin).
--
-- Columns left out on purpose: a task's `work` (the application's figures, read by the
-- work pages, not the model), a host's `last_seen_at` and `agent_token_hash` (written on
-- every sync; the model shows neither), and a task's measured `gpu_memory_peak_mib` and
-- `sm_percent` (they move with nearly every sync: the model reads them for every task on
-- a period of its own instead). Every other column counts, new ones included.
ALTER TABLE tasks ADD COLUMN fleet_mark BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN fleet_mark BIGINT NOT NULL DEFAULT 0;
CREATE INDEX tasks_fleet_mark ON tasks (fleet_mark);
CREATE INDEX hosts_fleet_mark ON hosts (fleet_mark);

CREATE FUNCTION fleet_mark_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.fleet_mark := pg_current_xact_id()::text::bigint;
    RETURN NEW;
END
$$;

CREATE TRIGGER tasks_mark_insert BEFORE INSERT ON tasks
    FOR EACH ROW EXECUTE FUNCTION fleet_mark_row();
CREATE TRIGGER tasks_mark_update BEFORE UPDATE ON tasks
    FOR EACH ROW
    WHEN ((to_jsonb(OLD) - 'work' - 'gpu_memory_peak_mib' - 'sm_percent' - 'fleet_mark')
          IS DISTINCT FROM (to_jsonb(NEW) - 'work' - 'gpu_memory_peak_mib' - 'sm_percent' - 'fleet_mark'))
    EXECUTE FUNCTION fleet_mark_row();
CREATE TRIGGER hosts_mark_insert BEFORE INSERT ON hosts
    FOR EACH ROW EXECUTE FUNCTION fleet_mark_row();
CREATE TRIGGER hosts_mark_update BEFORE UPDATE ON hosts
    FOR EACH ROW
    WHEN ((to_jsonb(OLD) - 'last_seen_at' - 'agent_token_hash' - 'fleet_mark')
          IS DISTINCT FROM (to_jsonb(NEW) - 'last_seen_at' - 'agent_token_hash' - 'fleet_mark'))
    EXECUTE FUNCTION fleet_mark_row();

-- What a task holds is part of the task; a host's GPUs are part of the host.
CREATE FUNCTION fleet_mark_owner() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    mark BIGINT := pg_current_xact_id()::text::bigint;
BEGIN
    IF TG_TABLE_NAME = 'task_gpus' THEN
        UPDATE tasks SET fleet_mark = mark
         WHERE id = CASE WHEN TG_OP = 'DELETE' THEN OLD.task_id ELSE NEW.task_id END
           AND fleet_mark <> mark;
    ELSE
        IF TG_OP <> 'INSERT' THEN
            UPDATE hosts SET fleet_mark = mark WHERE id = OLD.host_id AND fleet_mark <> mark;
        END IF;
        IF TG_OP <> 'DELETE' THEN
            UPDATE hosts SET fleet_mark = mark WHERE id = NEW.host_id AND fleet_mark <> mark;
        END IF;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER task_gpus_mark AFTER INSERT OR DELETE ON task_gpus
    FOR EACH ROW EXECUTE FUNCTION fleet_mark_owner();
CREATE TRIGGER gpus_mark AFTER INSERT OR DELETE ON gpus
    FOR EACH ROW EXECUTE FUNCTION fleet_mark_owner();
-- Every sync writes each GPU it reports again: only a change counts.
CREATE TRIGGER gpus_mark_update AFTER UPDATE ON gpus
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*)
    EXECUTE FUNCTION fleet_mark_owner();
