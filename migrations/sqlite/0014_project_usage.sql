-- What each project held in each pool over time: one row per project, pool and 5-minute
-- bucket, sampled by the reconcile loop once, halfway through the bucket. Fair share
-- compares projects' use over the last hour; the Projects page charts the last day.
CREATE TABLE project_usage (
    project         TEXT NOT NULL,
    pool            TEXT NOT NULL,
    bucket_start    INTEGER NOT NULL,
    gpus            INTEGER NOT NULL,
    gpu_memory_mib  INTEGER NOT NULL,
    compute_milli   INTEGER NOT NULL,
    cpu_milli       INTEGER NOT NULL,
    memory_mib      INTEGER NOT NULL,
    PRIMARY KEY (pool, bucket_start, project)
);
