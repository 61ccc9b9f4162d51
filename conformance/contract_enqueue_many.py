"""enqueue_many's clauses (BatchEnqueue, StreamEnqueue): every enqueue clause for a batch, all or nothing."""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

import pytest

from conformance.agents import AgentPool
from conformance.base import SuiteBase
from conformance.capabilities import requires
from conformance.clocks import frozen
from conformance.harness import Harness
from conformance.payloads import CHARACTER_CLASSES, first_difference, transit_text_of
from conformance.protocols import NEEDS_BATCH_ENQUEUE
from conformance.sessions import CALLER_ZONE, need
from conformance.zones import BEFORE_DST, ZONES
from proletarian_ref import errors
from proletarian_ref.job import JobSpec, default_serializer, enqueue_many
from proletarian_ref.job_ids import JobIdStrategy
from proletarian_ref.keywords import DEFAULT_QUEUE, to_keyword_text

# Texts a statement or a COPY must escape, each stored as the payload text as it is.
RAW_TEXTS: Final = (
    "line\nbreak",
    "carriage\r\nreturn",
    "tab\there",
    "back\\slash \\n \\t \\\\",
    "ends with a backslash\\",
    "\\N",
    "\\.",
    "\\.\nafter the end marker",
    'double "quote"',
    "single 'quote' ''",
    "`backtick`",
    "percent %s %(name)s %%",
    "\b\f\v controls \x01\x1b\x7f",
    "ä ǅ 😀 \u2028 \u2029",
    "",
)
# One more than the 1,000 rows SqlBackend writes per statement: a batch of two statements at least.
TWO_STATEMENTS: Final = 1_001


def _commit_if_it_can(conn: Any) -> None:
    """The caller commits after a failed enqueue_many; an aborted transaction may refuse, which is allowed:
    what the commit left in the table is what the clause checks."""
    with contextlib.suppress(Exception):
        conn.commit()


def _commit_on(caller: Any, _agents_conn: Any) -> None:
    """Commit the caller's connection (on an agent's thread, whose own transaction is unused)."""
    caller.commit()


class TextSerializer:
    """Writes each payload, a str, as the payload text itself: lets a batch store any text per job."""

    def encode(self, payload: Any) -> str:
        assert isinstance(payload, str)
        return payload

    def decode(self, text: str) -> Any:
        return text


@dataclass
class _TakenAt:
    """The harness's id strategy, except that its `at`-th id (from 1) is `taken`, already in the table."""

    strategy: JobIdStrategy
    taken: Any
    at: int
    calls: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def generate_id(self) -> Any:
        return self.taken if next(self.calls) == self.at else self.strategy.generate_id()

    def encode_id(self, job_id: Any) -> Any:
        return self.strategy.encode_id(job_id)

    def decode_id(self, value: Any) -> Any:
        return self.strategy.decode_id(value)


