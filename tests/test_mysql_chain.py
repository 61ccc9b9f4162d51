"""MySQL's chained plan (MySQLBackend(chain=True)): a finished job's checked archive and delete, its COMMIT
and the next claim in one query; each job still its own transaction."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mysql_chain_support import (
    BATCH,
    CHAIN,
    JOBS,
    WITHIN_S,
    archiving_nothing,
    assert_one_query_a_job,
    enqueue,
    refused,
    tables,
)
from support import assert_kept_or_lost, claim_finish_and_chain, drain_threaded

from conformance.harness import SqlHarness
from proletarian_ref import ConfigurationError, DatabaseError
from proletarian_ref.backends.mysql import MySQLBackend


def _recording(connect: Callable[[], Any], sent: list[str]) -> Callable[[], Any]:
    """Connections that note every query they send (PyMySQL's Connection.query, which cursors call)."""

    def factory() -> Any:
        conn = connect()
        query = conn.query

        def recorded(text: Any, unbuffered: bool = False) -> Any:
            sent.append(text if isinstance(text, str) else text.decode())
            return query(text, unbuffered)

        conn.query = recorded
        return conn

    return factory


def _drain(
    db: SqlHarness, backend: Any, batch_size: int, until: Callable[[], bool] = lambda: False
) -> list[Any]:
    """Run one worker thread on `backend` until every queued job is gone (or `until()`), then close the
    backend; the payloads it ran."""
    ran: list[Any] = []

    def handler(job_type: str, payload: Any) -> None:
        ran.append(payload)

    try:
        drain_threaded(db, backend, handler, batch_size=batch_size, until=until, timeout=WITHIN_S)
    finally:
        backend.close()
    return ran


@pytest.mark.parametrize("batch_size", [1, BATCH])
def test_a_mysql_chained_worker_sends_each_finished_job_with_its_commit_and_the_next_claim_in_one_query(
    mysql_chain_db: SqlHarness, batch_size: int
) -> None:
    job_ids = enqueue(mysql_chain_db, JOBS)
    sent: list[str] = []
    backend = MySQLBackend(_recording(mysql_chain_db.data_source, sent), **CHAIN)
    _drain(mysql_chain_db, backend, batch_size)
    assert_one_query_a_job(mysql_chain_db, sent, job_ids, batch_size)


class _ArchivesNothing(MySQLBackend):
    """The chain's kept-back archive archives no row (the delete still deletes the jobs); with `checked`
    False, the server's checks taken out too: what the chain would commit without them."""

    checked = True

    def _send_deferred(self, conn: Any, lease: Any) -> None:
        self._break(lease)
        super()._send_deferred(conn, lease)

    def _chained(self, conn: Any, claim: str, params: dict[str, Any], read: Any) -> Any:
        lease = self._local.lease
        if lease is not None:
            self._break(lease)
        return super()._chained(conn, claim, params, read)

    def _break(self, lease: Any) -> None:
        if lease.deferred is not None:
            lease.deferred.text = archiving_nothing(lease.deferred.text, checked=self.checked)


@pytest.mark.parametrize("batch_size", [1, BATCH])
@pytest.mark.parametrize("checked", [True, False], ids=["server-checked", "check-taken-out"])
def test_a_mysql_chains_archive_that_changes_no_row_rolls_back_its_commit_and_keeps_the_jobs(
    mysql_chain_db: SqlHarness, checked: bool, batch_size: int, caplog: pytest.LogCaptureFixture
) -> None:
    db = mysql_chain_db
    # One batch more than the worker's first, so that the broken archive goes with a chain's COMMIT.
    job_ids = enqueue(db, 2 * batch_size)
    backend = _ArchivesNothing(db.data_source, **CHAIN)
    backend.checked = checked
    assert _drain(db, backend, batch_size, until=lambda: refused(batch_size) in caplog.text)
    assert_kept_or_lost(db, job_ids, caplog.text, refused(batch_size), checked=checked, all_lost=False)


@pytest.mark.parametrize("batch_size", [1, BATCH])
def test_a_mysql_chains_refused_count_raises_before_its_commit_in_the_clients_check_words(
    mysql_chain_db: SqlHarness, batch_size: int
) -> None:
    db = mysql_chain_db
    enqueue(db, batch_size)
    queued = db.jobs()
    queue = queued[0].queue
    job_table, archived = tables(db)
    backend = _ArchivesNothing(db.data_source, **CHAIN)
    now = datetime.now(UTC) + timedelta(minutes=1)
    try:
        with (
            pytest.raises(DatabaseError, match=f"^{re.escape(refused(batch_size))}"),
            backend.transaction() as conn,
        ):
            claim_finish_and_chain(backend, conn, (job_table, archived), queue, now, batch_size)
    finally:
        backend.close()
    assert db.jobs() == queued and db.archived_jobs() == []


@pytest.mark.parametrize("ending", ["commit", "raise"])
def test_a_kept_back_archive_goes_before_the_next_statement_and_the_blocks_own_commit(
    mysql_chain_db: SqlHarness, ending: str
) -> None:
    """Outside a chain the kept-back write still goes first: the next statement on the connection sees it
    done, and the block's COMMIT writes it, or its rollback undoes it."""
    db = mysql_chain_db
    enqueue(db, 2)
    queue = db.jobs()[0].queue
    job_table, archived = tables(db)
    backend = MySQLBackend(db.data_source, **CHAIN)
    now = datetime.now(UTC) + timedelta(minutes=1)
    try:
        with (
            pytest.raises(RuntimeError) if ending == "raise" else contextlib.nullcontext(),
            backend.transaction() as conn,
        ):
            first = backend.get_next_job(conn, job_table, queue, now)
            assert first is not None
            backend.archive_and_delete_job(conn, job_table, archived, first.job_id, ":success", now)
            second = backend.get_next_job(conn, job_table, queue, now)
            assert second is not None and second.job_id != first.job_id
            with conn.cursor() as cursor:
                cursor.execute(f"SELECT COUNT(*) FROM {archived} WHERE job_id = %s", (first.job_id,))
                assert cursor.fetchone() == (1,)
            if ending == "raise":
                raise RuntimeError("planted")
    finally:
        backend.close()
    if ending == "commit":
        assert [job.job_id for job in db.archived_jobs()] == [first.job_id]
        assert [job.job_id for job in db.jobs()] == [second.job_id]
    else:
        assert db.archived_jobs() == [] and len(db.jobs()) == 2


def test_two_kept_back_archives_in_a_row_are_both_written(mysql_chain_db: SqlHarness) -> None:
    """A finished job kept back while another is (two archives with no statement between, which the
    worker never sends): the first goes before the second is kept, so neither is dropped."""
    db = mysql_chain_db
    enqueue(db, 2)
    queue = db.jobs()[0].queue
    job_table, archived = tables(db)
    backend = MySQLBackend(db.data_source, **CHAIN)
    now = datetime.now(UTC) + timedelta(minutes=1)
    try:
        with backend.transaction() as conn:
            for record in backend.get_next_jobs(conn, job_table, queue, now, 2):
                backend.archive_and_delete_job(conn, job_table, archived, record.job_id, ":success", now)
    finally:
        backend.close()
    assert db.jobs() == [] and len(db.archived_jobs()) == 2


def test_commit_and_get_next_job_on_a_callers_connection_commits_then_claims(
    mysql_chain_db: SqlHarness,
) -> None:
    """Outside the backend's own transaction (a caller's connection) the COMMIT and the claim go apart."""
    db = mysql_chain_db
    enqueue(db, 1)
    queue = db.jobs()[0].queue
    job_table, _ = tables(db)
    backend = MySQLBackend(db.data_source, **CHAIN)
    conn = db.connect()
    try:
        conn.autocommit(False)
        with conn.cursor() as cursor:
            cursor.execute("SET time_zone = '+00:00'")
        record = backend.commit_and_get_next_job(
            conn, job_table, queue, datetime.now(UTC) + timedelta(minutes=1)
        )
        assert record is not None and record.job_id == db.jobs()[0].job_id
        conn.rollback()
    finally:
        conn.close()
        backend.close()


def test_chain_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="chain must be True or False"):
        MySQLBackend(lambda: None, chain=1)  # type: ignore[arg-type]
    assert MySQLBackend(None).chained_claims is False
    assert MySQLBackend(None, chain=True).chained_claims is True


def test_a_chain_on_connections_without_multi_statements_is_refused_before_any_claim(
    mysql_db: SqlHarness,
) -> None:
    enqueue(mysql_db, 1)
    backend = MySQLBackend(mysql_db.data_source, chain=True)
    try:
        with (
            pytest.raises(
                ConfigurationError,
                match=r"MySQLBackend\(chain=True\) sends a job's COMMIT and the next claim",
            ),
            backend.transaction(),
        ):
            pass
    finally:
        backend.close()
    assert len(mysql_db.jobs()) == 1 and mysql_db.archived_jobs() == []
