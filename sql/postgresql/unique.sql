-- Unique jobs (proletarian_ref.unique, docs/unique.md): an optional side table beside the job table, never
-- read or written by Proletarian itself. {job_table} and {unique_table} are validated identifiers; every
-- value is a bound parameter. A key counts as held only while the job its row names is still in the job
-- table, so a job archived by any worker (a Clojure one included) frees its key without a write here.

-- name: create_table
CREATE TABLE IF NOT EXISTS {unique_table}
(
    unique_key TEXT PRIMARY KEY,        -- the caller's key, at most one live job per key
    job_id     UUID        NOT NULL,    -- the job that holds the key (last to take it)
    claimed_at TIMESTAMPTZ NOT NULL     -- when that job took the key
)

-- name: claim
-- Take the key for a new job, or lock the row of the job holding it: either way the row is locked until the
-- caller's transaction ends, and the id returned is the holder's (the new job's when the key was free of
-- rows). A concurrent claim of the same key waits here for this transaction, then reads what it committed.
INSERT INTO {unique_table} AS held (unique_key, job_id, claimed_at)
VALUES (%(unique_key)s, %(job_id)s, %(claimed_at)s)
ON CONFLICT (unique_key) DO UPDATE SET job_id = held.job_id
RETURNING job_id

-- name: holder_queued
-- Whether the holder is still in the job table (unique_until="archived"). A plain read: READ COMMITTED
-- sees the archive of every committed worker transaction, and a running job's row lock does not block it.
SELECT 1 FROM {job_table} WHERE job_id = %(job_id)s

-- name: holder_waiting
-- Whether the holder is in the job table and not running (unique_until="started"): a worker's claim holds
-- its row lock until the job is archived or retried, so a locked row is a job that has started.
SELECT 1 FROM {job_table} WHERE job_id = %(job_id)s FOR UPDATE SKIP LOCKED

-- name: take_over
-- Give the key, whose holder is gone, to the new job; the row is locked by claim, so the count is one.
UPDATE {unique_table} SET job_id = %(job_id)s, claimed_at = %(claimed_at)s
WHERE unique_key = %(unique_key)s AND job_id = %(holder_id)s

-- name: prune
-- Delete the rows of keys whose job is gone (no job holds them); the keys are free with or without them.
DELETE FROM {unique_table} AS held
WHERE NOT EXISTS (SELECT 1 FROM {job_table} AS job WHERE job.job_id = held.job_id)

-- name: table_exists
SELECT to_regclass(%(table)s) IS NOT NULL
