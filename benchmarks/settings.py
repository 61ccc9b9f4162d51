"""Sizes, sample counts and time bounds of a benchmark run: the quick, full and tiny presets."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Final

from benchmarks.common import DUE_APART

# How long a spawned drain process waits to start, and at most runs (workers.py and the peers' children).
CHILD_START_TIMEOUT_S: Final = 60.0
CHILD_MAX_RUN_S: Final = 900.0

ALL_BENCHMARKS: Final = (
    "poll_latency",
    "throughput",
    "enqueue_rate",
    "latency",
    "memory",
    "locust",
    "peers",
    "long_handlers",
    "serializer",
)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a run may vary; every loop below is bounded by one of these counts and one time limit."""

    mode: str
    # Poll latency: total rows in the job table, and samples per (depth, index) cell.
    depths: tuple[int, ...]
    claim_samples: int
    claim_budget_s: float
    noindex_samples: int
    noindex_budget_s: float
    # Throughput: thread counts in one process, then (processes, threads per process).
    thread_counts: tuple[int, ...]
    process_configs: tuple[tuple[int, int], ...]
    throughput_warmup_s: float
    throughput_window_s: float
    throughput_preload: int
    throughput_rounds: int
    # Enqueue rate, one thread: jobs per transaction of the batched figure.
    enqueue_window_s: float
    enqueue_max_jobs: int
    enqueue_batch: int
    # enqueue_many against the driver's own batched insert: jobs per transaction (one call each).
    enqueue_many_batch: int
    # Enqueue-to-start latency at low load, and the idle worker's cost.
    latency_jobs: int
    latency_gap_ms: tuple[float, float]
    idle_window_s: float
    # Memory over a long drain.
    memory_jobs: int
    memory_threads: int
    memory_timeout_s: float
    # Locust: users, jobs per second per user, run time, and how long the workers may take to catch up.
    locust_users: int
    locust_user_rate: float
    locust_run_time_s: int
    locust_worker_threads: int
    locust_drain_timeout_s: float
    # Profile the library's and the raw loop's per-job path with cProfile after the throughput runs.
    profile_jobs: int
    # Peers: jobs per drain, rounds (each system once per round, interleaved), jobs enqueued one per call
    # for the enqueue rate, consumer processes and connections per process (the same for every system),
    # enqueue-to-start samples, and the longest a drain may take.
    peers_jobs: int
    peers_rounds: int
    peers_enqueue_timed: int
    peers_processes: int
    peers_connections: int
    peers_latency_jobs: int
    peers_drain_timeout_s: float
    # Long handlers: K handlers holding their claim for hold_s, beside a stream of short jobs at
    # stream_rate a second drained by stream_threads; sampled every sample_s, from before_s before the
    # long handlers start to after_s after they end.
    long_handlers: int
    long_hold_s: float
    long_before_s: float
    long_after_s: float
    long_sample_s: float
    long_stream_rate: float
    long_stream_threads: int
    # Batch mode (create_queue_worker's batch_size): jobs per transaction, the (processes, threads)
    # configurations throughput adds in batch mode, and whether the peers scenario runs it too.
    batch_size: int = 10
    batch_configs: tuple[tuple[int, int], ...] = ((1, 4), (2, 2))
    # The peers scenario's asyncio worker, default and batch mode, on each of these drivers
    # (benchmarks.peer_aio.DRIVERS; a "compact" one in default mode only); none in quick mode, so CI's run
    # keeps its length.
    peers_async_drivers: tuple[str, ...] = ("psycopg", "asyncpg", "asyncpg compact")
    # Serializer (benchmarks/serializer.py, once per run, no database): least CPU seconds of one timing.
    serializer_seconds: float = 0.2
    # Throughput's (processes, threads, jobs a commit) rows at which the server's limit for the whole job
    # is measured too (server_limit.py): one point in quick mode, a scaling curve in full.
    limit_points: tuple[tuple[int, int, int], ...] = ((1, 4, 1),)
    # Whether each limit point drains with the asyncio worker too (benchmarks/async_drain.py: asyncpg or
    # aiomysql on the compact plan, processes x polling tasks); off in quick mode, so CI's run keeps its
    # length.
    throughput_async: bool = True
    # Throughput with the database on cores of its own (benchmarks/server_cores.py): the drains, pgbench
    # and mariadb-slap on the first half of the CPUs, the server side of their connections on the rest.
    server_cores: bool = False
    # How far apart in process_at throughput loads its due jobs (milliseconds; bulk_load's DUE_APART by
    # default). On MySQL's whole-second TIMESTAMP, 1000 or more gives each job a second of its own, the
    # layout of limit18's first try (benchmarks/results/limit18-try-cores-2026-12-07).
    throughput_due_apart_ms: float = DUE_APART / timedelta(milliseconds=1)
    benchmarks: tuple[str, ...] = ALL_BENCHMARKS
    profile: bool = True
    polling_interval_ms: float = 100.0
    table_suffix: str = ""

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)


