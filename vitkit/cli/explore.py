"""An attention explorer of a ViT: one self-contained HTML file to click through every layer, head
and patch, offline.

    vitkit explore runs/quickstart/latest/model.safetensors --test-images 2 --out explorer.html
    vitkit explore runs/shapes/model.safetensors images/ --out explorer.html --layers 0,5,11
    vitkit explore --model vit_small_patch16_224 --timm-weights vit_s.safetensors cat.jpg --out cat.html

Model sources are those of vitkit maps: a vitkit model file or training checkpoint,
or a timm ViT state dict. Images are the first N test images of the model's dataset
(--test-images N) and/or image files and folders, converted to the model's channels and size;
at most --max-images of them are kept (test images first). Unreadable files are reported by name
and skipped.

The file embeds each kept layer's attention quantised to 8 bits per weight (one float32 scale
per query row), about 4/3 x sum_l H_l x N^2 bytes per image: 3.7 MB for ViT-S/16 at 224 px
(12 layers x 6 heads x 197^2 tokens). A file over --max-bytes (default 50 MB) is refused before
anything is computed, with an error line that says how many images fit; --layers keeps fewer
blocks (rollout, gradient rollout and Chefer et al. still use them all).

An existing --out file is refused unless --force (a symlink is then replaced, never its target);
the model file and the input images are never replaced. The page is written atomically.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from vitkit.data import DataInfo
from vitkit.errors import UsageError
from vitkit.explain import explorer_html, explorer_size
from vitkit.output_dirs import check_output_file, write_output_file

from .commands import run_command
from .common import SKIPPED_INPUTS
from .explain_io import (
    ConversionNote,
    find_images,
    load_image_files,
    load_model_from_arguments,
    load_test_images,
    model_inputs,
)


def main(argv: list[str] | None = None) -> int:
    """``vitkit explore`` in this process (``tools/explore.py``, tests)."""
    return run_command("explore", run, argv)


def run(args: argparse.Namespace) -> int:
    paths = find_images(args.images)
    out = check_output_file(args.out, "--out", args.force, inputs=[*model_inputs(args), *paths])
    model, extra = load_model_from_arguments(args)
    info = DataInfo.from_extra(extra)
    wanted = args.test_images + len(paths)
    count = min(wanted, args.max_images)
    if not count:
        raise UsageError("no images to explore: give image files, folders or --test-images N.")
    # Refused from the configuration, before any image is read or any attention computed.
    explorer_size(model, count, tuple(info.img_size), args.layers).check(args.max_bytes)
    start = time.perf_counter()
    loaded = load_test_images(model, extra, min(args.test_images, count), args.seed) if args.test_images else []
    note = ConversionNote(info)
    files, failed = load_image_files(paths[: count - len(loaded)], info, note)
    loaded += files
    if (message := note.message()) is not None:
        print(message)
    if wanted > count:
        print(f"note: kept the first {count} of {wanted} images (--max-images {args.max_images}).")
    if not loaded:
        print(f"none of the {len(failed)} file(s) could be read: {', '.join(failed)}", file=sys.stderr)
        return SKIPPED_INPUTS
    # A model without a classifier has no class names of its own: its test images carry their true class in their name.
    headless = model.config.num_classes == 0
    names = [f"{image.name} ({image.class_name})" if headless and image.class_name else image.name for image in loaded]
    page = explorer_html(
        model,
        torch.stack([image.image for image in loaded]),
        info=info,
        names=names,
        labels=None if headless else [image.label for image in loaded],
        layers=args.layers,
        max_bytes=args.max_bytes,
        batch_size=args.batch_size,
        title=f"vitkit attention explorer: {Path(args.checkpoint or args.model).name}",
    )
    write_output_file(out, "--out", lambda tmp: Path(tmp).write_text(page, encoding="utf-8"), args.force)
    seconds = time.perf_counter() - start
    print(f"wrote {out} ({len(page.encode('utf-8')) / 1e6:.2f} MB, {len(loaded)} image(s)) in {seconds:.1f} s.")
    if failed:
        print(f"{len(failed)} file(s) could not be read: {', '.join(failed)}", file=sys.stderr)
    return SKIPPED_INPUTS if failed else 0
