-- Statements behind the operations commands (list, show, retry, cancel, reschedule, purge, health), MySQL.
-- {job_table} and {archived_job_table} are filled with validated identifiers; every value is a bound parameter.
-- Times are bound as UTC wall-clock values in whole seconds on a session whose time_zone is '+00:00'.

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
-- Which of these queued jobs no worker holds: SKIP LOCKED passes over the others, which are running. Run
-- at READ COMMITTED in a transaction of its own, rolled back at once.
SELECT job_id FROM {job_table} WHERE job_id IN %(job_ids)s FOR UPDATE SKIP LOCKED

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
-- after %(after_id)s. A plain read at READ COMMITTED locks nothing, and the batches walk the primary key
-- once (the archive has no index on finished_at, and none is needed): a DELETE ... LIMIT with that filter
-- would scan and, at REPEATABLE READ, lock every row and gap it passes, making workers' archive INSERTs
-- wait.
SELECT job_id
FROM {archived_job_table}
WHERE (%(first_batch)s OR job_id > %(after_id)s)
  AND finished_at < %(before)s
  AND (%(any_queue)s OR queue = %(queue)s)
  AND (%(any_status)s OR status = %(status)s)
ORDER BY job_id
LIMIT %(batch)s

-- name: purge_batch
-- Step 2: delete those rows by primary key (record locks on them alone), still matching the filter.
DELETE FROM {archived_job_table}
WHERE job_id IN %(job_ids)s
  AND finished_at < %(before)s
  AND (%(any_queue)s OR queue = %(queue)s)
  AND (%(any_status)s OR status = %(status)s)

-- name: table_columns
-- The columns of a table; an unqualified name is looked up in the connection's current database.
SELECT column_name
FROM information_schema.columns
WHERE table_schema = COALESCE(%(schema)s, DATABASE()) AND table_name = %(name)s
ORDER BY ordinal_position

-- name: long_claims
-- InnoDB transactions holding row locks for over %(max_seconds)s s, of sessions on this connection's database:
-- a worker's claim is a transaction that holds the job's row lock while the handler runs. The server keeps
-- no statement text of an idle transaction to match on. Ages come from the server's clock, as trx_started does.
SELECT trx.trx_mysql_thread_id, TIMESTAMPDIFF(SECOND, trx.trx_started, NOW()) AS seconds, trx.trx_state,
       trx.trx_rows_locked
FROM information_schema.innodb_trx AS trx
JOIN information_schema.processlist AS session ON session.id = trx.trx_mysql_thread_id
WHERE trx.trx_mysql_thread_id <> CONNECTION_ID()
  AND session.db <=> DATABASE()
  AND trx.trx_rows_locked > 0
  AND TIMESTAMPDIFF(SECOND, trx.trx_started, NOW()) > %(max_seconds)s
ORDER BY trx.trx_started
