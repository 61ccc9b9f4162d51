-- The MySQL backend's reads of table definitions (not Proletarian's: it sends the INSERT and lets the server
-- refuse or truncate). {job_table} is not used: tables are bound as values here.

-- name: payload_columns
-- The payload columns of the job table and of the archive table, for the size check before an enqueue.
-- A table named without a schema is in the connection's current database, as in the statements themselves.
SELECT TABLE_SCHEMA, TABLE_NAME, DATA_TYPE, CHARACTER_MAXIMUM_LENGTH, CHARACTER_OCTET_LENGTH, CHARACTER_SET_NAME
FROM information_schema.COLUMNS
WHERE COLUMN_NAME = 'payload'
  AND ((TABLE_SCHEMA = COALESCE(%(job_schema)s, DATABASE()) AND TABLE_NAME = %(job_name)s)
    OR (TABLE_SCHEMA = COALESCE(%(archive_schema)s, DATABASE()) AND TABLE_NAME = %(archive_name)s))
-- The job table's column first, so that of two columns of one size the error names the one enqueue writes.
ORDER BY (TABLE_SCHEMA = COALESCE(%(job_schema)s, DATABASE()) AND TABLE_NAME = %(job_name)s) DESC

-- name: claim_index
-- The job table's indexes whose first two columns are queue and process_at, which the bounded claims scan
-- (queries.sql, claim_bounded). Proletarian's DDL leaves its index unnamed: the server names it
-- after its first column, `queue`.
SELECT INDEX_NAME
FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = COALESCE(%(job_schema)s, DATABASE()) AND TABLE_NAME = %(job_name)s
  AND ((SEQ_IN_INDEX = 1 AND COLUMN_NAME = 'queue') OR (SEQ_IN_INDEX = 2 AND COLUMN_NAME = 'process_at'))
GROUP BY INDEX_NAME
HAVING COUNT(*) = 2
ORDER BY INDEX_NAME
