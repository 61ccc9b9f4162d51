"""Notification tests: a backend that announces enqueued jobs (instant wake-up) does so at commit only."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Final, cast

import pytest

from conformance.base import SuiteBase
from conformance.capabilities import requires
from conformance.clocks import EPOCH, frozen
from conformance.contract_enqueue_many import EnqueueManyTests
from conformance.harness import Harness
from conformance.protocols import NEEDS_NOTIFICATIONS
from conformance.sessions import need
from proletarian_ref.backend import Notifications
from proletarian_ref.errors import DatabaseError
from proletarian_ref.job import JobSpec, enqueue
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.tables import table_name

# Long enough for a notification sent at once to arrive; a wait that ends False proves nothing by
# itself, which is why each is followed by one that must end True.
QUIET_S: Final = 0.5
DELIVERED_WITHIN_S: Final = 10.0


class NotificationTests(SuiteBase):
    """The optional Notifications protocol: skipped for a backend without it (it polls only)."""

    __test__ = False

    def test_an_announcement_reaches_its_queues_listeners_at_commit_only(self, harness: Harness) -> None:
        """N1: enqueue(notify=True) wakes its queue's listeners at commit only: not before, not on rollback.

        A listener of another queue on the same table is not woken.
        """
        backend = harness.backend()
        if not isinstance(backend, Notifications):
            pytest.skip(f"{harness.name}: the backend has no Notifications (it runs every job by polling)")
        job_table, _ = self.tables(harness)
        mine = backend.listen(job_table, to_keyword_text("n1/mine", what="queue"))
        other = backend.listen(job_table, to_keyword_text("n1/other", what="queue"))
        conn = harness.connect()
        try:

            def announce() -> None:
                enqueue(
                    conn,
                    "conformance/job",
                    None,
                    queue="n1/mine",
                    job_table=harness.job_table,
                    job_id_strategy=harness.job_id_strategy(),
                    clock=frozen(EPOCH),
                    backend=backend,
                    notify=True,
                )

            announce()
            assert mine.wait(QUIET_S) is False, "N1: the job was announced before the enqueuer committed"
            conn.rollback()
            assert mine.wait(QUIET_S) is False, "N1: a rolled-back enqueue was announced"
            announce()
            conn.commit()
            assert mine.wait(DELIVERED_WITHIN_S) is True, "N1: a committed enqueue was never announced"
            assert other.wait(QUIET_S) is False, "N1: a listener of another queue was woken"
        finally:
            conn.close()
            mine.close()
            other.close()


class NotificationProtocolTests(SuiteBase):
    """The Notifications protocol itself, call by call: skipped, saying so, for a backend without it."""

    __test__ = False

    @requires(NEEDS_NOTIFICATIONS)
    def test_an_announcement_wakes_the_listeners_of_its_table_and_queues_only(self, harness: Harness) -> None:
        """N2: notify_enqueued of two queues, committed, wakes a listener of each on that job table only.

        A listener of a third queue, and one of the same queue on another job table, stay asleep; an
        enqueue_many(notify=True) of a job due now wakes its queue's listener at commit, one for later
        wakes no one.
        """
        backend = harness.backend()
        notifications = cast(Notifications, backend)
        job_table, _ = self.tables(harness)
        other_table = table_name(f"{harness.job_table}_n2")
        names = ("n2/a", "n2/b", "n2/c")
        a, b, c = (to_keyword_text(name, what="queue") for name in names)
        listeners = {
            "a": notifications.listen(job_table, a),
            "b": notifications.listen(job_table, b),
            "c": notifications.listen(job_table, c),
            "a on another table": notifications.listen(other_table, a),
        }
        try:
            with backend.transaction() as conn:
                notifications.notify_enqueued(conn, job_table, [a, b])
            for name in ("a", "b"):
                assert listeners[name].wait(DELIVERED_WITHIN_S) is True, (
                    f"N2: notify_enqueued(queues=[{a}, {b}]) committed, yet the listener of queue {name} "
                    f"was not woken within {DELIVERED_WITHIN_S:g} s"
                )
            for name in ("c", "a on another table"):
                assert listeners[name].wait(QUIET_S) is False, (
                    f"N2: notify_enqueued(queues=[{a}, {b}]) on {job_table} woke the listener of {name}; "
                    "expected only the listeners of those queues on that table"
                )
            conn = harness.connect()
            try:
                now = [JobSpec("conformance/job", None, queue=names[2])]
                later = [
                    JobSpec("conformance/job", None, queue=names[1], process_at=EPOCH + timedelta(hours=1))
                ]
                for jobs in (now, later):
                    EnqueueManyTests.enqueue_many_on(harness, conn, jobs, EPOCH, notify=True)
                assert listeners["c"].wait(QUIET_S) is False, "N2: enqueue_many announced before the commit"
                conn.commit()
            finally:
                conn.close()
            assert listeners["c"].wait(DELIVERED_WITHIN_S) is True, (
                "N2: a committed enqueue_many(notify=True) of a job due now did not wake its queue's listener"
            )
            assert listeners["b"].wait(QUIET_S) is False, (
                "N2: enqueue_many(notify=True) of a job due in an hour woke its queue's listener; expected "
                "no announcement for a job not yet due"
            )
        finally:
            for listener in listeners.values():
                listener.close()

    @requires(NEEDS_NOTIFICATIONS)
    def test_a_broken_listener_raises_and_a_new_one_hears_the_next_announcement(
        self, harness: Harness
    ) -> None:
        """N3: when a listener's session is killed its wait raises DatabaseError (never a quiet False
        forever), and a new listen() on the same backend hears the next committed announcement."""
        need(harness, "sessions")
        backend = harness.backend()
        notifications = cast(Notifications, backend)
        job_table, _ = self.tables(harness)
        queue = to_keyword_text("n3/q", what="queue")
        broken = notifications.listen(job_table, queue)
        try:
            # The listener's session: its connection's (a SQL backend's), the one an async listener names
            # (through the bridge), or the listener itself (in memory).
            if hasattr(broken, "conn"):
                session = harness.session_of(broken.conn)
            else:
                session = getattr(broken, "session", broken)
            harness.kill_session(session)
            began = time.monotonic()
            try:
                woke = broken.wait(DELIVERED_WITHIN_S)
            except DatabaseError:
                pass
            else:
                pytest.fail(
                    f"N3: Listener.wait of a listener whose session was killed returned {woke} after "
                    f"{time.monotonic() - began:.1f} s; expected DatabaseError, so that a worker listens anew"
                )
        finally:
            broken.close()
        fresh = notifications.listen(job_table, queue)
        try:
            with backend.transaction() as conn:
                notifications.notify_enqueued(conn, job_table, [queue])
            assert fresh.wait(DELIVERED_WITHIN_S) is True, (
                "N3: a listener made after a broken one was not woken by a committed announcement"
            )
        finally:
            fresh.close()
