"""Periodic jobs' pure rules (proletarian_ref.periodic): due ticks, catch-up, DST, versions, bad schedules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from proletarian_ref.errors import ConfigurationError
from proletarian_ref.periodic import Schedule, TickRow, due_ticks, next_tick, plan


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
