-- Proletarian 1.0.109's five statements (db.clj), PostgreSQL dialect, plus the database-generated id insert.
-- {job_table} and {archived_job_table} are filled with validated identifiers; every value is a bound parameter.
-- Timestamps are bound as ISO 8601 text with a +00:00 offset and no declared type, as pgjdbc's setTimestamp
-- does: the server reads them as the exact instant for TIMESTAMPTZ and as UTC wall-clock time for a legacy
-- TIMESTAMP column, whatever the session TimeZone.

-- name: enqueue
-- (E) Insert one job on the caller's connection, inside whatever transaction it is in.
INSERT INTO {job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, process_at)
VALUES (%(job_id)s, %(queue)s, %(job_type)s, %(payload)s, %(attempts)s, %(enqueued_at)s, %(process_at)s)

-- name: enqueue_db_generated
-- (E) without job_id, for the database-generated id strategy; returns the id the column default made.
INSERT INTO {job_table} (queue, job_type, payload, attempts, enqueued_at, process_at)
VALUES (%(queue)s, %(job_type)s, %(payload)s, %(attempts)s, %(enqueued_at)s, %(process_at)s)
RETURNING job_id

-- name: get_next_job
-- (S) Claim the oldest due job of a queue; the row lock is the only lease and lasts until commit.
SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at
FROM {job_table}
WHERE queue = %(queue)s AND process_at <= %(now)s
ORDER BY process_at ASC
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: archive_job
-- (A) Copy the job to the archive with the stored payload text, attempts + 1, status and finished_at.
INSERT INTO {archived_job_table} (job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at)
SELECT job_id, queue, job_type, payload, attempts + 1, %(status)s, enqueued_at, process_at, %(finished_at)s
FROM {job_table}
WHERE job_id = %(job_id)s

-- name: delete_job
-- (D) Remove the job after archiving it.
DELETE FROM {job_table} WHERE job_id = %(job_id)s

-- name: archive_and_delete_job
-- The compact plan's (A) and (D) in one statement (PostgresBackend(compact=True); not Proletarian's plan,
-- which sends archive_job and delete_job apart): the DELETE returns the job's row as stored, and the INSERT
-- archives exactly what archive_job would copy from it, attempts + 1, status and finished_at. Its row count
-- is the archived rows', which are the deleted rows'.
WITH moved AS (
    DELETE FROM {job_table} WHERE job_id = %(job_id)s
    RETURNING job_id, queue, job_type, payload, attempts, enqueued_at, process_at
)
INSERT INTO {archived_job_table} (job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at)
SELECT job_id, queue, job_type, payload, attempts + 1, %(status)s, enqueued_at, process_at, %(finished_at)s
FROM moved

-- name: archive_and_delete_job_checked
-- archive_and_delete_job for the chained pipeline (PostgresBackend(pipeline=True, compact=True, chain=True)),
-- which sends the job's COMMIT, the next BEGIN and the next claim after it in the same exchange, before its
-- row count comes back: so the server checks the count itself. The same DELETE and INSERT write the same
-- rows; a count other than 1 fails the statement (invalid text for an integer, which carries the count), the
-- transaction is aborted and the COMMIT queued after it does nothing, as a count checked by the client
-- before COMMIT rolls everything back. Its own result is one row, 1.
WITH moved AS (
    DELETE FROM {job_table} WHERE job_id = %(job_id)s
    RETURNING job_id, queue, job_type, payload, attempts, enqueued_at, process_at
), archived AS (
    INSERT INTO {archived_job_table} (job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at)
    SELECT job_id, queue, job_type, payload, attempts + 1, %(status)s, enqueued_at, process_at, %(finished_at)s
    FROM moved
    RETURNING 1
)
SELECT CAST(CASE count(*) WHEN 1 THEN '1' ELSE 'archive_and_delete_job changed ' || count(*) || ' rows' END AS integer)
FROM archived

-- name: synchronous_commit_off
-- The first statement of the worker's own job transaction with PostgresBackend(synchronous_commit_off=True)
-- (docs/worker.md, "Asynchronous commit"): its COMMIT returns before the WAL reaches disk. LOCAL: the
-- setting ends with the transaction, so the connection, a pool's included, is back to the server's
-- setting after it. Never sent on a caller's connection: enqueue keeps the server's durability.
SET LOCAL synchronous_commit = off

