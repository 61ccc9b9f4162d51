"""Job handlers that the CLI tests name with --handler cli_handlers:<name> (tests/ is put on PYTHONPATH)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import proletarian_ref
from proletarian_ref import Job


class PlannedFailure(Exception):
    """Raised on purpose by `fails_when_asked`."""


def _started(payload: Mapping[str, Any]) -> None:
    Path(str(payload["marker"])).write_text("started", encoding="utf-8")


def ignores_stop(job_type: str, payload: Mapping[str, Any]) -> None:
    """Sleeps without looking at interrupted(), then records whether the worker was stopping meanwhile."""
    _started(payload)
    time.sleep(float(payload["seconds"]))
    Path(str(payload["marker"]) + ".interrupted").write_text(
        str(proletarian_ref.interrupted()), encoding="utf-8"
    )


def honours_stop(job_type: str, payload: Mapping[str, Any]) -> None:
    """Sleeps with proletarian_ref.sleep, which raises JobInterrupted as soon as the worker stops."""
    _started(payload)
    proletarian_ref.sleep(float(payload["seconds"]))


def fails_when_asked(job_type: str, payload: Mapping[str, Any]) -> None:
    if payload.get("fail"):
        raise PlannedFailure(f"job {payload.get('n')} fails, as asked")


def records_runs(job_type: str, payload: Mapping[str, Any]) -> None:
    """Appends the job's n to the file payload["runs"] names, then fails if the payload asks it to."""
    with Path(str(payload["runs"])).open("a", encoding="utf-8") as runs:
        runs.write(f"{payload['n']}\n")
    fails_when_asked(job_type, payload)


def by_job(job: Job) -> None:
    """An advanced-mode handler: fails on its first attempt only."""
    if job.attempts == 1:
        raise PlannedFailure(f"{job.job_type} fails on attempt 1")


NOT_CALLABLE = 42


def records_pid(job_type: str, payload: Mapping[str, Any]) -> None:
    """Appends "n pid" to the file payload["runs"] names: which job ran, in which worker process."""
    with Path(str(payload["runs"])).open("a", encoding="utf-8") as runs:
        runs.write(f"{payload['n']} {os.getpid()}\n")


def crashes_once(job_type: str, payload: Mapping[str, Any]) -> None:
    """Kills its own process at once, as a segfaulting extension or the OOM killer would, the first time
    (payload["marker"] not there yet); runs normally after that."""
    marker = Path(str(payload["marker"]))
    if not marker.exists():
        marker.write_text("crashed", encoding="utf-8")
        os.kill(os.getpid(), signal.SIGKILL)


# -- coroutine handlers: the worker command runs them on the asyncio worker ----------------------------


async def records_runs_async(job_type: str, payload: Mapping[str, Any]) -> None:
    """records_runs as a coroutine: appends the job's n to payload["runs"], then fails if asked to."""
    await asyncio.sleep(0)
    records_runs(job_type, payload)


async def sleeps_async(job_type: str, payload: Mapping[str, Any]) -> None:
    """Marks its start, then awaits asyncio.sleep(payload["seconds"]): the asyncio worker's stop cancels
    it there at the shutdown deadline."""
    _started(payload)
    await asyncio.sleep(float(payload["seconds"]))
    Path(str(payload["marker"]) + ".finished").write_text("finished", encoding="utf-8")
