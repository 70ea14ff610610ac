"""Carve an N-class x M-image subset of an ImageNet-style folder (train, val and test when present).

    python tools/make_subset.py /data/imagenet /data/imagenet-10x100 --classes 10 --images 100 --seed 0

Files are symlinked (default) or copied (``--copy``); the same seed gives the same subset.
"""

from __future__ import annotations

import argparse
import sys

from vitkit.data.subset import make_subset
from vitkit.errors import UsageError, cli_errors, positive_int


def main(argv: list[str] | None = None) -> int:
    """Exit status 0, or 2 with one ``error: ...`` line for a bad argument, source or destination."""
    return cli_errors(_main, argv)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="ImageNet-style folder: SRC/train/<class>/*, SRC/val/<class>/*")
    parser.add_argument("dst", help="new or empty output folder, outside SRC (and SRC not inside it)")
    parser.add_argument("--classes", type=positive_int, required=True, help="number of classes to keep")
    parser.add_argument("--images", type=positive_int, required=True, help="training images per class")
    parser.add_argument("--val-images", type=positive_int, default=None,
                        help="val/test images per class (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random draw (default 0)")
    parser.add_argument("--copy", action="store_true", help="copy files instead of symlinking them")
    args = parser.parse_args(argv)
    try:
        summary = make_subset(args.src, args.dst, args.classes, args.images, args.seed, args.copy, args.val_images)
    except ValueError as error:  # make_subset raises ValueError for the user's choices of folders and counts
        raise UsageError(str(error)) from None
    counts = ", ".join(f"{split} {count}" for split, count in summary.counts.items())
    print(f"wrote {args.dst}: {len(summary.classes)} classes ({', '.join(summary.classes)}); images: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
