"""Periodic jobs: schedules declared in code, each tick enqueued exactly once by any number of schedulers.

The design (docs/periodic.md): the side table `<job_table>_periodic_tick` has one row per schedule name
holding the last tick enqueued. A scheduler locks a schedule's row (SKIP LOCKED: another scheduler at it
is doing the same work), works out the ticks due after it with cronsim in the schedule's time zone,
enqueues one ordinary Proletarian job per tick and moves the row past them, all in one transaction: a
crash enqueues and records or does neither, and the row lock keeps two schedulers from both doing it.

The decisions are pure functions (`Schedule`, `due_ticks`, `next_tick`, `plan`); the statements go
through a PeriodicStore, so an asyncio twin shares everything but the store's I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NamedTuple, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from proletarian_ref import side_tables
from proletarian_ref.backend import Backend
from proletarian_ref.backends import backend_for_data_source
from proletarian_ref.backends.memory import _DELETED
from proletarian_ref.clock import Clock, now_from, system_utc
from proletarian_ref.errors import ConfigurationError, DatabaseError
from proletarian_ref.job import enqueue
from proletarian_ref.job_ids import JobIdStrategy, default_job_id_strategy
from proletarian_ref.keywords import DEFAULT_QUEUE
from proletarian_ref.log import null_logger
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, TableName, table_name

FEATURE: Final = "periodic"
# The most ticks of one schedule a catching-up transaction enqueues; the rest follow in the next ones.
CATCH_UP_BATCH: Final = 100
MAX_NAME_LENGTH: Final = 255
Logger = Callable[[str, Any], None]


@dataclass(frozen=True, slots=True)
class Schedule:
    """One periodic job: at every tick of `cron` in `zone`, an ordinary job of `job_type` on `queue`.

    `payload` is the job's payload, or a callable given the tick (an aware UTC datetime) that returns it.
    `catch_up`: after the schedulers were down over several ticks, False enqueues only the latest missed
    tick, True every one (at most CATCH_UP_BATCH per transaction). `version`: raise it when you change the
    schedule; a scheduler whose version is lower than the one recorded leaves the schedule alone, so in a
    rolling upgrade the old deployment stops enqueueing it once a new one has.
    """

    name: str
    cron: str
    job_type: str
    payload: Any = None
    queue: str = DEFAULT_QUEUE
    zone: str = "UTC"
    catch_up: bool = False
    version: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 1 <= len(self.name) <= MAX_NAME_LENGTH:
            raise ConfigurationError(f"Schedule.name must be a str of 1 to {MAX_NAME_LENGTH} characters")
        if not isinstance(self.job_type, str) or not self.job_type:
            raise ConfigurationError(f"Schedule {self.name!r}: job_type must be a non-empty str")
        if type(self.version) is not int or self.version < 0:
            raise ConfigurationError(f"Schedule {self.name!r}: version must be an int >= 0")
        if not isinstance(self.catch_up, bool):
            raise ConfigurationError(f"Schedule {self.name!r}: catch_up must be True or False")
        try:
            zone = ZoneInfo(self.zone)
        except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
            raise ConfigurationError(f"Schedule {self.name!r}: unknown time zone {self.zone!r}") from exc
        try:
            CronSim(self.cron, datetime(2000, 1, 1, tzinfo=zone))
        except (CronSimError, TypeError) as exc:
            raise ConfigurationError(
                f"Schedule {self.name!r}: bad cron expression {self.cron!r}: {exc}"
            ) from exc

    @property
    def tzinfo(self) -> ZoneInfo:
        return ZoneInfo(self.zone)

    @property
    def definition(self) -> str:
        """What the side table records of the schedule, to show which deployment wrote the row."""
        return f"{self.cron} | {self.zone} | {self.job_type} | {self.queue}"

    @staticmethod
    def cron_and_zone(definition: str) -> tuple[str, str] | None:
        """The cron expression and zone of a recorded `definition`, or None if it is not one of ours."""
        parts = definition.split(" | ", 2)
        return (parts[0], parts[1]) if len(parts) == 3 else None

    def payload_for(self, tick: datetime) -> Any:
        return self.payload(tick) if callable(self.payload) else self.payload


def checked_schedules(schedules: Iterable[Schedule]) -> list[Schedule]:
    """`schedules` as a list, each a Schedule and no name twice."""
    found = list(schedules)
    names: set[str] = set()
    for schedule in found:
        if not isinstance(schedule, Schedule):
            raise ConfigurationError(f"schedules must be Schedule objects, not {type(schedule).__name__}")
        if schedule.name in names:
            raise ConfigurationError(f"schedule name {schedule.name!r} is used twice")
        names.add(schedule.name)
    return found


# -- the pure part: which ticks are due -------------------------------------------------------------------


def due_ticks(
    schedule: Schedule, last_tick: datetime, now: datetime, limit: int = CATCH_UP_BATCH
) -> list[datetime]:
    """The ticks after `last_tick` up to and including `now`, as UTC instants, oldest first.

    With catch_up=False only the latest of them; with True the first `limit`. Ticks come from cronsim in
    the schedule's zone (Debian cron's rules across DST changes: a time skipped by a spring-forward runs
    at the first minute after the gap; a fixed time repeated by a fall-back runs once; an interval runs in
    both hours), and only instants after `last_tick` count, so a tick is never due twice.
    """
    if now <= last_tick:
        return []
    zone = schedule.tzinfo
    if not schedule.catch_up:
        # The latest tick at or before now: the first one going back from a microsecond after it.
        latest = next(
            CronSim(schedule.cron, (now + timedelta(microseconds=1)).astimezone(zone), reverse=True)
        )
        tick = latest.astimezone(UTC)
        return [tick] if last_tick < tick <= now else []
    ticks: list[datetime] = []
    for candidate in CronSim(schedule.cron, last_tick.astimezone(zone)):
        tick = candidate.astimezone(UTC)
        if tick > now or len(ticks) == limit:
            break
        if tick > last_tick and (not ticks or tick > ticks[-1]):
            ticks.append(tick)
    return ticks


def next_tick(schedule: Schedule, after: datetime) -> datetime:
    """The first tick after `after`, as a UTC instant."""
    for candidate in CronSim(schedule.cron, after.astimezone(schedule.tzinfo)):
        tick = candidate.astimezone(UTC)
        if tick > after:
            return tick
    raise AssertionError("cronsim's iterator ended")  # pragma: no cover: it never does


class TickRow(NamedTuple):
    """A schedule's locked row: the last tick enqueued, and the definition and version that wrote it."""

    last_tick: datetime
    definition: str
    version: int


