-- Read-only queries behind `proletarian-ref stats`, the demo's summary and the CLI's schema check (PostgreSQL).
-- {job_table} and {archived_job_table} are filled with validated identifiers; every value is a bound parameter.
-- Times are bound as ISO 8601 text with a +00:00 offset, as queries.sql binds them, and come from the
-- application's clock, never the database's now().

-- name: table_location
-- Where a table is (no row if it does not exist): its database and schema, and the connection's database
-- (on PostgreSQL the same one). An unqualified name is looked up on the search_path, as the core's SQL is.
SELECT current_database(), n.nspname, current_database()
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(%(qualified)s)

-- name: schema_lock
-- A session lock that serialises "check the tables, install the missing ones" between commands starting at once.
SELECT pg_advisory_lock(%(key)s)

-- name: schema_unlock
SELECT pg_advisory_unlock(%(key)s)

-- name: queue_stats
-- Per queue: jobs due at %(now)s, jobs scheduled after it, and the process_at of the oldest due job; a page
-- of %(limit)s queues after %(after)s (the dashboard's), read in the order of the (queue, process_at) index,
-- of the %(queues)s given only (a worker's metrics), or of every queue.
SELECT queue,
       SUM(CASE WHEN process_at <= %(now)s THEN 1 ELSE 0 END) AS due,
       SUM(CASE WHEN process_at > %(now)s THEN 1 ELSE 0 END) AS scheduled,
       MIN(CASE WHEN process_at <= %(now)s THEN process_at END) AS oldest_due
FROM {job_table}
WHERE (%(from_first)s OR queue > %(after)s)
  AND (%(every_queue)s OR queue = ANY(%(queues)s))
GROUP BY queue
ORDER BY queue
LIMIT %(limit)s

-- name: waiting_stats
-- Per queue of those after %(after)s up to %(through)s, and of %(queues)s if given: due jobs no worker holds, and the process_at of the
-- oldest of them. A worker's claim locks its
-- row (FOR UPDATE), which stores the worker's transaction id in the row's xmax; a row whose xmax is a
-- transaction still running (pg_locks) is held. Read without taking a lock or writing a row.
SELECT queue, COUNT(*) AS waiting, MIN(process_at) AS oldest_waiting
FROM {job_table}
WHERE process_at <= %(now)s
  AND (%(from_first)s OR queue > %(after)s)
  AND (%(to_last)s OR queue <= %(through)s)
  AND (%(every_queue)s OR queue = ANY(%(queues)s))
  AND NOT (xmax <> '0'::xid
           AND xmax IN (SELECT transactionid FROM pg_locks WHERE locktype = 'transactionid' AND granted))
GROUP BY queue

-- name: archive_stats
-- Archived jobs per queue and status.
SELECT queue, status, COUNT(*) AS jobs
FROM {archived_job_table}
GROUP BY queue, status
ORDER BY queue, status

-- name: archived_count
-- How many jobs of a queue enqueued since %(since)s are archived: the demo's progress.
SELECT COUNT(*) FROM {archived_job_table} WHERE queue = %(queue)s AND enqueued_at >= %(since)s

-- name: archive_summary
-- Per status, for the jobs of a queue enqueued since %(since)s: jobs, jobs that took more than one attempt,
-- attempts in all, the first enqueue and the last finish.
SELECT status,
       COUNT(*) AS jobs,
       SUM(CASE WHEN attempts > 1 THEN 1 ELSE 0 END) AS retried,
       SUM(attempts) AS attempts,
       MIN(enqueued_at) AS first_enqueued_at,
       MAX(finished_at) AS last_finished_at
FROM {archived_job_table}
WHERE queue = %(queue)s AND enqueued_at >= %(since)s
GROUP BY status
ORDER BY status

-- name: throughput
-- Jobs finished per queue and status since %(m15)s, and of those since %(m5)s and %(m1)s: the dashboard's
-- throughput over the last minutes.
SELECT queue, status,
       SUM(CASE WHEN finished_at >= %(m1)s THEN 1 ELSE 0 END) AS last_1m,
       SUM(CASE WHEN finished_at >= %(m5)s THEN 1 ELSE 0 END) AS last_5m,
       COUNT(*) AS last_15m
FROM {archived_job_table}
WHERE finished_at >= %(m15)s
GROUP BY queue, status
ORDER BY queue, status
