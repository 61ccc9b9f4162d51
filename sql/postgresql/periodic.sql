-- Periodic jobs (proletarian_ref.periodic, docs/periodic.md): an optional side table beside the job table,
-- one row per schedule name, never read or written by Proletarian itself. {tick_table} is a validated
-- identifier; every value is a bound parameter. A tick's job is enqueued in the transaction that moves
-- last_tick past it, under the row's lock: a crash does both or neither, and no two schedulers both do it.

-- name: create_table
CREATE TABLE IF NOT EXISTS {tick_table}
(
    schedule_name TEXT PRIMARY KEY,       -- Schedule.name
    last_tick     TIMESTAMPTZ NOT NULL,   -- the latest tick enqueued (or, before the first, when first seen)
    last_job_id   UUID,                   -- the job of last_tick (NULL before the first tick)
    definition    TEXT        NOT NULL,   -- cron, zone, job type and queue of the scheduler that wrote it
    version       INTEGER     NOT NULL,   -- Schedule.version of the scheduler that wrote it
    updated_at    TIMESTAMPTZ NOT NULL    -- when a scheduler last wrote the row
)

-- name: register
-- A schedule seen for the first time starts at `now`: its first job is for the first tick after it.
INSERT INTO {tick_table} (schedule_name, last_tick, last_job_id, definition, version, updated_at)
VALUES (%(schedule_name)s, %(now)s, NULL, %(definition)s, %(version)s, %(now)s)
ON CONFLICT (schedule_name) DO NOTHING

-- name: lock_tick
-- The schedule's row, locked until the tick's transaction ends; another scheduler at it is skipped, not
-- waited for (it is enqueueing the same ticks).
SELECT last_tick, definition, version FROM {tick_table}
WHERE schedule_name = %(schedule_name)s
FOR UPDATE SKIP LOCKED

-- name: advance
-- Record the ticks just enqueued; conditional on the last_tick read under the lock, so a count of zero
-- (never expected) rolls the enqueue back instead of recording a tick twice.
UPDATE {tick_table}
SET last_tick = %(last_tick)s, last_job_id = %(last_job_id)s, definition = %(definition)s,
    version = %(version)s, updated_at = %(now)s
WHERE schedule_name = %(schedule_name)s AND last_tick = %(expected_tick)s

-- name: list_ticks
SELECT schedule_name, last_tick, last_job_id, definition, version, updated_at FROM {tick_table}
ORDER BY schedule_name

-- name: forget
-- Delete the rows of schedules no longer defined (proletarian-ref periodic list --prune).
DELETE FROM {tick_table} WHERE schedule_name = %(schedule_name)s

-- name: database_now
SELECT clock_timestamp()

-- name: table_exists
SELECT to_regclass(%(table)s) IS NOT NULL
