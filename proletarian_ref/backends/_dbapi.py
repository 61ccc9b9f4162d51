"""What the SQL backends share: connections per worker thread, transactions, named statements, errors."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.errors import ConfigurationError, DatabaseError
from proletarian_ref.tables import TableName


class SqlBackend:
    """A Backend over a DB-API driver whose statements live in sql/<dialect>/queries.sql.

    A data source that is a callable is called for one connection per worker thread; the thread keeps
    it across polls (a poll per interval must not cost a connect) and replaces it after it breaks.
    """

    dialect: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    def __init__(self, data_source: Any = None, *, first_connection: Any = None) -> None:
        self._data_source = data_source
        self._local = threading.local()
        self._lock = threading.Lock()
        self._owned: list[Any] = []
        self._spare: list[Any] = [first_connection] if first_connection is not None else []
        if first_connection is not None:
            self._owned.append(first_connection)

    # -- driver specifics, overridden per dialect ------------------------------------------------------

    def _translate(self, exc: BaseException) -> DatabaseError | None:
        """The library's exception for a driver exception, or None if `exc` is not the driver's."""
        raise NotImplementedError

    def _cursor(self, conn: Any) -> Any:
        raise NotImplementedError

    def _db_time(self, value: datetime, *, scheduled: bool = False) -> Any:
        """A UTC instant as this driver's parameter; `scheduled` marks a time a job must not run before."""
        raise NotImplementedError

    def _from_db_time(self, value: Any) -> datetime:
        raise NotImplementedError

    def _prepare_session(self, conn: Any, *, worker: bool = False) -> None:
        """Per-connection settings, applied once; `worker` marks a connection the backend itself took."""

    def _begin(self, conn: Any) -> Any:
        """Leave autocommit for the transaction; returns what _end needs to restore."""
        raise NotImplementedError

    def _end(self, conn: Any, state: Any) -> None:
        raise NotImplementedError

    def _is_broken(self, conn: Any) -> bool:
        raise NotImplementedError

    def _generated_id(self, cursor: Any) -> Any:
        raise NotImplementedError

    def _checkout_pooled(self) -> Any:
        raise ConfigurationError(f"{type(self).__name__} cannot take connections from {self._data_source!r}")

    def _checkin_pooled(self, conn: Any) -> None:
        raise NotImplementedError

    @property
    def _pooled(self) -> bool:
        return False

    # -- errors ----------------------------------------------------------------------------------------

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except DatabaseError:
            raise
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            raise translated from exc

    # -- connections and transactions ------------------------------------------------------------------

    def _thread_connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        with self._lock:
            conn = self._spare.pop() if self._spare else None
        if conn is None:
            if not callable(self._data_source):
                raise ConfigurationError(f"{type(self).__name__} has no data source to open connections with")
            factory: Callable[[], Any] = self._data_source
            with self._errors():
                conn = factory()
            with self._lock:
                self._owned.append(conn)
        self._local.conn = conn
        return conn

    def _discard_thread_connection(self, conn: Any) -> None:
        self._local.conn = None
        with self._lock:
            if conn in self._owned:
                self._owned.remove(conn)
        with contextlib.suppress(Exception):  # It is already broken; closing only tidies up.
            conn.close()

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        pooled = self._pooled
        with self._errors():
            conn = self._checkout_pooled() if pooled else self._thread_connection()
        healthy = True
        try:
            with self._errors():
                self._prepare_session(conn, worker=True)
                state = self._begin(conn)
            try:
                yield conn
                with self._errors():
                    conn.commit()
            except BaseException:
                try:
                    conn.rollback()
                except Exception:
                    healthy = False  # The original error matters more; the connection is dropped below.
                raise
            finally:
                try:
                    self._end(conn, state)
                except Exception:
                    healthy = False
        except BaseException:
            healthy = healthy and not self._is_broken(conn)
            raise
        finally:
            if pooled:
                self._checkin_pooled(conn)
            elif not healthy:
                self._discard_thread_connection(conn)

    def close(self) -> None:
        with self._lock:
            owned, self._owned, self._spare = self._owned, [], []
        for conn in owned:
            with contextlib.suppress(Exception):  # At shutdown a broken connection is as good as closed.
                conn.close()

    # -- statements ------------------------------------------------------------------------------------

    def _execute(self, conn: Any, statement: str, params: dict[str, Any], fetch: bool = False) -> Any:
        with self._errors():
            self._prepare_session(conn)
            cursor = self._cursor(conn)
            try:
                cursor.execute(statement, params)
                if fetch:
                    return cursor.fetchone()
                return cursor
            finally:
                if fetch:
                    cursor.close()

    def _render(self, name: str, job_table: TableName, archived_job_table: TableName | None = None) -> str:
        return sql.render(self.dialect, name, job_table, archived_job_table)

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        params = {
            "job_id": job.job_id,
            "queue": job.queue,
            "job_type": job.job_type,
            "payload": job.payload,
            "attempts": job.attempts,
            "enqueued_at": self._db_time(job.enqueued_at),
            "process_at": self._db_time(job.process_at, scheduled=job.process_at > job.enqueued_at),
        }
        if job.job_id is not None:
            self._execute(conn, self._render("enqueue", job_table), params).close()
            return job.job_id
        del params["job_id"]
        cursor = self._execute(conn, self._render("enqueue_db_generated", job_table), params)
        try:
            with self._errors():
                return self._generated_id(cursor)
        finally:
            cursor.close()

    def get_next_job(self, conn: Any, job_table: TableName, queue: str, now: datetime) -> JobRecord | None:
        row = self._execute(
            conn,
            self._render("get_next_job", job_table),
            {"queue": queue, "now": self._db_time(now)},
            fetch=True,
        )
        if row is None:
            return None
        job_id, queue_text, job_type, payload, attempts, enqueued_at, process_at = row
        return JobRecord(
            job_id=job_id,
            queue=queue_text,
            job_type=job_type,
            payload=payload,
            attempts=int(attempts),
            enqueued_at=self._from_db_time(enqueued_at),
            process_at=self._from_db_time(process_at),
        )

    def _write_one(self, conn: Any, statement: str, params: dict[str, Any], what: str) -> None:
        cursor = self._execute(conn, statement, params)
        try:
            count = cursor.rowcount
        finally:
            cursor.close()
        # The row is locked by this transaction, so anything but one row means the table is not what the
        # worker thinks it is; failing keeps the job rather than losing it.
        if count != 1:
            raise DatabaseError(
                f"{what} changed {count} rows of job {params['job_id']!r}; expected exactly 1"
            )

    def archive_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        params = {"job_id": job_id, "status": status, "finished_at": self._db_time(finished_at)}
        self._write_one(
            conn, self._render("archive_job", job_table, archived_job_table), params, "archive_job"
        )

    def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        self._write_one(conn, self._render("delete_job", job_table), {"job_id": job_id}, "delete_job")

    def retry_at(self, conn: Any, job_table: TableName, job_id: Any, retry_at: datetime) -> None:
        params = {"job_id": job_id, "retry_at": self._db_time(retry_at, scheduled=True)}
        self._write_one(conn, self._render("retry_at", job_table), params, "retry_at")
