"""Evaluate a trained model: top-1, top-5 and per-class accuracy, and a confusion matrix.

    python tools/evaluate.py runs/quickstart/<timestamp>/model.safetensors
    python tools/evaluate.py runs/vit_small/<timestamp>/checkpoints/best.ckpt --data root=/data/cifar --out eval/

Prints the accuracies; with --out (default: beside the model) writes eval.json and confusion_matrix.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vitkit.errors import cli_errors
from vitkit.output_dirs import claim_output_dir
from vitkit.train import evaluate


def main(argv: list[str] | None = None) -> int:
    """Exit status 0, or 1 with one ``error: ...`` line for a bad model file, data option or output folder."""
    return cli_errors(_main, argv, status=1)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="model.safetensors or a training .ckpt")
    parser.add_argument("--data", nargs="*", default=[], metavar="KEY=VALUE",
                        help="changes to the saved data options, e.g. root=/data/cifar num_workers=0")
    parser.add_argument("--split", choices=("test", "val"), default="test")
    parser.add_argument("--out", help="output folder (default: eval/ beside the model)")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else Path(args.model).resolve().parent / "eval"
    claim_output_dir(out, "evaluate")
    report = evaluate(args.model, args.data, out_dir=out, split=args.split)
    per_class = "  ".join(f"{name}: {acc:.1f}" for name, acc in report["per_class"].items())
    print(f"{report['dataset']} {report['split']} ({report['num_images']} images): "
          f"top-1 {report['top1']:.2f}%  top-5 {report['top5']:.2f}%")
    print(f"per class: {per_class}")
    print(json.dumps({key: report[key] for key in ("top1", "top5", "num_images")}))
    print(f"wrote {out / 'eval.json'} and {out / 'confusion_matrix.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
