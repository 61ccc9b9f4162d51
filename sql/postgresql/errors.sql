-- Error history (proletarian_ref.error_history, docs/errors.md): an optional side table beside the job
-- table, never read or written by Proletarian itself. One row per failed attempt, written by the worker in
-- the transaction that retries or archives the job, so it commits and rolls back with that write.
-- {job_table} and {error_table} are validated identifiers; every value is a bound parameter.

-- name: create_table
CREATE TABLE IF NOT EXISTS {error_table}
(
    error_id        BIGINT GENERATED ALWAYS AS IDENTITY, -- insertion order (`retry` restarts attempts at 1)
    job_id          UUID        NOT NULL,     -- the job (queued or archived) that failed
    attempt         INTEGER     NOT NULL,     -- the attempt that failed, from 1
    error_type      TEXT        NOT NULL,     -- the exception's qualified class name
    message         TEXT        NOT NULL,     -- str(exception), truncated (error_history.MAX_MESSAGE)
    traceback       TEXT        NOT NULL,     -- the formatted traceback, truncated (MAX_TRACEBACK)
    queue_worker_id TEXT        NOT NULL,     -- the worker's queue_worker_id ('' when run by hand)
    host            TEXT        NOT NULL,     -- socket.gethostname() of the worker's process
    thread          TEXT        NOT NULL,     -- the worker thread (or task) number, '' when run by hand
    failed_at       TIMESTAMPTZ NOT NULL,     -- when the failure was written (the worker's clock)
    PRIMARY KEY (job_id, error_id)            -- a job's rows together, oldest first
)

-- name: insert
INSERT INTO {error_table}
    (job_id, attempt, error_type, message, traceback, queue_worker_id, host, thread, failed_at)
VALUES (%(job_id)s, %(attempt)s, %(error_type)s, %(message)s, %(traceback)s, %(queue_worker_id)s,
        %(host)s, %(thread)s, %(failed_at)s)

-- name: oldest_kept
-- The error_id of the job's newest row past the %(keep)s kept ones: it and older rows go (bounded size).
SELECT error_id FROM {error_table} WHERE job_id = %(job_id)s ORDER BY error_id DESC LIMIT 1 OFFSET %(keep)s

-- name: trim
DELETE FROM {error_table} WHERE job_id = %(job_id)s AND error_id <= %(error_id)s

-- name: history
SELECT attempt, error_type, message, traceback, queue_worker_id, host, thread, failed_at
FROM {error_table} WHERE job_id = %(job_id)s ORDER BY error_id

-- name: purge_batch
-- Beside ops.sql's purge_batch, in its transaction: the history of the archived jobs it deletes.
DELETE FROM {error_table} WHERE job_id = ANY(%(job_ids)s)

-- name: table_exists
SELECT to_regclass(%(table)s) IS NOT NULL
