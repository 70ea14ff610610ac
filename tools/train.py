"""Train a ViT from a recipe.

    python tools/train.py recipes/quickstart.yaml
    python tools/train.py recipes/vit_small.yaml trainer.max_epochs=5 model.num_heads=8 trainer.precision=bf16-mixed
    python tools/train.py recipes/vit_small.yaml --resume runs/vit_small/<timestamp>/checkpoints/last.ckpt

Writes runs/<recipe>/<timestamp>/ (config.yaml, metrics.csv, checkpoints/, curves.png,
summary.json, model.safetensors). Multi-GPU / multi-node: set trainer.devices, trainer.num_nodes
and trainer.strategy=ddp; Lightning launches the other processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from vitkit.data import DataFileError  # noqa: E402
from vitkit.train import NonFiniteLossError, RecipeError, UnsafeCheckpointError, train  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="recipe YAML file (recipes/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.max_epochs=5")
    parser.add_argument("--resume", metavar="CKPT", help="checkpoint to continue from (e.g. .../checkpoints/last.ckpt)")
    args = parser.parse_args(argv)
    try:
        result = train(args.recipe, args.overrides, resume=args.resume)
    except (RecipeError, NonFiniteLossError, UnsafeCheckpointError, FileNotFoundError, DataFileError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, RecipeError) else 1
    print(json.dumps(result.summary, indent=2))
    print(f"run directory: {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
