"""Carve an N-class x M-image subset of an ImageNet-style folder (train, val and test when present).

    vitkit make-subset /data/imagenet /data/imagenet-10x100 --classes 10 --images 100 --seed 0

Files are symlinked (default) or copied (``--copy``); the same seed gives the same subset.
"""

from __future__ import annotations

import argparse

from vitkit.data.subset import make_subset
from vitkit.errors import UsageError

from .commands import run_command


def main(argv: list[str] | None = None) -> int:
    """``vitkit make-subset`` in this process (``tools/make_subset.py``, tests)."""
    return run_command("make-subset", run, argv)


def run(args: argparse.Namespace) -> int:
    try:
        summary = make_subset(args.src, args.dst, args.classes, args.images, args.seed, args.copy, args.val_images)
    except ValueError as error:  # make_subset raises ValueError for the user's choices of folders and counts
        raise UsageError(str(error)) from None
    counts = ", ".join(f"{split} {count}" for split, count in summary.counts.items())
    print(f"wrote {args.dst}: {len(summary.classes)} classes ({', '.join(summary.classes)}); images: {counts}")
    return 0
