"""Evaluate a trained model: top-1, top-5 and per-class accuracy, and a confusion matrix.

    vitkit evaluate runs/quickstart/<timestamp>/model.safetensors
    vitkit evaluate runs/vit_small/<timestamp>/checkpoints/best.ckpt --data root=/data/cifar --out eval/
    vitkit evaluate runs/fashion_mnist_fast/<timestamp>/model.safetensors --tta none   # one view per image

Prints the accuracies; with --out (default: beside the model) writes eval.json and confusion_matrix.png.
"""

from __future__ import annotations

import argparse
import errno
import json
from pathlib import Path

from vitkit.files import path_kind
from vitkit.output_dirs import check_output_dir, claim_output_dir
from vitkit.train import evaluate, write_evaluation

from .commands import run_command


def main(argv: list[str] | None = None) -> int:
    """``vitkit evaluate`` in this process (``tools/evaluate.py``, tests)."""
    return run_command("evaluate", run, argv)


def run(args: argparse.Namespace) -> int:
    if not Path(args.model).is_file():  # before the output folder beside it is claimed
        raise FileNotFoundError(errno.ENOENT, f"the model file {path_kind(args.model)}; expected a .safetensors or .ckpt file",
                                args.model)
    out = Path(args.out) if args.out else Path(args.model).resolve().parent / "eval"
    check_output_dir(out, "evaluate")  # claimed once there are results: a refused model leaves no folder
    report = evaluate(args.model, args.data, split=args.split, tta=args.tta, merge_tokens=args.merge_tokens,
                      precision=args.precision)
    write_evaluation(report, claim_output_dir(out, "evaluate"))
    per_class = "  ".join(f"{name}: {acc:.1f}" for name, acc in report["per_class"].items())
    views = "" if report["tta"] == "none" else f", {report['tta']} views averaged"
    views += f", {report['merge_tokens']} tokens merged per block" if report["merge_tokens"] else ""
    print(f"{report['dataset']} {report['split']} ({report['num_images']} images{views}): "
          f"top-1 {report['top1']:.2f}%  top-5 {report['top5']:.2f}%")
    print(f"per class: {per_class}")
    print(json.dumps({key: report[key] for key in ("top1", "top5", "num_images", "tta", "merge_tokens")}))
    print(f"wrote {out / 'eval.json'} and {out / 'confusion_matrix.png'}")
    return 0

