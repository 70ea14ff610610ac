"""The mutation list of tools/mutation_check.py stays applicable as the code changes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutation_applies_exactly_once_and_names_existing_tests(load_tool: Callable[[str], ModuleType]) -> None:
    tool = load_tool("mutation_check")
    packages = {m.package for m in tool.MUTATIONS}
    assert {"layers", "models", "data", "train", "explain", "prune", "io"} <= packages
    for mutation in tool.MUTATIONS:
        assert (ROOT / mutation.path).read_text().count(mutation.old) == 1, mutation.what
        assert mutation.old != mutation.new
        assert all((ROOT / test).is_file() for test in mutation.tests), mutation.what
