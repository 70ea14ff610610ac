"""Deletion / insertion / negative-perturbation curves against a hand computation on a 2x2 grid, and
a model where one patch alone decides the class: a map that ranks it first drops at the first step,
one that ranks it last does not."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from vitkit.explain.faithfulness import baseline_images, patch_order, perturbation_curves


class PatchLogit(nn.Module):
    """Two classes: class 1's logit is sum_p w_p * mean(patch p) over a 2x2 grid of 2x2 patches, class 0's is 0."""

    def __init__(self, weights: list[float]) -> None:
        super().__init__()
        self.weights = torch.tensor(weights)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        means = nn.functional.avg_pool2d(images[:, :1], 2).flatten(1)  # [B, 4] row-major patches
        return torch.stack([torch.zeros(len(images)), means @ self.weights], dim=-1)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_the_curves_and_their_areas_equal_a_hand_computation_on_a_2x2_grid() -> None:
    model = PatchLogit([1.0, 2.0, 3.0, 4.0])
    image = torch.ones(1, 1, 4, 4)  # every patch mean 1: class 1's logit is the sum of the kept weights
    maps = torch.tensor([[[0.1, 0.4], [0.3, 0.2]]])  # ranks patches 1, 2, 3, 0
    curves = perturbation_curves(model, image, maps, (2, 2), target=torch.tensor([1]))
    # deletion removes patches 1, 2, 3, 0 in turn: logits 10, 8, 5, 1, 0
    deletion = [sigmoid(v) for v in (10, 8, 5, 1, 0)]
    insertion = [sigmoid(v) for v in (0, 2, 5, 9, 10)]  # reveals 1, 2, 3, 0 on a zero baseline
    positive = [1, 1, 1, 1, 0]  # class 1 is predicted while its logit is > 0 (a tie goes to class 0)
    negative = [1, 1, 1, 1, 0]  # removes 0, 3, 2, 1 (least relevant first): logits 10, 9, 5, 2, 0
    for name, expected in (("deletion", deletion), ("insertion", insertion), ("positive", positive), ("negative", negative)):
        torch.testing.assert_close(getattr(curves, name)[0], torch.tensor(expected, dtype=torch.float32), atol=1e-6, rtol=1e-6)
    areas = curves.auc()
    by_hand = sum((a + b) / 2 * 0.25 for a, b in zip(deletion, deletion[1:]))  # trapezoids of width 1/4
    assert areas["deletion"].item() == pytest.approx(by_hand, abs=1e-6)
    assert areas["positive"].item() == pytest.approx(100 * 0.25 * 3.5)  # percent: three full steps and a half
    assert areas["insertion"] > areas["deletion"]
    # against a reference class the model never predicts, the accuracy is 0 until class 0 wins the tie
    wrong = perturbation_curves(model, image, maps, (2, 2), target=torch.tensor([1]), reference=torch.tensor([0]))
    assert wrong.positive[0].tolist() == [0, 0, 0, 0, 1] and wrong.auc()["positive"].item() == pytest.approx(12.5)
    torch.testing.assert_close(wrong.deletion, curves.deletion)  # the probability is the target's


def test_a_map_that_finds_the_one_deciding_patch_drops_at_once_and_one_that_misses_it_does_not() -> None:
    model = PatchLogit([0.0, 0.0, 8.0, 0.0])  # only patch 2 (bottom left) decides
    images = torch.ones(3, 1, 4, 4)
    good = torch.tensor([[0.0, 0.0], [1.0, 0.0]]).expand(3, -1, -1)
    bad = 1 - good
    found = perturbation_curves(model, images, good, (2, 2))
    missed = perturbation_curves(model, images, bad, (2, 2))
    assert (found.deletion[:, 1] < 0.51).all() and (found.deletion[:, 0] > 0.99).all()
    assert (missed.deletion[:, 1:4] > 0.99).all() and (missed.deletion[:, 4] < 0.51).all()
    assert (found.auc()["deletion"] < missed.auc()["deletion"]).all()
    # positive deletes the deciding patch first, negative (least relevant first) last
    assert found.positive[0].tolist() == [1, 0, 0, 0, 0] and found.negative[0].tolist() == [1, 1, 1, 1, 0]
    assert missed.negative[0].tolist() == [1, 0, 0, 0, 0]


def test_the_order_is_most_relevant_first_and_the_blur_baseline_keeps_the_mean() -> None:
    assert patch_order(torch.tensor([[[0.2, 0.9], [0.2, 0.5]]])).tolist() == [[1, 3, 0, 2]]  # ties: lower index first
    images = torch.randn(2, 3, 16, 16)
    assert torch.equal(baseline_images(images, "mean"), torch.zeros_like(images))
    blurred = baseline_images(torch.full((1, 1, 16, 16), 0.7), "blur")
    torch.testing.assert_close(blurred, torch.full((1, 1, 16, 16), 0.7))


def test_maps_of_the_wrong_grid_and_steps_out_of_range_are_refused() -> None:
    model = PatchLogit([1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"\[1, 2, 2\]"):
        perturbation_curves(model, torch.ones(1, 1, 4, 4), torch.ones(1, 3, 3), (2, 2))
    with pytest.raises(ValueError, match=r"steps must lie in \[1, 4\]"):
        perturbation_curves(model, torch.ones(1, 1, 4, 4), torch.ones(1, 2, 2), (2, 2), steps=5)


def test_a_vitkit_model_s_rollout_runs_through_the_curves_at_its_patch_grid() -> None:
    import vitkit
    from vitkit.explain import capture_attention
    from vitkit.explain.rollout import attention_rollout

    model = vitkit.create_model("vit_cifar_tiny", img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2,
                                num_classes=3, reg_tokens=1).eval()
    images = torch.randn(2, 3, 16, 16)
    capture = capture_attention(model, images)
    maps = attention_rollout(capture.attentions, "mean", 0.0, capture.num_prefix_tokens, capture.pooling)
    curves = perturbation_curves(model, images, maps.view(2, 4, 4), model.config.patch_size, steps=8,
                                 baseline="blur")
    assert curves.deletion.shape == (2, 9) and curves.fractions[-1] == 1.0
    with torch.no_grad():
        predicted = model(images).softmax(-1).max(-1).values
    torch.testing.assert_close(curves.deletion[:, 0], predicted)  # step 0: the untouched image's probability
