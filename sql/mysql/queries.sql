-- Proletarian 1.0.109's five statements (db.clj), MySQL dialect, plus the database-generated id insert.
-- {job_table} and {archived_job_table} are filled with validated identifiers; every value is a bound parameter.
-- Timestamps are bound as UTC wall-clock values in whole seconds on a session whose time_zone is '+00:00'.

-- name: enqueue
-- (E) Insert one job on the caller's connection, inside whatever transaction it is in.
INSERT INTO {job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, process_at)
VALUES (%(job_id)s, %(queue)s, %(job_type)s, %(payload)s, %(attempts)s, %(enqueued_at)s, %(process_at)s)

-- name: enqueue_db_generated
-- (E) without job_id, for the database-generated id strategy; the id is the AUTO_INCREMENT value.
INSERT INTO {job_table} (queue, job_type, payload, attempts, enqueued_at, process_at)
VALUES (%(queue)s, %(job_type)s, %(payload)s, %(attempts)s, %(enqueued_at)s, %(process_at)s)

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

-- The compact plan (MySQLBackend(compact=True); not Proletarian's plan) sends archive_job and delete_job,
-- these very two statements, as one multi-statement query: one round trip, each row count checked apart.
-- They stay two statements: MySQL has no DELETE ... RETURNING, and neither server takes a DELETE in a WITH.

-- name: chain_check_count
-- The chained plan (MySQLBackend(chain=True), backend.ChainedClaim; not Proletarian's plan, whose worker ends
-- every job's transaction and polls again in a new one) sends a finished job's archive_job and delete_job,
-- its COMMIT and the next claim as one multi-statement query, before any row count comes back: so the
-- server checks each write's count itself, with this statement right after it. A count other than
-- %(count)s takes the sum past BIGINT UNSIGNED's largest value, an error (1690) on MySQL and MariaDB in
-- every sql_mode, which stops the query there: the COMMIT after it never runs, as with a count the client
-- checks before COMMIT. A SET, so that a count that is right costs the client an OK packet, not a result
-- set to read; its variable lives in the session of the backend's own connection, and nothing reads it.
-- (Not DO: MariaDB's DO reports an expression's error as a warning and goes on.)
SET @proletarian_count_check = 18446744073709551615 + (ROW_COUNT() <> %(count)s)

-- name: chain_commit
-- The chained plan's COMMIT, sent in one query with the writes before it and the next claim after it; the
-- session stays out of autocommit, so the claim begins the next job's transaction.
COMMIT

-- name: retry_at
-- (R) Reschedule a failed job and count the failed attempt.
UPDATE {job_table} SET process_at = %(retry_at)s, attempts = attempts + 1 WHERE job_id = %(job_id)s

-- name: enqueue_many
-- (E) for a batch (enqueue_many): {rows} is enqueue_many_row once per job, so a chunk of jobs is one
-- statement that writes all its rows or none.
INSERT INTO {job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, process_at)
VALUES {rows}

-- name: enqueue_many_row
(%s, %s, %s, %s, %s, %s, %s)

-- name: enqueue_many_savepoint
-- Before a batch that needs more than one INSERT, in the caller's transaction: a failed statement undoes
-- only itself on MySQL, so the savepoint undoes the batch's earlier ones; released after the last.
SAVEPOINT proletarian_enqueue_many

-- name: enqueue_many_rollback
ROLLBACK TO SAVEPOINT proletarian_enqueue_many

-- name: enqueue_many_release
RELEASE SAVEPOINT proletarian_enqueue_many

-- name: get_next_jobs
-- (S) for batch mode: claim up to %(limit)s due jobs of a queue, oldest first, in one statement; their row
-- locks last until the batch commits.
SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at
FROM {job_table}
WHERE queue = %(queue)s AND process_at <= %(now)s
ORDER BY process_at ASC
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- The bounded claim (not Proletarian's statements): get_next_job's and get_next_jobs' with the index scan
-- started at the oldest due job, for every plan but Proletarian's exact one (MySQLBackend's bounded_claim,
-- docs/mysql.md "The bounded claim"). A job's DELETE leaves its index entry delete-marked until InnoDB's
-- purge removes it, and the purge lags behind a busy queue; a locking read at READ COMMITTED looks up the
-- row of every such entry it steps over (two pages each, benchmarks.delete_marked). Here the scalar
-- subquery finds the oldest due job with a plain read, which takes no lock (a locking clause does not reach
-- into a subquery, on MySQL 8 as on MariaDB) and steps over those entries for much less, and the locking
-- scan starts at it. What it finds is the oldest row committed when the statement began: no claimable row
-- lies before it but one committed since with an older process_at, which the next poll claims, as the
-- classic claim's own scan passes a row committed behind it. No due job: the bound is NULL and nothing is
-- claimed. ORDER BY ... LIMIT 1, not MIN(): on the prefix index (queue(256), process_at) MIN reads every
-- due row of the queue. {claim_index} is the job table's (queue, process_at) index, looked up in
-- information_schema (columns.sql, claim_index) and quoted: without FORCE INDEX MariaDB chooses a ref
-- access on the queue prefix, which checks the bound row by row over every entry again, or a sort.

-- name: claim_bounded
-- {limit} is 1 for get_next_job, the bound parameter %(limit)s for get_next_jobs (mysql_claim.statement).
SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at
FROM {job_table} FORCE INDEX ({claim_index})
WHERE queue = %(queue)s
  AND process_at BETWEEN (SELECT process_at FROM {job_table} FORCE INDEX ({claim_index})
                          WHERE queue = %(queue)s AND process_at <= %(now)s ORDER BY process_at ASC LIMIT 1)
                     AND %(now)s
ORDER BY process_at ASC
LIMIT {limit}
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

-- The compact plan in batch mode sends archive_jobs and delete_jobs, these very two statements, as one
-- multi-statement query, as it does archive_job and delete_job for one job: each row count checked apart.

-- name: job_savepoint
-- Batch mode: around a failed job's retry or failure archive, so that if they fail only they are undone.
SAVEPOINT proletarian_job

-- name: job_savepoint_rollback
ROLLBACK TO SAVEPOINT proletarian_job

-- name: job_savepoint_release
RELEASE SAVEPOINT proletarian_job
