-- Statements behind the operations commands (list, show, retry, cancel, reschedule, purge, health), PostgreSQL.
-- {job_table} and {archived_job_table} are filled with validated identifiers; every value is a bound parameter.
-- Times are bound as ISO 8601 text with a +00:00 offset, as queries.sql binds them.

-- Filters: each %(any_x)s flag is true when that filter is not given, so one statement serves every
-- combination and the placeholders never need a type of their own.

-- name: list_queued
-- A page of queued jobs, next to run first, after the keyset (%(after_at)s, %(after_id)s); never OFFSET.
SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at
FROM {job_table}
WHERE (%(any_queue)s OR queue = %(queue)s)
  AND (%(any_job_type)s OR job_type = %(job_type)s)
  AND (%(any_min_attempts)s OR attempts >= %(min_attempts)s)
  AND (%(any_max_attempts)s OR attempts <= %(max_attempts)s)
  AND (%(any_enqueued_before)s OR enqueued_at <= %(enqueued_before)s)
  AND (%(any_enqueued_after)s OR enqueued_at >= %(enqueued_after)s)
  AND (%(any_due_by)s OR process_at <= %(due_by)s)
  AND (%(any_due_after)s OR process_at > %(due_after)s)
  AND (%(first_page)s OR process_at > %(after_at)s OR (process_at = %(after_at)s AND job_id > %(after_id)s))
ORDER BY process_at, job_id
LIMIT %(limit)s

-- name: list_archived
-- A page of archived jobs, last finished first, after the keyset (%(after_at)s, %(after_id)s); never OFFSET.
SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at, status, finished_at
FROM {archived_job_table}
WHERE (%(any_queue)s OR queue = %(queue)s)
  AND (%(any_job_type)s OR job_type = %(job_type)s)
  AND (%(any_status)s OR status = %(status)s)
  AND (%(any_min_attempts)s OR attempts >= %(min_attempts)s)
  AND (%(any_max_attempts)s OR attempts <= %(max_attempts)s)
  AND (%(any_enqueued_before)s OR enqueued_at <= %(enqueued_before)s)
  AND (%(any_enqueued_after)s OR enqueued_at >= %(enqueued_after)s)
  AND (%(first_page)s OR finished_at < %(after_at)s OR (finished_at = %(after_at)s AND job_id < %(after_id)s))
ORDER BY finished_at DESC, job_id DESC
LIMIT %(limit)s

-- name: free_jobs
-- Which of these queued jobs no worker holds (see stats.sql, waiting_stats): the others are running.
SELECT job_id
FROM {job_table}
WHERE job_id = ANY(%(job_ids)s)
  AND NOT (xmax <> '0'::xid
           AND xmax IN (SELECT transactionid FROM pg_locks WHERE locktype = 'transactionid' AND granted))

-- name: show_queued
SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at
FROM {job_table}
WHERE job_id = %(job_id)s

-- name: show_archived
SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at, status, finished_at
FROM {archived_job_table}
WHERE job_id = %(job_id)s

-- name: lock_archived
-- Retry, step 1: lock the archived row, a failure or a cancelled job. A second retry of the same job waits
-- here, then finds it gone.
SELECT job_id, status
FROM {archived_job_table}
WHERE job_id = %(job_id)s AND status IN (%(status)s, %(other_status)s)
FOR UPDATE

-- name: requeue_archived
-- Retry, step 2: the row Proletarian's enqueue! wrote, copied column for column (same id, queue, job
-- type, payload text and enqueued_at), with attempts back to 0 and a new process_at.
INSERT INTO {job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, process_at)
SELECT job_id, queue, job_type, payload, 0, enqueued_at, %(process_at)s
FROM {archived_job_table}
WHERE job_id = %(job_id)s

-- name: delete_archived
-- Retry, step 3.
DELETE FROM {archived_job_table} WHERE job_id = %(job_id)s

-- name: lock_queued
-- Cancel and reschedule: lock a queued job unless a worker holds it (is running it right now).
SELECT job_id FROM {job_table} WHERE job_id = %(job_id)s FOR UPDATE SKIP LOCKED

-- name: queued_exists
-- Told apart after lock_queued found nothing: a job being run (locked) from one that does not exist.
SELECT COUNT(*) FROM {job_table} WHERE job_id = %(job_id)s

-- name: archive_cancelled
-- Cancel, step 2: archive_job's copy with the attempts unchanged (the job did not run) and its own status.
INSERT INTO {archived_job_table} (job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at)
SELECT job_id, queue, job_type, payload, attempts, %(status)s, enqueued_at, process_at, %(finished_at)s
FROM {job_table}
WHERE job_id = %(job_id)s

-- name: delete_queued
-- Cancel, step 3.
DELETE FROM {job_table} WHERE job_id = %(job_id)s

-- name: reschedule_queued
UPDATE {job_table} SET process_at = %(process_at)s WHERE job_id = %(job_id)s

-- name: purge_count
-- How many archived rows finished before %(before)s a purge would delete.
SELECT COUNT(*)
FROM {archived_job_table}
WHERE finished_at < %(before)s
  AND (%(any_queue)s OR queue = %(queue)s)
  AND (%(any_status)s OR status = %(status)s)

-- name: purge_ids
-- A purge batch, step 1: the next %(batch)s archived rows finished before %(before)s, in primary key order
-- after %(after_id)s, so that the batches walk the key once instead of rescanning what earlier ones passed
-- over (the archive has no index on finished_at, and none is needed). Rows another purge is deleting are
-- skipped, not waited for.
SELECT job_id
FROM {archived_job_table}
WHERE (%(first_batch)s OR job_id > %(after_id)s)
  AND finished_at < %(before)s
  AND (%(any_queue)s OR queue = %(queue)s)
  AND (%(any_status)s OR status = %(status)s)
ORDER BY job_id
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED

-- name: purge_batch
-- Step 2: delete those rows, locked by step 1.
DELETE FROM {archived_job_table} WHERE job_id = ANY(%(job_ids)s)

-- name: table_columns
-- The columns of a table, found on the search_path as the core's SQL finds it.
SELECT attname
FROM pg_attribute
WHERE attrelid = to_regclass(%(qualified)s) AND attnum > 0 AND NOT attisdropped
ORDER BY attnum

-- name: long_claims
-- Transactions that have held a job claimed for over %(max_seconds)s s: a worker's claim is a transaction
-- left idle in transaction after its SELECT ... FOR UPDATE SKIP LOCKED on the job table while the handler
-- runs. Ages come from the server's clock, since xact_start does.
SELECT pid, EXTRACT(EPOCH FROM (clock_timestamp() - xact_start)) AS seconds, state, application_name
FROM pg_stat_activity
WHERE datname = current_database()
  AND pid <> pg_backend_pid()
  AND state IN ('idle in transaction', 'idle in transaction (aborted)', 'active')
  AND position('SKIP LOCKED' in query) > 0
  AND position(%(job_table)s in query) > 0
  AND clock_timestamp() - xact_start > make_interval(secs => %(max_seconds)s)
ORDER BY xact_start
