"""A Proletarian backend on mysql-connector-python, kept apart from the project as a third party's would be.

Written against docs/backends.md alone: the five verbs from sql/mysql/queries.sql, one connection per
thread, times as naive UTC in UTC sessions, the caller's time zone put back after enqueue.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import mysql.connector

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.errors import (
    DatabaseError,
    PayloadTooLargeError,
    ProletarianError,
    SchemaMissingError,
    TransientDatabaseError,
)
from proletarian_ref.tables import TableName

# Lock wait timeout, deadlock, killed (MariaDB), too many connections, and the client's lost connections.
_TRANSIENT: Final = frozenset({1040, 1053, 1205, 1213, 1317, 1927, 2006, 2013, 2055})
_NO_SUCH_TABLE: Final = 1146
_DATA_TOO_LONG: Final = 1406  # strict mode refuses what the TEXT column cannot hold, rather than cut it
_UTC: Final = "+00:00"


def library_error(exc: BaseException) -> ProletarianError:
    """The library's exception for one of mysql-connector's (or a socket error under it)."""
    errno = getattr(exc, "errno", None)
    message = f"mysql-connector: {exc}"
    if errno == _NO_SUCH_TABLE:
        return SchemaMissingError(message)
    if errno == _DATA_TOO_LONG:
        return PayloadTooLargeError(message)
    if errno in _TRANSIENT or isinstance(
        exc, (mysql.connector.InterfaceError, mysql.connector.OperationalError, OSError)
    ):
        return TransientDatabaseError(message)
    return DatabaseError(message)


def _naive_utc(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None)


class MySQLConnectorBackend:
    """Proletarian's MySQL statements on mysql-connector-python."""

    dialect: Final = "mysql"
    capabilities: Final = Capabilities(
        time_precision=timedelta(seconds=1), claim_locks_only_the_claimed_row=False
    )

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[Any] = []

    def _run(
        self,
        conn: Any,
        name: str,
        job_table: TableName,
        archived_job_table: TableName | None = None,
        **values: Any,
    ) -> Any:
        """Run the named statement: its first row if it returns rows, else its row count."""
        text, names = sql.positional(sql.render(self.dialect, name, job_table, archived_job_table))
        params = tuple(_naive_utc(v) if isinstance(v, datetime) else v for v in (values[n] for n in names))
        try:
            cursor = conn.cursor()
            try:
                cursor.execute(text, params)
                return cursor.fetchone() if cursor.description else cursor.rowcount
            finally:
                cursor.close()
        except (mysql.connector.Error, OSError) as exc:
            raise library_error(exc) from exc

    def _write_one(self, conn: Any, name: str, *tables: TableName, **values: Any) -> None:
        count = self._run(conn, name, *tables, **values)
        if count != 1:
            raise DatabaseError(f"{name} changed {count} rows of job {values['job_id']!r}; expected 1")

    def _session(self, conn: Any, statement: str, params: tuple[Any, ...] = ()) -> Any:
        try:
            cursor = conn.cursor()
            try:
                cursor.execute(statement, params)
                return cursor.fetchone() if cursor.description else None
            finally:
                cursor.close()
        except (mysql.connector.Error, OSError) as exc:
            raise library_error(exc) from exc

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        # TIMESTAMP values are read in the session's zone: UTC for the INSERT, the caller's zone after it.
        (zone,) = self._session(conn, "SELECT @@session.time_zone")
        if zone != _UTC:
            self._session(conn, "SET time_zone = %s", (_UTC,))
        try:
            if job.job_id is None:
                self._run(conn, "enqueue_db_generated", job_table, **job._asdict())
                (stored,) = self._session(conn, "SELECT LAST_INSERT_ID()")
                return stored
            self._run(conn, "enqueue", job_table, **job._asdict())
            return job.job_id
        finally:
            if zone != _UTC:
                self._session(conn, "SET time_zone = %s", (zone,))

    def get_next_job(self, conn: Any, job_table: TableName, queue: str, now: datetime) -> JobRecord | None:
        row = self._run(conn, "get_next_job", job_table, queue=queue, now=now)
        if row is None:
            return None
        job_id, queue_text, job_type, payload, attempts, enqueued_at, process_at = row
        return JobRecord(
            bytes(job_id),
            queue_text,
            job_type,
            payload,
            int(attempts),
            enqueued_at.replace(tzinfo=UTC),
            process_at.replace(tzinfo=UTC),
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
        self._write_one(
            conn,
            "archive_job",
            job_table,
            archived_job_table,
            job_id=job_id,
            status=status,
            finished_at=finished_at,
        )

    def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        self._write_one(conn, "delete_job", job_table, job_id=job_id)

    def retry_at(self, conn: Any, job_table: TableName, job_id: Any, retry_at: datetime) -> None:
        self._write_one(conn, "retry_at", job_table, job_id=job_id, retry_at=retry_at)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = self._connect()
            except (mysql.connector.Error, OSError) as exc:
                raise library_error(exc) from exc
            with self._lock:
                self._connections.append(conn)
            self._local.conn = conn
            # Its own sessions only: UTC for TIMESTAMP values, READ COMMITTED against InnoDB's gap locks.
            self._session(conn, "SET time_zone = %s", (_UTC,))
            self._session(conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            conn.commit()
        try:
            yield conn
            try:
                conn.commit()
            except (mysql.connector.Error, OSError) as exc:
                raise library_error(exc) from exc
        except BaseException as exc:
            try:
                conn.rollback()
            except Exception:
                self.close_thread_connection()
            else:
                if isinstance(exc, TransientDatabaseError):
                    self.close_thread_connection()
            raise

    def close_thread_connection(self) -> None:
        conn, self._local.conn = getattr(self._local, "conn", None), None
        if conn is not None:
            with self._lock:
                if conn in self._connections:
                    self._connections.remove(conn)
            _close(conn)

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            _close(conn)


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # broken already: nothing is left to release
        return
