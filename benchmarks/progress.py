"""A progress display (rich) for long runs, and a silent stand-in for tests and CI logs."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress


class Progress:
    """Tasks with a description and a step count; the base class draws nothing."""

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def task(self, description: str, total: int) -> Any:
        return description

    def describe(self, task: Any, description: str) -> None:
        return None

    def advance(self, task: Any, steps: int = 1) -> None:
        return None

    def done(self, task: Any) -> None:
        return None

    def log(self, message: str) -> None:
        return None


class RichProgressDisplay(Progress):
    """Bars on stderr; refreshed twice a second so the display steals little CPU from the measurements."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
            refresh_per_second=2,
        )

    def __enter__(self) -> RichProgressDisplay:
        self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def task(self, description: str, total: int) -> Any:
        return self._progress.add_task(description, total=total)

    def describe(self, task: Any, description: str) -> None:
        self._progress.update(task, description=description)

    def advance(self, task: Any, steps: int = 1) -> None:
        self._progress.advance(task, steps)

    def done(self, task: Any) -> None:
        total = self._progress.tasks[self._index(task)].total
        self._progress.update(task, completed=total)

    def _index(self, task: Any) -> int:
        return next(i for i, t in enumerate(self._progress.tasks) if t.id == task)

    def log(self, message: str) -> None:
        self._progress.console.log(message)