class Plan(NamedTuple):
    """What a scheduler does with one schedule this round: the ticks to enqueue, or why none."""

    ticks: list[datetime]
    reason: Literal["due", "nothing due", "newer version recorded"]


def plan(schedule: Schedule, row: TickRow, now: datetime) -> Plan:
    """The ticks a scheduler holding `row`'s lock enqueues at `now`."""
    if row.version > schedule.version:
        return Plan([], "newer version recorded")
    ticks = due_ticks(schedule, row.last_tick, now)
    return Plan(ticks, "due" if ticks else "nothing due")


# -- the store: the side table's statements ----------------------------------------------------------------


class Advance(NamedTuple):
    """A tick's record: the schedule's row moved from the tick read under its lock to the last enqueued."""

    name: str
    expected: datetime
    tick: datetime
    job_id: Any
    definition: str
    version: int
    now: datetime


class ScheduleState(NamedTuple):
    """A row of the side table, as the CLI lists it."""

    name: str
    last_tick: datetime
    last_job_id: Any
    definition: str
    version: int
    updated_at: datetime


class PeriodicStore(Protocol):
    """The side table's statements, each on a connection in a transaction the scheduler owns."""

    def register(self, conn: Any, schedule: Schedule, now: datetime) -> None:
        """Add the schedule's row, starting at `now`, unless it is there."""
        ...

    def lock(self, conn: Any, name: str) -> TickRow | None:
        """The schedule's row, locked; None if another transaction has it locked (or it is missing)."""
        ...

    def advance(self, conn: Any, step: Advance) -> None:
        """Move the locked row from `step.expected` to `step.tick`; raise unless that row alone changed."""
        ...

    def states(self, conn: Any) -> list[ScheduleState]: ...

    def forget(self, conn: Any, name: str) -> None: ...

    def database_now(self, conn: Any) -> datetime: ...


