"""Small modules with one job: no file of ``vitkit/`` over :data:`MAX_FILE_LINES` lines, no function
(or method) over :data:`MAX_FUNCTION_LINES` lines, its signature, docstring and body counted.

Each file is its own case, read with :mod:`ast`; a file still over a limit while other work
splits it is listed in :data:`BEING_SPLIT` and reported as an expected failure (an unexpected pass
once it is split: then drop it from the list)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "vitkit"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80

#: Files over a limit that another piece of work owns and is splitting (the registry work, merged separately).
BEING_SPLIT = {
    "train/config.py": "901 lines: the recipe sections, split by the registry work",
    "train/run.py": "_fit, 103 lines, shortened by the registry work",
}


def oversized(path: Path) -> list[str]:
    """What in ``path`` is over a limit: the file's length, and each function's name and length."""
    source = path.read_text()
    found = [f"{len(source.splitlines())} lines"] if len(source.splitlines()) > MAX_FILE_LINES else []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{node.name} (line {node.lineno}): {length} lines")
    return found


def cases() -> list:
    files = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py"))
    return [pytest.param(name, marks=pytest.mark.xfail(reason=BEING_SPLIT[name], strict=False))
            if name in BEING_SPLIT else name for name in files]


@pytest.mark.parametrize("name", cases())
def test_the_file_and_each_function_are_within_the_limits(name: str) -> None:
    assert not oversized(PACKAGE / name), f"vitkit/{name}: {oversized(PACKAGE / name)}"


def test_the_measure_counts_a_function_from_its_def_to_its_last_line(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 2))
    fits = f"def fits():\n    '''Doc.'''\n{body}\n"  # exactly the limit
    over = f"class A:\n    def over(self):\n        '''Doc.'''\n        y = 0\n{body.replace('    ', '        ')}\n"
    (tmp_path / "fits.py").write_text(fits)
    (tmp_path / "over.py").write_text(over + "\n" * (MAX_FILE_LINES - len(over.splitlines()) + 1))
    assert oversized(tmp_path / "fits.py") == []
    assert oversized(tmp_path / "over.py") == [f"{MAX_FILE_LINES + 1} lines", f"over (line 2): {MAX_FUNCTION_LINES + 1} lines"]


def test_every_file_listed_as_being_split_exists() -> None:
    assert all((PACKAGE / name).is_file() for name in BEING_SPLIT)
