-- GPUs a host's agent reports beyond what the host was admitted with (a new one, a
-- replacement, a changed model or memory), in a pool with manual admission: a JSON list of
-- {uuid, index, model, memory, mps_client_limit, why}, kept out of the gpus table (so out
-- of capacity) until an admin approves them. NULL: none.
ALTER TABLE hosts ADD COLUMN pending_gpus TEXT;
