"""Enqueueing jobs on the caller's connection, one or a batch (proletarian.job/enqueue!), and Job."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NamedTuple, NoReturn

from proletarian_ref.backend import JobRecord
from proletarian_ref.backends import backend_for_connection
from proletarian_ref.clock import Clock, now_from, system_utc
from proletarian_ref.errors import ConfigurationError, ProletarianError, SerializationError
from proletarian_ref.job_ids import JobIdStrategy, default_job_id_strategy, random_uuids
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.serializers import Serializer, create_serializer
from proletarian_ref.tables import TableName, table_name
from proletarian_ref.unique import UniqueKey, unique_key_of

__all__ = [
    "DEFAULT_NOTIFY",
    "Job",
    "JobSpec",
    "default_serializer",
    "enqueue",
    "enqueue_many",
    "to_process_at",
]

_DEFAULT_SERIALIZER = create_serializer()
_new_tuple: Final = tuple.__new__
# Whether enqueue announces its jobs to listening workers unless told (docs/worker.md, "Instant
# wake-up", says why and with which measurements).
DEFAULT_NOTIFY: Final = False


def default_serializer() -> Serializer:
    return _DEFAULT_SERIALIZER


class Job(NamedTuple):
    """A claimed job as handlers, retry_strategy_fn and failed_job_fn see it; immutable.

    `attempts` is the number of the current attempt (1 on the first run), as in Proletarian's job map.
    `queue` and `job_type` are keyword names without the colon, e.g. "my.ns/job-type". A NamedTuple
    rather than a frozen dataclass, which costs three times as much to build, once for every job run;
    `job._replace(...)` gives a changed copy.
    """

    job_id: Any
    queue: str
    job_type: str
    payload: Any
    attempts: int
    enqueued_at: datetime
    process_at: datetime


def to_process_at(now: datetime, process_at: datetime | None, process_in: timedelta | None) -> datetime:
    """Proletarian's ->process-at: process_at wins; the past is clamped to now; a negative delay means now."""
    if process_at is not None:
        if not isinstance(process_at, datetime):
            raise ConfigurationError(f"process_at must be an aware datetime, got {type(process_at).__name__}")
        if process_at.tzinfo is None or process_at.utcoffset() is None:
            raise ConfigurationError(
                f"process_at={process_at!r} is a naive datetime; pass an aware one, e.g. with tzinfo=UTC"
            )
        try:
            return max(process_at.astimezone(now.tzinfo), now)
        except OverflowError:
            # Within a day of datetime.min or datetime.max, UTC falls outside years 1 to 9999.
            if process_at.year == 1:
                return now
            raise ConfigurationError(f"process_at={process_at!r} is past year 9999 in UTC") from None
    if process_in is not None:
        if not isinstance(process_in, timedelta):
            raise ConfigurationError(f"process_in must be a timedelta, got {type(process_in).__name__}")
        if process_in < timedelta(0):
            return now
        try:
            return now + process_in
        except OverflowError:
            raise ConfigurationError(f"process_in={process_in!r} puts the job past year 9999") from None
    return now


class JobSpec(NamedTuple):
    """One job for enqueue_many: what enqueue takes per job, the rest shared by the batch.

    A plain `(job_type, payload)` tuple is a JobSpec too. `queue` None means enqueue_many's `queue`;
    `process_at` and `process_in` are as for enqueue (process_at wins; neither means now), and so is
    `unique_key`.
    """

    job_type: str
    payload: Any
    queue: str | None = None
    process_at: datetime | None = None
    process_in: timedelta | None = None
    unique_key: str | UniqueKey | None = None


class _Enqueuing(NamedTuple):
    """What every job of one enqueue or enqueue_many call shares, the options checked and defaulted."""

    # A Backend, or an AsyncBackend for proletarian_ref.aio (both APIs' code reads it: _async/enqueue.py).
    backend: Any
    table: TableName
    archive: TableName
    serializer: Serializer
    strategy: JobIdStrategy
    now: datetime  # the clock is read once a call
    # The backend's PayloadLimits.check_payload, or None: the protocol is optional.
    check_payload: Callable[[Any, TableName, TableName, str], None] | None
    # The default strategies' ids in blocks (job_ids.random_uuids), or None: strategy.generate_id per job.
    random_ids: Iterator[tuple[Any, Any]] | None
    # An AsyncBackend's check_payload when it is a coroutine function, which the encoding cannot await:
    # enqueue awaits it before the INSERT (check_payload is None then).
    awaited_check: Callable[[Any, TableName, TableName, str], Awaitable[None]] | None


# The checked options of the calls that leave backend, serializer and job_id_strategy to the library, by
# connection type and the two table names as given: parsing both names, finding the backend and making
# the id strategy again on every call was a tenth of enqueue's client instructions. Values only (types,
# names, the library's own backends), never a connection or anything of the caller's.
_DefaultSetup = tuple[Any, TableName, TableName, JobIdStrategy, Any, Any]
_DEFAULT_SETUPS: dict[tuple[object, type, object, object], _DefaultSetup] = {}
_DEFAULT_SETUPS_MAX: Final = 256


