"""The input pipeline alone: in-memory images through the batched and the per-image transforms,
and ImageNet-style folders through vitkit's, timm's and torchvision's loaders."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from ..timing import interleaved_times


def bench_data(repeats: int) -> list[str]:
    """Input pipeline alone: in-memory images per second through the batched transform and through
    the per-image albumentations pipeline (same pad-crop + flip + Normalize), and shapes generation."""
    from torch.utils.data import DataLoader

    from ..data import ArrayDataset, AugmentConfig, build_train_transform, generate_shapes
    from ..data.batch_transforms import build_batch_transform
    from ..data.info import DataInfo

    info = DataInfo(10, tuple("abcdefghij"), (28, 28), 1, (0.5,), (0.25,), "bench")
    augment = AugmentConfig(crop="pad", padding=2, hflip=0.5)
    images = torch.randint(0, 256, (8192, 28, 28, 1), dtype=torch.uint8).numpy()
    labels = torch.randint(0, 10, (8192,)).numpy()
    datasets = {
        "batched (torch)": ArrayDataset(images, labels, build_train_transform(augment, info),
                                        build_batch_transform(augment, info, (28, 28))),
        "per image (albumentations)": ArrayDataset(images, labels, build_train_transform(augment, info)),
    }

    def epoch(dataset: ArrayDataset) -> Callable[[], None]:
        def run() -> None:
            for _ in DataLoader(dataset, batch_size=128, shuffle=True, drop_last=True):
                pass

        return run

    times = interleaved_times({name: epoch(d) for name, d in datasets.items()}, repeats=repeats, warmup=1)
    rows = ["| input pipeline (28x28x1, pad-crop + flip + Normalize, 1 process) | images/s |", "|---|---|"]
    rows += [f"| {name} | {8064 / statistics.median(times[name]):,.0f} |" for name in datasets]
    shapes = interleaved_times({"shapes": lambda: generate_shapes(6000, 32, seed=0)}, repeats=repeats, warmup=0)
    rows.append(f"| generate_shapes, 6000 images of 32x32 | {statistics.median(shapes['shapes']):.2f} s |")
    return rows


#: Images/s a modern GPU trains ViT-S/16 at: the loader must reach it with its workers.
GPU_FEED = 3000


def write_jpeg_folder(root: Path, count: int, size: tuple[int, int] = (500, 375), classes: int = 2) -> Path:
    """``root/train/<class>/*.jpg``: ``count`` photo-like JPEGs of ``size`` (W, H) (smooth colour
    gradients with fine noise, quality 90, as an ImageNet photo is typically stored), and one per
    class in ``root/val/``; returns ``root``."""
    import numpy as np
    from PIL import Image

    generator = np.random.default_rng(0)
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for index in range(count):
        folder = root / "train" / f"class_{index % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        base = generator.uniform(0, 255, 3) + 80 * np.sin(xx[..., None] / generator.uniform(20, 80, 3))
        base += 60 * np.cos(yy[..., None] / generator.uniform(20, 80, 3)) + generator.normal(0, 12, (height, width, 3))
        picture = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
        picture.save(folder / f"{index}.jpg", quality=90)
        if index < classes:
            (root / "val" / folder.name).mkdir(parents=True, exist_ok=True)
            picture.save(root / "val" / folder.name / f"{index}.jpg", quality=90)
    return root


def folder_loaders(root: Path, img_size: int, batch_size: int, workers: int) -> dict[str, Iterable[Any]]:
    """The same folder through vitkit's training loader (``imagefolder``: decode, random-resized
    crop, flip, normalise), timm's ``create_loader`` (its training transform, no prefetcher) and
    torchvision's ``ImageFolder`` with v2 transforms, each with ``workers`` worker processes."""
    import timm.data
    from torch.utils.data import DataLoader
    from torchvision import datasets
    from torchvision.transforms import v2

    from ..data import DataConfig, build_datasets

    train = build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=img_size, num_workers=workers)).train
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    timm_set = timm.data.create_dataset("", root=str(root / "train"))
    tv_transform = v2.Compose([v2.ToImage(), v2.RandomResizedCrop(img_size, antialias=True), v2.RandomHorizontalFlip(),
                               v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    common = dict(batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0, drop_last=True)
    return {
        "vitkit (imagefolder recipe)": DataLoader(train, shuffle=True, **common),
        "timm create_loader": timm.data.create_loader(
            timm_set, input_size=(3, img_size, img_size), batch_size=batch_size, is_training=True, num_workers=workers,
            use_prefetcher=False, mean=mean, std=std, persistent_workers=workers > 0),
        "torchvision ImageFolder + v2": DataLoader(datasets.ImageFolder(str(root / "train"), tv_transform), shuffle=True,
                                                   **common),
    }


def bench_folder_loaders(repeats: int, count: int = 192, img_size: int = 224, workers: tuple[int, ...] = (1, 2),
                         batch_size: int = 32) -> list[str]:
    """Images/s per worker of the ImageNet-style folder loaders (:func:`folder_loaders`) on
    ``count`` 500x375 JPEGs written here, for each worker count, epochs interleaved; and the
    workers each would need to feed :data:`GPU_FEED` images/s."""
    import tempfile

    rows = [f"| folder loader ({count} JPEGs of 500x375 -> {img_size} px, random-resized crop + flip + normalise) "
            "| workers | images/s | images/s per worker | vs timm |", "|---|---|---|---|---|"]
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="vitkit-bench-") as folder:
        root = write_jpeg_folder(Path(folder), count)
        for count_workers in workers:
            loaders = folder_loaders(root, img_size, batch_size, count_workers)
            images = {name: sum(len(batch[0]) for batch in loader) for name, loader in loaders.items()}  # warm-up epoch

            def epoch(loader: Iterable[Any]) -> Callable[[], None]:
                return lambda: [None for _ in loader]

            times = interleaved_times({name: epoch(loader) for name, loader in loaders.items()}, repeats=repeats, warmup=0)
            timm_rate = images["timm create_loader"] / statistics.median(times["timm create_loader"])
            for name in loaders:
                rate = images[name] / statistics.median(times[name])
                per_worker = rate / max(count_workers, 1)  # 0 workers: the main process loads
                best[name] = max(best.get(name, 0.0), per_worker)
                rows.append(f"| {name} | {count_workers} | {rate:,.0f} | {per_worker:,.0f} | {rate / timm_rate:.2f} |")
    rows += ["", f"Workers to feed {GPU_FEED:,} images/s (at the best rate per worker above): "
             + ", ".join(f"{name} {math.ceil(GPU_FEED / rate)}" for name, rate in best.items())]
    return rows
