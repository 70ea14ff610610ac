"""Image folders without ``train/``: class folders ``root/<class>/*`` or a flat folder of images,
split by ``val_fraction`` / ``test_fraction``; a flat folder (one class) only for pre-training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.data import DataConfig, ImageFolderError, build_datasets
from vitkit.data.imagefolder import UNLABELLED


def save_images(folder: Path, count: int, start: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(start, start + count):
        pixels = np.full((10, 12, 3), 10 * index % 256, dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{index}.png")


def config(root: Path, **changes: object) -> DataConfig:
    return DataConfig(name="imagefolder", root=str(root), img_size=8, val_fraction=0.2, test_fraction=0.2, **changes)


def test_class_folders_without_train_are_split_class_by_class(tmp_path: Path) -> None:
    save_images(tmp_path / "cat", 10)
    save_images(tmp_path / "dog", 10, start=10)
    bundle = build_datasets(config(tmp_path))
    assert bundle.info.class_names == ("cat", "dog")
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (12, 4, 4)
    for split in (bundle.train, bundle.val, bundle.test):
        assert sorted(set(split.labels.tolist())) == [0, 1]  # stratified: both classes in every split
    every = [path for split in (bundle.train, bundle.val, bundle.test) for path in split.files]
    assert len(set(every)) == 20  # a partition: no image in two splits
    assert build_datasets(config(tmp_path)).train.files == bundle.train.files  # the same split every time


def test_a_flat_folder_is_one_unlabelled_class_for_pretraining(tmp_path: Path) -> None:
    save_images(tmp_path, 6)
    save_images(tmp_path / "more", 4, start=6)  # subfolders of a flat folder are more of its images
    bundle = build_datasets(config(tmp_path, require_classes=False))
    assert bundle.info.class_names == (UNLABELLED,)
    assert len(bundle.train) + len(bundle.val) + len(bundle.test) == 10
    assert bundle.train[0][0].shape == (3, 8, 8)


def test_a_flat_folder_is_refused_for_classification_with_the_pretraining_switch_named(tmp_path: Path) -> None:
    save_images(tmp_path, 6)
    with pytest.raises(ImageFolderError, match="images but no class folders.*data.require_classes=false"):
        build_datasets(config(tmp_path))


def test_too_few_images_for_a_split_are_refused(tmp_path: Path) -> None:
    save_images(tmp_path, 2)
    with pytest.raises(ImageFolderError, match="too few to give the"):
        build_datasets(config(tmp_path, require_classes=False))
