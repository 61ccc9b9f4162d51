"""The suite's extra, `conformance`, holds what the suite imports and nothing else, and the docs name it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
# Not imported, but what `pytest -n`, which the recipe allows, needs.
RUNNERS: Final = frozenset({"pytest-xdist"})
# Distribution names of the modules the suite imports, where they differ.
DISTRIBUTIONS: Final = {"pytest": "pytest", "hypothesis": "hypothesis"}


def top_level_imports(path: Path) -> set[str]:
    """The top-level modules a file imports at module level (drivers imported inside functions are not)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Try):  # conformance/__init__.py's optional pytest
            for inner in node.body:
                if isinstance(inner, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in inner.names)
    return found


def test_the_conformance_extra_is_what_the_suite_imports_and_nothing_else() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    declared = {re.split(r"[<>=\[ ;]", requirement)[0] for requirement in extras["conformance"]}
    imported = set().union(*(top_level_imports(path) for path in (ROOT / "conformance").glob("*.py")))
    third_party = imported - set(sys.stdlib_module_names) - {"__future__", "conformance", "proletarian_ref"}
    assert declared == {DISTRIBUTIONS.get(name, name) for name in third_party} | RUNNERS, (
        f"the conformance extra declares {sorted(declared)}; the suite imports {sorted(third_party)}"
    )
    own = re.fullmatch(r"proletarian-ref\[([a-z,-]+)\]", extras["test"][0])
    assert own is not None and "conformance" in own.group(1).split(","), "the test extra includes the suite's"


def test_the_readme_and_the_conformance_docs_say_how_to_install_the_suite() -> None:
    for document in (ROOT / "README.md", ROOT / "docs" / "conformance.md"):
        assert "pip install 'proletarian-ref[conformance]'" in document.read_text(encoding="utf-8"), (
            document.name
        )


def test_the_suites_modules_are_loaded_by_pytests_assertion_rewriter() -> None:
    """So a clause's plain assert shows the values it compared, installed package or not."""
    import conformance.contract

    loader = type(conformance.contract.__loader__).__name__
    assert loader == "AssertionRewritingHook", f"conformance.contract was loaded by {loader}"
