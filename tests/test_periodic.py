"""Periodic jobs (proletarian_ref.periodic): due ticks, catch-up, DST, versions, removal, bad input."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conformance.harness import Harness, MemoryHarness
from conformance.side_tables import prepare
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.job import default_serializer
from proletarian_ref.periodic import Schedule, Scheduler, TickRow, due_ticks, next_tick, plan


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def test_a_scheduler_down_for_an_hour_enqueues_the_latest_tick_or_every_one_per_catch_up() -> None:
    skip = Schedule("s", "*/10 * * * *", "t/y")
    catch = Schedule("c", "*/10 * * * *", "t/y", catch_up=True)
    last, now = _utc("2026-01-01T10:00:00+00:00"), _utc("2026-01-01T11:05:00+00:00")
    assert due_ticks(skip, last, now) == [_utc("2026-01-01T11:00:00+00:00")]
    assert due_ticks(catch, last, now) == [last + timedelta(minutes=10 * n) for n in range(1, 7)]
    assert due_ticks(catch, last, now, limit=2) == [last + timedelta(minutes=10 * n) for n in range(1, 3)]


def test_a_tick_at_now_is_due_and_never_twice() -> None:
    schedule = Schedule("s", "0 * * * *", "t/y")
    tick = _utc("2026-01-01T10:00:00+00:00")
    assert due_ticks(schedule, tick - timedelta(minutes=1), tick) == [tick]
    assert due_ticks(schedule, tick, tick + timedelta(minutes=59)) == []


def test_a_time_skipped_by_spring_forward_runs_after_the_gap_once() -> None:
    # Europe/Oslo springs forward at 02:00 on 2026-03-29: 02:30 does not exist that night.
    schedule = Schedule("s", "30 2 * * *", "t/y", zone="Europe/Oslo", catch_up=True)
    ticks = due_ticks(schedule, _utc("2026-03-28T12:00:00+01:00"), _utc("2026-03-30T12:00:00+02:00"))
    assert ticks == [_utc("2026-03-29T03:00:00+02:00"), _utc("2026-03-30T02:30:00+02:00")]


def test_a_fixed_time_repeated_by_fall_back_runs_once_and_an_interval_in_both_hours() -> None:
    fixed = Schedule("f", "30 2 * * *", "t/y", zone="Europe/Oslo", catch_up=True)
    every = Schedule("e", "*/30 2 * * *", "t/y", zone="Europe/Oslo", catch_up=True)
    last, now = _utc("2026-10-25T00:00:00+02:00"), _utc("2026-10-25T05:00:00+01:00")
    assert due_ticks(fixed, last, now) == [_utc("2026-10-25T02:30:00+02:00")]
    assert due_ticks(every, last, now) == [
        _utc("2026-10-25T02:00:00+02:00"),
        _utc("2026-10-25T02:30:00+02:00"),
        _utc("2026-10-25T02:00:00+01:00"),
        _utc("2026-10-25T02:30:00+01:00"),
    ]


def test_an_older_version_leaves_the_schedule_alone() -> None:
    schedule = Schedule("s", "* * * * *", "t/y", version=1)
    row = TickRow(_utc("2026-01-01T10:00:00+00:00"), "other", 2)
    assert plan(schedule, row, _utc("2026-01-01T11:00:00+00:00")).ticks == []
    newer = Schedule("s", "* * * * *", "t/y", version=2)
    assert plan(newer, row, _utc("2026-01-01T10:01:00+00:00")).ticks == [_utc("2026-01-01T10:01:00+00:00")]


def test_next_tick_is_strictly_after() -> None:
    schedule = Schedule("s", "0 12 * * *", "t/y", zone="Europe/Oslo")
    assert next_tick(schedule, _utc("2026-01-01T11:00:00+00:00")) == _utc("2026-01-02T12:00:00+01:00")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "bad cron expression"),
        ({"zone": "Mars/Olympus"}, "unknown time zone"),
        ({"name": ""}, "Schedule.name"),
        ({"version": -1}, "version"),
        ({"job_type": ""}, "job_type"),
    ],
)
def test_a_bad_schedule_is_refused_naming_what_is_wrong(options: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"name": "s", "cron": "* * * * *", "job_type": "t/y", **options}
    with pytest.raises(ConfigurationError, match=message):
        Schedule(**fields)  # type: ignore[arg-type]


# -- on every backend: the behaviour docs/periodic.md defines ----------------------------------------------


class _Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _ticks(harness: Harness) -> list[str]:
    payloads = [row.payload for row in harness.jobs()] + [row.payload for row in harness.archived_jobs()]
    return sorted(default_serializer().decode(payload)["tick"] for payload in payloads)


def _schedule(cron: str = "0 * * * *", **options: Any) -> Schedule:
    return Schedule("report", cron, "t/y", payload=lambda t: {"tick": t.isoformat()}, **options)


def _scheduler(harness: Harness, schedule: Schedule, clock: Any) -> Scheduler:
    return Scheduler(harness.backend(), [schedule], clock=clock, **harness.table_options)


def test_after_an_hour_down_catch_up_false_enqueues_only_the_latest_tick(db: Harness) -> None:
    prepare(db)
    clock = _Clock(_utc("2026-01-01T09:59:00+00:00"))
    scheduler = _scheduler(db, _schedule("*/10 * * * *"), clock)
    scheduler.register()
    clock.now = _utc("2026-01-01T11:05:00+00:00")
    scheduler.tick()
    assert _ticks(db) == ["2026-01-01T11:00:00+00:00"]
    clock.now = _utc("2026-01-01T11:10:00+00:00")
    scheduler.tick()
    assert _ticks(db) == ["2026-01-01T11:00:00+00:00", "2026-01-01T11:10:00+00:00"]


def test_a_newer_version_takes_over_and_the_older_deployment_stops(db: Harness) -> None:
    prepare(db)
    clock = _Clock(_utc("2026-01-01T09:59:00+00:00"))
    old = _scheduler(db, _schedule("0 * * * *", catch_up=True), clock)
    new = _scheduler(db, _schedule("30 * * * *", catch_up=True, version=2), clock)
    old.register()
    new.register()
    clock.now = _utc("2026-01-01T10:00:00+00:00")
    old.tick()  # the old deployment, still alone: its 10:00
    clock.now = _utc("2026-01-01T10:45:00+00:00")
    new.tick()  # the new one from the recorded 10:00 under its own cron: 10:30
    clock.now = _utc("2026-01-01T12:40:00+00:00")
    old.tick()  # version 1 < 2 recorded: leaves the schedule alone
    new.tick()
    assert _ticks(db) == [
        "2026-01-01T10:00:00+00:00",
        "2026-01-01T10:30:00+00:00",
        "2026-01-01T11:30:00+00:00",
        "2026-01-01T12:30:00+00:00",
    ]
    (state,) = new.states()
    assert state.version == 2 and state.definition.startswith("30 * * * * | UTC")


def test_a_schedule_removed_from_code_keeps_its_row_and_is_left_alone(db: Harness) -> None:
    prepare(db)
    clock = _Clock(_utc("2026-01-01T09:59:00+00:00"))
    first = _scheduler(db, _schedule(), clock)
    first.register()
    other = Scheduler(db.backend(), [], clock=clock, **db.table_options)
    clock.now = _utc("2026-01-01T12:00:00+00:00")
    assert other.tick() == []
    assert [state.name for state in other.states()] == ["report"]
    assert _ticks(db) == []


def test_the_database_clock_decides_when_asked(db: Harness) -> None:
    prepare(db)
    scheduler = Scheduler(db.backend(), [_schedule("* * * * *")], clock="database", **db.table_options)
    scheduler.register()
    (state,) = scheduler.states()
    assert abs(state.last_tick - datetime.now(UTC)) < timedelta(minutes=5)


def test_run_ticks_until_stopped_and_a_failing_schedule_stops_no_other() -> None:
    memory = MemoryHarness()
    clock = _Clock(_utc("2026-01-01T09:59:00+00:00"))

    def broken(tick: datetime) -> Any:
        raise RuntimeError("the payload callable failed")

    schedules = [_schedule(), Schedule("broken", "0 * * * *", "t/y", payload=broken)]
    scheduler = Scheduler(memory.backend(), schedules, clock=clock, **memory.table_options)
    errors: list[Any] = []
    scheduler.register()
    clock.now = _utc("2026-01-01T10:00:00+00:00")
    stop = threading.Event()
    thread = threading.Thread(
        target=scheduler.run,
        args=(stop,),
        kwargs={"max_sleep": 0.01, "on_error": lambda e, d: errors.append(d)},
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not (_ticks(memory) and errors) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join()
    assert _ticks(memory) == ["2026-01-01T10:00:00+00:00"]
    assert errors[0]["schedule"] == "broken" and "the payload callable failed" in errors[0]["error"]
    (state,) = [s for s in scheduler.states() if s.name == "broken"]
    assert state.last_job_id is None  # its tick stays due


def test_a_changed_schedule_goes_on_from_the_recorded_tick_and_equal_versions_both_tick(db: Harness) -> None:
    prepare(db)
    clock = _Clock(_utc("2026-01-01T09:59:00+00:00"))
    logged: list[str] = []
    old = _scheduler(db, _schedule("0 * * * *", catch_up=True), clock)
    changed = Scheduler(
        db.backend(),
        [_schedule("30 * * * *", catch_up=True)],
        clock=clock,
        log=lambda event, data: logged.append(event),
        **db.table_options,
    )
    old.register()
    clock.now = _utc("2026-01-01T10:10:00+00:00")
    old.tick()
    clock.now = _utc("2026-01-01T10:40:00+00:00")
    changed.tick()  # from the recorded 10:00 under its own cron, nothing made up before it
    clock.now = _utc("2026-01-01T11:10:00+00:00")
    old.tick()  # the same version: the old definition still ticks, after the recorded 10:30
    assert _ticks(db) == [
        "2026-01-01T10:00:00+00:00",
        "2026-01-01T10:30:00+00:00",
        "2026-01-01T11:00:00+00:00",
    ]
    assert "periodic.definitions-differ" in logged
