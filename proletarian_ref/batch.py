"""Batch mode of the queue worker: run_next_batch, one batch's transaction, lives with run_next_job's."""

from proletarian_ref._sync.job_run import run_next_batch

__all__ = ["run_next_batch"]