FULL: Final = Settings(
    mode="full",
    depths=(1_000, 10_000, 100_000, 1_000_000),
    claim_samples=1_000,
    claim_budget_s=8.0,
    noindex_samples=200,
    noindex_budget_s=12.0,
    thread_counts=(1, 2, 4, 8),
    process_configs=((2, 2), (2, 4), (4, 4)),
    batch_configs=((1, 4), (2, 2), (4, 4)),
    limit_points=(
        *((p, t, 1) for p, t in ((1, 1), (1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 4))),
        *((p, t, 10) for p, t in ((1, 4), (2, 2), (4, 4))),
    ),
    throughput_warmup_s=0.3,
    throughput_window_s=0.8,
    throughput_preload=40_000,
    throughput_rounds=8,
    enqueue_window_s=4.0,
    enqueue_max_jobs=50_000,
    enqueue_batch=100,
    enqueue_many_batch=1000,
    latency_jobs=100,
    latency_gap_ms=(20.0, 200.0),
    idle_window_s=10.0,
    memory_jobs=100_000,
    memory_threads=4,
    memory_timeout_s=240.0,
    locust_users=8,
    locust_user_rate=40.0,
    locust_run_time_s=20,
    locust_worker_threads=4,
    locust_drain_timeout_s=60.0,
    profile_jobs=3_000,
    peers_jobs=10_000,
    peers_rounds=3,
    peers_enqueue_timed=1_000,
    peers_processes=2,
    peers_connections=2,
    peers_latency_jobs=50,
    peers_drain_timeout_s=900.0,
    long_handlers=2,
    long_hold_s=30.0,
    long_before_s=5.0,
    long_after_s=10.0,
    long_sample_s=0.5,
    long_stream_rate=200.0,
    long_stream_threads=2,
)

QUICK: Final = Settings(
    mode="quick",
    depths=(1_000, 10_000),
    claim_samples=200,
    claim_budget_s=1.5,
    noindex_samples=100,
    noindex_budget_s=1.5,
    thread_counts=(1, 4),
    process_configs=((2, 2),),
    throughput_warmup_s=0.2,
    throughput_window_s=0.6,
    throughput_preload=10_000,
    throughput_rounds=3,
    enqueue_window_s=0.6,
    enqueue_max_jobs=10_000,
    enqueue_batch=100,
    enqueue_many_batch=1000,
    latency_jobs=20,
    latency_gap_ms=(20.0, 120.0),
    idle_window_s=1.5,
    memory_jobs=10_000,
    memory_threads=4,
    memory_timeout_s=60.0,
    locust_users=4,
    locust_user_rate=40.0,
    locust_run_time_s=5,
    locust_worker_threads=2,
    locust_drain_timeout_s=30.0,
    profile_jobs=500,
    peers_jobs=500,
    peers_rounds=3,
    peers_enqueue_timed=100,
    peers_processes=2,
    peers_connections=2,
    peers_latency_jobs=6,
    peers_drain_timeout_s=300.0,
    long_handlers=2,
    long_hold_s=3.0,
    long_before_s=1.0,
    long_after_s=1.5,
    long_sample_s=0.5,
    long_stream_rate=200.0,
    long_stream_threads=2,
    serializer_seconds=0.02,
    profile=False,
    peers_async_drivers=(),
    throughput_async=False,
)

# For the smoke test: the quick machinery on sizes that say nothing about speed but finish in seconds.
TINY: Final = QUICK.with_(
    mode="tiny",
    depths=(100, 300),
    claim_samples=10,
    claim_budget_s=0.5,
    noindex_samples=10,
    noindex_budget_s=0.5,
    thread_counts=(1, 2),
    process_configs=((2, 1),),
    batch_configs=((1, 2),),
    limit_points=((1, 2, 1), (1, 2, 10)),
    throughput_warmup_s=0.1,
    throughput_window_s=0.3,
    throughput_preload=2_000,
    throughput_rounds=1,
    enqueue_window_s=0.2,
    enqueue_max_jobs=300,
    enqueue_batch=10,
    enqueue_many_batch=50,
    latency_jobs=3,
    latency_gap_ms=(5.0, 20.0),
    idle_window_s=0.5,
    memory_jobs=300,
    memory_threads=2,
    memory_timeout_s=30.0,
    locust_users=2,
    locust_user_rate=20.0,
    # Long enough for locust's own start-up on a loaded 2-core machine, where 2 s committed nothing.
    locust_run_time_s=5,
    locust_drain_timeout_s=20.0,
    profile_jobs=50,
    peers_jobs=100,
    peers_rounds=1,
    peers_enqueue_timed=10,
    peers_processes=1,
    peers_latency_jobs=2,
    peers_drain_timeout_s=20.0,
    peers_async_drivers=("psycopg",),
    long_hold_s=1.5,
    long_before_s=0.5,
    long_after_s=0.5,
    long_stream_rate=100.0,
    serializer_seconds=0.002,
    profile=True,
)

PRESETS: Final = {"full": FULL, "quick": QUICK, "tiny": TINY}
