"""Notification tests: a backend that announces enqueued jobs (instant wake-up) does so at commit only."""

from __future__ import annotations

from typing import Final

import pytest

from conformance.base import SuiteBase
from conformance.clocks import EPOCH, frozen
from conformance.harness import Harness
from proletarian_ref.backend import Notifications
from proletarian_ref.job import enqueue
from proletarian_ref.keywords import to_keyword_text

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
