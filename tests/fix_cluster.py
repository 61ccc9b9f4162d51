"""Pytest plugin: engines in front of or beside the throwaway servers (PgBouncer, Galera, a standby).

Like fix_throwaway, every process gets its own directory in a temporary directory and free ports on
127.0.0.1, and is stopped when the fixture ends. A tool the machine lacks makes the tests skip with the
reason, or fail in CI (PROLETARIAN_TEST_REQUIRE_DATABASES or CI set), never pass silently.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from fix_throwaway import ThrowawayPostgres, ThrowawayServer, _missing, free_port

PGBOUNCER_POOL_SIZE = 4


class PgBouncer(ThrowawayServer):
    """PgBouncer in transaction mode in front of one PostgreSQL, with trust authentication.

    PgBouncer refuses to run as root, so as root it runs as `postgres`, like the server.
    """

    dialect: ClassVar[str] = "postgresql"

    def __init__(self, root: Path, port: int, server: ThrowawayPostgres, binary: str) -> None:
        super().__init__(root, port)
        self.binary = binary
        self.server = server
        self.ini = root / "pgbouncer.ini"
        user = self._user()
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        (root / "userlist.txt").write_text('"postgres" ""\n', encoding="utf-8")
        self.ini.write_text(
            "[databases]\n"
            f"postgres = host=127.0.0.1 port={server.port} dbname=postgres\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {root / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {PGBOUNCER_POOL_SIZE}\n"
            "max_client_conn = 100\n"
            f"pidfile = {root / 'pgbouncer.pid'}\n",
            encoding="utf-8",
        )

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _user(self) -> str | None:
        return "postgres" if os.geteuid() == 0 else None

    def _command(self) -> list[str]:
        return [self.binary, str(self.ini)]

    def _ping(self) -> None:
        import psycopg

        psycopg.connect(self.dsn, connect_timeout=2).close()

    def _signal(self, mode: str) -> signal.Signals:
        # SIGINT waits for the clients' transactions to end; SIGTERM drops them at once.
        return {"fast": signal.SIGTERM, "immediate": signal.SIGKILL}[mode]


def pgbouncer_binary() -> str | None:
    return (
        os.environ.get("PROLETARIAN_TEST_PGBOUNCER")
        or shutil.which("pgbouncer")
        or ("/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None)
    )


@pytest.fixture(scope="session")
def _pgbouncer_session(_throwaway_pg_session: ThrowawayPostgres) -> Iterator[PgBouncer]:
    binary = pgbouncer_binary()
    if binary is None:
        _missing("pgbouncer (apt-get install pgbouncer, as ci/test.sh does): set PROLETARIAN_TEST_PGBOUNCER")
    assert binary is not None
    root = Path(tempfile.mkdtemp(prefix="scale_pgbouncer_"))
    bouncer = PgBouncer(root, free_port(), _throwaway_pg_session, binary)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.destroy()


@pytest.fixture
def pgbouncer(throwaway_pg: ThrowawayPostgres, _pgbouncer_session: PgBouncer) -> PgBouncer:
    """PgBouncer (transaction mode) in front of this session's throwaway PostgreSQL, both running."""
    _pgbouncer_session.start()
    return _pgbouncer_session
