"""The recipes ship inside the package (vitkit/recipes, which a clone's recipes/ links to): found
by name from any folder, listed by ``vitkit recipes``, a misspelt name answered in one line; no
message sends a user to ``python tools/...``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vitkit.cli.main import main
from vitkit.recipe_files import SHIPPED
from vitkit.train.config import load_recipe

ROOT = Path(__file__).resolve().parents[2]


def test_a_clones_recipes_folder_is_the_packages() -> None:
    assert SHIPPED == (ROOT / "vitkit" / "recipes").resolve() == (ROOT / "recipes").resolve()
    assert len(list(SHIPPED.glob("*.yaml"))) >= 10


def test_vitkit_recipes_lists_every_shipped_recipe_with_its_first_comment_line(capsys: pytest.CaptureFixture) -> None:
    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = []
    for path in sorted(SHIPPED.glob("*.yaml")):
        first = next(line for line in path.read_text().splitlines() if line.startswith("#"))
        expected.append((path.stem, first[1:].strip()))
    assert [tuple(re.split(r"\s{2,}", line, maxsplit=1)) for line in lines[:-1]] == expected
    assert lines[-1] == f"(files in {SHIPPED}; train one with: vitkit train NAME)"


def test_a_recipe_is_found_by_name_or_a_clones_path_from_any_folder_and_a_local_file_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no recipes/ here
    shipped = load_recipe(SHIPPED / "quickstart.yaml").to_dict()
    for spelling in ("quickstart", "quickstart.yaml", "recipes/quickstart.yaml"):
        assert load_recipe(spelling).to_dict() == shipped
    local = (SHIPPED / "quickstart.yaml").read_text().replace("seed: 0", "seed: 123")
    assert local != (SHIPPED / "quickstart.yaml").read_text()
    (tmp_path / "quickstart.yaml").write_text(local)
    assert load_recipe("quickstart.yaml").trainer.seed == 123


def test_a_misspelt_recipe_name_is_one_line_with_the_closest_and_the_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "quickstrat"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: recipe file quickstrat does not exist; give a YAML file or a shipped recipe's name")
    assert "quickstart, shapes" in line and line.endswith("vitkit recipes describes them). Did you mean 'quickstart'?")


def test_no_message_or_recipe_tells_users_to_run_python_tools() -> None:
    files = [*ROOT.joinpath("vitkit").rglob("*.py"), *SHIPPED.glob("*.yaml")]
    assert [str(f) for f in files if re.search(r"python tools/|in tools/\w+\.py", f.read_text())] == []
