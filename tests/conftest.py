"""Test configuration: the conformance suite's hypothesis profile for every test, and the fixtures plugins."""

from __future__ import annotations

from conformance import profiles

pytest_plugins = ["fix_db", "fix_throwaway", "fix_cluster", "fix_patroni", "kill_matrix", "fix_worker_end"]

# The suite's profiles (conformance.profiles): PROLETARIAN_HYPOTHESIS_PROFILE=deep explores much further.
profiles.load()
