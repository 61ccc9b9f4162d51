"""Load benchmarks for proletarian-ref: poll latency, throughput, enqueue rate, latency, memory, locust."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
