"""Isolation clauses: one per behaviour that depends on the isolation level a backend claims at."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

from conformance.agents import AgentPool, TxAgent
from conformance.base import SuiteBase
from conformance.capabilities import requires
from conformance.clocks import EPOCH, frozen
from conformance.harness import Harness
from proletarian_ref.job import enqueue
from proletarian_ref.keywords import to_keyword_text

QUEUE: Final = "conformance/i"
QUEUE_TEXT: Final = to_keyword_text(QUEUE, what="queue")


class IsolationTests(SuiteBase):
    """Claims read committed rows, the latest ones, and lock only what they claim."""

    __test__ = False

    def _enqueue_in(
        self,
        agent: TxAgent,
        harness: Harness,
        queue: str,
        process_at: datetime,
        clock_at: datetime,
        what: str,
    ) -> Any:
        """enqueue inside the agent's open transaction, with the enqueuer's clock at `clock_at`."""
        backend = agent.backend

        def write(conn: Any) -> Any:
            return enqueue(
                conn,
                "conformance/job",
                None,
                queue=queue,
                process_at=process_at,
                job_table=harness.job_table,
                job_id_strategy=harness.job_id_strategy(),
                clock=frozen(clock_at),
                backend=backend,
                **harness.enqueue_options,
            )

        return agent.run(write, what)

    def test_a_job_committed_while_a_worker_session_is_open_is_seen_by_its_next_claim(
        self, harness: Harness
    ) -> None:
        """I1 (no stale snapshot): a claim sees every job committed before it, however old its transaction.

        A job enqueued and committed after a worker's transaction made its first (empty) claim is seen by
        that transaction's next claim, and by the next transaction of the same session; the enqueue does
        not wait for the worker. REPEATABLE READ or SERIALIZABLE keep the snapshot of the transaction's
        first statement (PostgreSQL) or lock the gap the empty claim scanned (InnoDB), and a session that
        keeps one transaction across polls keeps its snapshot for good: the worker never sees new jobs.
        """
        job_table, _ = self.tables(harness)
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            worker, enqueuer = pool.agent(), pool.agent()
            worker.begin()
            assert self.claim_in(worker, job_table, QUEUE_TEXT, EPOCH) is None
            # Through an agent, so that an enqueue waiting on the empty claim's gap lock fails in seconds.
            enqueuer.begin()
            first = self._enqueue_in(
                enqueuer, harness, QUEUE, EPOCH, EPOCH, "I1: enqueueing while a worker's empty claim is open"
            )
            enqueuer.commit()
            job = self.claim_in(worker, job_table, QUEUE_TEXT, EPOCH, "I1: a second claim")
            assert job is not None, (
                "I1: a claim missed a job committed after its transaction began (a snapshot older than the "
                "claim: REPEATABLE READ or SERIALIZABLE)"
            )
            assert self.key(harness, job.job_id) == str(first)
            worker.run(lambda conn: worker.backend.delete_job(conn, job_table, job.job_id), "delete")
            worker.commit()
            worker.begin()
            assert self.claim_in(worker, job_table, QUEUE_TEXT, EPOCH) is None
            worker.commit()
            second = self.enqueue_job(harness, EPOCH, queue=QUEUE)
            worker.begin()
            again = self.claim_in(worker, job_table, QUEUE_TEXT, EPOCH, "I1: the session's next claim")
            worker.rollback()
        assert again is not None and self.key(harness, again.job_id) == str(second), (
            "I1: the next poll of a reused session missed a job committed between its polls"
        )

    @requires(skip_locked=True)
    def test_a_running_handler_neither_blocks_enqueues_nor_hides_newer_jobs(self, harness: Harness) -> None:
        """I2 (no gap locks): while a worker holds a job, no enqueue waits for it and others claim the rest.

        Enqueues of another queue, and of the same queue due before or after the held job, return at once;
        other workers then claim them. REPEATABLE READ and SERIALIZABLE on InnoDB lock the gap before the
        claimed row too, so an enqueue into it waits until the handler's transaction ends.
        """
        job_table, _ = self.tables(harness)
        self.enqueue_job(harness, EPOCH, queue="conformance/i-b")
        # (queue, process_at) of each enqueue: before and after the held job in every index order. The
        # enqueuer's clock is behind (skewed), so a process_at before the held job's is still its future.
        planned = (
            ("conformance/i-a", EPOCH + timedelta(seconds=5)),
            ("conformance/i-b", EPOCH - timedelta(seconds=5)),
            ("conformance/i-b", EPOCH + timedelta(seconds=5)),
            ("conformance/i-c", EPOCH - timedelta(seconds=5)),
        )
        later = EPOCH + timedelta(minutes=1)
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            holder, enqueuer = pool.agent(), pool.agent()
            holder.begin()
            assert self.claim_in(holder, job_table, ":conformance/i-b", later) is not None
            enqueuer.begin()
            expected: dict[str, list[str]] = {}
            for queue, at in planned:
                job_id = self._enqueue_in(
                    enqueuer,
                    harness,
                    queue,
                    at,
                    EPOCH - timedelta(minutes=1),
                    f"I2: enqueueing a job of {queue} due {at.isoformat()} while a worker holds another",
                )
                expected.setdefault(queue, []).append(str(job_id))
            enqueuer.commit()
            claimed: dict[str, list[str]] = {}
            others = []
            for queue, ids in expected.items():
                for _ in ids:
                    other = pool.agent()
                    others.append(other)
                    other.begin()
                    job = self.claim_in(
                        other, job_table, f":{queue}", later, f"I2: claiming {queue} beside a running handler"
                    )
                    assert job is not None, f"I2: a worker of {queue} found no job while a handler ran"
                    claimed.setdefault(queue, []).append(self.key(harness, job.job_id))
            for agent in (holder, *others):
                agent.rollback()
        assert claimed == expected, f"I2: other workers claimed {claimed}, expected {expected}"

    @requires(transactional_enqueue=True)
    def test_a_claim_never_sees_an_uncommitted_job(self, harness: Harness) -> None:
        """I3 (no dirty reads): a job whose enqueue has not committed is neither claimed nor in the way.

        Beside an older uncommitted job, a claim takes the committed one at once; once the enqueuer
        commits, the older job is claimed. READ UNCOMMITTED reads show the uncommitted row.
        """
        job_table, _ = self.tables(harness)
        committed = self.enqueue_job(harness, EPOCH, queue=QUEUE)
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            enqueuer, worker = pool.agent(), pool.agent()
            enqueuer.begin()
            pending = self._enqueue_in(
                enqueuer,
                harness,
                QUEUE,
                EPOCH - timedelta(seconds=30),
                EPOCH - timedelta(seconds=30),
                "enqueue",
            )
            # Read by another session before any claim: a job already committed is enqueue's doing.
            visible = {self.key(harness, row.job_id) for row in harness.jobs()}
            assert str(pending) not in visible, (
                f"I3: job {pending} is committed while its enqueuer's transaction is still open; expected it "
                "invisible until that commit: enqueue committed the caller's transaction (not a dirty read)"
            )
            worker.begin()
            job = self.claim_in(
                worker, job_table, QUEUE_TEXT, EPOCH, "I3: claiming beside an uncommitted job"
            )
            worker.rollback()
            assert job is not None, "I3: an uncommitted job hid the committed one from the claim"
            assert self.key(harness, job.job_id) == str(committed), (
                f"I3: get_next_job returned job {self.key(harness, job.job_id)}, whose enqueuing transaction "
                f"has not committed; expected the committed job {committed} (the claim read uncommitted rows)"
            )
            enqueuer.commit()
            worker.begin()
            job = self.claim_in(worker, job_table, QUEUE_TEXT, EPOCH, "I3: claiming after the commit")
            worker.rollback()
        assert job is not None and self.key(harness, job.job_id) == str(pending), (
            "I3: once committed, the older job was not the one claimed"
        )
