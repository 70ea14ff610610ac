"""FixMatch built from a recipe (``FixMatchTask.from_recipe``): the weak view is the data section's
flip and shift, the strong view takes ``task.fixmatch``'s operations and Cutout size, evaluation
takes the trainer's test-time augmentation with the black border of the data's normalisation
(none by default); the training step takes the pseudo-labels' temperature and logs its terms;
recipes FixMatch cannot read are refused by key and sentence, and a labelled split not held in
memory naming what was given."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from vitkit.data import DataInfo
from vitkit.data.arrays import ArrayDataset
from vitkit.data.config import AugmentConfig
from vitkit.data.unlabeled import FixMatchViews, SemiSupervisedStream
from vitkit.models import ViTConfig
from vitkit.schema import FieldError
from vitkit.tasks import FixMatchOptions, FixMatchTask, TaskSetup, fixmatch_loss

EXTRA = {"mean": (0.5,), "std": (0.25,), "img_size": (8, 8), "in_chans": 1, "class_names": ["a", "b", "c"]}


def built(options: FixMatchOptions, tta: str = "hflip_shift", val_tta: str | None = "none") -> FixMatchTask:
    augment = AugmentConfig(crop="pad", padding=2, hflip=0.25)
    data = SimpleNamespace(resolved=lambda: SimpleNamespace(augment=augment))
    recipe = SimpleNamespace(data=data, trainer=SimpleNamespace(tta=tta, val_tta=val_tta, seed=7))
    model = ViTConfig(img_size=8, patch_size=4, in_chans=1, num_classes=3, embed_dim=8, depth=1, num_heads=2)
    return FixMatchTask.from_recipe(options, TaskSetup(model, EXTRA, recipe, 1))


def test_the_views_take_the_data_sections_shift_and_flip_and_the_tasks_strong_options() -> None:
    options = FixMatchOptions(strong_ops=2, cutout=0.25, mu=3)
    task = built(options)
    assert task.options is options and task.seed == 7  # the run's seed draws the passes over the unlabeled images
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
        out = task.training_step(model, (labelled, labels, unlabeled, torch.arange(8).view(4, 2)))
        losses[temperature] = out.loss.detach()
    assert set(out.metrics) == {"acc1", "loss_labelled", "loss_unlabeled", "mask_rate"}
    assert out.metrics["mask_rate"].item() == 1.0  # threshold 0: every pseudo-label counts
    # the step's draws in its order: the unlabeled weak views, the labelled weak views, the strong views
    torch.manual_seed(1)
    weak, weak_labelled, strong = views.weak(unlabeled.flatten(0, 1)), views.weak(labelled), views.strong(unlabeled.flatten(0, 1))
    with torch.no_grad():
        soft = fixmatch_loss(model(weak_labelled), labels, model(weak), model(strong), threshold=0.0, temperature=0.5)
        hard = fixmatch_loss(model(weak_labelled), labels, model(weak), model(strong), threshold=0.0)
    torch.testing.assert_close(losses[0.5], soft.total)
    torch.testing.assert_close(losses[None], hard.total)
    assert not torch.isclose(soft.total, hard.total)
    right = (model(weak_labelled).argmax(dim=1) == labels).float().mean().item() * 100
    assert out.metrics["acc1"]().item() == pytest.approx(right)


def test_the_loss_thresholds_at_the_papers_095_by_default() -> None:
    weak = torch.log(torch.tensor([[0.96, 0.04], [0.94, 0.06]]))
    out = fixmatch_loss(torch.zeros(1, 2), torch.tensor([0]), weak, torch.zeros(2, 2))
    assert out.mask.tolist() == [1.0, 0.0]


def data_section(**changes: object) -> SimpleNamespace:
    fields = dict(name="imagefolder", in_memory=True, train_per_class=5, augment=AugmentConfig(crop="pad", padding=2))
    resolved = SimpleNamespace(**{**fields, **changes})
    return SimpleNamespace(resolved=lambda: resolved)


def recipe_with(data: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(data=data, optim=SimpleNamespace(mixup=0.0, cutmix=0.0, label_smoothing=0.0),
                           distill=SimpleNamespace(type="none"))


@pytest.mark.parametrize(("changes", "key", "problem"), [
    ({"train_per_class": None}, "task.name",
     "is 'fixmatch', which reads unlabeled images beside the labelled ones, but every training image is labelled: set "
     "data.train_per_class (the training images it leaves out are the unlabeled ones) or task.fixmatch.unlabeled_root "
     "(a folder of images)."),
    ({"in_memory": False}, "data.in_memory",
     "is false, but FixMatch draws its views of the labelled images on the device from memory: set data.in_memory=true."),
])
def test_a_recipe_fixmatch_cannot_read_is_refused_by_its_key(changes: dict, key: str, problem: str) -> None:
    with pytest.raises(FieldError) as error:
        FixMatchTask.check_recipe(FixMatchOptions(), recipe_with(data_section(**changes)))
    assert (error.value.key, error.value.problem) == (key, problem)
    FixMatchTask.check_recipe(FixMatchOptions(), recipe_with(data_section()))  # an image folder in memory trains
    FixMatchTask.check_recipe(FixMatchOptions(), recipe_with(data_section(name="cifar10", in_memory=False)))


def test_a_labelled_split_not_in_memory_is_refused_naming_its_type() -> None:
    task = built(FixMatchOptions())
    with pytest.raises(TypeError, match="from memory, not a TensorDataset"):
        task.split_data(TensorDataset(torch.zeros(2, 1)), "train")


def test_the_training_stream_draws_its_passes_by_the_tasks_seed() -> None:
    images = np.arange(12, dtype=np.uint8).reshape(12, 1, 1, 1).repeat(8, 1).repeat(8, 2)
    labelled = ArrayDataset(np.zeros((2, 8, 8, 1), np.uint8), np.arange(2), lambda image: torch.zeros(1), None)
    views = FixMatchViews(AugmentConfig(enabled=False), DataInfo.from_extra(EXTRA))
    task = FixMatchTask(views, lambda: images, FixMatchOptions(mu=2), seed=7)
    draws = lambda stream: [stream[i][3].tolist() for i in range(6)]  # noqa: E731
    drawn = draws(task.split_data(labelled, "train"))
    assert drawn == draws(SemiSupervisedStream(labelled, images, 2, seed=7))
    assert drawn != draws(SemiSupervisedStream(labelled, images, 2, seed=0))


def test_an_augmentation_the_views_cannot_batch_is_refused_by_the_task_name() -> None:
    data = data_section(augment=AugmentConfig(crop="random_resized", hflip=0.5))
    with pytest.raises(FieldError) as error:
        FixMatchTask.check_recipe(FixMatchOptions(), recipe_with(data))
    assert error.value.key == "task.name"
    assert error.value.problem.startswith("is 'fixmatch', whose weak and strong views run on whole batches, but ")
    assert "random_resized" in error.value.problem


def test_an_empty_unlabeled_root_is_refused_by_its_key() -> None:
    options = FixMatchOptions()
    options.unlabeled_root = ""
    with pytest.raises(FieldError) as error:
        options.validate()
    assert (error.value.key, error.value.problem) == ("unlabeled_root", "is empty; give the folder of unlabeled images, or null.")
