"""What running a job reads, checked before anything runs: the options, the handler's form, a row as a Job."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from proletarian_ref.backend import AsyncBackend, Backend, BatchClaim, JobRecord
from proletarian_ref.clock import Clock, reader, system_utc
from proletarian_ref.error_history import ErrorHistory
from proletarian_ref.errors import ConfigurationError, PayloadDecodeError
from proletarian_ref.job import Job, default_serializer
from proletarian_ref.job_ids import JobIdStrategy, default_job_id_strategy
from proletarian_ref.keywords import DEFAULT_QUEUE, from_keyword_text, to_keyword_text
from proletarian_ref.retry import FailedJobFn, RetryStrategyFn, no_failed_job_fn, no_retries
from proletarian_ref.serializers import Serializer
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, TableName, table_name

_new_tuple: Final = tuple.__new__
HandlerFnMode = Literal["default", "advanced"]
HandlerFn = Callable[..., object]
HANDLER_FN_MODES: Final = ("default", "advanced")


@dataclass(frozen=True, slots=True)
class JobSettings:
    """The options that running one job reads (the config map of process-next-job!)."""

    queue: str
    job_table: TableName
    archived_job_table: TableName
    serializer: Serializer
    job_id_strategy: JobIdStrategy
    handler_fn_mode: HandlerFnMode
    retry_strategy_fn: RetryStrategyFn
    failed_job_fn: FailedJobFn
    clock: Clock
    # Jobs claimed and run per transaction: 1 is Proletarian's one job a transaction (run_next_job),
    # more is batch mode (proletarian_ref.batch.run_next_batch).
    batch_size: int = 1
    # Where failures go (proletarian_ref.error_history): the side table's store, looked up at the first
    # failed job of these settings' worker (or process_next_job call) and kept; a job that succeeds never
    # asks. Each job_settings() call makes a new one.
    error_history: ErrorHistory = field(default_factory=ErrorHistory, compare=False, repr=False)
    # now_from(clock), as clock.reader makes it: what the worker reads the time with.
    now: Callable[[], datetime] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "now", reader(self.clock))


def job_settings(
    backend: Backend | AsyncBackend,
    *,
    queue: str = DEFAULT_QUEUE,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    serializer: Serializer | None = None,
    job_id_strategy: JobIdStrategy | None = None,
    handler_fn_mode: str = "default",
    retry_strategy_fn: RetryStrategyFn | None = None,
    failed_job_fn: FailedJobFn | None = None,
    clock: Clock | None = None,
    batch_size: int = 1,
) -> JobSettings:
    """Apply defaults and check every option before anything runs."""
    check_batch_size(batch_size, backend)
    if handler_fn_mode not in HANDLER_FN_MODES:
        raise ConfigurationError(
            f"handler_fn_mode must be one of {', '.join(map(repr, HANDLER_FN_MODES))}, "
            f"got {handler_fn_mode!r}"
        )
    serializer = serializer if serializer is not None else default_serializer()
    if not (callable(getattr(serializer, "encode", None)) and callable(getattr(serializer, "decode", None))):
        raise ConfigurationError(f"serializer must have encode and decode methods, got {serializer!r}")
    strategy = job_id_strategy if job_id_strategy is not None else default_job_id_strategy(backend.dialect)
    if not all(callable(getattr(strategy, m, None)) for m in ("generate_id", "encode_id", "decode_id")):
        raise ConfigurationError(f"job_id_strategy must implement JobIdStrategy, got {strategy!r}")
    for name, fn in (
        ("retry_strategy_fn", retry_strategy_fn),
        ("failed_job_fn", failed_job_fn),
        ("clock", clock),
    ):
        if fn is not None and not callable(fn):
            raise ConfigurationError(f"{name} must be callable, got {fn!r}")
    return JobSettings(
        queue=to_keyword_text(queue, what="queue"),
        job_table=table_name(job_table, option="job_table"),
        archived_job_table=table_name(archived_job_table, option="archived_job_table"),
        serializer=serializer,
        job_id_strategy=strategy,
        handler_fn_mode="advanced" if handler_fn_mode == "advanced" else "default",
        retry_strategy_fn=retry_strategy_fn if retry_strategy_fn is not None else no_retries,
        failed_job_fn=failed_job_fn if failed_job_fn is not None else no_failed_job_fn,
        clock=clock if clock is not None else system_utc,
        batch_size=batch_size,
    )


def check_batch_size(batch_size: object, backend: Backend | AsyncBackend | None = None) -> None:
    """Refuse a batch_size that is not an int >= 1, or > 1 on a backend without batch mode."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigurationError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if batch_size > 1 and backend is not None and not isinstance(backend, BatchClaim):
        raise ConfigurationError(
            f"batch_size={batch_size} needs a backend with batch mode (proletarian_ref.backend.BatchClaim); "
            f"{type(backend).__name__} has none: leave batch_size at 1"
        )


def to_job(record: JobRecord, settings: JobSettings) -> tuple[Job, PayloadDecodeError | None]:
    """Decode a claimed row; a payload that does not decode becomes the job's failure, not the worker's."""
    error: PayloadDecodeError | None = None
    try:
        payload = settings.serializer.decode(record.payload)
    except Exception as exc:
        error = (
            exc
            if isinstance(exc, PayloadDecodeError)
            else PayloadDecodeError(f"payload does not decode: {exc}")
        )
        if error is not exc:
            error.__cause__ = exc
        payload = record.payload
    # tuple.__new__, in Job's field order: the generated __new__ with keywords costs six times as much, and
    # _make a Python call more.
    job = _new_tuple(
        Job,
        (
            settings.job_id_strategy.decode_id(record.job_id),
            from_keyword_text(record.queue),
            from_keyword_text(record.job_type),
            payload,
            record.attempts + 1,
            record.enqueued_at,
            record.process_at,
        ),
    )
    return job, error


class _GivenBack(enum.Enum):
    """What handle_job returns for a job that goes back to the queue untouched: nothing of it is written."""

    GIVEN_BACK = enum.auto()


GIVEN_BACK: Final = _GivenBack.GIVEN_BACK
