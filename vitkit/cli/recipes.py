"""List the recipes shipped with vitkit: each name, then the recipe's first comment line.

    vitkit recipes
    vitkit train quickstart

A recipe is named without its folder and suffix (vitkit train quickstart); in a clone the same
files are recipes/*.yaml. Copy one to change more than command-line overrides reach.
"""

from __future__ import annotations

import argparse

from vitkit.recipe_files import SHIPPED, shipped_recipes

from .commands import run_command


def main(argv: list[str] | None = None) -> int:
    """``vitkit recipes`` in this process (tests)."""
    return run_command("recipes", run, argv)


def run(args: argparse.Namespace) -> int:
    recipes = shipped_recipes()
    width = max(map(len, recipes))
    print("\n".join(f"{name:<{width}}  {line}" for name, line in recipes.items()))
    print(f"(files in {SHIPPED}; train one with: vitkit train NAME)")
    return 0
