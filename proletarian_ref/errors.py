"""The library's own exceptions: what callers catch, whatever driver is underneath."""

from __future__ import annotations


class ProletarianError(Exception):
    """Base class of every error raised by proletarian_ref."""

    # The position of the job enqueue_many refused in the jobs it was given; None everywhere else.
    index: int | None = None


class ConfigurationError(ProletarianError, ValueError):
    """An option, table name or argument is invalid; raised before any SQL runs."""


class InvalidKeywordError(ConfigurationError):
    """A queue or job type is not text that Clojure's EDN reader reads back as the same keyword."""


class SerializationError(ProletarianError, ValueError):
    """A payload could not be encoded by the serializer; nothing was written."""


class PayloadDecodeError(ProletarianError, ValueError):
    """Stored payload text could not be decoded by the serializer."""


class InvalidRetryStrategyError(ProletarianError, ValueError):
    """retry_strategy_fn returned something that is neither None nor a valid retry strategy."""


class FailedJobFnError(ProletarianError):
    """failed_job_fn raised; the archive and delete are rolled back with it (Proletarian #30)."""

    def __init__(self, message: str, *, job: object) -> None:
        super().__init__(message)
        self.job = job


class JobInterrupted(ProletarianError):
    """Raised inside a handler when its worker is stopping (Proletarian's InterruptedException).

    The job is left in the queue with its attempts unchanged.
    """


class JobTimeoutError(ProletarianError):
    """A job ran past its worker's job_timeout_ms: the job's failure, as a handler's exception is, so
    retry_strategy_fn and failed_job_fn see it (docs/worker.md, "Job timeout"); its __cause__ is what the
    handler raised once told, if anything."""


class ShutdownTimeoutError(ProletarianError):
    """stop() could not finish the worker threads within await_termination_timeout_ms."""


class DatabaseError(ProletarianError):
    """A database operation failed; the driver's exception is the __cause__."""


class TransientDatabaseError(DatabaseError):
    """A failure expected to pass (lost connection, pool timeout, lock wait timeout, deadlock).

    A queue worker logs it and polls again after the interval instead of stopping.
    """


class SchemaMissingError(DatabaseError):
    """The job or archive table does not exist."""


class PayloadTooLargeError(SerializationError):
    """The encoded payload does not fit the table's payload column; raised before the INSERT."""


class JobTransactionError(ProletarianError):
    """A handler misused the job's transaction (current_job().connection()): it tried to commit, roll back,
    close it or change its autocommit, ended it some other way, or used it outside its handler.

    Refused inside the handler, it fails the job as any handler error does; found after the handler (the
    transaction was ended behind the guard), it leaves run_next_job and the job stays queued, attempts
    unchanged (docs/job-transaction.md).
    """
