"""The side tables' clauses: unique jobs (U) and periodic jobs (Y), on any harness, memory included."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final

from hypothesis import strategies as st

from conformance import aio_bridge
from conformance.base import SuiteBase, property_test
from conformance.harness import Harness, MemoryHarness, SqlHarness
from proletarian_ref import side_tables
from proletarian_ref.backend import STATUS_SUCCESS, ArchivedJobRecord, Backend, JobRecord
from proletarian_ref.errors import DatabaseError
from proletarian_ref.job import default_serializer, enqueue
from proletarian_ref.periodic import PeriodicStore, Schedule, Scheduler, due_ticks
from proletarian_ref.tables import table_name
from proletarian_ref.unique import UniqueKey

FEATURES: Final = ["periodic", "unique", "errors"]
START: Final = datetime(2026, 3, 28, 22, 0, tzinfo=UTC)  # Europe/Oslo springs forward that night


def prepare(harness: Harness) -> None:
    """Create the side tables of `harness`'s job table if missing, and empty them."""
    job = table_name(harness.job_table)
    tables = [str(side_tables.side_table(job, feature)) for feature in FEATURES]
    if isinstance(harness, MemoryHarness):
        harness.memory.clear(*tables)
        return
    assert isinstance(harness, SqlHarness)
    for statement in side_tables.install_statements(harness.dialect, FEATURES, job):
        harness.execute(statement)
    for table in tables:
        harness.execute(f"DELETE FROM {table}")


def keyed_enqueue(conn: Any, job_type: str, payload: Any, **options: Any) -> Any:
    """The U clauses' enqueue: proletarian_ref.enqueue, or on the asyncio bridge's connections
    proletarian_ref.aio.enqueue, awaited on the bridge's loop (so the clauses prove the asyncio API)."""
    if isinstance(conn, aio_bridge.BlockingConnection):
        return aio_bridge.blocking_enqueue(conn, job_type, payload, **options)
    return enqueue(conn, job_type, payload, **options)


def _options(harness: Harness) -> dict[str, Any]:
    return {"job_table": harness.job_table, "archived_job_table": harness.archived_job_table}


def _payloads(harness: Harness) -> list[Any]:
    """The decoded payloads of every job, queued or archived."""
    return [harness_payload(row.payload) for row in _all_rows(harness)]


def tick_once(harness: Harness, schedules: list[Schedule], first_seen: datetime, now: datetime) -> list[Any]:
    """Register `schedules` at `first_seen` and tick them at `now`, on a backend of their own; the job ids."""
    clock = [first_seen]
    scheduler = Scheduler(harness.make_backend(), schedules, clock=lambda: clock[0], **_options(harness))
    try:
        scheduler.register()
        clock[0] = now
        return scheduler.tick()
    finally:
        scheduler.backend.close()


def _all_rows(harness: Harness) -> list[JobRecord | ArchivedJobRecord]:
    return [*harness.jobs(), *harness.archived_jobs()]


@contextlib.contextmanager
def _connection(harness: Harness) -> Iterator[Any]:
    conn = harness.connect()
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            conn.rollback()
        conn.close()


def _archive_one(backend: Backend, harness: Harness) -> bool:
    """What a Clojure worker does to a due job: Proletarian's claim, archive and delete, and nothing else."""
    job_table, archive = table_name(harness.job_table), table_name(harness.archived_job_table)
    with backend.transaction() as conn:
        job = backend.get_next_job(
            conn, job_table, ":proletarian/default", datetime.now(UTC) + timedelta(days=1)
        )
        if job is None:
            return False
        backend.archive_job(conn, job_table, archive, job.job_id, STATUS_SUCCESS, datetime.now(UTC))
        backend.delete_job(conn, job_table, job.job_id)
        return True


class _Crash(Exception):
    """A scheduler dying inside its tick's transaction (the transaction rolls back)."""


