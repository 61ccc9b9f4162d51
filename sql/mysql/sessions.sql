-- What a worker asks of the server about sessions: never on a caller's connection, nor inside a job's
-- transaction (docs/worker.md, "Job timeout").

-- name: time_limits
-- How long the server lets a session sit idle, in milliseconds, as a new session of the worker's sees it
-- (a connection's init_command included): a job's handler that does not use the connection leaves its
-- transaction idle that long. MySQL has no limit on a transaction's own length.
SELECT 'wait_timeout', @@SESSION.wait_timeout * 1000

-- name: end_session
-- Ends a job's session past its time bound: the server rolls its transaction back and frees the row.
KILL %(session)s

-- name: time_limits_mariadb
-- MariaDB also ends a transaction left idle (10.3+): any, a read-only one, or one that wrote; which of the
-- last two a job's claim counts as is MariaDB's to say, so all three are read.
SELECT 'wait_timeout', @@SESSION.wait_timeout * 1000
UNION ALL SELECT 'idle_transaction_timeout', @@SESSION.idle_transaction_timeout * 1000
UNION ALL SELECT 'idle_readonly_transaction_timeout', @@SESSION.idle_readonly_transaction_timeout * 1000
UNION ALL SELECT 'idle_write_transaction_timeout', @@SESSION.idle_write_transaction_timeout * 1000
