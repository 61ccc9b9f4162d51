"""The model test: random operations on the backend and on the in-memory reference, compared step by step."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conformance.agents import AgentPool, TxAgent
from conformance.capabilities import capability
from conformance.clocks import EPOCH, ManualClock, frozen
from conformance.faults import DoubleClaim, Fault
from conformance.harness import Harness, MemoryHarness
from proletarian_ref.backend import STATUS_FAILURE, STATUS_SUCCESS, ArchivedJobRecord, Backend, JobRecord
from proletarian_ref.backends.memory import MemoryConnection
from proletarian_ref.job import enqueue
from proletarian_ref.job_ids import JobIdStrategy
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.tables import table_name

MODEL_QUEUES: Final = ("model/a", "model/b")
MAX_OPEN: Final = 3
_ID_BASE: Final = 0xC0FFEE << 96


class FixedIdStrategy:
    """The harness's id strategy, but generating the id the test chose, so both sides store the same id."""

    def __init__(self, base: JobIdStrategy, job_id: uuid.UUID) -> None:
        self._base = base
        self._job_id = job_id

    def generate_id(self) -> Any:
        return self._job_id

    def encode_id(self, job_id: Any) -> Any:
        return self._base.encode_id(job_id)

    def decode_id(self, value: Any) -> Any:
        return self._base.decode_id(value)


@dataclass
class OpenTx:
    """A transaction open on both sides: the backend's in an agent thread, the model's on a connection."""

    agent: TxAgent
    model_conn: MemoryConnection
    claimed: list[uuid.UUID] = field(default_factory=list)


Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Sides:
    """How each side stores ids: the backend as its harness says, the model as the memory backend does."""

    real: JobIdStrategy
    model: JobIdStrategy
    precision: timedelta


def _job_row(strategy: JobIdStrategy, job: JobRecord) -> Row:
    return (str(strategy.decode_id(job.job_id)), job.queue, job.job_type, job.payload, job.attempts)


def _times_differ(a: datetime, b: datetime, precision: timedelta) -> bool:
    return abs(a - b) >= precision


def describe_job_difference(real: JobRecord | None, model: JobRecord | None, sides: Sides) -> str | None:
    """How the backend's row differs from the model's, or None when they agree."""
    if real is None or model is None:
        if real is model:
            return None
        return f"backend {real!r}, model {model!r}"
    if _job_row(sides.real, real) != _job_row(sides.model, model):
        return f"backend {_job_row(sides.real, real)}, model {_job_row(sides.model, model)}"
    for name in ("enqueued_at", "process_at"):
        if _times_differ(getattr(real, name), getattr(model, name), sides.precision):
            return f"{name}: backend {getattr(real, name)}, model {getattr(model, name)}"
    return None


def describe_archive_difference(
    real: ArchivedJobRecord, model: ArchivedJobRecord, sides: Sides
) -> str | None:
    def row(strategy: JobIdStrategy, a: ArchivedJobRecord) -> Row:
        return (str(strategy.decode_id(a.job_id)), a.queue, a.job_type, a.payload, a.attempts, a.status)

    if row(sides.real, real) != row(sides.model, model):
        return f"backend {row(sides.real, real)}, model {row(sides.model, model)}"
    for name in ("enqueued_at", "process_at", "finished_at"):
        if _times_differ(getattr(real, name), getattr(model, name), sides.precision):
            return f"{name}: backend {getattr(real, name)}, model {getattr(model, name)}"
    return None


_payloads = st.one_of(
    st.none(),
    st.text(max_size=12),
    st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=3),
    st.dictionaries(st.sampled_from(["a", "b", "ü"]), st.text(max_size=6), max_size=2),
)


