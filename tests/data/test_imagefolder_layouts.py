"""Image folders without ``train/``: class folders ``root/<class>/*`` or a flat folder of images,
split by ``val_fraction`` / ``test_fraction``; a flat folder (one class) only for pre-training."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import DataConfig, ImageFolderError, build_datasets
from vitkit.data.imagefolder import UNLABELLED


def save_images(folder: Path, count: int, start: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(start, start + count):
        pixels = np.full((10, 12, 3), 10 * index % 256, dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{index}.png")


def config(root: Path, **changes: object) -> DataConfig:
    """A split of every folder (``no_split_below=0``) unless ``changes`` say otherwise."""
    return DataConfig(name="imagefolder", root=str(root), val_fraction=0.2, test_fraction=0.2,
                      **{"img_size": 8, "no_split_below": 0, **changes})


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


def test_class_folders_too_small_to_split_train_on_every_image_with_a_note(tmp_path: Path, caplog) -> None:
    save_images(tmp_path / "cat", 10)
    save_images(tmp_path / "dog", 12, start=10)
    # 0.6 of 10 images = 6 training images of the smaller class, under 7: nothing is held out
    bundle = build_datasets(config(tmp_path, no_split_below=7))
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (22, 22, 22)
    assert bundle.train.files == bundle.val.files == bundle.test.files and not bundle.held_out
    assert "holds 10 to 12 images per class, too few to hold some out" in caplog.text
    assert "data.no_split_below" in caplog.text and "vitkit evaluate MODEL TEST_FOLDER" in caplog.text
    caplog.clear()
    split = build_datasets(config(tmp_path, no_split_below=6))  # 6 is enough: split, counts said
    assert len(split.train) + len(split.val) + len(split.test) == 22 and split.held_out
    assert "split per class into 14 training, 4 validation and 4 test images" in caplog.text  # 6+8, 2+2, 2+2


def test_one_stray_image_beside_class_folders_is_noted(tmp_path: Path, caplog) -> None:
    save_images(tmp_path / "cat", 5)
    save_images(tmp_path / "dog", 5, start=5)
    save_images(tmp_path, 1, start=10)  # 10.png at the top
    bundle = build_datasets(config(tmp_path, require_classes=False))
    assert bundle.info.class_names == (UNLABELLED,)
    assert "1 image(s) at its top (e.g. 10.png) beside the folder(s) 'cat', 'dog'" in caplog.text
    assert "move the top-level image(s) into a class folder" in caplog.text


def test_a_flat_gray_folder_settles_its_channels_and_size_from_the_images(tmp_path: Path) -> None:
    from vitkit.data import settle_unset

    tmp_path.joinpath("deeper").mkdir()
    for index, side in enumerate((20, 20, 24, 28, 28, 28, 28, 40, 40, 50)):  # median shorter side 28
        folder = tmp_path / "deeper" if index % 2 else tmp_path
        Image.fromarray(np.zeros((side, side + 3), dtype=np.uint8)).save(folder / f"{index}.png")
    flat = DataConfig(name="imagefolder", root=str(tmp_path), require_classes=False, val_fraction=0.2)
    settled, notes = settle_unset(flat)  # no class folders, no in_chans: read, not refused
    assert settled.in_chans == 1 and settled.img_size == 28
    assert any("grayscale" in note for note in notes) and any("about 28 px" in note for note in notes)
    kept, _ = settle_unset(dataclasses.replace(flat, img_size=16, in_chans=3))
    assert (kept.img_size, kept.in_chans) == (16, 3)  # the recipe's own values win
    given, notes = settle_unset(flat, given={"img_size": 32, "in_chans": 1}, source="enc.safetensors")
    assert given.img_size == 32 and "data.img_size=32 and data.in_chans=1 as enc.safetensors was trained" in notes[0]


def test_a_folder_held_in_memory_gives_the_files_pixels_and_splits(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        for index in range(10):
            Image.fromarray(rng.integers(0, 255, (10, 12, 3), dtype=np.uint8)).save(tmp_path / name / f"{index}.png")
    whole = {"augment": {"crop": "pad", "padding": 1}}
    files = build_datasets(config(tmp_path, **whole))
    memory = build_datasets(config(tmp_path, in_memory=True, **whole))
    assert (len(memory.train), len(memory.val), len(memory.test)) == (len(files.train), len(files.val), len(files.test))
    for split in ("val", "test"):  # evaluation: the same normalised pixels, image by image, as from the files
        ours, theirs = getattr(memory, split), getattr(files, split)
        assert [int(label) for label in ours.labels] == [int(label) for label in theirs.labels]
        for index in range(len(theirs)):
            image, label = ours[index]
            expected, expected_label = theirs[index]
            assert label == expected_label and image.shape == expected.shape == (3, 8, 8)
            torch.testing.assert_close(image, expected, atol=1e-6, rtol=0)


def test_in_memory_needs_whole_image_training(tmp_path: Path) -> None:
    from vitkit.schema import RecipeError
    from vitkit.train import load_recipe

    with pytest.raises(RecipeError, match="in_memory.*augment.crop pad or resize"):
        load_recipe({"data": {"name": "imagefolder", "root": str(tmp_path), "in_memory": True,
                              "augment": {"crop": "random_resized"}}})


def test_dino_crops_of_a_folder_held_in_memory_equal_those_of_its_files(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from vitkit.data.multicrop import MultiCrop, multi_crop_dataset

    rng = np.random.default_rng(1)
    for index in range(6):  # stored at the image size: the memory path holds the file's own pixels
        Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8)).save(tmp_path / f"{index}.png")
    dino = {"img_size": 16, "in_chans": 1, "require_classes": False, "crop_pct": 1.0, "augment": {"enabled": False}}
    crops = MultiCrop((0.5,), (0.25,), global_size=16, local_size=8, local_crops=2)
    views = {}
    for in_memory in (False, True):
        bundle = build_datasets(config(tmp_path, in_memory=in_memory, **dino))
        assert (type(bundle.train).__name__ == "ArrayDataset") is in_memory
        torch.manual_seed(0)  # one image a batch: both paths draw the same numbers in the same order
        views[in_memory] = list(DataLoader(multi_crop_dataset(bundle.train, crops), batch_size=1))
    assert len(views[True]) == len(views[False]) == 4  # one image each held out for val and test
    for (memory, _), (files, _) in zip(views[True], views[False]):
        assert [view.shape for view in memory] == [(1, 1, 16, 16)] * 2 + [(1, 1, 8, 8)] * 2
        for ours, theirs in zip(memory, files):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_a_folder_held_in_memory_decodes_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitkit.data import images

    save_images(tmp_path / "cat", 5)
    save_images(tmp_path / "dog", 5, start=5)
    opened: list[str] = []
    original = images._open
    monkeypatch.setattr(images, "_open", lambda path: opened.append(Path(path).name) or original(path))
    bundle = build_datasets(config(tmp_path, in_memory=True, verify_images=True, augment={"crop": "pad"}))
    assert sorted(opened) == sorted(f"{index}.png" for index in range(10))  # the check's decode is the one kept
    for split in (bundle.train, bundle.val, bundle.test):
        [split[index] for index in range(len(split))]
    assert len(opened) == 10  # nothing read again


def test_in_memory_needs_an_eval_crop_of_the_whole_image(tmp_path: Path) -> None:
    from vitkit.schema import RecipeError
    from vitkit.train import load_recipe

    for augment in ({"crop": "pad"}, {"enabled": False}):  # whole images trained, or a task's own crops of them
        with pytest.raises(RecipeError, match="in_memory.*data.crop_pct 1.0"):
            load_recipe({"data": {"name": "imagefolder", "root": str(tmp_path), "in_memory": True, "crop_pct": 0.9,
                                  "augment": augment}})
        whole = load_recipe({"data": {"name": "imagefolder", "root": str(tmp_path), "in_memory": True,
                                      "crop_pct": 1.0, "augment": augment}})
        assert whole.data.in_memory
