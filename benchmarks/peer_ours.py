"""proletarian-ref's consumers for the peers scenario, in a child process like the peers' own."""

from __future__ import annotations

from benchmarks.common import BENCH_QUEUE, BackendSpec, Counter
from benchmarks.peer_child import Signals
from proletarian_ref import create_queue_worker


def consume(
    spec: BackendSpec,
    job_table: str,
    archived_job_table: str,
    polling_interval_ms: float,
    connections: int,
    batch_size: int,
    signals: Signals,
) -> None:
    """Each round: a queue worker of `connections` threads (one connection each), from go until stop;
    in batch mode when `batch_size` > 1."""
    harness = spec.load(job_table, archived_job_table)

    def publish(value: int) -> None:
        signals.slots[signals.index] = value

    counter = Counter(publish)
    try:
        for round_ in range(signals.rounds):
            worker = create_queue_worker(
                harness.data_source,
                lambda job_type, payload: counter.add(),
                queue=BENCH_QUEUE,
                worker_threads=connections,
                polling_interval_ms=polling_interval_ms,
                batch_size=batch_size,
                **harness.table_options,
            )
            if not signals.wait_go(round_):
                return
            worker.start()
            signals.wait_stop(round_)
            worker.stop()
    finally:
        harness.close()
