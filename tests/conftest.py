"""Test configuration: hypothesis profiles and the database fixtures plugin."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

pytest_plugins = ["fix_db", "fix_throwaway", "fix_cluster", "fix_patroni", "kill_matrix"]

# CI is repeatable: derandomized and bounded. PROLETARIAN_HYPOTHESIS_PROFILE=deep explores much further.
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    print_blob=True,
)
settings.register_profile(
    "deep",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("PROLETARIAN_HYPOTHESIS_PROFILE", "ci"))
