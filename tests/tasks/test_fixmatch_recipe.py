"""FixMatch built from a recipe (``FixMatchTask.from_recipe``): the weak view is the data section's
flip and shift, the strong view takes ``task.fixmatch``'s operations and Cutout size, evaluation
takes the trainer's test-time augmentation with the black border of the data's normalisation; a
labelled split not held in memory is refused naming what was given."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import TensorDataset

from vitkit.data.config import AugmentConfig
from vitkit.models import ViTConfig
from vitkit.tasks import FixMatchOptions, FixMatchTask, TaskSetup

EXTRA = {"mean": (0.5,), "std": (0.25,), "img_size": (8, 8), "in_chans": 1, "class_names": ["a", "b", "c"]}


def built(options: FixMatchOptions, tta: str = "hflip_shift", val_tta: str | None = "none") -> FixMatchTask:
    augment = AugmentConfig(crop="pad", padding=2, hflip=0.25)
    data = SimpleNamespace(resolved=lambda: SimpleNamespace(augment=augment))
    recipe = SimpleNamespace(data=data, trainer=SimpleNamespace(tta=tta, val_tta=val_tta))
    model = ViTConfig(img_size=8, patch_size=4, in_chans=1, num_classes=3, embed_dim=8, depth=1, num_heads=2)
    return FixMatchTask.from_recipe(options, TaskSetup(model, EXTRA, recipe, 1))


def test_the_views_take_the_data_sections_shift_and_flip_and_the_tasks_strong_options() -> None:
    options = FixMatchOptions(strong_ops=2, cutout=0.25, mu=3)
    task = built(options)
    assert task.options is options
    assert (task.views.weak.padding, task.views.weak.hflip, task.views.weak.rand_augment) == (2, 0.25, None)
    strong = task.views.strong
    assert (strong.padding, strong.hflip, strong.rand_augment.num_ops, strong.rand_augment.cutout) == (2, 0.25, 2, 0.25)
    defaults = built(FixMatchOptions()).views.strong.rand_augment
    assert (defaults.num_ops, defaults.cutout) == (3, 0.5)  # USB's strong view


def test_evaluation_takes_the_trainers_test_time_augmentation_and_the_black_border() -> None:
    task = built(FixMatchOptions())
    assert (task.tta, task.val_tta) == ("hflip_shift", "none")
    torch.testing.assert_close(task.fill, torch.tensor([-2.0]))  # black: (0 - 0.5) / 0.25
    assert built(FixMatchOptions(), tta="hflip", val_tta=None).val_tta == "hflip"  # validation follows the test's


def test_a_labelled_split_not_in_memory_is_refused_naming_its_type() -> None:
    task = built(FixMatchOptions())
    with pytest.raises(TypeError, match="from memory, not a TensorDataset"):
        task.split_data(TensorDataset(torch.zeros(2, 1)), "train")
