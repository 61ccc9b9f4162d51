"""The suite's hypothesis profiles, registered on import and chosen by PROLETARIAN_HYPOTHESIS_PROFILE."""

from __future__ import annotations

import os
from typing import Final

from hypothesis import HealthCheck, settings

# The environment variable that picks the profile, and its values: the suite's own profiles under names
# of their own, so a project's "ci" or "dev" profile is neither overwritten nor used by the suite.
PROFILE_ENV: Final = "PROLETARIAN_HYPOTHESIS_PROFILE"
DEFAULT_PROFILE: Final = "ci"
PROFILES: Final = {"ci": "proletarian-ci", "deep": "proletarian-deep", "dev": "proletarian-dev"}

_SUPPRESSED: Final = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]

# ci: repeatable and bounded, what every run gets unless it asks for another. deep: random and long, by
# hand (hours). dev: random, as short as ci, to look for what ci's fixed seed does not reach.
settings.register_profile(
    PROFILES["ci"],
    derandomize=True,
    max_examples=30,
    deadline=None,
    suppress_health_check=_SUPPRESSED,
    print_blob=True,
)
settings.register_profile(
    PROFILES["deep"], max_examples=2000, deadline=None, suppress_health_check=_SUPPRESSED, print_blob=True
)
settings.register_profile(PROFILES["dev"], max_examples=30, deadline=None, suppress_health_check=_SUPPRESSED)


def profile_name() -> str:
    """The hypothesis name of the profile PROLETARIAN_HYPOTHESIS_PROFILE picks ("ci" when unset)."""
    chosen = os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    if chosen not in PROFILES:
        raise ValueError(
            f"{PROFILE_ENV}={chosen!r} is not a conformance profile; use one of {sorted(PROFILES)}"
        )
    return PROFILES[chosen]


def active() -> settings:
    """The settings of the chosen profile: the parent of every property test of the suite."""
    return settings.get_profile(profile_name())


def load() -> None:
    """Make the chosen profile hypothesis's default too, for a project's own tests (tests/conftest.py)."""
    settings.load_profile(profile_name())