class SqlPeriodicStore(side_tables.SqlStore):
    """PeriodicStore over sql/<dialect>/periodic.sql."""

    feature = FEATURE

    def register(self, conn: Any, schedule: Schedule, now: datetime) -> None:
        params = {
            "schedule_name": schedule.name,
            "now": self._time(now),
            "definition": schedule.definition,
            "version": schedule.version,
        }
        self._run(conn, "register", params, side_tables.count)

    def lock(self, conn: Any, name: str) -> TickRow | None:
        found = self._run(conn, "lock_tick", {"schedule_name": name}, side_tables.rows)
        if not found:
            return None
        last_tick, definition, version = found[0]
        return TickRow(side_tables.from_db_time(last_tick), definition, int(version))

    def advance(self, conn: Any, step: Advance) -> None:
        params = {
            "schedule_name": step.name,
            "expected_tick": self._time(step.expected),
            "last_tick": self._time(step.tick),
            "last_job_id": step.job_id,
            "definition": step.definition,
            "version": step.version,
            "now": self._time(step.now),
        }
        changed = self._run(conn, "advance", params, side_tables.count)
        if changed != 1:
            raise _not_recorded(step, changed)

    def states(self, conn: Any) -> list[ScheduleState]:
        found = self._run(conn, "list_ticks", {}, side_tables.rows)
        return [
            ScheduleState(
                name,
                side_tables.from_db_time(last),
                job_id,
                definition,
                int(version),
                side_tables.from_db_time(at),
            )
            for name, last, job_id, definition, version, at in found
        ]

    def forget(self, conn: Any, name: str) -> None:
        self._run(conn, "forget", {"schedule_name": name}, side_tables.count)

    def database_now(self, conn: Any) -> datetime:
        found = self._run(conn, "database_now", {}, side_tables.rows)
        value: datetime = found[0][0]
        return side_tables.from_db_time(value)


class MemoryPeriodicStore:
    """The in-memory twin of the side table: the executable specification of its statements."""

    def __init__(self, backend: Any, job_table: TableName) -> None:
        self.db = backend.db
        self.table = str(side_tables.side_table(job_table, FEATURE))

    def register(self, conn: Any, schedule: Schedule, now: datetime) -> None:
        with self.db.lock:
            conn.check_alive()
            if (
                conn._get(self.table, schedule.name) is None
                and (self.table, schedule.name) not in self.db.row_locks
            ):
                conn._lock_row(self.table, schedule.name)
                state = ScheduleState(schedule.name, now, None, schedule.definition, schedule.version, now)
                conn._write(self.table, schedule.name, state)

    def lock(self, conn: Any, name: str) -> TickRow | None:
        with self.db.lock:
            conn.check_alive()
            owner = self.db.row_locks.get((self.table, name))
            row = conn._get(self.table, name)
            if row is None or (owner is not None and owner is not conn):
                return None  # SKIP LOCKED
            conn._lock_row(self.table, name)
            return TickRow(row.last_tick, row.definition, row.version)

    def advance(self, conn: Any, step: Advance) -> None:
        with self.db.lock:
            conn.check_alive()
            row = conn._get(self.table, step.name)
            locked = self.db.row_locks.get((self.table, step.name)) is conn
            if row is None or row.last_tick != step.expected or not locked:
                raise _not_recorded(step, 0)
            state = ScheduleState(step.name, step.tick, step.job_id, step.definition, step.version, step.now)
            conn._write(self.table, step.name, state)

    def states(self, conn: Any) -> list[ScheduleState]:
        with self.db.lock:
            names = set(self.db.tables.get(self.table, {})) | set(conn._changes.get(self.table, {}))
            found = [conn._get(self.table, name) for name in names]
        return sorted((row for row in found if row is not None), key=lambda row: row.name)

    def forget(self, conn: Any, name: str) -> None:
        with self.db.lock:
            conn.check_alive()
            if conn._get(self.table, name) is not None:
                conn._lock_row(self.table, name)
                conn._write(self.table, name, _DELETED)

    def database_now(self, conn: Any) -> datetime:
        return datetime.now(UTC)


