"""Train a ViT from a recipe.

    python tools/train.py recipes/quickstart.yaml
    python tools/train.py recipes/vit_small.yaml trainer.max_epochs=5 model.num_heads=8 trainer.precision=bf16-mixed
    python tools/train.py recipes/vit_small.yaml --resume runs/vit_small/<timestamp>/checkpoints/last.ckpt

Writes runs/<recipe>/<timestamp>/ (config.yaml, metrics.csv, checkpoints/, curves.png,
summary.json, model.safetensors). Multi-GPU / multi-node: set trainer.devices, trainer.num_nodes
and trainer.strategy=ddp; Lightning launches the other processes.

Exit status: 0 done, 2 bad recipe or arguments, 1 any other error (data, checkpoint, divergence,
disk), 143 stopped by SIGTERM (last.ckpt saved; the message says how to resume). --debug shows
the traceback of an error.
"""

from __future__ import annotations

import argparse
import json
import sys

from vitkit.errors import cli_errors
from vitkit.train import RUN_EXIT_STATUSES, train


def main(argv: list[str] | None = None) -> int:
    return cli_errors(_main, argv, status=1, statuses=RUN_EXIT_STATUSES)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="recipe YAML file (recipes/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.max_epochs=5")
    parser.add_argument("--resume", metavar="CKPT", help="checkpoint to continue from (e.g. .../checkpoints/last.ckpt)")
    args = parser.parse_intermixed_args(argv)  # overrides may follow --resume CKPT
    result = train(args.recipe, args.overrides, resume=args.resume)
    print(json.dumps(result.summary, indent=2))
    print(f"run directory: {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
