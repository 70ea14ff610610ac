"""FixMatch built from a recipe (``FixMatchTask.from_recipe``): the weak view is the data section's
flip and shift, the strong view takes ``task.fixmatch``'s operations and Cutout size, evaluation
takes the trainer's test-time augmentation with the black border of the data's normalisation
(none by default); the training step takes the pseudo-labels' temperature; a labelled split not
held in memory is refused naming what was given."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from vitkit.data import DataInfo
from vitkit.data.config import AugmentConfig
from vitkit.data.unlabeled import FixMatchViews
from vitkit.models import ViTConfig
from vitkit.tasks import FixMatchOptions, FixMatchTask, TaskSetup, fixmatch_loss

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
    views = FixMatchViews(AugmentConfig(enabled=False), DataInfo.from_extra(EXTRA))
    plain = FixMatchTask(views, lambda: np.zeros((0, 8, 8, 1), np.uint8), FixMatchOptions())
    assert (plain.tta, plain.val_tta, plain.fill) == ("none", "none", None)


def test_the_training_step_takes_the_pseudo_labels_temperature_from_its_options() -> None:
    views = FixMatchViews(AugmentConfig(enabled=False), DataInfo.from_extra(EXTRA), strong_ops=2)
    rng = np.random.default_rng(0)
    labelled = torch.from_numpy(rng.integers(0, 256, (4, 8, 8, 1), dtype=np.uint8))
    unlabeled = torch.from_numpy(rng.integers(0, 256, (4, 2, 8, 8, 1), dtype=np.uint8))
    labels = torch.tensor([0, 1, 2, 0])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    losses = {}
    for temperature in (None, 0.5):
        task = FixMatchTask(views, lambda: np.zeros((0, 8, 8, 1), np.uint8),
                            FixMatchOptions(threshold=0.0, mu=2, temperature=temperature))
        torch.manual_seed(1)
        losses[temperature] = task.training_step(model, (labelled, labels, unlabeled)).loss.detach()
    # the step's draws in its order: the unlabeled weak views, the labelled weak views, the strong views
    torch.manual_seed(1)
    weak, weak_labelled, strong = views.weak(unlabeled.flatten(0, 1)), views.weak(labelled), views.strong(unlabeled.flatten(0, 1))
    with torch.no_grad():
        soft = fixmatch_loss(model(weak_labelled), labels, model(weak), model(strong), threshold=0.0, temperature=0.5)
        hard = fixmatch_loss(model(weak_labelled), labels, model(weak), model(strong), threshold=0.0)
    torch.testing.assert_close(losses[0.5], soft.total)
    torch.testing.assert_close(losses[None], hard.total)
    assert not torch.isclose(soft.total, hard.total)


def test_a_labelled_split_not_in_memory_is_refused_naming_its_type() -> None:
    task = built(FixMatchOptions())
    with pytest.raises(TypeError, match="from memory, not a TensorDataset"):
        task.split_data(TensorDataset(torch.zeros(2, 1)), "train")
