"""Evaluate a trained model: top-1, top-5 and per-class accuracy, a confusion matrix, and images/s.

    vitkit evaluate runs/quickstart/<timestamp>/model.safetensors
    vitkit evaluate runs/shapes/<timestamp>/model.safetensors my_test_images/      # every image of FOLDER/<class>/*
    vitkit evaluate quickstart.onnx my_test_images/                               # an exported model, on onnxruntime
    vitkit evaluate runs/vit_small/<timestamp>/checkpoints/best.ckpt --data root=/data/cifar --out eval/
    vitkit evaluate runs/fashion_mnist_fast/<timestamp>/model.safetensors --tta none   # one view per image

Without FOLDER, the test (or --split val) split of the data the model was trained on, as saved
with it (--data changes those options). With FOLDER, every image of FOLDER/<class>/* (no split),
read with the model's own preprocessing (size, channels, crop, mean/std in the model file); the
folders must be named after the model's classes: a folder the model has no class for is refused,
a folder with only some of them is scored on those. Prints the accuracies, the confusion matrix
(rows: true class) and the model's images/s (its forward passes alone, so token merging's and
bf16's speed-up shows); with --out (default: eval/ beside the model) writes eval.json,
confusion_matrix.png and confusion_matrix.csv.
"""

from __future__ import annotations

import argparse
import errno
import json
from collections.abc import Sequence
from pathlib import Path

from vitkit.files import path_kind
from vitkit.output_dirs import check_output_dir, claim_output_dir
from vitkit.train import evaluate, write_evaluation

from .commands import run_command

#: Classes up to which the confusion matrix is printed whole; beyond, its largest confusions.
PRINTED_CLASSES = 12


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
                      precision=args.precision, folder=args.folder)
    write_evaluation(report, claim_output_dir(out, "evaluate"))
    views = "" if report["tta"] == "none" else f", {report['tta']} views averaged"
    views += f", {report['merge_tokens']} tokens merged per block" if report["merge_tokens"] else ""
    top5 = "" if report["top5"] is None else f"  top-5 {report['top5']:.2f}%"
    print(f"{report['dataset']} {report['split']} ({report['num_images']} images{views}): "
          f"top-1 {report['top1']:.2f}%{top5}  ({report['images_per_second']:,.0f} images/s)")
    if report["missing_classes"]:
        shown = len(report["class_names"]) - len(report["missing_classes"])
        print(f"note: the folder has {shown} of the model's {len(report['class_names'])} classes (none of "
              f"{', '.join(report['missing_classes'])}); per class covers those {shown}.")
    print("per class: " + "  ".join(f"{name}: {acc:.1f} ({report['per_class_counts'][name][0]}/"
                                    f"{report['per_class_counts'][name][1]})" for name, acc in report["per_class"].items()))
    print("\n".join(confusion_lines(report["confusion_matrix"], report["class_names"])))
    print(json.dumps({key: report[key] for key in ("top1", "top5", "num_images", "images_per_second", "tta",
                                                   "merge_tokens")}))
    print(f"wrote {out / 'eval.json'}, {out / 'confusion_matrix.png'} and {out / 'confusion_matrix.csv'}")
    source = args.folder or "IMAGES_OR_FOLDER"
    print(f"next: each image's classes: vitkit predict {args.model} {source} --csv predictions.csv")
    return 0


def confusion_lines(matrix: Sequence[Sequence[int]], names: Sequence[str]) -> list[str]:
    """The confusion matrix (rows: true class, columns: predicted) as aligned text, or, with more
    than :data:`PRINTED_CLASSES` classes, its five largest off-diagonal counts."""
    if len(names) > PRINTED_CLASSES:
        confused = sorted(((count, names[i], names[j]) for i, row in enumerate(matrix) for j, count in enumerate(row)
                           if i != j and count), reverse=True)[:5]
        return ["most confused (true -> predicted): " + (", ".join(f"{a} -> {b} {n}" for n, a, b in confused) or "none")]
    width = max(len(str(value)) for row in matrix for value in row)
    labels = [name[:8] for name in names]
    cell = max(width, *map(len, labels))
    first = max(map(len, labels))
    lines = ["confusion matrix (rows: true class, columns: predicted):",
             " " * first + " " + " ".join(f"{label:>{cell}}" for label in labels)]
    lines += [f"{label:>{first}} " + " ".join(f"{value:>{cell}}" for value in row) for label, row in zip(labels, matrix)]
    return lines
