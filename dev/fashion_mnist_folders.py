"""Fashion-MNIST written out as a user's folders of PNGs, for the own-images journey (docs/pretrain.md):

    python dev/fashion_mnist_folders.py OUT [--unlabelled 20000] [--labelled-per-class 10] [--test-per-class 300] [--seed 0]

OUT/unlabelled/ is one flat folder of training images, OUT/labelled/<class>/ holds a few other training images of each class, and OUT/test/<class>/
images of the official test set. The labelled images are drawn by --seed from training images the
unlabelled folder does not hold, so nothing is seen twice. A developer tool, not part of the package.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from vitkit.data.mnist import load_mnist


def write(images: np.ndarray, folder: Path, names: list[str] | None = None) -> None:
    """``images`` ``[N, 28, 28, 1]`` as ``folder/<name or index>.png``, 8-bit gray."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, image in enumerate(images):
        Image.fromarray(image[..., 0]).save(folder / f"{names[index] if names else index:0>5}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--unlabelled", type=int, default=20_000)
    parser.add_argument("--labelled-per-class", type=int, default=10)
    parser.add_argument("--test-per-class", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    images, labels, test_images, test_labels, classes = load_mnist("fashion_mnist", args.root, download=False)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(images))
    unlabelled, rest = order[: args.unlabelled], order[args.unlabelled:]
    write(images[unlabelled], args.out / "unlabelled", [f"img{i:05d}" for i in unlabelled])
    for label, name in enumerate(classes):
        folder = name.replace("/", "-")
        write(images[rest[labels[rest] == label][: args.labelled_per_class]], args.out / "labelled" / folder)
        test = rng.permutation(np.flatnonzero(test_labels == label))[: args.test_per_class]
        write(test_images[test], args.out / "test" / folder)
    print(f"wrote {args.out}/unlabelled ({len(unlabelled):,}), {args.out}/labelled ({args.labelled_per_class} a class), "
          f"{args.out}/test ({args.test_per_class} a class)")


if __name__ == "__main__":
    main()
