"""An xdist worker ends within execnet's grace: its garbage collected before it reports its session done."""

from __future__ import annotations

import gc
import os

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    # When the controller is done with a worker, execnet gives the worker's execution 5 s to end and then
    # sends it SIGINT (execnet.gateway_base._terminate_execution). What a worker still does after it reports
    # its session finished includes pytest's own end-of-run gc.collect(), which over a worker's whole heap on
    # a loaded 2-core machine outlasted that: every full run printed a KeyboardInterrupt raised in the middle
    # of a collection. Collected here, before xdist reports the session finished (the controller waits for
    # that report however long it takes), any unraisable exception still surfaces; gc.freeze() then leaves
    # the survivors out of the later collection, which finds only what was made since.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        gc.collect()
        gc.freeze()
