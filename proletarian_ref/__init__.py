"""proletarian-ref: the Python reference implementation of Proletarian, the durable job queue."""

# The submodules the docs name as `pr.<module>.<name>` are attributes of the package after
# `import proletarian_ref`. None of them imports a driver: backends import theirs when first used.
from typing import Any

from proletarian_ref import schema
from proletarian_ref._sync.job_tx import JobTransaction, current_job
from proletarian_ref.backend import Backend, BatchEnqueue, Capabilities, JobRecord, StreamEnqueue
from proletarian_ref.errors import (
    ConfigurationError,
    DatabaseError,
    FailedJobFnError,
    InvalidKeywordError,
    InvalidRetryStrategyError,
    JobInterrupted,
    JobTimeoutError,
    JobTransactionError,
    PayloadDecodeError,
    PayloadTooLargeError,
    ProletarianError,
    SchemaMissingError,
    SerializationError,
    ShutdownTimeoutError,
    TransientDatabaseError,
)
from proletarian_ref.interrupts import check_interrupted, interrupted, sleep
from proletarian_ref.job import Job, JobSpec, enqueue, enqueue_many
from proletarian_ref.job_ids import (
    ConstantIdStrategy,
    DbGeneratedStrategy,
    JobIdStrategy,
    MysqlUuidStrategy,
    PostgresqlUuidStrategy,
    constant_id_strategy,
    db_generated_strategy,
    mysql_time_ordered_uuid_strategy,
    mysql_uuid_strategy,
    postgresql_uuid_strategy,
)
from proletarian_ref.keywords import DEFAULT_QUEUE

# stats moved to proletarian_ref.ops (operations, not the core); `pr.stats` still names it.
from proletarian_ref.ops import stats
from proletarian_ref.retry import RetryStrategy
from proletarian_ref.serializers import Serializer, TransitSerializer, create_serializer
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE
from proletarian_ref.worker import QueueWorker, create_queue_worker, process_next_job

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_ARCHIVED_JOB_TABLE",
    "DEFAULT_JOB_TABLE",
    "DEFAULT_QUEUE",
    "Backend",
    "BatchEnqueue",
    "Capabilities",
    "ConfigurationError",
    "ConstantIdStrategy",
    "DatabaseError",
    "DbGeneratedStrategy",
    "FailedJobFnError",
    "InvalidKeywordError",
    "InvalidRetryStrategyError",
    "Job",
    "JobIdStrategy",
    "JobInterrupted",
    "JobRecord",
    "JobSpec",
    "JobTimeoutError",
    "JobTransaction",
    "JobTransactionError",
    "MysqlUuidStrategy",
    "PayloadDecodeError",
    "PayloadTooLargeError",
    "PostgresqlUuidStrategy",
    "ProletarianError",
    "QueueWorker",
    "RetryStrategy",
    "SchemaMissingError",
    "SerializationError",
    "Serializer",
    "ShutdownTimeoutError",
    "StreamEnqueue",
    "TransientDatabaseError",
    "TransitSerializer",
    "aio",
    "check_interrupted",
    "constant_id_strategy",
    "create_queue_worker",
    "create_serializer",
    "current_job",
    "db_generated_strategy",
    "enqueue",
    "enqueue_many",
    "interrupted",
    "mysql_time_ordered_uuid_strategy",
    "mysql_uuid_strategy",
    "postgresql_uuid_strategy",
    "process_next_job",
    "schema",
    "sleep",
    "stats",
]


def __getattr__(name: str) -> Any:
    # proletarian_ref.aio on first use: it imports asyncio, which a threaded program need not load; the
    # framework integrations (proletarian_ref.integrations.sqlalchemy, .django) likewise.
    if name in ("aio", "integrations"):
        import importlib

        return importlib.import_module(f"proletarian_ref.{name}")
    raise AttributeError(f"module 'proletarian_ref' has no attribute {name!r}")
