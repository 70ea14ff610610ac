"""Classify images with a trained model: the top classes and their probabilities, per image.

    vitkit predict runs/quickstart/latest/model.safetensors digit.png
    vitkit predict runs/shapes/model.safetensors images/ --top-k 3 --csv predictions.csv

Images are preprocessed as the model file records (size, channels, crop, mean/std). Folders are
read recursively (image suffixes only), in batches. Each line (and CSV row) gives the file, then
the top-k classes, most probable first, with their probabilities. An unreadable file gets one
error line naming it, and the rest are classified; the exit status then says that files were
skipped.
"""

from __future__ import annotations

import argparse
import csv
import sys

from tqdm import tqdm

from vitkit.data import ImageReadError, load_image
from vitkit.errors import UsageError
from vitkit.inference import load_predictor, predict

from .common import SKIPPED_INPUTS
from .explain_io import ConversionNote, find_images
from .main import run_command


def main(argv: list[str] | None = None) -> int:
    """``vitkit predict`` in this process (``tools/predict.py``, tests)."""
    return run_command("predict", argv)


def run(args: argparse.Namespace) -> int:
    model, info, tta = load_predictor(args.model, args.tta)
    paths = find_images(args.images)
    if not paths:
        raise UsageError(f"no image files in {', '.join(args.images)} (suffixes .png, .jpg, .jpeg, .bmp, ...).")
    note = ConversionNote(info)
    rows: list[list[str]] = []
    failed: list[str] = []
    batches = range(0, len(paths), args.batch_size)
    for first in tqdm(batches, desc="predicting", unit="batch", disable=None if len(batches) > 1 else True):
        read, images = [], []
        for path in paths[first : first + args.batch_size]:
            try:
                image = load_image(path)
            except ImageReadError as error:
                tqdm.write(f"error: {error}; skipped.", file=sys.stderr)
                failed.append(str(path))
                continue
            note.add(path, image)
            read.append(path)
            images.append(image)
        for path, prediction in zip(read, predict(model, images, args.top_k, info=info, batch_size=args.batch_size, tta=tta)):
            ranked = list(zip(prediction.classes, prediction.probabilities))
            tqdm.write(f"{path}: " + ", ".join(f"{name} ({p:.1%})" for name, p in ranked))
            rows.append([str(path), *(value for name, p in ranked for value in (name, f"{p:.6f}"))])
    if (message := note.message()) is not None:
        print(message)
    if args.csv and rows:
        k = min(args.top_k, info.num_classes)
        with open(args.csv, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["path", *(f"{key}_{rank}" for rank in range(1, k + 1) for key in ("class", "probability"))])
            writer.writerows(rows)
        print(f"wrote {len(rows)} prediction(s) to {args.csv}")
    if failed:
        print(f"{len(failed)} file(s) could not be read: {', '.join(failed)}", file=sys.stderr)
    return SKIPPED_INPUTS if failed else 0
