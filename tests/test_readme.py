"""Every Python snippet in the README runs as written (in a scratch folder, on the CPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vitkit.kernels import AUTOTUNER

README = Path(__file__).parent.parent / "README.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_the_readme_has_snippets() -> None:
    assert len(SNIPPETS) >= 5


@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet{i + 1}" for i in range(len(SNIPPETS))])
def test_readme_snippet_runs_as_written(code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for state in ("_cache_path", "_cache_path_set", "_disk"):  # a snippet points the autotuner at a cache file
        monkeypatch.setattr(AUTOTUNER, state, getattr(AUTOTUNER, state))
    exec(compile(code, f"README.md snippet\n{code[:60]}", "exec"), {"__name__": "readme_snippet"})