-- name: chain_commit
-- The chained plan (PostgresBackend(chain=True), backend.ChainedClaim; not Proletarian's plan, whose worker
-- ends every job's transaction and polls again in a new one): the finished job's transaction commits and
-- the next one begins at once, in one statement (PostgreSQL 12+), sent with the claim after it (one simple
-- query, or one pipeline sync); the next claim, get_next_job, runs in the new transaction. AND CHAIN gives
-- the new transaction the finished one's: the isolation level and access mode the connection was given,
-- which the chain's first BEGIN stated. A server before 12 gets chain_commit_plain (a plain COMMIT) and
-- chain_begin stating them instead.
COMMIT AND CHAIN

-- name: chain_commit_plain
COMMIT

-- name: chain_begin
BEGIN

-- name: retry_at
-- (R) Reschedule a failed job and count the failed attempt.
UPDATE {job_table} SET process_at = %(retry_at)s, attempts = attempts + 1 WHERE job_id = %(job_id)s

-- name: enqueue_copy
-- (E) for a batch (enqueue_many): every job's row streamed through one COPY, enqueue's columns and values.
-- No bind-parameter limit applies, and a failed COPY writes no row of the batch.
COPY {job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, process_at) FROM STDIN

-- name: enqueue_many_savepoint
-- Before a COPY that starts while the batch's later jobs are still being made, in the caller's
-- transaction: a bad job found part-way fails the COPY, which would leave that transaction refusing all
-- but a rollback; rolled back to and released, it leaves the transaction as it was.
SAVEPOINT proletarian_enqueue_many

-- name: enqueue_many_rollback
ROLLBACK TO SAVEPOINT proletarian_enqueue_many

-- name: enqueue_many_release
RELEASE SAVEPOINT proletarian_enqueue_many

-- name: enqueue_many_db_generated
-- (E) for a batch with the database-generated id strategy: {rows} is enqueue_many_db_generated_row once
-- per job. PostgreSQL returns the rows of INSERT ... VALUES in the order of the list (not a documented
-- promise; README, "Enqueueing a batch").
INSERT INTO {job_table} (queue, job_type, payload, attempts, enqueued_at, process_at)
VALUES {rows}
RETURNING job_id

-- name: enqueue_many_db_generated_row
(%s, %s, %s, %s, %s, %s)

-- name: enqueue_many
-- (E) for a batch on a PostgreSQL backend without COPY (SqlBackend's own way, e.g. over psycopg2): {rows}
-- is enqueue_many_row once per job; 1,000 rows of 7 values stay below the 65,535 bind parameters.
INSERT INTO {job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, process_at)
VALUES {rows}

-- name: enqueue_many_row
(%s, %s, %s, %s, %s, %s, %s)

-- name: get_next_jobs
-- (S) for batch mode: claim up to %(limit)s due jobs of a queue, oldest first, in one statement; their row
-- locks last until the batch commits.
SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at
FROM {job_table}
WHERE queue = %(queue)s AND process_at <= %(now)s
ORDER BY process_at ASC
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: archive_jobs
-- (A) for batch mode: archive_job of every finished job of the batch in one statement. The first two
-- placeholders are status and finished_at; {ids} is one placeholder per job id.
INSERT INTO {archived_job_table} (job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at)
SELECT job_id, queue, job_type, payload, attempts + 1, %s, enqueued_at, process_at, %s
FROM {job_table}
WHERE job_id IN ({ids})

-- name: delete_jobs
-- (D) for batch mode: delete every finished job of the batch in one statement; {ids} as in archive_jobs.
DELETE FROM {job_table} WHERE job_id IN ({ids})

-- name: archive_and_delete_jobs
-- The compact plan's (A) and (D) for batch mode in one statement (PostgresBackend(compact=True)):
-- archive_and_delete_job for every finished job of the batch. {ids} is one placeholder per job id, as in
-- archive_jobs and delete_jobs, and comes first here; the last two placeholders are status and finished_at.
-- The archived rows are those archive_jobs would copy; the row count is the archived rows', which are the
-- deleted rows'.
WITH moved AS (
    DELETE FROM {job_table} WHERE job_id IN ({ids})
    RETURNING job_id, queue, job_type, payload, attempts, enqueued_at, process_at
)
INSERT INTO {archived_job_table} (job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at)
SELECT job_id, queue, job_type, payload, attempts + 1, %s, enqueued_at, process_at, %s
FROM moved

-- name: archive_and_delete_jobs_checked
-- archive_and_delete_jobs for the chained pipeline in batch mode, its count checked by the server as in
-- archive_and_delete_job_checked: {ids} first, then status and finished_at, then the number of jobs twice
-- (the count expected, and the words of the error). The same rows as archive_and_delete_jobs.
WITH moved AS (
    DELETE FROM {job_table} WHERE job_id IN ({ids})
    RETURNING job_id, queue, job_type, payload, attempts, enqueued_at, process_at
), archived AS (
    INSERT INTO {archived_job_table} (job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at)
    SELECT job_id, queue, job_type, payload, attempts + 1, %s, enqueued_at, process_at, %s
    FROM moved
    RETURNING 1
)
SELECT CAST(CASE count(*) WHEN %s THEN '1' ELSE 'archive_and_delete_jobs changed ' || count(*) || ' rows of ' || %s || ' jobs' END AS integer)
FROM archived

-- name: job_savepoint
-- Batch mode: around a failed job's retry or failure archive, so that if they fail only they are undone.
SAVEPOINT proletarian_job

-- name: job_savepoint_rollback
ROLLBACK TO SAVEPOINT proletarian_job

-- name: job_savepoint_release
RELEASE SAVEPOINT proletarian_job

-- name: notify_enqueued
-- Announce jobs of the queues in %(queues)s (keyword text) to the workers listening on the job table's
-- channel: one statement for a whole batch, in the caller's transaction, so PostgreSQL delivers at commit
-- and never on rollback (identical notifications of one transaction fold into one). Kept apart from the
-- INSERT, so enqueue's statement stays Proletarian's.
SELECT pg_notify(%(channel)s, queue) FROM unnest(%(queues)s::text[]) AS queue

-- name: listen
-- The listener's own autocommit connection subscribes to the channel; {channel} is a quoted identifier made
-- from a validated table name (notification_channel).
LISTEN {channel}
