-- Error history (proletarian_ref.error_history, docs/errors.md): an optional side table beside the job
-- table, never read or written by Proletarian itself. One row per failed attempt, written by the worker in
-- the transaction that retries or archives the job, so it commits and rolls back with that write.
-- {job_table} and {error_table} are validated identifiers; every value is a bound parameter.
-- DATETIME(6) holds UTC wall-clock time whatever the session time zone, which the caller's session keeps.

-- name: create_table
CREATE TABLE IF NOT EXISTS {error_table}
(
    error_id        BIGINT       NOT NULL AUTO_INCREMENT, -- insertion order (`retry` restarts attempts at 1)
    job_id          BINARY(16)   NOT NULL,                -- the job (queued or archived) that failed
    attempt         INT          NOT NULL,                -- the attempt that failed, from 1
    error_type      VARCHAR(255) NOT NULL,                -- the exception's qualified class name
    message         TEXT         NOT NULL,                -- str(exception), truncated (MAX_MESSAGE)
    traceback       MEDIUMTEXT   NOT NULL,                -- the formatted traceback, truncated (MAX_TRACEBACK)
    queue_worker_id VARCHAR(255) NOT NULL,                -- the worker's queue_worker_id ('' by hand)
    host            VARCHAR(255) NOT NULL,                -- socket.gethostname() of the worker's process
    thread          VARCHAR(64)  NOT NULL,                -- the worker thread (or task) number, '' by hand
    failed_at       DATETIME(6)  NOT NULL,                -- when the failure was written (UTC)
    PRIMARY KEY (job_id, error_id),                       -- a job's rows together, oldest first
    KEY (error_id)                                        -- AUTO_INCREMENT leads an index of its own
) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin

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
DELETE FROM {error_table} WHERE job_id IN %(job_ids)s

-- name: table_exists
SELECT COUNT(*) > 0 FROM information_schema.TABLES
WHERE TABLE_SCHEMA = COALESCE(%(schema)s, DATABASE()) AND TABLE_NAME = %(name)s
