"""Operating a queue: list, show, retry, cancel, reschedule and purge jobs, health, stats, metrics."""
