"""`worker --processes N`: N worker processes from one command, stopped together, one exit code for all.

Each child is the same `worker` command with `--processes 1`, so it has its own threads, connections and
interpreter (no shared GIL), and keeps every promise of a single worker: a stop drains its jobs in flight
and releases the rest. The children run in a session of their own, so a terminal's Ctrl-C reaches only the
parent, which passes each SIGINT/SIGTERM on: the first as SIGTERM, which stops every child, draining; a
second as SIGINT (two SIGTERMs close together would reach a child as one), which makes them exit at once,
sent again every half second to a child still running (one that took both signals as one stop); the
command then exits 130, whether a child ended with its own 130 or by that SIGINT.
A child that ends before any stop was asked (a crash, a lost schema) stops the others, and the command
exits non-zero naming it. A child whose parent is gone (killed with SIGKILL) stops itself (`PARENT_ENV`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Final

from proletarian_ref.cli.errors import CliError, ExitCode
from proletarian_ref.cli.logs import notice

# The parent's pid, in each child's environment: the child stops when its parent is no longer it.
PARENT_ENV: Final = "PROLETARIAN_WORKER_PARENT_PID"
_STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
_POLL_S: Final = 0.1
# After a second stop signal, SIGINT again this often to every child still running.
_AT_ONCE_AGAIN_S: Final = 0.5


def child_command(argv: Sequence[str]) -> list[str]:
    """The command line of one child: this command again, one process (the last --processes wins)."""
    return [sys.executable, "-m", "proletarian_ref", *argv, "--processes", "1"]


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _exit_code(code: int) -> ExitCode:
    try:
        return ExitCode(code) if code > 0 else ExitCode.RUNTIME_ERROR
    except ValueError:
        return ExitCode.RUNTIME_ERROR


def run_processes(argv: Sequence[str], count: int) -> int:
    """Run `count` children of the worker command `argv` until a signal or a child's end; their exit code."""
    command = child_command(argv)
    env = dict(os.environ, **{PARENT_ENV: str(os.getpid())})
    children: list[subprocess.Popen[bytes]] = []
    signals_seen = 0
    at_once_sent = [0.0]

    def forward() -> None:
        # SIGTERM first, SIGINT after: two of one signal sent close together reach a child as one.
        sent = signal.SIGTERM if signals_seen <= 1 else signal.SIGINT
        if sent == signal.SIGINT:
            at_once_sent[0] = time.monotonic()
        for child in children:
            if child.poll() is None:
                child.send_signal(sent)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal signals_seen
        signals_seen += 1
        name = signal.Signals(signum).name
        if signals_seen == 1:
            notice(f"{name}: stopping {count} worker processes (send it again to exit at once)")
        forward()

    previous = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, on_signal)
    try:
        for _ in range(count):
            # A session of their own: a terminal's Ctrl-C goes to the parent only, which passes it on once.
            children.append(subprocess.Popen(command, env=env, start_new_session=True))
        notice(f"{count} worker processes running (pids {', '.join(str(c.pid) for c in children)})")
        failed: tuple[int, subprocess.Popen[bytes]] | None = None
        while True:
            # Every child polled each time (not any(), which stops at the first one alive).
            ended = [child.poll() is not None for child in children]
            if all(ended):
                break
            if failed is None and signals_seen == 0:
                for index, child in enumerate(children):
                    if ended[index]:
                        failed = (index, child)
                        # Nobody asked this one to stop: the others stop too, draining their jobs.
                        forward()
                        break
            time.sleep(_POLL_S)
            if signals_seen >= 2 and time.monotonic() - at_once_sent[0] >= _AT_ONCE_AGAIN_S:
                # A child can still take the two signals passed on back to back as one stop (both pending
                # at once; a clean-clone CI run saw one drain for its whole timeout): asked again, it ends.
                forward()
        if failed is None and signals_seen == 0:
            # Every child ended between two looks, unasked.
            failed = min(enumerate(children), key=lambda pair: pair[1].returncode == 0)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        if main_thread:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    return _outcome(children, count, failed, at_once=signals_seen >= 2)


def _outcome(
    children: Sequence[subprocess.Popen[bytes]],
    count: int,
    failed: tuple[int, subprocess.Popen[bytes]] | None,
    *,
    at_once: bool,
) -> int:
    """The command's exit code once every child has ended; a CliError for one that failed, or for an
    exit at once (`at_once`: a second stop signal was passed on)."""
    if failed is not None:
        index, child = failed
        raise CliError(
            f"{_name(index, count, child)} {_describe(child.returncode)} "
            "without being asked to stop; the other worker processes were stopped",
            exit_code=_exit_code(child.returncode),
        )
    # Killed by the SIGTERM passed on before it had set up its handlers: it had no worker to drain.
    stopped: set[int] = {0, -signal.SIGTERM}
    # The exit at once is the child's "interrupted" (130), or the SIGINT itself when it lands after the child
    # has put back Python's own handler on its way out (an uncaught KeyboardInterrupt ends Python by SIGINT).
    interrupted: set[int] = {int(ExitCode.INTERRUPTED), -signal.SIGINT} if at_once else set()
    for index, child in enumerate(children):
        if child.returncode not in stopped | interrupted:
            raise CliError(
                f"{_name(index, count, child)} {_describe(child.returncode)} "
                "while stopping (its messages above say why)",
                exit_code=_exit_code(child.returncode),
            )
    cut_short = [
        f"{_name(index, count, child)} {_describe(child.returncode)}"
        for index, child in enumerate(children)
        if child.returncode in interrupted
    ]
    if cut_short:
        raise CliError(
            f"interrupted: {'; '.join(cut_short)}, exiting at once on the second signal",
            exit_code=ExitCode.INTERRUPTED,
        )
    notice(f"all {count} worker processes stopped")
    return int(ExitCode.OK)


def _name(index: int, count: int, child: subprocess.Popen[bytes]) -> str:
    return f"worker process {index + 1} of {count} (pid {child.pid})"


def watch_parent(stop: threading.Event) -> None:
    """In a child of `worker --processes`: set `stop` once the parent that started it is gone."""
    expected = os.environ.get(PARENT_ENV)
    if not expected or not expected.isdigit():
        return

    def watch() -> None:
        while not stop.wait(1.0):
            if os.getppid() != int(expected):
                notice("the parent `worker --processes` is gone: stopping")
                stop.set()
                return

    threading.Thread(target=watch, name="proletarian-ref-parent-watch", daemon=True).start()