class _CrashingStore:
    """A store that dies before or after recording a tick, when told to."""

    def __init__(self, store: PeriodicStore) -> None:
        self.store = store
        self.crash: str | None = None
        self.during: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def advance(self, conn: Any, step: Any) -> None:
        if self.during is not None:
            self.during()
        if self.crash == "before":
            raise _Crash("before recording")
        self.store.advance(conn, step)
        if self.crash == "after":
            raise _Crash("after recording")


class SideTableTests(SuiteBase):
    """Unique keys (U) and periodic ticks (Y) on the side tables, whatever backend the harness has."""

    __test__ = False
    # How long a competing enqueue is given to reach its wait on the key's row lock before the first commits.
    settle_s: ClassVar[float] = 0.3

    # -- unique jobs -------------------------------------------------------------------------------------

    def test_a_rolled_back_enqueue_leaves_no_key_and_an_archived_job_frees_its_key(
        self, harness: Harness
    ) -> None:
        """U1 A rolled-back keyed enqueue leaves no key; a job a Clojure-like worker archived frees its key.

        The archive is Proletarian's own claim, archive and delete, which know nothing of the side table.
        """
        prepare(harness)
        backend = harness.backend()
        options = {**_options(harness), "backend": backend}
        with _connection(harness) as conn:
            rolled_back = keyed_enqueue(conn, "t/u", {"n": 0}, unique_key="k", **options)
            conn.rollback()
            first = keyed_enqueue(conn, "t/u", {"n": 1}, unique_key="k", **options)
            conn.commit()
            assert first != rolled_back
            assert keyed_enqueue(conn, "t/u", {"n": 2}, unique_key="k", **options) == first
            conn.commit()
            assert len(harness.jobs()) == 1
            assert _archive_one(backend, harness)
            second = keyed_enqueue(conn, "t/u", {"n": 3}, unique_key="k", **options)
            conn.commit()
            assert second != first
            assert keyed_enqueue(conn, "t/u", {"n": 4}, unique_key="k", **options) == second
            conn.commit()
        assert sorted(p["n"] for p in _payloads(harness)) == [1, 3]

    def test_a_running_job_holds_its_key_until_its_archive_commits(self, harness: Harness) -> None:
        """U2 A job a worker has claimed still holds its key (until="archived"), and no longer with "started".

        Released before the archive commits, the key would let a second job in while the first can still
        be retried: two live jobs for one key.
        """
        prepare(harness)
        backend = harness.backend()
        options = {**_options(harness), "backend": backend}
        job_table = table_name(harness.job_table)
        with _connection(harness) as conn:
            first = keyed_enqueue(conn, "t/u", {"n": 1}, unique_key="k", **options)
            conn.commit()
            with backend.transaction() as worker:
                claimed = backend.get_next_job(worker, job_table, ":proletarian/default", datetime.now(UTC))
                assert claimed is not None
                assert keyed_enqueue(conn, "t/u", {"n": 2}, unique_key="k", **options) == first
                conn.commit()
                started = keyed_enqueue(
                    conn, "t/u", {"n": 3}, unique_key=UniqueKey("k", until="started"), **options
                )
                conn.commit()
                assert started != first
                backend.retry_at(worker, job_table, claimed.job_id, datetime.now(UTC))
        assert sorted(p["n"] for p in _payloads(harness)) == [1, 3]

    def test_concurrent_enqueues_of_one_key_make_one_job(self, harness: Harness) -> None:
        """U3 Two open transactions enqueue one key: one job, and the second answers with it.

        The second waits on the key's row lock until the first commits (the memory backend refuses at
        once instead, and the enqueue is tried again), so a check made before the lock cannot let both in.
        """
        prepare(harness)
        options = {**_options(harness), "backend": harness.backend()}
        answers: list[Any] = []
        with _connection(harness) as first_conn, _connection(harness) as second_conn:
            first = keyed_enqueue(first_conn, "t/u", {"n": 1}, unique_key="k", **options)

            def second() -> None:
                for _ in range(50):
                    try:
                        answers.append(keyed_enqueue(second_conn, "t/u", {"n": 2}, unique_key="k", **options))
                        second_conn.commit()
                        return
                    except DatabaseError:
                        second_conn.rollback()
                        time.sleep(0.05)

            thread = threading.Thread(target=second)
            thread.start()
            time.sleep(self.settle_s)
            first_conn.commit()
            thread.join()
        assert answers == [first]
        assert [p["n"] for p in _payloads(harness)] == [1]

    @property_test(
        1.0,
        plan=st.lists(
            st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.booleans()), min_size=1, max_size=6),
            min_size=2,
            max_size=4,
        ),
    )
    def test_concurrent_enqueuers_with_rollbacks_keep_one_live_job_per_key(
        self, harness: Harness, plan: list[list[tuple[int, bool, bool]]]
    ) -> None:
        """U4 Enqueuers of random keys, rolling back at random, beside a Clojure-like archiver: none lost.

        Per key at most one job in the job table; every committed enqueue answers with a job of its key
        that exists (its own or the holder's); no rolled-back job exists.
        """
        harness.clear()
        prepare(harness)
        backend = harness.make_backend()
        options = {**_options(harness), "backend": backend}
        committed: list[tuple[str, Any, int]] = []
        rolled_back: list[int] = []
        lock = threading.Lock()

        def enqueuer(number: int, ops: list[tuple[int, bool, bool]]) -> None:
            with _connection(harness) as conn:
                for step, (key, rollback, archive) in enumerate(ops):
                    op = number * 100 + step
                    try:
                        job_id = keyed_enqueue(
                            conn, "t/u", {"n": op, "key": f"k{key}"}, unique_key=f"k{key}", **options
                        )
                        if rollback:
                            conn.rollback()
                            with lock:
                                rolled_back.append(op)
                        else:
                            conn.commit()
                            with lock:
                                committed.append((f"k{key}", job_id, op))
                    except DatabaseError:  # a deadlock victim or the memory backend's refusal: rolled back
                        conn.rollback()
                        with lock:
                            rolled_back.append(op)
                    if archive:
                        with contextlib.suppress(DatabaseError):
                            _archive_one(backend, harness)

        threads = [threading.Thread(target=enqueuer, args=(n, ops)) for n, ops in enumerate(plan)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        backend.close()
        strategy = harness.job_id_strategy()
        payloads = {
            strategy.decode_id(row.job_id): harness_payload(row.payload) for row in _all_rows(harness)
        }
        live = [harness_payload(row.payload)["key"] for row in harness.jobs()]
        assert len(live) == len(set(live)), f"two live jobs for one key: {sorted(live)}"
        for key, job_id, _op in committed:
            assert job_id in payloads, f"enqueue of {key} answered {job_id}, which is in neither table"
            assert payloads[job_id]["key"] == key
        written = {payload["n"] for payload in payloads.values()}
        assert not written & set(rolled_back), "a rolled-back enqueue left its job"

    # -- periodic jobs -----------------------------------------------------------------------------------

    def test_a_scheduler_skips_a_schedule_another_is_ticking(self, harness: Harness) -> None:
        """Y1 While one scheduler's tick transaction is open, another enqueues none of its ticks, nor waits"""
        prepare(harness)
        now = [START]
        schedule = Schedule(
            "every-10", "*/10 * * * *", "t/y", payload=lambda tick: {"tick": tick.isoformat()}
        )
        first = Scheduler(harness.backend(), [schedule], clock=lambda: now[0], **_options(harness))
        second = Scheduler(harness.backend(), [schedule], clock=lambda: now[0], **_options(harness))
        first.register()
        second.register()
        now[0] += timedelta(minutes=25)
        crashing = _CrashingStore(first.store)
        first.store = crashing
        during: list[list[Any]] = []
        crashing.during = lambda: during.append(second.tick())
        assert len(first.tick()) == 1
        assert during == [[]]
        assert [p["tick"] for p in _payloads(harness)] == ["2026-03-28T22:20:00+00:00"]

    @property_test(
        1.0,
        skews=st.lists(st.integers(-120, 120), min_size=2, max_size=4),
        steps=st.lists(
            st.tuples(st.integers(0, 2400), st.integers(0, 3), st.sampled_from([None, "before", "after"])),
            min_size=1,
            max_size=14,
        ),
    )
    def test_schedulers_with_crashes_and_skewed_clocks_enqueue_each_tick_once(
        self, harness: Harness, skews: list[int], steps: list[tuple[int, int, str | None]]
    ) -> None:
        """Y2 Schedulers with skewed clocks, over simulated hours, crashing mid-tick: one job per tick.

        A crash before or after recording rolls the tick's jobs and record back together; in the end
        every tick after the schedule was first seen has exactly one job (catch_up=True), and none twice.
        Two schedulers tick at once in each step. The zone springs forward in the simulated night.
        """
        harness.clear()
        prepare(harness)
        base = [START]
        schedules = [
            _catching_up("seven", "*/7 * * * *"),
            _catching_up("oslo", "30 2 * * *", zone="Europe/Oslo"),
            _catching_up("hourly", "0 * * * *"),
        ]

        backends = [harness.make_backend() for _ in range(len(skews) + 1)]
        try:
            self._run_schedulers(harness, schedules, backends, skews, steps, base)
        finally:
            for backend in backends:
                backend.close()

    def _run_schedulers(
        self,
        harness: Harness,
        schedules: list[Schedule],
        backends: list[Backend],
        skews: list[int],
        steps: list[tuple[int, int, str | None]],
        base: list[datetime],
    ) -> None:
        def clock_of(skew: int) -> Any:
            return lambda: base[0] + timedelta(seconds=skew)

        schedulers = [
            Scheduler(backend, schedules, clock=clock_of(skew), **_options(harness))
            for backend, skew in zip(backends, skews, strict=False)
        ]
        for scheduler in schedulers:
            scheduler.store = _CrashingStore(scheduler.store)
        schedulers[0].register()
        first_seen = {state.name: state.last_tick for state in schedulers[0].states()}
        for advance, index, crash in steps:
            base[0] += timedelta(seconds=advance)
            chosen = schedulers[index % len(schedulers)]
            other = schedulers[(index + 1) % len(schedulers)]
            store = chosen.store
            assert isinstance(store, _CrashingStore)
            store.crash = crash

            def run(scheduler: Scheduler) -> None:
                with contextlib.suppress(_Crash, DatabaseError):
                    scheduler.tick()

            threads = [
                threading.Thread(target=run, args=(s,))
                for s in {id(chosen): chosen, id(other): other}.values()
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            store.crash = None
        horizon = base[0] + timedelta(seconds=max(skews))
        final = Scheduler(backends[-1], schedules, clock=lambda: horizon, **_options(harness))
        final.tick()
        got: dict[str, list[str]] = {}
        for payload in _payloads(harness):
            got.setdefault(payload["s"], []).append(payload["tick"])
        for schedule in schedules:
            ticks = got.get(schedule.name, [])
            assert len(ticks) == len(set(ticks)), f"{schedule.name}: a tick enqueued twice: {sorted(ticks)}"
            expected = [
                t.isoformat() for t in due_ticks(schedule, first_seen[schedule.name], horizon, 10_000)
            ]
            assert sorted(ticks) == expected, f"{schedule.name}: ticks {sorted(ticks)}, expected {expected}"


def _catching_up(name: str, cron: str, zone: str = "UTC") -> Schedule:
    """A schedule enqueueing every tick, each job's payload naming the schedule and its tick."""
    return Schedule(
        name, cron, "t/y", payload=lambda t: {"s": name, "tick": t.isoformat()}, zone=zone, catch_up=True
    )


def harness_payload(text: str) -> Any:
    return default_serializer().decode(text)