def model_machine(harness: Harness, step_timeout: float) -> type[RuleBasedStateMachine]:
    """A state machine class bound to `harness`; each run starts from empty tables."""
    job_table = table_name(harness.job_table)
    archived_job_table = table_name(harness.archived_job_table, option="archived_job_table")
    strategy = harness.job_id_strategy()
    precise_locks = bool(capability(harness, "claim_locks_only_the_claimed_row"))

    class BackendMatchesModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            harness.clear()
            self.model = MemoryHarness(harness.job_table, harness.archived_job_table)
            self.model_backend: Backend = self.model.make_backend()
            self.sides = Sides(strategy, self.model.job_id_strategy(), harness.capabilities.time_precision)
            self.pool = AgentPool(harness.make_backend, step_timeout)
            self.idle: list[TxAgent] = []
            self.open: list[OpenTx] = []
            self.clock = ManualClock(EPOCH)
            self.used_times: set[datetime] = set()
            self.count = 0

        # -- helpers -----------------------------------------------------------------------------------

        def _unique_time(self, wanted: datetime) -> datetime:
            # Distinct process_at values make "the oldest due job" one job on both sides: a tie would let
            # the database and the model pick different, equally right, jobs.
            at = wanted
            while at in self.used_times:
                at += timedelta(seconds=1)
            self.used_times.add(at)
            return at

        def _agent(self) -> TxAgent:
            return self.idle.pop() if self.idle else self.pool.agent()

        def _pick(self, which: int, claimed_only: bool = False) -> OpenTx:
            candidates = [tx for tx in self.open if tx.claimed or not claimed_only]
            return candidates[which % len(candidates)]

        def _close(self, tx: OpenTx) -> None:
            self.open.remove(tx)
            self.idle.append(tx.agent)

        # -- rules -------------------------------------------------------------------------------------

        @initialize(jobs=st.lists(st.tuples(st.sampled_from(MODEL_QUEUES), st.integers(-60, -1)), max_size=6))
        def seed(self, jobs: list[tuple[str, int]]) -> None:
            """Start with some committed jobs that are already due, in random process_at order."""
            for queue, offset in jobs:
                self.enqueue(queue, offset, None, MAX_OPEN)

        @rule(
            queue=st.sampled_from(MODEL_QUEUES),
            offset=st.integers(min_value=-20, max_value=8),
            payload=_payloads,
            where=st.integers(min_value=0, max_value=MAX_OPEN),
        )
        def enqueue(self, queue: str, offset: int, payload: Any, where: int) -> None:
            """E: the same job, into an open transaction (where < open ones) or in one of its own.

            A negative offset means the job was enqueued that long ago and has been due since; a
            positive one that it is due that long from now.
            """
            self.count += 1
            job_id = uuid.UUID(int=_ID_BASE + self.count)
            now = self.clock()
            if offset < 0:
                enqueued_at, process_at = self._unique_time(now + timedelta(seconds=offset)), None
            else:
                enqueued_at, process_at = now, self._unique_time(now + timedelta(seconds=offset))
            options: dict[str, Any] = {
                "queue": queue,
                "process_at": process_at,
                "job_table": job_table,
                "clock": frozen(enqueued_at),
                **harness.enqueue_options,
            }

            def on_backend(conn: Any, agent: TxAgent) -> Any:
                ids = FixedIdStrategy(strategy, job_id)
                return enqueue(
                    conn, "model/job", payload, job_id_strategy=ids, backend=agent.backend, **options
                )

            def on_model(conn: MemoryConnection) -> None:
                ids = FixedIdStrategy(self.sides.model, job_id)
                enqueue(
                    conn, "model/job", payload, job_id_strategy=ids, backend=self.model_backend, **options
                )

            if where < len(self.open):
                tx = self.open[where]
                tx.agent.run(lambda conn: on_backend(conn, tx.agent), "enqueue")
                on_model(tx.model_conn)
                return
            agent = self._agent()
            agent.begin()
            agent.run(lambda conn: on_backend(conn, agent), "enqueue")
            agent.commit()
            self.idle.append(agent)
            conn = self.model.connect()
            on_model(conn)
            conn.commit()

        def _begin(self) -> OpenTx:
            agent = self._agent()
            agent.begin()
            tx = OpenTx(agent, self.model.connect())
            self.open.append(tx)
            return tx

        @rule(which=st.integers(min_value=0, max_value=MAX_OPEN - 1), queue=st.sampled_from(MODEL_QUEUES))
        def claim(self, which: int, queue: str) -> None:
            """S: both sides claim the same job, or both find none; `which` past the open ones begins one."""
            tx = self.open[which] if which < len(self.open) else self._begin()
            now = self.clock()
            queue_text = to_keyword_text(queue, what="queue")
            backend = tx.agent.backend
            real = tx.agent.run(lambda conn: backend.get_next_job(conn, job_table, queue_text, now), "claim")
            model = self.model_backend.get_next_job(tx.model_conn, job_table, queue_text, now)
            held = None if real is None else uuid.UUID(str(strategy.decode_id(real.job_id)))
            if held is not None and any(held in other.claimed for other in self.open if other is not tx):
                raise DoubleClaim(
                    f"M-claim (get_next_job): claiming {queue_text} at {now} returned job {held}, which "
                    "another open transaction holds: the claim neither locked nor skipped locked rows"
                )
            difference = describe_job_difference(real, model, self.sides)
            assert difference is None, f"M-claim: claiming {queue_text} at {now} differs: {difference}"
            if real is None and not precise_locks:
                # Such a backend may still hold the record that ended the empty scan (see S7); a worker
                # commits an empty poll at once, so the model does here what the worker does.
                tx.agent.commit()
                tx.model_conn.commit()
                self._close(tx)
                return
            if held is not None and held not in tx.claimed:
                tx.claimed.append(held)

        @precondition(lambda self: any(tx.claimed for tx in self.open))
        @rule(
            which=st.integers(min_value=0, max_value=MAX_OPEN - 1),
            delay=st.integers(min_value=0, max_value=6),
        )
        def retry(self, which: int, delay: int) -> None:
            """R: reschedule a claimed job on both sides."""
            tx = self._pick(which, claimed_only=True)
            job_id = tx.claimed[0]
            at = self._unique_time(self.clock() + timedelta(seconds=delay))
            backend = tx.agent.backend
            stored = strategy.encode_id(job_id)
            tx.agent.run(lambda conn: backend.retry_at(conn, job_table, stored, at), "retry_at")
            self.model_backend.retry_at(tx.model_conn, job_table, self.sides.model.encode_id(job_id), at)

        @precondition(lambda self: any(tx.claimed for tx in self.open))
        @rule(
            which=st.integers(min_value=0, max_value=MAX_OPEN - 1),
            status=st.sampled_from([STATUS_SUCCESS, STATUS_FAILURE]),
        )
        def archive(self, which: int, status: str) -> None:
            """A + D: archive a claimed job and delete it, on both sides."""
            tx = self._pick(which, claimed_only=True)
            job_id = tx.claimed.pop(0)
            now = self.clock()
            backend = tx.agent.backend
            stored = strategy.encode_id(job_id)

            def archive_and_delete(conn: Any) -> None:
                backend.archive_job(conn, job_table, archived_job_table, stored, status, now)
                backend.delete_job(conn, job_table, stored)

            tx.agent.run(archive_and_delete, "archive_job + delete_job")
            model_id = self.sides.model.encode_id(job_id)
            self.model_backend.archive_job(
                tx.model_conn, job_table, archived_job_table, model_id, status, now
            )
            self.model_backend.delete_job(tx.model_conn, job_table, model_id)

        @precondition(lambda self: any(tx.claimed for tx in self.open))
        @rule(which=st.integers(min_value=0, max_value=MAX_OPEN - 1))
        def delete(self, which: int) -> None:
            """D: delete a claimed job without archiving it, on both sides."""
            tx = self._pick(which, claimed_only=True)
            job_id = tx.claimed.pop(0)
            backend = tx.agent.backend
            stored = strategy.encode_id(job_id)
            tx.agent.run(lambda conn: backend.delete_job(conn, job_table, stored), "delete_job")
            self.model_backend.delete_job(tx.model_conn, job_table, self.sides.model.encode_id(job_id))

        @precondition(lambda self: bool(self.open))
        @rule(which=st.integers(min_value=0, max_value=MAX_OPEN - 1))
        def commit(self, which: int) -> None:
            tx = self._pick(which)
            tx.agent.commit()
            tx.model_conn.commit()
            self._close(tx)

        @precondition(lambda self: bool(self.open))
        @rule(which=st.integers(min_value=0, max_value=MAX_OPEN - 1))
        def rollback(self, which: int) -> None:
            """T: a rolled-back transaction leaves nothing behind on either side."""
            tx = self._pick(which)
            tx.agent.rollback()
            tx.model_conn.rollback()
            self._close(tx)

        @rule(seconds=st.integers(min_value=1, max_value=5))
        def tick(self, seconds: int) -> None:
            self.clock.advance(timedelta(seconds=seconds))

        # -- what must hold after every step -------------------------------------------------------------

        @invariant()
        def committed_tables_agree(self) -> None:
            real_jobs = {str(strategy.decode_id(j.job_id)): j for j in harness.jobs()}
            model_jobs = {str(self.sides.model.decode_id(j.job_id)): j for j in self.model.jobs()}
            assert sorted(real_jobs) == sorted(model_jobs), (
                f"M-tables: committed jobs differ: backend has {sorted(real_jobs)}, "
                f"model has {sorted(model_jobs)}"
            )
            for key, real in real_jobs.items():
                difference = describe_job_difference(real, model_jobs[key], self.sides)
                assert difference is None, f"M-tables: committed job {key} differs: {difference}"
            real_archive = {str(strategy.decode_id(a.job_id)): a for a in harness.archived_jobs()}
            model_archive = {str(self.sides.model.decode_id(a.job_id)): a for a in self.model.archived_jobs()}
            assert sorted(real_archive) == sorted(model_archive), (
                f"M-tables: archives differ: backend has {sorted(real_archive)}, "
                f"model has {sorted(model_archive)}"
            )
            for key, real_row in real_archive.items():
                difference = describe_archive_difference(real_row, model_archive[key], self.sides)
                assert difference is None, f"M-tables: archived job {key} differs: {difference}"

        def teardown(self) -> None:
            blocked: Fault | None = None
            for tx in list(self.open):
                # A step that failed already reported why; this is only cleaning up. A rollback that blocks
                # is a fault of its own, reported once every agent is closed, so no lock outlives the test.
                try:
                    tx.agent.rollback()
                except Exception:
                    pass
                except Fault as exc:
                    blocked = blocked or exc
                tx.model_conn.rollback()
            self.open = []
            self.pool.close()
            if blocked is not None:
                raise blocked

    return BackendMatchesModel
