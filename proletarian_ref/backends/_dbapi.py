"""What the SQL backends share: connections per worker thread, transactions, named statements, errors."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.errors import ConfigurationError, DatabaseError
from proletarian_ref.tables import TableName


class ConnectionReleasedError(DatabaseError):
    """The transaction's connection was released by QueueWorker.stop(); nothing more is written on it."""


@dataclass(slots=True)
class _Lease:
    """A connection in use by one thread's transaction, as release_connection needs to see it."""

    conn: Any
    # True while the owning thread is talking to the server; a connection is never closed under it.
    busy: bool = True
    released: bool = False


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
        # Open transactions by thread ident, so stop() can release a stuck thread's job.
        self._leases: dict[int, _Lease] = {}

    # -- driver specifics, overridden per dialect ------------------------------------------------------

    def _translate(self, exc: BaseException) -> DatabaseError | None:
        """The library's exception for a driver exception, or None if `exc` is not the driver's."""
        raise NotImplementedError

    def _cursor(self, conn: Any, *, reads_rows: bool = False) -> Any:
        raise NotImplementedError

    def _db_time(self, value: datetime, *, scheduled: bool = False, what: str = "time") -> Any:
        """A UTC instant as this driver's parameter; `scheduled` marks a time a job must not run before.

        Raises ConfigurationError, naming `what`, for a time the column cannot hold, before any SQL runs.
        """
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
    def _using(self, lease: _Lease | None) -> Iterator[None]:
        """Mark the lease busy around a round trip, refusing one on a released connection."""
        if lease is None:
            yield
            return
        with self._lock:
            if lease.released:
                raise ConnectionReleasedError(
                    "the queue worker released this job while it ran; its outcome is not written"
                )
            lease.busy = True
        try:
            yield
        finally:
            with self._lock:
                lease.busy = False

    def _lease_of(self, conn: Any) -> _Lease | None:
        lease = self._leases.get(threading.get_ident())
        return lease if lease is not None and lease.conn is conn else None

    def _mark(self, lease: _Lease, *, busy: bool) -> bool:
        """Set whether the thread is talking to the server; False if the connection was released."""
        with self._lock:
            lease.busy = busy
            return not lease.released

    def _end_lease(self, lease: _Lease) -> bool:
        """Forget the lease; True if it was released, after closing its connection."""
        with self._lock:
            self._leases.pop(threading.get_ident(), None)
        if lease.released:
            # Released mid-statement (so not closed then) or closed already: either way the server must
            # see the connection go, which rolls the transaction back.
            _close_quietly(lease.conn)
        return lease.released

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        pooled = self._pooled
        with self._errors():
            conn = self._checkout_pooled() if pooled else self._thread_connection()
        lease = _Lease(conn)
        with self._lock:
            self._leases[threading.get_ident()] = lease
        healthy = True
        try:
            with self._errors():
                self._prepare_session(conn, worker=True)
                state = self._begin(conn)
            self._mark(lease, busy=False)
            try:
                yield conn
                with self._using(lease), self._errors():
                    conn.commit()
            except BaseException:
                # From here on only this thread touches the connection: a release closes nothing.
                if self._mark(lease, busy=True):
                    try:
                        conn.rollback()
                    except Exception:
                        healthy = False  # The original error matters more; the connection is dropped below.
                raise
            finally:
                if self._mark(lease, busy=True):
                    try:
                        self._end(conn, state)
                    except Exception:
                        healthy = False
        except BaseException:
            healthy = healthy and not self._is_broken(conn)
            raise
        finally:
            if self._end_lease(lease):
                healthy = False
            if pooled:
                self._checkin_pooled(conn)
            elif not healthy:
                self._discard_thread_connection(conn)

    def release_connection(self, thread_id: int) -> bool:
        """Abandon the transaction thread `thread_id` has open: its job becomes claimable again.

        Closes the connection at once if the thread is not talking to the server (the usual case: it is
        running a handler), so the server rolls back and frees the row lock; otherwise the thread closes
        it after its current statement. Whatever the thread does next on it fails with
        ConnectionReleasedError, so a handler that returns later writes nothing. False if the thread had
        no transaction open.
        """
        with self._lock:
            lease = self._leases.get(thread_id)
            if lease is None or lease.released:
                return False
            lease.released = True
            close_now = not lease.busy
        if close_now:
            _close_quietly(lease.conn)
        return True

    def close(self) -> None:
        with self._lock:
            owned, self._owned, self._spare = self._owned, [], []
            leases = list(self._leases.values())
            for lease in leases:
                lease.released = True
            # A connection mid-statement is closed by its own thread after the statement (it sees the
            # release); closing it under the thread would break the driver, not just the transaction.
            busy = {id(lease.conn) for lease in leases if lease.busy}
        idle = {id(conn): conn for conn in [*owned, *(lease.conn for lease in leases)]}
        for key, conn in idle.items():
            if key in busy:
                continue
            _close_quietly(conn)

    # -- statements ------------------------------------------------------------------------------------

    def _execute(self, conn: Any, statement: str, params: dict[str, Any], fetch: bool = False) -> Any:
        with self._using(self._lease_of(conn)), self._errors():
            self._prepare_session(conn)
            cursor = self._cursor(conn, reads_rows=fetch)
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
            "enqueued_at": self._db_time(job.enqueued_at, what="enqueued_at"),
            "process_at": self._db_time(
                job.process_at, scheduled=job.process_at > job.enqueued_at, what="process_at"
            ),
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
            {"queue": queue, "now": self._db_time(now, what="now")},
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
        params = {
            "job_id": job_id,
            "status": status,
            "finished_at": self._db_time(finished_at, what="finished_at"),
        }
        self._write_one(
            conn, self._render("archive_job", job_table, archived_job_table), params, "archive_job"
        )

    def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        self._write_one(conn, self._render("delete_job", job_table), {"job_id": job_id}, "delete_job")

    def retry_at(self, conn: Any, job_table: TableName, job_id: Any, retry_at: datetime) -> None:
        params = {"job_id": job_id, "retry_at": self._db_time(retry_at, scheduled=True, what="retry_at")}
        self._write_one(conn, self._render("retry_at", job_table), params, "retry_at")


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # Closing is all that is left to do; a failure changes nothing.
        conn.close()