class EnqueueManyTests(SuiteBase):
    """What a backend with BatchEnqueue or StreamEnqueue owes enqueue_many: skipped, saying so, without."""

    __test__ = False

    @staticmethod
    def enqueue_many_on(
        harness: Harness, conn: Any, jobs: Sequence[JobSpec], now: datetime, **options: Any
    ) -> list[Any]:
        """enqueue_many on the caller's `conn` at clock time `now`, with the harness's tables and options."""
        options.setdefault("job_id_strategy", harness.job_id_strategy())
        return enqueue_many(
            conn,
            jobs,
            job_table=harness.job_table,
            clock=frozen(now),
            backend=harness.backend(),
            **{**harness.enqueue_options, **options},
        )

    def _committed_batch(
        self, harness: Harness, jobs: Sequence[JobSpec], now: datetime, **options: Any
    ) -> list[Any]:
        conn = harness.connect()
        try:
            ids = self.enqueue_many_on(harness, conn, jobs, now, **options)
            conn.commit()
        finally:
            conn.close()
        return ids

    @requires(NEEDS_BATCH_ENQUEUE)
    def test_enqueue_many_stores_every_payload_text_as_it_is(self, harness: Harness) -> None:
        """Q1: enqueue_many stores each job's payload text exactly: newlines, backslashes, quotes, COPY's
        markers (\\N, \\.), controls, astral characters, the empty text, and the serializer's Transit of
        every character class of B2; each under the id returned for it, in order."""
        serializer = default_serializer()
        texts = [*RAW_TEXTS, serializer.encode(dict(CHARACTER_CLASSES))]
        jobs = [JobSpec("conformance/job", text) for text in texts]
        try:
            ids = self._committed_batch(harness, jobs, BEFORE_DST, serializer=TextSerializer())
        except Exception as exc:
            pytest.fail(
                f"Q1: enqueue_many raised {type(exc).__name__}: {exc}; expected it to store texts that only "
                "need escaping (newlines, tabs, backslashes, quotes) as they are"
            )
        stored = {self.key(harness, job.job_id): job.payload for job in harness.jobs()}
        assert len(stored) == len(texts), f"Q1: {len(stored)} rows stored for a batch of {len(texts)}"
        for job_id, text in zip(ids, texts, strict=True):
            got = stored.get(str(job_id))
            assert got is not None, f"Q1: no row holds the id enqueue_many returned for {text!r}"
            assert got == text, (
                f"Q1: enqueue_many stored {got!r} for the payload text {text!r} "
                f"({first_difference(text, got)}): the batch's rows were written without escaping"
            )
        if harness.supports("payload_bytes"):
            stored_bytes, _ = harness.payload_bytes()
            assert sorted(stored_bytes) == sorted(t.encode("utf-8") for t in texts), (
                "Q1: the stored payload bytes are not the UTF-8 of the texts enqueue_many wrote"
            )

    @requires(NEEDS_BATCH_ENQUEUE)
    def test_a_failing_enqueue_many_writes_no_job_of_the_batch(self, harness: Harness) -> None:
        """Q2: a batch of 1,001 whose last job's id is taken raises and leaves none of its jobs, even when the
        caller goes on and commits (more rows than one statement writes: every statement or none).

        As C3: the caller's transaction then goes on (its own writes commit) or is aborted (nothing does).
        """
        strategy = harness.job_id_strategy()
        taken = self.enqueue_job(harness, BEFORE_DST)
        jobs = [JobSpec("conformance/job", n) for n in range(TWO_STATEMENTS)]
        conn = harness.connect()
        writes = harness.supports("caller_writes")
        try:
            if writes:
                harness.caller_write(conn, 1)
            with pytest.raises(errors.ProletarianError):
                self.enqueue_many_on(
                    harness, conn, jobs, BEFORE_DST, job_id_strategy=_TakenAt(strategy, taken, TWO_STATEMENTS)
                )
            _commit_if_it_can(conn)
        finally:
            conn.close()
        left = len(harness.jobs()) - 1
        assert left == 0, (
            f"Q2: enqueue_many raised (the batch's job {TWO_STATEMENTS} has a taken id), yet {left} of its "
            f"{TWO_STATEMENTS} jobs were committed with the caller's transaction; expected none "
            "(each statement of a batch but the failed one stayed: no savepoint around them)"
        )
        assert [self.key(harness, j.job_id) for j in harness.jobs()] == [str(taken)]
        if writes:
            assert harness.caller_markers() in ([], [1]), "Q2: the caller's own write was duplicated"

    @requires(NEEDS_BATCH_ENQUEUE)
    def test_enqueue_many_writes_the_rows_enqueue_writes(self, harness: Harness) -> None:
        """Q3: each row is the one enqueue would write: keyword text, attempts 0, one `now` of the clock for
        enqueued_at, process_at clamped, kept or now + process_in; the ids returned are the rows' ids, in
        order, new for each job. In every session zone the harness can set (across a DST change), too."""
        now = BEFORE_DST + timedelta(milliseconds=250)
        jobs = [
            JobSpec("my.ns/type", 0),
            JobSpec(":other.ns/job-type", 1, queue="my.ns/queue", process_at=now - timedelta(hours=3)),
            JobSpec("conformance/job", 2, process_at=now + timedelta(hours=1, seconds=90)),
            JobSpec("conformance/job", 3, process_in=timedelta(hours=2)),
            JobSpec("conformance/job", 4, process_in=timedelta(minutes=-5)),
        ]
        expected = [
            (":proletarian/default", ":my.ns/type", now),
            (":my.ns/queue", ":other.ns/job-type", now),
            (":proletarian/default", ":conformance/job", now + timedelta(hours=1, seconds=90)),
            (":proletarian/default", ":conformance/job", now + timedelta(hours=2)),
            (":proletarian/default", ":conformance/job", now),
        ]
        zones = ZONES if harness.supports("zones") else ()
        for zone in (None, *zones):
            harness.clear()
            caller = harness if zone is None else harness.zoned(zone)
            where = "" if zone is None else f" (sessions in {zone})"
            try:
                ids = self._committed_batch(caller, jobs, now)
            finally:
                if caller is not harness:
                    caller.close()
            assert len(set(map(str, ids))) == len(jobs), (
                f"Q3{where}: enqueue_many returned repeated ids {ids}"
            )
            serializer = default_serializer()
            rows = {serializer.decode(job.payload): job for job in harness.jobs()}
            assert sorted(rows) == list(range(len(jobs))), (
                f"Q3{where}: rows stored for payloads {sorted(rows)}"
            )
            for n, (job_id, (queue, job_type, process_at)) in enumerate(zip(ids, expected, strict=True)):
                row = rows[n]
                assert self.key(harness, row.job_id) == str(job_id), (
                    f"Q3{where}: enqueue_many returned {job_id} for jobs[{n}], whose row has id "
                    f"{self.key(harness, row.job_id)}"
                )
                assert (row.queue, row.job_type, row.attempts) == (queue, job_type, 0), (
                    f"Q3{where}: jobs[{n}] stored as queue {row.queue!r}, job_type {row.job_type!r}, "
                    f"attempts {row.attempts}; expected {queue!r}, {job_type!r}, 0"
                )
                self.assert_instant(harness, row.enqueued_at, now, f"Q3{where}: jobs[{n}] enqueued_at")
                self.assert_instant(harness, row.process_at, process_at, f"Q3{where}: jobs[{n}] process_at")

    @requires(NEEDS_BATCH_ENQUEUE, transactional_enqueue=True)
    def test_enqueue_many_joins_the_callers_transaction(self, harness: Harness) -> None:
        """Q4: enqueue_many never commits: its jobs and the caller's writes before and after it are invisible
        until the caller commits, and all gone when the caller rolls back; the connection goes on."""
        writes = harness.supports("caller_writes")
        jobs = [JobSpec("conformance/job", n) for n in range(3)]
        conn = harness.connect()
        try:
            if writes:
                harness.caller_write(conn, 1)
            self.enqueue_many_on(harness, conn, jobs, BEFORE_DST)
            if writes:
                harness.caller_write(conn, 2)
                assert harness.caller_markers() == [], "Q4: enqueue_many committed the caller's writes"
            assert harness.jobs() == [], "Q4: enqueue_many's jobs are visible before the caller committed"
            conn.rollback()
            assert harness.jobs() == [], "Q4: the caller rolled back, but enqueue_many's jobs stayed"
            if writes:
                assert harness.caller_markers() == [], "Q4: the caller rolled back, but its writes stayed"
                harness.caller_write(conn, 3)
            self.enqueue_many_on(harness, conn, jobs, BEFORE_DST)
            conn.commit()
        finally:
            conn.close()
        assert len(harness.jobs()) == len(jobs), "Q4: the caller's commit did not commit enqueue_many's jobs"
        if writes:
            assert harness.caller_markers() == [3], (
                f"Q4: after rollback, enqueue_many and commit the caller's markers are "
                f"{harness.caller_markers()}; expected [3]"
            )

    @requires(NEEDS_BATCH_ENQUEUE)
    def test_enqueue_many_leaves_the_callers_session_state_unchanged(self, harness: Harness) -> None:
        """Q5: enqueue_many, of one statement's rows or several, changes no session state of the caller's
        (settings, time zone, isolation, autocommit, user variables): read as C4 reads it."""
        need(harness, "sessions")
        caller = harness.zoned(CALLER_ZONE) if harness.supports("zones") else harness
        conn = caller.connect()
        try:
            if caller.supports("caller_writes"):
                caller.caller_write(conn, 1)
            before = caller.session_state(conn)
            states = []
            for size in (2, TWO_STATEMENTS):
                self.enqueue_many_on(
                    caller, conn, [JobSpec("conformance/job", n) for n in range(size)], BEFORE_DST
                )
                states.append((f"after a batch of {size}", caller.session_state(conn)))
            conn.commit()
            states.append(("after the caller's commit", caller.session_state(conn)))
        finally:
            conn.close()
            if caller is not harness:
                caller.close()
        for when, state in states:
            changed = {
                key: (before.get(key), state.get(key))
                for key in sorted(set(before) | set(state))
                if before.get(key) != state.get(key)
            }
            assert not changed, (
                f"Q5: the caller's session {when} of enqueue_many differs (before, after): {changed}"
            )

    @requires(NEEDS_BATCH_ENQUEUE)
    def test_enqueue_many_refuses_a_payload_over_the_limit_and_writes_none_of_the_batch(
        self, harness: Harness
    ) -> None:
        """Q6: a batch whose second payload is one byte over the column's limit raises the library's error
        (index 1) and stores no job of it; a batch of payloads exactly at the limit is stored whole."""
        limit = harness.payload_limit_bytes
        if limit is None:
            pytest.skip(f"{harness.name}: the payload column has no size limit worth testing")
        need(harness, "payload_bytes")
        fits, over = transit_text_of(limit), transit_text_of(limit + 1)
        expected: type[Exception] = getattr(errors, "PayloadTooLargeError", errors.ProletarianError)
        conn = harness.connect()
        try:
            with pytest.raises(expected) as raised:
                self.enqueue_many_on(
                    harness,
                    conn,
                    [JobSpec("conformance/job", fits), JobSpec("conformance/job", over)],
                    BEFORE_DST,
                    serializer=TextSerializer(),
                )
            index = getattr(raised.value, "index", None)
            assert index == 1, (
                f"Q6: the error names jobs[{index}]; expected jobs[1], the payload over the limit"
            )
            _commit_if_it_can(conn)
        finally:
            conn.close()
        over_limit = [len(s) for s in harness.payload_bytes()[0]]
        assert not over_limit, (
            f"Q6: a batch with a payload over the limit stored payloads of {over_limit} bytes"
        )
        self._committed_batch(
            harness, [JobSpec("conformance/job", fits)] * 2, BEFORE_DST, serializer=TextSerializer()
        )
        stored, _ = harness.payload_bytes()
        assert stored == [fits.encode("utf-8")] * 2, (
            "Q6: payloads at the column's limit were not stored whole"
        )

    @requires(NEEDS_BATCH_ENQUEUE, skip_locked=True)
    def test_concurrent_enqueue_many_calls_neither_wait_nor_see_each_other(self, harness: Harness) -> None:
        """Q7: two open transactions' enqueue_many calls (two batches each) neither wait for each other nor
        for a batch claim holding jobs, and no claim sees a batch before its commit; after both commit
        every job is there once, under its own id."""
        job_table, _ = self.tables(harness)
        queue = to_keyword_text(DEFAULT_QUEUE, what="queue")
        self.enqueue_job(harness, BEFORE_DST - timedelta(seconds=1), payload=-1)
        ids: list[Any] = []
        # Each enqueuer is a caller's connection driven from an agent's thread, so a call that waits fails
        # within step_timeout instead of hanging the suite.
        callers = [harness.connect(), harness.connect()]
        try:
            with AgentPool(harness.make_backend, self.step_timeout) as pool:
                worker, first, second, reader = pool.agent(), pool.agent(), pool.agent(), pool.agent()
                for agent in (worker, first, second, reader):
                    agent.begin()
                held = self.claim_in(
                    worker, job_table, queue, BEFORE_DST, "Q7: claiming the job enqueued first"
                )
                assert held is not None, "Q7: the committed job was not claimed"
                for round_ in range(2):
                    for n, (agent, caller) in enumerate(zip((first, second), callers, strict=True)):
                        start = 10 * (2 * round_ + n)
                        jobs = [JobSpec("conformance/job", start + k) for k in range(3)]
                        batch = agent.run(
                            functools.partial(self._enqueue_on_caller, harness, caller, jobs),
                            f"Q7: enqueue_many beside another open batch and a held job (round {round_ + 1})",
                        )
                        ids.extend(batch)
                seen = self.claim_in(reader, job_table, queue, BEFORE_DST, "Q7: claiming beside open batches")
                assert seen is None, (
                    f"Q7: a claim took {seen} while the only free jobs were in uncommitted enqueue_many "
                    "batches; expected none (a batch is invisible until its transaction commits)"
                )
                for agent, caller in zip((first, second), callers, strict=True):
                    agent.run(functools.partial(_commit_on, caller), "Q7: the caller's commit")
                for agent in (worker, first, second, reader):
                    agent.rollback()
        finally:
            for caller in callers:
                caller.close()
        stored = sorted(self.key(harness, job.job_id) for job in harness.jobs())
        assert len(stored) == len(set(stored)) == len(ids) + 1, (
            f"Q7: {len(stored)} rows ({len(set(stored))} ids) after two committed transactions of "
            f"{len(ids)} jobs and one job before; expected {len(ids) + 1}, each id once"
        )
        assert set(map(str, ids)) <= set(stored), "Q7: enqueue_many returned ids no row holds"

    def _enqueue_on_caller(
        self, harness: Harness, caller: Any, jobs: list[JobSpec], _agents_conn: Any
    ) -> list[Any]:
        """enqueue_many on the caller's connection, run on an agent's thread (its own transaction unused)."""
        return self.enqueue_many_on(harness, caller, jobs, BEFORE_DST)
