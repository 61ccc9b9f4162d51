"""Asynchronous commit clauses (W): a PostgreSQL backend's synchronous_commit_off=True, proved on its worker.

An optional capability of PostgreSQL backends (PostgresBackend, AsyncPostgresBackend, AsyncpgBackend):
the worker's job transaction begins with `SET LOCAL synchronous_commit = off` (docs/worker.md,
"Asynchronous commit"). These clauses are a suite of their own, as the side tables' are: subclass
`SynchronousCommitTests` with a `harness` fixture whose backend has the option on (tests/
test_conformance_synchronous_commit.py runs it on psycopg, psycopg's asyncio API and asyncpg).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from conformance.base import SuiteBase
from conformance.clocks import EPOCH, ManualClock, frozen
from conformance.harness import Harness, one_value
from proletarian_ref import current_job
from proletarian_ref.backend import STATUS_SUCCESS
from proletarian_ref.job import Job, enqueue

JOBS: Final = 5
SETTING: Final = "SELECT current_setting('synchronous_commit')"


def _setting(conn: Any) -> str:
    """The session's synchronous_commit on a DB-API connection (the guard's, the worker's, a caller's)."""
    return str(one_value(conn, SETTING))


def _worker_connection(guarded: Any) -> Any:
    """The driver connection behind current_job().connection()'s guard, to read it after the job is over.

    The guard refuses use once the handler returns; the connection itself stays the backend's, kept for
    its next transaction.
    """
    return object.__getattribute__(guarded, "_conn")


class SynchronousCommitTests(SuiteBase):
    """What a backend with synchronous_commit_off=True owes: asynchronous commit in the worker's job
    transaction only, and the same jobs run and archived."""

    __test__ = False

    def test_jobs_run_and_archive_exactly_once_with_asynchronous_commit(self, harness: Harness) -> None:
        """W1: with the option on, a drain runs each job once and archives it once, the job table empty."""
        ids = {str(self.enqueue_job(harness, EPOCH - timedelta(seconds=s), payload=s)) for s in range(JOBS)}
        seen: list[int] = []
        ran = self._drain(harness, lambda job: seen.append(int(job.payload)))
        assert ran == JOBS, f"the drain ran {ran} polls with a job, not {JOBS}"
        assert sorted(seen) == list(range(JOBS)), f"the handler ran for {sorted(seen)}, not each job once"
        assert harness.jobs() == [], "jobs were left in the job table after the drain"
        archived = harness.archived_jobs()
        assert sorted(str(a.job_id) for a in archived) == sorted(ids), (
            "the archive does not hold each job once"
        )
        assert {a.status for a in archived} == {STATUS_SUCCESS}, "an archived job is not a success"
        assert {a.attempts for a in archived} == {1}, "an archived job does not count one attempt"

    def test_the_job_transaction_commits_asynchronously(self, harness: Harness) -> None:
        """W2: inside the job's transaction, on its own connection, synchronous_commit is off.

        The handler reads current_setting('synchronous_commit') through current_job().connection(): a
        backend that never sends the SET LOCAL (or sends it elsewhere) reads the server's `on`.
        """
        self.enqueue_job(harness, EPOCH - timedelta(seconds=1), payload=1)
        inside: list[str] = []

        def handler(job: Job) -> None:
            inside.append(_setting(current_job().connection()))

        ran = self._drain(harness, handler)
        assert ran == 1, f"the drain ran {ran} jobs, not 1"
        assert inside == ["off"], f"synchronous_commit in the job's transaction was {inside}, not ['off']"

    def test_the_setting_is_local_to_the_job_transaction(self, harness: Harness) -> None:
        """W3: after the job's transaction its connection is back to `on`; a caller's never leaves `on`.

        A caller holds a transaction open with a job enqueued in it while the worker runs an earlier job;
        the caller's session reads `on` before and after. The worker's connection, kept by the backend for
        its next transaction, reads `on` once the job's transaction is over: a session-wide SET (not LOCAL)
        would leave it `off` for everything that connection does next.
        """
        self.enqueue_job(harness, EPOCH - timedelta(seconds=1), payload=1)
        kept: list[Any] = []

        def handler(job: Job) -> None:
            kept.append(_worker_connection(current_job().connection()))

        caller = harness.connect()
        try:
            before = _setting(caller)
            self.enqueue_job_on(harness, caller, payload=2)
            ran = self._drain(harness, handler)
            during = _setting(caller)
            caller.rollback()
            after = _setting(caller)
            caller.rollback()
        finally:
            caller.close()
        assert ran == 1, f"the drain ran {ran} jobs, not 1"
        assert (before, during, after) == ("on", "on", "on"), (
            f"the caller's session read synchronous_commit {before}, {during}, {after}: it must stay on"
        )
        assert len(kept) == 1
        worker = kept[0]
        try:
            left = _setting(worker)
        finally:
            worker.rollback()
        assert left == "on", (
            f"the worker's connection read synchronous_commit {left!r} after the job's transaction: the SET "
            "outlived the transaction (a session SET, not SET LOCAL)"
        )

    # -- helpers ---------------------------------------------------------------------------------------

    def _drain(self, harness: Harness, handler: Any) -> int:
        """process_next_job on one backend until no job is due at EPOCH; the number of jobs it ran."""
        clock = ManualClock(EPOCH)
        backend = harness.backend()
        ran = 0
        while self.run_next(harness, clock, handler, backend=backend, handler_fn_mode="advanced") is not None:
            ran += 1
        return ran

    @staticmethod
    def enqueue_job_on(harness: Harness, conn: Any, *, payload: Any) -> Any:
        """A job due a day after EPOCH, enqueued in the caller's open transaction on `conn`, not committed."""
        return enqueue(
            conn,
            "conformance/job",
            payload,
            job_table=harness.job_table,
            job_id_strategy=harness.job_id_strategy(),
            clock=frozen(EPOCH + timedelta(days=1)),
            backend=harness.backend(),
        )
