"""The recipes shipped with vitkit (``vitkit/recipes/*.yaml``, installed as package data; a clone's
``recipes/`` links there): found by name, listed with their first comment line."""

from __future__ import annotations

import os
from pathlib import Path

#: The folder of the shipped recipes, in a clone and in an installed package alike.
SHIPPED = Path(__file__).resolve().parent / "recipes"


def shipped_recipes() -> dict[str, str]:
    """``{name: the recipe's first comment line}`` of every shipped recipe, sorted by name."""
    recipes = {}
    for path in sorted(SHIPPED.glob("*.yaml")):
        lines = path.read_text(encoding="utf-8").splitlines()
        recipes[path.stem] = next((line.lstrip("#").strip() for line in lines if line.startswith("#")), "")
    return recipes


def find_recipe(recipe: str | os.PathLike) -> Path:
    """The file ``recipe`` names: an existing file, else the shipped recipe it names as
    ``quickstart``, ``quickstart.yaml`` or ``recipes/quickstart.yaml`` (the path a clone uses),
    else ``recipe`` itself (which the reader then refuses as missing)."""
    path = Path(recipe)
    if path.is_file() or path.parent not in (Path("."), Path("recipes")) or path.suffix not in ("", ".yaml"):
        return path
    shipped = SHIPPED / f"{path.stem}.yaml"
    return shipped if shipped.is_file() else path
