-- Unique jobs (proletarian_ref.unique, docs/unique.md): an optional side table beside the job table, never
-- read or written by Proletarian itself. {job_table} and {unique_table} are validated identifiers; every
-- value is a bound parameter. A key counts as held only while the job its row names is still in the job
-- table, so a job archived by any worker (a Clojure one included) frees its key without a write here.
-- DATETIME(6) holds UTC wall-clock time whatever the session time zone, which the caller's session keeps.

-- name: create_table
CREATE TABLE IF NOT EXISTS {unique_table}
(
    unique_key VARCHAR(255) NOT NULL PRIMARY KEY, -- the caller's key, at most one live job per key
    job_id     BINARY(16)   NOT NULL,             -- the job that holds the key (last to take it)
    claimed_at DATETIME(6)  NOT NULL              -- when that job took the key (UTC)
) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin

-- name: claim
-- Take the key for a new job, or take the row of the job holding it with an exclusive lock (ON DUPLICATE
-- KEY UPDATE locks the existing row exclusively, where INSERT IGNORE would take a shared lock that two
-- claims then both try to upgrade: a deadlock). The holder is read by claim_holder.
INSERT INTO {unique_table} (unique_key, job_id, claimed_at)
VALUES (%(unique_key)s, %(job_id)s, %(claimed_at)s)
ON DUPLICATE KEY UPDATE job_id = job_id

-- name: claim_holder
-- The holder of the key claim locked: a locking read, so the latest committed row whatever the isolation.
SELECT job_id FROM {unique_table} WHERE unique_key = %(unique_key)s FOR UPDATE

-- name: holder_queued
-- Whether the holder is still in the job table (unique_until="archived"), without waiting for a worker's
-- row lock: a consistent read. Under REPEATABLE READ its snapshot may predate this transaction's lock on
-- the key row, so the key row is read again in the same snapshot: the job's absence is trusted only when
-- that snapshot already names the same holder (jobs never come back once archived).
SELECT held.job_id, job.job_id
FROM {unique_table} AS held LEFT JOIN {job_table} AS job ON job.job_id = held.job_id
WHERE held.unique_key = %(unique_key)s

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
DELETE held FROM {unique_table} AS held
LEFT JOIN {job_table} AS job ON job.job_id = held.job_id
WHERE job.job_id IS NULL

-- name: table_exists
SELECT COUNT(*) > 0 FROM information_schema.TABLES
WHERE TABLE_SCHEMA = COALESCE(%(schema)s, DATABASE()) AND TABLE_NAME = %(name)s
