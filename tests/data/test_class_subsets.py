"""data.classes and data.train_per_class: a recipe trains on some classes of a dataset, with a
few labelled images per class (few-shot fine-tuning), relabelled in the order given."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from tiny_runs import tiny_recipe

from vitkit.data import DataConfig, build_datasets
from vitkit.data.info import DataFileError
from vitkit.train import RecipeError, load_recipe, train
from vitkit.train.datamodule import ViTDataModule


def images_by_label(dataset) -> dict[int, set[bytes]]:
    """Each label's images as raw bytes, to compare two builds of the same split."""
    found: dict[int, set[bytes]] = {}
    for index in range(len(dataset)):
        image, label = dataset[index]
        found.setdefault(int(label), set()).add(np.asarray(image).tobytes())
    return found


def test_chosen_classes_are_relabelled_in_the_order_given_in_every_split() -> None:
    base = dict(name="digits", img_size=8, num_workers=0, augment={"enabled": False})
    full = build_datasets(DataConfig.from_dict(base))
    chosen = build_datasets(DataConfig.from_dict({**base, "classes": [7, 2, 9]}))
    assert chosen.info.class_names == ("7", "2", "9") and chosen.info.num_classes == 3
    for split in ("train", "val", "test"):
        whole, part = images_by_label(getattr(full, split)), images_by_label(getattr(chosen, split))
        assert part == {0: whole[7], 1: whole[2], 2: whole[9]}, split


def test_train_per_class_keeps_that_many_training_images_of_each_class_and_every_evaluation_image() -> None:
    base = dict(name="digits", img_size=8, num_workers=0, augment={"enabled": False}, classes=[0, 1])
    all_train = build_datasets(DataConfig.from_dict(base))
    few = build_datasets(DataConfig.from_dict({**base, "train_per_class": 5}))
    counts = {label: len(images) for label, images in images_by_label(few.train).items()}
    assert counts == {0: 5, 1: 5}
    whole = images_by_label(all_train.train)
    assert all(images <= whole[label] for label, images in images_by_label(few.train).items())
    assert len(few.val) == len(all_train.val) and len(few.test) == len(all_train.test)
    other_seed = build_datasets(DataConfig.from_dict({**base, "train_per_class": 5, "seed": 1}))
    assert images_by_label(other_seed.train) != images_by_label(few.train)  # drawn by the seed


def test_bad_class_choices_are_one_line() -> None:
    with pytest.raises(DataFileError, match=r"data.classes \[12\] do not exist: digits has classes 0 to 9"):
        build_datasets(DataConfig(name="digits", num_workers=0, classes=[1, 12]))
    with pytest.raises(DataFileError, match=r"train_per_class=1000, but class '0' has only \d+ training images"):
        build_datasets(DataConfig(name="digits", num_workers=0, classes=[0], train_per_class=1000))
    with pytest.raises(RecipeError, match=r"data.classes .*must list distinct class indices"):
        load_recipe({"data": {"name": "digits", "classes": [1, 1]}})
    with pytest.raises(RecipeError, match=r"data.train_per_class .*applies to cifar10"):
        load_recipe({"data": {"name": "shapes", "train_per_class": 3}})


def test_a_training_split_smaller_than_one_batch_trains_in_smaller_batches_with_a_note(tmp_path, caplog) -> None:
    recipe = tiny_recipe(tmp_path / "runs", limit_val_batches=1, limit_test_batches=1)
    recipe["data"]["train_per_class"] = 2  # 20 images, batch 32
    with caplog.at_level(logging.INFO):
        result = train(recipe)
    assert ("note: trainer.batch_size 32 is more than the 20 training images; batches of 4 instead (5 full batches "
            "an epoch; set trainer.batch_size to choose).") in caplog.messages
    assert result.summary["global_steps"] == 5 and load_recipe(result.run_dir / "config.yaml").trainer.batch_size == 4


def test_a_few_labels_that_give_fewer_than_four_batches_train_in_smaller_batches_with_a_note() -> None:
    datamodule = ViTDataModule(DataConfig(name="digits", num_workers=0, train_per_class=10), 32)  # 100 images
    # 100 // 32 = 3 steps an epoch; the largest power of two giving 4 full batches: 16 (100 // 4 = 25)
    assert datamodule.fit_batch() == ("note: trainer.batch_size 32 gives 3 full batches an epoch of the 100 training "
                                      "images; batches of 16 instead (6 full batches an epoch; set trainer.batch_size "
                                      "to choose).")
    assert datamodule.batch_size == 16
    assert ViTDataModule(DataConfig(name="digits", num_workers=0, train_per_class=10), 25).fit_batch() is None  # 4 fit


def test_a_split_smaller_than_one_batch_per_device_is_refused(tmp_path) -> None:
    datamodule = ViTDataModule(DataConfig(name="digits", num_workers=0, classes=[0, 1], train_per_class=2), 2)
    assert datamodule.fit_batch() is None
    with pytest.raises(RecipeError, match=r"training split has 4 images, fewer than one batch .* x 4 device"):
        datamodule.check_batch(replicas=4)


def test_explained_test_images_are_spread_over_the_classes_by_a_seed() -> None:
    from vitkit.data.arrays import spread_over_classes

    labels = np.repeat([0, 1, 2], [5, 3, 1])  # stored class by class, as an image folder is
    chosen = spread_over_classes(labels, 6, seed=0)
    assert labels[chosen].tolist() == [0, 1, 2, 0, 1, 0]  # one of each class in turn, until a class runs out
    assert len(set(chosen.tolist())) == 6 and spread_over_classes(labels, 6, seed=0).tolist() == chosen.tolist()
    assert spread_over_classes(labels, 6, seed=1).tolist() != chosen.tolist()  # another seed, other images
    assert sorted(spread_over_classes(labels, 100, seed=0).tolist()) == list(range(9))  # all, when fewer
