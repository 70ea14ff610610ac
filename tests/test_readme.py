"""The README opens with its two commands, and every Python snippet in the README and in docs/*.md
runs as written (in a scratch folder, on the CPU). A snippet whose first line is the comment
``# continued`` runs after the page's snippets above it, in their namespace, as one script would."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
from tiny_runs import shipped_tasks

from vitkit.kernels import AUTOTUNER
from vitkit.tasks import registry

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [
    (page, code)
    for page in PAGES
    for code in re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)
]
SNIPPET_IDS = [
    f"{page.relative_to(ROOT)}:{[p for p, _ in SNIPPETS[: i + 1]].count(page)}" for i, (page, _) in enumerate(SNIPPETS)
]


def test_the_readme_has_snippets() -> None:
    assert len([page for page, _ in SNIPPETS if page == README]) >= 1
    assert len(SNIPPETS) >= 5


def test_the_readme_opens_with_make_demo_and_make_test() -> None:
    first_block = re.search(r"^```(\w*)\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)
    assert first_block and first_block.group(1) == "bash"
    assert [line.split("#")[0].strip() for line in first_block.group(2).splitlines()] == ["make demo", "make test"]


@pytest.mark.parametrize(("page", "code"), SNIPPETS, ids=SNIPPET_IDS)
def test_readme_snippet_runs_as_written(page: Path, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for state in ("_cache_path", "_cache_path_set", "_disk"):  # a snippet points the autotuner at a cache file
        monkeypatch.setattr(AUTOTUNER, state, getattr(AUTOTUNER, state))
    # the snippet's tasks register into a registry of the shipped tasks only, dropped afterwards
    monkeypatch.setattr(registry, "_TASKS", shipped_tasks())
    module = types.ModuleType("readme_snippet")  # a dataclass in a snippet looks its module up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    name = page.relative_to(ROOT)
    index = SNIPPETS.index((page, code))
    script = [code]
    while script[0].startswith("# continued\n"):
        index -= 1
        assert SNIPPETS[index][0] == page, f"the first snippet of {name} continues nothing"
        script.insert(0, SNIPPETS[index][1])
    for part in script:
        exec(compile(part, f"{name} snippet\n{part[:60]}", "exec"), module.__dict__)
