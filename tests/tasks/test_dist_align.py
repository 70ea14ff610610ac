"""Distribution alignment (``vitkit.tasks.dist_align``, ``task.fixmatch.dist_align``): the running
mean and the aligned probabilities worked out by hand over two batches; the mean survives a state
dict and a foreign one is refused; the task's mask and pseudo-labels read the aligned
probabilities (the unaligned ones give another loss); a temperature with alignment is refused; a
run with ``dist_align: true`` checkpoints the running mean."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_fixmatch import Recorder, fixmatch_task, random_batch
from test_fixmatch_training import fixmatch_recipe

from vitkit.schema import FieldError
from vitkit.tasks.dist_align import DistributionAlignment
from vitkit.tasks.fixmatch import FixMatchOptions, fixmatch_loss
from vitkit.train import train


def test_the_running_mean_and_the_aligned_probabilities_by_hand() -> None:
    align = DistributionAlignment(2)
    first = torch.tensor([[0.8, 0.2], [0.6, 0.4]])
    aligned = align.aligned(first)
    # the first batch's mean is the running mean, (0.7, 0.3); each row times 0.5 / mean, renormalised:
    # (0.8 / 0.7, 0.2 / 0.3) = (8/7, 2/3) -> (12/19, 7/19); (0.6 / 0.7, 0.4 / 0.3) = (6/7, 4/3) -> (9/23, 14/23)
    torch.testing.assert_close(align.p_model, torch.tensor([0.7, 0.3]))
    torch.testing.assert_close(aligned, torch.tensor([[12 / 19, 7 / 19], [9 / 23, 14 / 23]]), atol=1e-5, rtol=0)
    second = torch.tensor([[0.1, 0.9], [0.3, 0.7]])  # mean (0.2, 0.8)
    aligned = align.aligned(second)
    mean = (0.999 * 0.7 + 0.001 * 0.2, 0.999 * 0.3 + 0.001 * 0.8)  # (0.6995, 0.3005)
    torch.testing.assert_close(align.p_model, torch.tensor(mean))
    row = (0.1 / mean[0], 0.9 / mean[1])
    torch.testing.assert_close(aligned[0], torch.tensor(row) / sum(row), atol=1e-5, rtol=0)


def test_the_running_mean_round_trips_a_state_dict_and_a_foreign_one_is_refused() -> None:
    align = DistributionAlignment(3)
    assert align.state_dict()["p_model"].shape == (0,)  # nothing seen yet
    align.aligned(torch.tensor([[0.2, 0.3, 0.5]]))
    restored = DistributionAlignment(3)
    restored.load_state_dict(align.state_dict())
    torch.testing.assert_close(restored.p_model, torch.tensor([0.2, 0.3, 0.5]))
    fresh = DistributionAlignment(3)
    fresh.load_state_dict({"p_model": torch.empty(0)})
    assert fresh.p_model is None
    for foreign in ({"p_model": torch.ones(4) / 4}, {"kept": torch.zeros(3)}):
        with pytest.raises(ValueError, match="does not fit 3 classes"):
            DistributionAlignment(3).load_state_dict(foreign)


def test_the_task_masks_and_pseudo_labels_by_the_aligned_probabilities() -> None:
    batch = random_batch(mu=3, seed=2)
    losses = {}
    for align in (False, True):
        task = fixmatch_task(FixMatchOptions(threshold=0.5, mu=3, dist_align=align))
        task.align = DistributionAlignment(3) if align else None
        torch.manual_seed(0)
        model = Recorder(64)
        torch.manual_seed(1)
        out = task.training_step(model, batch)
        (weak_in, _), (joint_in, _) = model.seen
        with torch.no_grad():
            weak = model.linear(weak_in.flatten(1)) * 2
            probs = weak.softmax(dim=-1)
            if align:  # one batch: the running mean is the batch's mean
                probs = probs / 3 / probs.mean(dim=0)
                probs = probs / probs.sum(dim=-1, keepdim=True)
            expected = fixmatch_loss(model.linear(joint_in[:4].flatten(1)) * 2, batch[1], weak,
                                     model.linear(joint_in[4:].flatten(1)) * 2, threshold=0.5, weak_probs=probs)
        torch.testing.assert_close(out.metrics["loss_unlabeled"], expected.unsupervised, atol=1e-5, rtol=1e-5)
        assert out.metrics["mask_rate"].item() == pytest.approx(expected.mask.mean().item())
        losses[align] = (out.metrics["mask_rate"].item(), out.metrics["loss_unlabeled"].item())
    assert losses[True] != losses[False]  # the alignment changed what was pseudo-labelled


def test_a_temperature_with_alignment_is_refused_by_its_key() -> None:
    with pytest.raises(FieldError) as error:
        FixMatchOptions(dist_align=True, temperature=0.5)
    assert error.value.key == "dist_align"
    assert error.value.problem.startswith("is true with a temperature: soft pseudo-labels would not read the aligned")


def test_a_run_with_alignment_checkpoints_the_running_mean(tmp_path: Path) -> None:
    recipe = fixmatch_recipe(tmp_path, mu=2)
    result = train(recipe, ["trainer.limit_train_batches=2", "trainer.limit_test_batches=1", "task.fixmatch.dist_align=true"])
    checkpoint = torch.load(result.run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    means = [state["p_model"] for key, state in checkpoint["callbacks"].items() if key == "DistributionAlignment"]
    assert len(means) == 1 and means[0].shape == (10,)
    assert means[0].sum().item() == pytest.approx(1.0, abs=1e-5)  # a mean of probability rows