def _not_recorded(step: Advance, changed: int) -> DatabaseError:
    return DatabaseError(
        f"recording tick {step.tick.isoformat()} of schedule {step.name!r} changed {changed} rows"
    )


def store_for(backend: Backend, job_table: TableName) -> PeriodicStore:
    """The backend's store for `job_table`'s side table; a backend may bring its own as `periodic_store`."""
    store: PeriodicStore = side_tables.store_class(
        backend, "periodic_store", MemoryPeriodicStore, SqlPeriodicStore
    )(backend, job_table)
    return store


# -- the scheduler ---------------------------------------------------------------------------------------


class Scheduler:
    """Enqueues the ticks of `schedules`; run as many as you like, on any hosts, against one database.

    `data_source` is what create_queue_worker takes (a pool, a connection factory, a Backend). `clock`:
    the application's clock (the default, as for everything else in the library), or "database" for the
    database server's, which every host then agrees on (docs/periodic.md, "Clock skew").
    """

    def __init__(
        self,
        data_source: Any,
        schedules: Iterable[Schedule],
        *,
        job_table: str | TableName = DEFAULT_JOB_TABLE,
        archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
        clock: Clock | Literal["database"] = system_utc,
        job_id_strategy: JobIdStrategy | None = None,
        store: PeriodicStore | None = None,
        log: Logger = null_logger,
    ) -> None:
        self.backend = backend_for_data_source(data_source)
        self.schedules = checked_schedules(schedules)
        self.job_table = table_name(job_table, option="job_table")
        self.archived_job_table = table_name(archived_job_table, option="archived_job_table")
        if clock != "database" and not callable(clock):
            raise ConfigurationError(f"clock must be a Clock or 'database', not {clock!r}")
        self.clock = clock
        self.strategy = job_id_strategy or default_job_id_strategy(self.backend.dialect)
        self.store = store if store is not None else store_for(self.backend, self.job_table)
        self.log = log
        self._registered = False

    def _now(self, conn: Any) -> datetime:
        if self.clock == "database":
            return self.store.database_now(conn)
        return now_from(self.clock)

    def register(self) -> None:
        """Add the rows of schedules seen for the first time (found or not found once, at start)."""
        with self.backend.transaction() as conn:
            if not side_tables.exists(self.backend, conn, FEATURE, self.job_table):
                raise side_tables.missing_table_error(FEATURE, self.job_table)
            now = self._now(conn)
            for schedule in sorted(self.schedules, key=lambda s: s.name):
                self.store.register(conn, schedule, now)
        self._registered = True

    def tick(self) -> list[Any]:
        """One round: every schedule's due ticks enqueued, each schedule in its own transaction; the ids."""
        return self._round(None)

    def _round(self, on_error: Logger | None) -> list[Any]:
        """tick(); with `on_error`, a schedule whose round fails is reported to it and the others go on."""
        if not self._registered:
            self.register()
        enqueued: list[Any] = []
        for schedule in self.schedules:
            try:
                while True:
                    batch = self.tick_schedule(schedule)
                    enqueued.extend(batch)
                    if len(batch) < CATCH_UP_BATCH:
                        break
            except Exception as exc:
                if on_error is None:
                    raise
                on_error("periodic.error", {"schedule": schedule.name, "error": repr(exc)})
        return enqueued

    def tick_schedule(self, schedule: Schedule) -> list[Any]:
        """One transaction for `schedule`: lock its row, enqueue its due ticks, record the last; the ids."""
        with self.backend.transaction() as conn:
            row = self.store.lock(conn, schedule.name)
            if row is None:
                return []  # another scheduler has it now, and enqueues what is due
            now = self._now(conn)
            decided = plan(schedule, row, now)
            if decided.reason == "newer version recorded":
                self.log(
                    "periodic.older-definition", {"schedule": schedule.name, "version": schedule.version}
                )
            if not decided.ticks:
                return []
            if row.version == schedule.version and row.definition != schedule.definition:
                self.log(
                    "periodic.definitions-differ", {"schedule": schedule.name, "recorded": row.definition}
                )
            ids = [self._enqueue(conn, schedule, tick, now) for tick in decided.ticks]
            last_id = self.strategy.encode_id(ids[-1])
            step = Advance(
                schedule.name,
                row.last_tick,
                decided.ticks[-1],
                last_id,
                schedule.definition,
                schedule.version,
                now,
            )
            self.store.advance(conn, step)
        self.log(
            "periodic.enqueued", {"schedule": schedule.name, "ticks": [t.isoformat() for t in decided.ticks]}
        )
        return ids

    def _enqueue(self, conn: Any, schedule: Schedule, tick: datetime, now: datetime) -> Any:
        return enqueue(
            conn,
            schedule.job_type,
            schedule.payload_for(tick),
            queue=schedule.queue,
            process_at=tick,
            job_table=self.job_table,
            archived_job_table=self.archived_job_table,
            job_id_strategy=self.strategy,
            clock=lambda: now,
            backend=self.backend,
        )

    def states(self) -> list[ScheduleState]:
        """The side table's rows (schedules no longer defined included)."""
        with self.backend.transaction() as conn:
            return self.store.states(conn)

    def next_wake(self, now: datetime) -> datetime:
        """When the next tick of any schedule is due."""
        return min(
            (next_tick(schedule, now) for schedule in self.schedules), default=now + timedelta(minutes=1)
        )

    def run(self, stop: threading.Event, *, max_sleep: float = 60.0, on_error: Logger | None = None) -> None:
        """Tick until `stop` is set, sleeping until the next tick (at most `max_sleep` seconds) in between.

        An error ends nothing: a schedule whose round fails (its payload callable raised, the database went
        away) is logged as periodic.error and the others go on; a round that could not start (registering,
        at start) is tried again after a second. Either way its ticks stay due and are enqueued later.
        """
        report = on_error or self.log
        while not stop.is_set():
            try:
                self._round(report)
            except Exception as exc:
                report("periodic.error", {"error": repr(exc)})
                stop.wait(1.0)
                continue
            now = datetime.now(UTC) if self.clock == "database" else now_from(self.clock)
            wait = (self.next_wake(now) - now).total_seconds()
            stop.wait(min(max(wait, 0.0), max_sleep))


def recorded_next_tick(state: ScheduleState, now: datetime) -> datetime | None:
    """The next tick of a recorded schedule by the definition its row holds (None if that cannot tell)."""
    found = Schedule.cron_and_zone(state.definition)
    if found is None:
        return None
    try:
        schedule = Schedule(state.name, found[0], "-", zone=found[1])
    except ConfigurationError:
        return None
    return next_tick(schedule, max(state.last_tick, now))


def listing(
    schedules: Sequence[Schedule], states: Sequence[ScheduleState], now: datetime
) -> list[tuple[str, str, datetime | None, datetime | None]]:
    """(name, definition, last tick, next tick) per schedule in code and per recorded row not in code."""
    recorded = {state.name: state for state in states}
    rows: list[tuple[str, str, datetime | None, datetime | None]] = []
    for schedule in sorted(schedules, key=lambda s: s.name):
        state = recorded.pop(schedule.name, None)
        last = state.last_tick if state is not None and state.last_job_id is not None else None
        after = max(state.last_tick, now) if state is not None else now
        rows.append((schedule.name, schedule.definition, last, next_tick(schedule, after)))
    for state in recorded.values():
        rows.append((state.name, f"(not in code) {state.definition}", state.last_tick, None))
    return rows
