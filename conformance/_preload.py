"""Imported first by the fork server: gives it the test process's sys.path, then imports what it will need.

Python 3.11's fork server is handed the parent's sys.path but never applies it, so a harness factory in
a test module (on a path pytest added) would be imported again by every worker process, at a second or
so each. Anything that fails here is only not preloaded; the worker process imports it and reports.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys

from conformance.drain import PRELOAD_ENV

_wanted = json.loads(os.environ.get(PRELOAD_ENV) or "{}")
for _entry in reversed(_wanted.get("sys_path", [])):
    if _entry not in sys.path:
        sys.path.insert(0, _entry)
for _module in _wanted.get("modules", []):
    with contextlib.suppress(Exception):
        importlib.import_module(_module)
