"""The error history's clauses (H): an attempt's row commits with its retry or archive, goes with purge."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from conformance.base import SuiteBase
from conformance.clocks import EPOCH, ManualClock
from conformance.harness import Harness
from conformance.sessions import need
from conformance.side_tables import prepare
from proletarian_ref.error_history import ErrorEntry, find_store
from proletarian_ref.errors import TransientDatabaseError
from proletarian_ref.tables import TableName, table_name

RETRY_ONCE = {"retries": 1, "delays": [0]}


class _Failed(Exception):
    """The handler's failure, whose row the clauses look for."""


def _fail(job_type: str, payload: Any) -> None:
    raise _Failed("the handler failed")


def history(harness: Harness, stored_id: Any) -> list[ErrorEntry]:
    """The committed error history of one job, read on a backend of the harness."""
    backend = harness.backend()
    with backend.transaction() as conn:
        store = find_store(backend, conn, table_name(harness.job_table))
        assert store is not None, f"{harness.name}: no error history store although prepare() made its table"
        rows: list[ErrorEntry] = store.history(conn, stored_id)  # type: ignore[attr-defined]
        return rows


class _KilledAfterTheRow:
    """The backend under test, with its session killed right after the error history's row is written."""

    def __init__(self, backend: Any, harness: Harness) -> None:
        self._backend = backend
        self._harness = harness

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def error_store(self, proxy: Any, job_table: TableName) -> Any:
        inner, harness = self._backend, self._harness

        class Store:
            def record(self, conn: Any, row: ErrorEntry) -> None:
                store = find_store(inner, conn, job_table)
                assert store is not None
                store.record(conn, row)
                harness.kill_session(harness.session_of(conn))

        return Store()


class ErrorHistoryTests(SuiteBase):
    """The error history's side table (proletarian_ref.error_history) on any harness, memory included."""

    __test__ = False

    def test_a_failed_attempt_is_kept_with_its_retry_and_its_failure_archive(self, harness: Harness) -> None:
        """F1 Each failed attempt leaves one row, committed with the retry and with the failure archive."""
        prepare(harness)
        job_id = self.enqueue_job(harness, EPOCH)
        stored = harness.job_id_strategy().encode_id(job_id)
        for _ in range(2):
            assert self.run_next(
                harness, ManualClock(EPOCH), _fail, retry_strategy_fn=lambda j, e: RETRY_ONCE
            )
        assert harness.jobs() == [] and len(harness.archived_jobs()) == 1
        rows = history(harness, stored)
        assert [(row.attempt, row.message) for row in rows] == [
            (1, "the handler failed"),
            (2, "the handler failed"),
        ], f"F1: the history is {rows}"
        assert all(row.error_type.endswith("_Failed") for row in rows), f"F1: the history is {rows}"

    def test_a_killed_session_takes_the_attempts_row_with_it(self, harness: Harness) -> None:
        """F2 A session killed right after the row is written commits neither the row nor the retry or
        archive it belongs to: the job is queued again with attempts unchanged and no history.

        A row written outside the job's transaction would stay behind, naming an attempt that never counted.
        """
        need(harness, "sessions")
        for retried in (True, False):
            prepare(harness)
            harness.clear()
            job_id = self.enqueue_job(harness, EPOCH - timedelta(seconds=1))
            stored = harness.job_id_strategy().encode_id(job_id)
            killing = _KilledAfterTheRow(harness.backend(), harness)
            what = "retry" if retried else "failure archive"
            with pytest.raises(TransientDatabaseError):
                self.run_next(
                    harness,
                    ManualClock(EPOCH),
                    _fail,
                    backend=killing,
                    retry_strategy_fn=lambda j, e, retried=retried: RETRY_ONCE if retried else None,
                )
            assert [job.attempts for job in harness.jobs()] == [0], (
                f"F2 ({what}): the job is not back as it was"
            )
            assert harness.archived_jobs() == [], f"F2 ({what}): the killed transaction's archive stayed"
            assert history(harness, stored) == [], f"F2 ({what}): the killed attempt's row stayed"

    def test_purging_archived_jobs_takes_their_history_with_them(self, harness: Harness) -> None:
        """F3 The store's purge of archived jobs' history (what `purge` runs in each batch's transaction)
        leaves none of their rows, keeps every other job's, and rolls back with its transaction.

        A purge that left the rows would keep the history of jobs no longer anywhere, and grow without end.
        """
        prepare(harness)
        purged, kept = (self.enqueue_job(harness, EPOCH) for _ in range(2))
        for _ in range(2):
            assert self.run_next(harness, ManualClock(EPOCH), _fail), "F3: a due job did not run"
        assert len(harness.archived_jobs()) == 2 and harness.jobs() == [], "F3: both jobs are not archived"
        strategy = harness.job_id_strategy()
        gone, stays = strategy.encode_id(purged), strategy.encode_id(kept)
        backend = harness.backend()
        with pytest.raises(_Failed), backend.transaction() as conn:
            store = find_store(backend, conn, table_name(harness.job_table))
            assert store is not None
            store.purge(conn, [gone])
            raise _Failed("the purge's batch rolls back")
        assert len(history(harness, gone)) == 1, "F3: a rolled-back purge took the history anyway"
        with backend.transaction() as conn:
            store = find_store(backend, conn, table_name(harness.job_table))
            assert store is not None
            store.purge(conn, [gone])
        assert history(harness, gone) == [], "F3: the purged job's history stayed after its purge"
        assert len(history(harness, stays)) == 1, "F3: the purge took the history of a job it did not purge"
