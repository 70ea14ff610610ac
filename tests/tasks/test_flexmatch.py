"""FlexMatch's class-wise thresholds (``vitkit.tasks.flexmatch``, ``task.fixmatch.threshold_mode:
flex``): the thresholds and the record equal USB's ``FlexMatchThresholdingHook`` (tests/helpers'
flexmatch_reference) batch after batch on the same probabilities; a small case by hand; the
record survives a state dict; the task masks by them; and a run with ``threshold_mode: flex``
trains with them and checkpoints the record."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from flexmatch_reference import FlexMatchThresholdingHook
from test_fixmatch import Recorder, fixmatch_task, random_batch
from test_fixmatch_training import fixmatch_recipe, left_out

from vitkit.tasks.fixmatch import FixMatchOptions, fixmatch_loss
from vitkit.tasks.flexmatch import FlexThresholds
from vitkit.train import train


def probabilities(generator: torch.Generator, rows: int, classes: int, sharpness: float) -> torch.Tensor:
    return (torch.randn(rows, classes, generator=generator) * sharpness).softmax(dim=-1)


@pytest.mark.parametrize("tau", [0.95, 0.6])
def test_thresholds_and_record_equal_usbs_flexmatch_batch_after_batch(tau: float) -> None:
    images, classes = 60, 4
    ours, usb = FlexThresholds(classes), FlexMatchThresholdingHook(ulb_dest_len=images, num_classes=classes)
    ours.bind(images)
    generator = torch.Generator().manual_seed(0)
    masks = []
    for step in range(12):  # growing confidence: the record fills and the thresholds rise
        probs = probabilities(generator, 16, classes, sharpness=1.0 + step)
        indices = torch.randperm(images, generator=generator)[:16]
        expected = usb.masking(SimpleNamespace(p_cutoff=tau), probs, indices, softmax_x_ulb=False)
        mask = probs.max(dim=-1).values.ge(ours.thresholds(probs, indices, tau)).float()
        torch.testing.assert_close(mask, expected, rtol=0, atol=0)
        assert torch.equal(ours.kept, usb.selected_label)
        torch.testing.assert_close(ours.learning_effect, usb.classwise_acc, rtol=0, atol=0)
        masks.append(mask.mean().item())
    assert masks[0] == 1.0  # nothing kept yet: every threshold 0
    assert 0 < min(masks) < 1 and (usb.selected_label >= 0).sum() > images / 2  # the thresholds did bite


def test_thresholds_by_hand() -> None:
    flex = FlexThresholds(2)
    flex.bind(4)
    first = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]])
    torch.testing.assert_close(flex.thresholds(first, torch.tensor([0, 1, 2]), 0.8), torch.zeros(3))
    assert flex.kept.tolist() == [0, -1, -1, -1]  # only image 0 reached 0.8
    # kept: 3 none, 1 of class 0 -> beta = (1/3, 0); class 0's threshold 0.8 * (1/3) / (2 - 1/3) = 0.16
    torch.testing.assert_close(flex.learning_effect, torch.tensor([1 / 3, 0.0]))
    second = torch.tensor([[0.1, 0.9], [0.85, 0.15], [0.15, 0.85]])
    torch.testing.assert_close(flex.thresholds(second, torch.tensor([3, 1, 2]), 0.8), torch.tensor([0.0, 0.16, 0.0]))
    assert flex.kept.tolist() == [0, 0, 1, 1]  # no none left: sigma = (2, 2), beta = (1, 1)
    torch.testing.assert_close(flex.learning_effect, torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(flex.thresholds(first, torch.tensor([0, 1, 2]), 0.8), torch.full((3,), 0.8))


def test_while_one_value_holds_every_image_the_record_keeps_its_learning_effect() -> None:
    flex = FlexThresholds(3)
    flex.bind(2)
    flex.thresholds(torch.tensor([[0.9, 0.05, 0.05]] * 2), torch.tensor([0, 1]), 0.5)  # both kept as class 0
    assert flex.kept.tolist() == [0, 0] and flex.learning_effect.tolist() == [0.0, 0.0, 0.0]  # USB: no update


def test_thresholds_before_the_record_is_sized_are_refused_and_one_image_gets_a_record_of_one() -> None:
    with pytest.raises(RuntimeError, match="bind was not called"):
        FlexThresholds(2).thresholds(torch.tensor([[0.9, 0.1]]), torch.tensor([0]), 0.5)
    flex = FlexThresholds(2)
    flex.bind(1)  # a single unlabeled image: a record of one image, kept as none
    assert flex.kept.tolist() == [-1]


def test_the_record_round_trips_a_state_dict_and_a_foreign_one_is_refused() -> None:
    flex = FlexThresholds(2)
    flex.bind(4)
    flex.thresholds(torch.tensor([[0.9, 0.1], [0.2, 0.8]]), torch.tensor([2, 3]), 0.7)
    restored = FlexThresholds(2)
    restored.load_state_dict(flex.state_dict())
    restored.bind(4)  # the dataset's size, as the resumed run reads it: the record stays
    assert restored.kept.tolist() == [-1, -1, 0, 1]
    torch.testing.assert_close(restored.learning_effect, flex.learning_effect)
    restored.bind(5)  # other unlabeled images: a fresh record
    assert restored.kept.tolist() == [-1] * 5 and restored.learning_effect.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="2 classes"):
        restored.load_state_dict(FlexThresholds(3).state_dict())


def test_the_task_masks_by_the_flexible_thresholds_and_records_the_batchs_indices() -> None:
    batch = random_batch(mu=3, seed=1)
    task = fixmatch_task(FixMatchOptions(threshold=1.0, mu=3, threshold_mode="flex"))
    task.flex = FlexThresholds(3)
    task.flex.bind(20)
    torch.manual_seed(0)
    model = Recorder(64)
    out = task.training_step(model, batch)
    (weak_in, _), (joint_in, _) = model.seen
    with torch.no_grad():  # nothing kept yet: every threshold 0, where the fixed threshold 1 masks everything
        expected = fixmatch_loss(model.linear(joint_in[:4].flatten(1)) * 2, batch[1], model.linear(weak_in.flatten(1)) * 2,
                                 model.linear(joint_in[4:].flatten(1)) * 2, threshold=0.0)
    assert out.metrics["mask_rate"].item() == 1.0 and expected.unsupervised > 0
    torch.testing.assert_close(out.metrics["loss_unlabeled"], expected.unsupervised)
    task.options.threshold = 0.0  # every weak view is now confident: its index is recorded with its class
    task.training_step(model, batch)
    guess = model.linear(model.seen[2][0].flatten(1)).argmax(dim=-1)
    assert task.flex.kept[:12].tolist() == guess.tolist() and task.flex.kept[12:].tolist() == [-1] * 8


def test_a_flex_run_trains_with_flexible_thresholds_and_checkpoints_the_record(tmp_path: Path) -> None:
    """tau = 1: no weak view is ever that confident, so FixMatch masks every image out, while
    FlexMatch's thresholds stay 0 (nothing is kept) and every image counts."""
    recipe = fixmatch_recipe(tmp_path, mu=2, threshold=1.0)
    limits = ["trainer.limit_train_batches=3", "trainer.limit_test_batches=1", "trainer.log_every=1"]
    rates = {}
    for mode in ("fixed", "flex"):
        result = train(recipe, [*limits, f"task.fixmatch.threshold_mode={mode}"])
        with open(result.run_dir / "metrics.csv") as handle:
            rates[mode] = [float(row["train/mask_rate"]) for row in csv.DictReader(handle)
                           if row.get("train/mask_rate")]
        checkpoint = torch.load(result.run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        records = [state for key, state in checkpoint["callbacks"].items() if key == "FlexThresholds"]
        assert len(records) == (mode == "flex")
    assert rates["fixed"] == [0.0] * 3 and rates["flex"] == [1.0] * 3
    kept = records[0]["kept"]
    assert len(kept) == left_out() and set(kept.tolist()) == {-1}  # one entry per unlabeled image, none kept at tau 1
