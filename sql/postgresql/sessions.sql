-- What a worker asks of the server about sessions: never on a caller's connection, nor inside a job's
-- transaction (docs/worker.md, "Job timeout").

-- name: time_limits
-- The server's limits on how long a transaction may stay open or idle, as a new session of the worker's
-- sees them (a role's or a database's ALTER ... SET included), in milliseconds; 0 is no limit. A server
-- before PostgreSQL 17 has no transaction_timeout, so no row for it.
SELECT name, setting::bigint
FROM pg_settings
WHERE name IN ('idle_in_transaction_session_timeout', 'transaction_timeout')

-- name: end_session
-- Ends a job's session past its time bound: the server rolls its transaction back and frees the row.
SELECT pg_terminate_backend(%(session)s)
