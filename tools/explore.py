"""An attention explorer of a ViT: one self-contained HTML file to click through every layer, head
and patch, offline.

    python tools/explore.py --checkpoint runs/quickstart/latest/model.safetensors --test-images 2 --out explorer.html
    python tools/explore.py --checkpoint runs/shapes/model.safetensors images/ --out explorer.html --layers 0,5,11
    python tools/explore.py --model vit_small_patch16_224 --timm-weights vit_s.safetensors cat.jpg --out cat.html

Model sources are those of tools/attention_maps.py: a vitkit model file or training checkpoint,
or a timm ViT state dict. Images are the first N test images of the model's dataset
(--test-images N) and/or image files and folders, converted to the model's channels and size;
at most --max-images of them are kept (test images first). Unreadable files are reported by name
and skipped (exit 1).

The file embeds each kept layer's attention quantised to 8 bits per weight (one float32 scale
per query row), about 4/3 x sum_l H_l x N^2 bytes per image: 3.7 MB for ViT-S/16 at 224 px
(12 layers x 6 heads x 197^2 tokens). A file over --max-bytes (default 50 MB) is refused before
anything is computed, with an error line that says how many images fit; --layers keeps fewer
blocks (rollout, gradient rollout and Chefer et al. still use them all).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from vitkit.data import DataInfo
from vitkit.errors import UsageError, cli_errors, positive_int
from vitkit.explain import DEFAULT_MAX_BYTES, explorer_html, explorer_size
from vitkit.explain.cli import (
    ConversionNote,
    add_model_arguments,
    find_images,
    load_explained_model,
    load_image_files,
    load_test_images,
    output_clashes,
)


def layer_list(text: str) -> list[int]:
    """``argparse`` type of ``--layers``: comma-separated block indices (``0,5,-1``)."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated block indices such as 0,5,11, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("images", nargs="*", help="image files and/or folders")
    parser.add_argument(
        "--test-images", type=int, default=0, metavar="N",
        help="also explore the first N test images of the dataset the checkpoint was trained on",
    )
    parser.add_argument("--out", required=True, help="the HTML file to write")
    parser.add_argument("--layers", type=layer_list, default=None, help="blocks to embed, e.g. 0,5,11 (default: all)")
    parser.add_argument("--max-images", type=positive_int, default=8, help="images kept, test images first (default: 8)")
    parser.add_argument(
        "--max-bytes", type=positive_int, default=DEFAULT_MAX_BYTES,
        help=f"refuse a file larger than this (default: {DEFAULT_MAX_BYTES:,})",
    )
    parser.add_argument("--batch-size", type=positive_int, default=8)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 1 when an image could not be read or none was found; 2 with one ``error: ...``
    line for a bad argument, model file, output path or a file over --max-bytes."""
    return cli_errors(_main, argv)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; give the HTML file to write, e.g. {out / 'explorer.html'}.")
    model, extra = load_explained_model(args.checkpoint, args.model, args.timm_weights)
    info = DataInfo.from_extra(extra)
    paths = find_images(args.images)
    clashes = output_clashes(out, (), paths, [out])
    if clashes:
        raise UsageError(f"{'; '.join(clashes)}.")
    if args.test_images < 0:
        raise UsageError(f"--test-images must be 0 or more, got {args.test_images}.")
    wanted = args.test_images + len(paths)
    count = min(wanted, args.max_images)
    if not count:
        print("no images to explore (give files, folders or --test-images N).", file=sys.stderr)
        return 1
    # Refused from the configuration, before any image is read or any attention computed.
    explorer_size(model, count, tuple(info.img_size), args.layers).check(args.max_bytes)
    start = time.perf_counter()
    loaded = load_test_images(model, extra, min(args.test_images, count)) if args.test_images else []
    note = ConversionNote(info)
    files, failed = load_image_files(paths[: count - len(loaded)], info, note)
    loaded += files
    if (message := note.message()) is not None:
        print(message)
    if wanted > count:
        print(f"note: kept the first {count} of {wanted} images (--max-images {args.max_images}).")
    if not loaded:
        print(f"none of the {len(failed)} file(s) could be read: {', '.join(failed)}", file=sys.stderr)
        return 1
    page = explorer_html(
        model,
        torch.stack([image.image for image in loaded]),
        info=info,
        names=[image.name for image in loaded],
        labels=[image.label for image in loaded],
        layers=args.layers,
        max_bytes=args.max_bytes,
        batch_size=args.batch_size,
        title=f"vitkit attention explorer: {Path(args.checkpoint or args.model).name}",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    seconds = time.perf_counter() - start
    print(f"wrote {out} ({len(page.encode('utf-8')) / 1e6:.2f} MB, {len(loaded)} image(s)) in {seconds:.1f} s.")
    if failed:
        print(f"{len(failed)} file(s) could not be read: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
