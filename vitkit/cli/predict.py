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

from vitkit.errors import cli_errors, positive_int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="vitkit predict",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="model file: .safetensors (training, save_model) or a training .ckpt")
    parser.add_argument("images", nargs="+", metavar="IMAGE_OR_FOLDER", help="image files and/or folders")
    parser.add_argument("--top-k", type=positive_int, default=5, help="classes per image (default: %(default)s)")
    parser.add_argument("--csv", metavar="FILE", help="also write the predictions to this CSV file")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="images per batch (default: %(default)s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 1 when a file could not be read or none was found; 2 with one ``error: ...``
    line for a bad argument or model file."""
    return cli_errors(_main, argv)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    from tqdm import tqdm

    from vitkit.data import ImageReadError, load_image
    from vitkit.explain.cli import ConversionNote, find_images
    from vitkit.inference import load_predictor, predict

    model, info = load_predictor(args.model)
    paths = find_images(args.images)
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
        for path, prediction in zip(read, predict(model, images, args.top_k, info=info, batch_size=args.batch_size)):
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
    elif not rows:
        print("no image files found in the given paths.", file=sys.stderr)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
