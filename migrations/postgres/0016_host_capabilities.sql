-- What a host's agent can enforce there (GPU discovery, MPS, device isolation, cgroup
-- limits, task uids, containers), as a JSON object of {held, detail} per capability, as
-- its agent last said. NULL: not said yet (or an agent older than this column).
ALTER TABLE hosts ADD COLUMN capabilities TEXT;