def _enqueuing(
    conn: Any,
    job_table: str | TableName,
    archived_job_table: str | TableName,
    serializer: Serializer | None,
    job_id_strategy: JobIdStrategy | None,
    clock: Clock | None,
    backend: Any,
    notify: object,
    find_backend: Callable[[Any], Any] = backend_for_connection,
) -> _Enqueuing:
    """The options of one enqueue call, checked and defaulted; `find_backend` finds the backend `conn`
    needs when none is given (proletarian_ref.aio's finds an AsyncBackend)."""
    if not isinstance(notify, bool):
        raise ConfigurationError(f"notify must be True or False, got {notify!r}")
    if (
        backend is None
        and serializer is None
        and job_id_strategy is None
        # A connection that names its own backend may name another each time.
        and not callable(getattr(conn, "proletarian_backend", None))
    ):
        # Each API's own backends: a connection type one of them refuses is never the other's cached answer.
        key = (find_backend, type(conn), job_table, archived_job_table)
        try:
            known = _DEFAULT_SETUPS.get(key)
            cacheable = True
        except TypeError:  # a table name that cannot be hashed is refused below
            known, cacheable = None, False
        if known is None:
            table = table_name(job_table, option="job_table")
            archive = table_name(archived_job_table, option="archived_job_table")
            backend = find_backend(conn)
            strategy = default_job_id_strategy(backend.dialect)
            known = (backend, table, archive, strategy, *_payload_checks(backend))
            if cacheable and len(_DEFAULT_SETUPS) < _DEFAULT_SETUPS_MAX:
                _DEFAULT_SETUPS[key] = known
        backend, table, archive, strategy, check_payload, awaited_check = known
        # now_from(system_utc) is this, less a call.
        now = datetime.now(UTC) if clock is None else now_from(clock)
        ids = random_uuids(strategy)
        return _Enqueuing._make(
            (backend, table, archive, _DEFAULT_SERIALIZER, strategy, now, check_payload, ids, awaited_check)
        )
    table = table_name(job_table, option="job_table")
    archive = table_name(archived_job_table, option="archived_job_table")
    if backend is None:
        backend = find_backend(conn)
    strategy = job_id_strategy if job_id_strategy is not None else default_job_id_strategy(backend.dialect)
    check_payload, awaited_check = _payload_checks(backend)
    return _Enqueuing(
        backend,
        table,
        archive,
        serializer if serializer is not None else _DEFAULT_SERIALIZER,
        strategy,
        now_from(clock if clock is not None else system_utc),
        check_payload,
        random_uuids(strategy),
        awaited_check,
    )


def _payload_checks(backend: Any) -> tuple[Any, Any]:
    """The backend's check_payload (the optional PayloadLimits) as (called, awaited): one of them, or none."""
    check = getattr(backend, "check_payload", None)
    if check is not None and inspect.iscoroutinefunction(check):
        return None, check
    return check, None


def _record_stream(
    conn: Any,
    setup: _Enqueuing,
    jobs: Iterable[JobSpec | tuple[str, Any]],
    queue: str,
    ids: list[Any],
    records: list[JobRecord],
) -> Iterator[JobRecord]:
    """enqueue_many's rows, each job made by _job_record as it is read; a bad one named by its index.

    Each new id and row is also added to `ids` and `records`.
    """
    job_queue: str | None
    process_at: datetime | None
    process_in: timedelta | None
    for index, item in enumerate(jobs):
        try:
            if type(item) is tuple and len(item) == 2:
                job_type, payload = item
                job_queue, process_at, process_in = queue, None, None
            else:
                job_type, payload, job_queue, process_at, process_in = _job_spec(item)[:5]
                if job_queue is None:
                    job_queue = queue
            job_id, record = _job_record(
                conn, setup, job_type, payload, job_queue, process_at, process_in, ids[0] if ids else _NO_ID
            )
        except ProletarianError as exc:
            _raise_at_index(exc, index)
        ids.append(job_id)
        records.append(record)
        yield record


_NO_ID: Final = object()


def batch_unique_keys(items: Sequence[JobSpec | tuple[str, Any]]) -> list[UniqueKey | None]:
    """The checked unique key (or None) of each job of a batch; a bad one's error has its `index` set."""
    keys: list[UniqueKey | None] = []
    for index, item in enumerate(items):
        try:
            given = item.unique_key if type(item) is JobSpec else None
            keys.append(None if given is None else unique_key_of(given))
        except ProletarianError as exc:
            _raise_at_index(exc, index)
    return keys


def _strategy_id(strategy: JobIdStrategy, first_id: Any) -> tuple[Any, Any]:
    """A new id from `strategy` and its stored form; refused if it is None and `first_id` is not, or back."""
    job_id = strategy.generate_id()
    stored_id = None if job_id is None else strategy.encode_id(job_id)
    if first_id is not _NO_ID and (job_id is None) != (first_id is None):
        raise ConfigurationError("job_id_strategy returned None for some jobs and an id for others")
    return job_id, stored_id


