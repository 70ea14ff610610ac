"""Classify images with a trained model: the top classes and their probabilities, per image.

    vitkit predict runs/quickstart/latest/model.safetensors digit.png
    vitkit predict runs/shapes/model.safetensors images/ --top-k 3 --csv predictions.csv
    vitkit predict --model vit_small_patch16_224.augreg_in21k_ft_in1k --timm-weights vit_s.safetensors cat.jpg
    vitkit predict quickstart.onnx digit.png      # an exported model (vitkit export), run by onnxruntime

Images are preprocessed as the model file records (size, channels, crop, mean/std), or for timm
weights as timm's pretrained_cfg of --model says (as vitkit maps does); an .onnx file from vitkit
export runs on onnxruntime with the preprocessing its metadata records, and gives the same output. Folders are
read recursively (image suffixes only), in batches. Each line (and CSV row) gives the file, then
the top-k classes, most probable first, with their probabilities (with --csv, only the file has
them). Symlinked folders are followed, as training follows them. An unreadable file gets one
error line naming it, and the rest are classified; the exit status then says that files were
skipped (2 when none could be read). A model without a classifier (num_classes=0, e.g. timm's
DINOv2) is refused: it gives features, not classes.

An existing --csv file is refused before any image is read unless --force (a symlink is then
replaced, never its target); the model file and the images are never replaced. The CSV is
written atomically, and a cell beginning with = + - or @ gets a leading ' so that spreadsheets
show it as text rather than run it as a formula.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from vitkit.class_folders import class_scores, folder_labels
from vitkit.data import ImageReadError, load_image
from vitkit.errors import UsageError
from vitkit.inference import predict, prediction_settings
from vitkit.output_dirs import check_output_file, write_output_file

from .commands import run_command
from .common import SKIPPED_INPUTS, USAGE_ERROR
from .explain_io import ConversionNote, find_images, load_model_from_arguments, model_inputs


def main(argv: list[str] | None = None) -> int:
    """``vitkit predict`` in this process (``tools/predict.py``, tests)."""
    return run_command("predict", run, argv)


def run(args: argparse.Namespace) -> int:
    if args.model is None and args.timm_weights is None:  # the first input names the model file
        args.checkpoint, *images = args.inputs
        if not images:
            raise UsageError(
                f"no images given after the model file {args.checkpoint}: vitkit predict MODEL_FILE IMAGE_OR_FOLDER..."
            )
    else:
        args.checkpoint, images = None, args.inputs
    paths = find_images(images)
    folders = [Path(item) for item in images if Path(item).is_dir()]  # class folders in them may label the images
    if not paths:
        raise UsageError(f"no image files in {', '.join(images)} (suffixes .png, .jpg, .jpeg, .bmp, ...).")
    if args.csv:
        check_output_file(args.csv, "--csv", args.force, inputs=[*model_inputs(args), *paths])
    if args.checkpoint is not None and Path(args.checkpoint).suffix == ".onnx":  # run by onnxruntime
        from vitkit.export import OnnxClassifier

        refuse_onnx_options(args)
        model = OnnxClassifier(args.checkpoint)
        extra = model.extra
    else:
        model, extra = load_model_from_arguments(args)
    info, tta = prediction_settings(model, extra, args.checkpoint or args.model, args.tta)
    note = ConversionNote(info)
    rows: list[list[str]] = []
    failed: list[str] = []
    scored: list[Path] = []
    top1: list[int] = []
    seconds = 0.0
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
        start = time.perf_counter()
        predictions = predict(model, images, args.top_k, info=info, batch_size=args.batch_size, tta=tta,
                              precision=args.precision)
        seconds += time.perf_counter() - start
        for path, prediction in zip(read, predictions):
            scored.append(path)
            top1.append(prediction.indices[0])
            ranked = list(zip(prediction.classes, prediction.probabilities))
            if not args.csv:  # with --csv the file holds them, and one line per image would bury the rest
                tqdm.write(f"{path}: " + ", ".join(f"{name} ({p:.1%})" for name, p in ranked))
            rows.append([as_text(str(path)), *(value for name, p in ranked for value in (as_text(name), f"{p:.6f}"))])
    if (message := note.message()) is not None:
        print(message)
    if args.csv and rows:
        k = min(args.top_k, info.num_classes)
        header = ["path", *(f"{key}_{rank}" for rank in range(1, k + 1) for key in ("class", "probability"))]

        def write(tmp: str) -> None:
            with open(tmp, "w", newline="") as handle:
                csv.writer(handle).writerows([header, *rows])

        write_output_file(args.csv, "--csv", write, args.force)
        print(f"wrote {len(rows)} prediction(s) to {args.csv}")
    if scored:
        print_scores(scored, top1, folders, info.class_names)
        print(f"{len(scored)} image(s) in {seconds:.2f} s: {len(scored) / max(seconds, 1e-9):,.0f} images/s "
              "(preprocessing and model)")
    if failed:
        print(f"{len(failed)} file(s) could not be read: {', '.join(failed)}", file=sys.stderr)
    if failed and not rows:
        return USAGE_ERROR
    return SKIPPED_INPUTS if failed else 0


def refuse_onnx_options(args: argparse.Namespace) -> None:
    """Refuse, rather than ignore, the options an ``.onnx`` model cannot take: its graph fixes the
    token merging, its metadata the preprocessing, and onnxruntime runs it as exported.

    Raises:
        UsageError: naming the options given.
    """
    given = [f"--{key.replace('_', '-')}" for key in ("merge_tokens", "mean", "std", "crop_pct") if getattr(args, key) is not None]
    given += [f"--precision {args.precision}"] * (args.precision != "fp32")
    if given:
        raise UsageError(
            f"{', '.join(given)}: {args.checkpoint} is an .onnx file, which runs as exported (its graph fixes the token "
            "merging, its metadata the preprocessing, onnxruntime the precision); give the vitkit model file it was "
            "exported from, or export it again (vitkit export --merge-tokens R)."
        )


def print_scores(paths: list[Path], top1: list[int], folders: list[Path], class_names: tuple[str, ...]) -> None:
    """The accuracy of the ``top1`` predictions of ``paths`` when the class folders of ``folders``
    label them all (:func:`~vitkit.class_folders.folder_labels`), with each class's counts."""
    labels = folder_labels(paths, folders, class_names)
    if labels is None:
        return
    scores = class_scores(torch.tensor(labels), torch.tensor(top1), class_names)
    print(f"accuracy (the class folders as labels): top-1 {scores['top1']:.2f}% of {len(paths)} images")
    print("per class: " + "  ".join(f"{name}: {right}/{total}" for name, (right, total) in scores["per_class_counts"].items()))


def as_text(cell: str) -> str:
    """``cell`` as a spreadsheet shows it as text: a leading = + - or @ would make it a formula."""
    return f"'{cell}" if cell[:1] in ("=", "+", "-", "@") else cell
