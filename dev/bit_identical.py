"""Do the shipped recipes still train as before? Run ``fashion_mnist_fast``, ``mae_fashion_mnist``
and ``dino_fashion_mnist`` for a few deterministic CPU steps on a small subset of Fashion-MNIST and
print, for each, the sha256 of the last checkpoint's state dict (the model, its EMA and the task's
own parts) and of the exported ``model.safetensors``'s tensors: a refactoring that changes no
behaviour leaves every hash as it was.

    python dev/bit_identical.py                          # print the hashes as JSON
    python dev/bit_identical.py --save before.json       # record them (e.g. on main)
    python dev/bit_identical.py --expect before.json     # compare: exit 1 on any difference

A developer tool (a few minutes on 2 cores), not part of the installed package; it needs
Fashion-MNIST's IDX files (``apt-get install dataset-fashion-mnist``, or ``--root``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("fashion_mnist_fast", "mae_fashion_mnist", "dino_fashion_mnist")
#: A few steps on 2 classes, 32 training images each, one thread, deterministic kernels, no time limit.
SHORT = (
    "trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1", "trainer.batch_size=16", "trainer.accelerator=cpu", "trainer.devices=1",
    "trainer.num_threads=1", "trainer.deterministic=true", "trainer.compile=false", "trainer.max_time_minutes=null",
    "trainer.time_budget_minutes=null",
    "trainer.enable_progress_bar=false", "trainer.log_every=1", "data.classes=[0,1]", "data.train_per_class=32",
)


def tensors_hash(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over ``tensors`` in key order: each key, dtype, shape and raw bytes."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        tensor = tensors[key].detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def run_hashes(recipe: str, root: str, out_dir: Path) -> dict[str, str]:
    """Train ``recipe`` briefly into ``out_dir``; the hashes of its last checkpoint and model file."""
    from vitkit.train import train

    result = train(recipe, [*SHORT, f"data.root={root}", f"output.dir={out_dir}"])
    checkpoint = torch.load(result.run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return {"checkpoint": tensors_hash(checkpoint["state_dict"]),
            "model_file": tensors_hash(load_file(result.run_dir / "model.safetensors"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST's IDX files")
    parser.add_argument("--save", type=Path, help="write the hashes to this JSON file")
    parser.add_argument("--expect", type=Path, help="compare with the hashes of this JSON file")
    parser.add_argument("--only", nargs="+", choices=RECIPES, default=RECIPES)
    args = parser.parse_args(argv)
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        hashes = {recipe: run_hashes(recipe, args.root, Path(tmp) / recipe) for recipe in args.only}
    print(json.dumps(hashes, indent=2))
    if args.save is not None:
        args.save.write_text(json.dumps(hashes, indent=2) + "\n")
    if args.expect is None:
        return 0
    expected = json.loads(args.expect.read_text())
    differ = [f"{recipe} {kind}" for recipe in args.only for kind in hashes[recipe]
              if expected.get(recipe, {}).get(kind) != hashes[recipe][kind]]
    print("bit-identical" if not differ else f"DIFFERENT: {', '.join(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