def announced_queues(setup: _Enqueuing, records: Iterable[JobRecord]) -> list[str]:
    """The queues (keyword text) with a job due now among `records`, each once, in order."""
    return list(dict.fromkeys(record.queue for record in records if record.process_at <= setup.now))


def _job_spec(item: Any) -> JobSpec:
    if isinstance(item, JobSpec):
        return item
    if isinstance(item, tuple) and len(item) == 2:
        return JobSpec(item[0], item[1])
    what = f"a tuple of {len(item)}" if isinstance(item, tuple) else type(item).__name__
    raise ConfigurationError(f"a job must be a JobSpec or a (job_type, payload) tuple, not {what}")


def _raise_at_index(exc: ProletarianError, index: int) -> NoReturn:
    """Raise `exc` again, as its own type (from `exc`), with the message and `index` naming the job it was
    about; called in the block handling `exc`."""
    error: ProletarianError | None
    try:
        error = type(exc)(f"jobs[{index}]: {exc}")
    except TypeError:  # an exception class with other arguments: the original, marked
        error = None
    if error is None:
        exc.index = index
        raise exc  # outside the except TypeError block, so the TypeError is not its context
    error.index = index
    raise error from exc


def _job_record(
    conn: Any,
    setup: _Enqueuing,
    job_type: str,
    payload: Any,
    queue: str,
    process_at: datetime | None,
    process_in: timedelta | None,
    first_id: Any = _NO_ID,
) -> tuple[Any, JobRecord]:
    """The new id (None if the database makes it) and the row for one job, checked and encoded.

    `first_id` is the id of the batch's first job, if this one is not: an id strategy must give None
    for all of a batch or for none of it.
    """
    # One unpacking: a NamedTuple's field by name is a descriptor call each.
    _, table, archive, serializer, strategy, now, check_payload, random_ids, _ = setup
    # A plain str is its keyword text's cache key as it is (to_keyword_text makes sure of that).
    job_type_text = _KEYWORD_TEXTS.get(job_type) if type(job_type) is str else None
    if job_type_text is None:
        job_type_text = _keyword_text(job_type, "job_type")
    queue_text = _KEYWORD_TEXTS.get(queue) if type(queue) is str else None
    if queue_text is None:
        queue_text = _keyword_text(queue, "queue")
    if process_at is None and process_in is None:
        effective_process_at = now
    else:
        effective_process_at = to_process_at(now, process_at, process_in)
    payload_text = encode_payload(serializer, payload)
    if check_payload is not None:
        check_payload(conn, table, archive, payload_text)
    if random_ids is not None:
        job_id, stored_id = next(random_ids)
    else:
        job_id, stored_id = _strategy_id(strategy, first_id)
    # tuple.__new__ as JobRecord._make does, less its Python-level call: the generated constructor
    # with keywords costs six times as much.
    record = _new_tuple(
        JobRecord, (stored_id, queue_text, job_type_text, payload_text, 0, now, effective_process_at)
    )
    return job_id, record


# Keyword text by plain str name, for the names seen (a bounded number of them).
_KEYWORD_TEXTS: dict[str, str] = {}
_KEYWORD_TEXTS_MAX: Final = 4096


def _keyword_text(name: Any, what: str) -> str:
    text = to_keyword_text(name, what=what)
    if type(name) is str and len(_KEYWORD_TEXTS) < _KEYWORD_TEXTS_MAX:
        _KEYWORD_TEXTS[name] = text
    return text


def encode_payload(serializer: Serializer, payload: Any) -> str:
    """Encode with `serializer`, turning any failure into a SerializationError that names the cause."""
    try:
        text = serializer.encode(payload)
    except ProletarianError:
        raise
    except Exception as exc:
        raise _encoding_error(payload, exc) from exc
    if type(text) is str and text.isascii():
        return text
    return _checked_payload_text(text)


def _encoding_error(payload: Any, exc: Exception) -> SerializationError:
    """The error for serializer.encode's `exc` (not one of the library's own, which is raised as it is)."""
    return SerializationError(f"payload of type {type(payload).__name__} could not be encoded: {exc}")


def _checked_payload_text(text: Any) -> str:
    """serializer.encode's result, if it is text every database column can store."""
    if not isinstance(text, str):
        raise SerializationError(f"serializer.encode must return str, got {type(text).__name__}")
    if not text.isascii():
        # The drivers encode to UTF-8 only when sending; a custom serializer's lone surrogate would fail
        # there with an error that names neither the payload nor the serializer.
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SerializationError(
                f"serializer.encode returned text that is not valid Unicode ({exc.reason} at index "
                f"{exc.start}), which no database column can store"
            ) from None
    return text


# The I/O, generated from proletarian_ref/_async/enqueue.py (which imports the functions above): last, so
# that they exist when it does.
from proletarian_ref._sync.enqueue import enqueue, enqueue_many  # noqa: E402
