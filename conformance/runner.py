"""Running one suite test outside pytest, briefly: how the project proves each mutant is caught."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, Phase, given, is_hypothesis_test, settings
from hypothesis.errors import HypothesisWarning

from conformance.base import STRATEGIES_ATTRIBUTE, SuiteBase
from conformance.capabilities import unmet_need
from conformance.faults import Fault
from conformance.harness import Harness
from conformance.properties import model_settings_override


@dataclass(frozen=True, slots=True)
class Result:
    """How one suite test went against one harness."""

    test: str
    outcome: Literal["passed", "failed", "skipped"]
    error: BaseException | None = None

    @property
    def message(self) -> str:
        if self.error is None:
            return ""
        lines = str(self.error).strip().splitlines()
        return f"{type(self.error).__name__}: {lines[0] if lines else ''}"

    @property
    def text(self) -> str:
        """The whole failure message, as pytest would show it after the exception's name."""
        return "" if self.error is None else f"{type(self.error).__name__}: {self.error}"


def brief_settings(max_examples: int) -> settings:
    """Few examples, no shrinking, the same seed every time: find a failure fast, report it as found."""
    return settings(
        max_examples=max_examples,
        phases=[Phase.explicit, Phase.generate],
        derandomize=True,
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )


@contextmanager
def _model_settings(brief: settings) -> Iterator[None]:
    token = model_settings_override.set(brief)
    try:
        yield
    finally:
        model_settings_override.reset(token)


def run_suite_test(suite: type[SuiteBase], name: str, harness: Harness, *, max_examples: int = 5) -> Result:
    """Run test `name` of `suite` against `harness` as the suite's guard would, with few examples.

    A hypothesis test is rebuilt from its own strategies with `max_examples` generated examples and no
    shrinking, seeded as the CI profile is: a mutant must be caught fast and the same way every time.
    """
    test: Any = getattr(suite, name)
    reason = unmet_need(test, harness)
    if reason is not None:
        return Result(name, "skipped", pytest.skip.Exception(reason))
    brief = brief_settings(max_examples)
    if is_hypothesis_test(test) and hasattr(test, STRATEGIES_ATTRIBUTE):
        test = brief(given(**getattr(test, STRATEGIES_ATTRIBUTE))(test.hypothesis.inner_test))
    harness.clear()
    try:
        with _model_settings(brief), warnings.catch_warnings():
            # Hypothesis warns when it prints a falsifying example with a large payload; expected here.
            warnings.simplefilter("ignore", HypothesisWarning)
            test(suite(), harness)
    except pytest.skip.Exception as exc:
        return Result(name, "skipped", exc)
    except (Exception, pytest.fail.Exception, Fault) as exc:
        return Result(name, "failed", exc)
    finally:
        harness.close()
    return Result(name, "passed")
