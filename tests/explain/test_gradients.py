"""Integrated Gradients: equal to captum's on the same model and baseline, complete (the attributions
add up to the logit's change along the path), and each option used."""

from __future__ import annotations

import pytest
import torch

import vitkit
from vitkit.explain import HeadlessModelError, integrated_gradients
from vitkit.explain.gradients import gauss_legendre


def tiny(**options: object) -> vitkit.VisionTransformer:
    torch.manual_seed(0)
    settings = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 3}
    return vitkit.create_model("vit_cifar_tiny", **{**settings, **options}).eval()


@pytest.mark.parametrize("options", [{}, {"distilled": True}, {"reg_tokens": 2, "global_pool": "avg"}])
def test_equal_to_captum_whatever_the_chunking(options: dict) -> None:
    captum = pytest.importorskip("captum.attr")
    model = tiny(**options)
    images, targets = torch.randn(5, 3, 16, 16), torch.tensor([0, 1, 2, 0, 1])
    theirs = captum.IntegratedGradients(model).attribute(images, baselines=torch.zeros_like(images), target=targets)
    for batch_size in (7, 1000):  # path points split unevenly across images, or all at once
        ours = integrated_gradients(model, images, targets, batch_size=batch_size)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-4)
    baseline = torch.full((1, 3, 16, 16), 0.3)
    theirs = captum.IntegratedGradients(model).attribute(images, baselines=baseline.expand_as(images), target=targets,
                                                          n_steps=8)
    torch.testing.assert_close(integrated_gradients(model, images, targets, baseline=baseline, steps=8), theirs,
                               atol=1e-6, rtol=1e-4)


def test_the_attributions_add_up_to_the_logits_change() -> None:
    model = tiny()
    images = torch.randn(4, 3, 16, 16)
    attributions = integrated_gradients(model, images, steps=200)
    with torch.no_grad():
        logits = model(images)
        targets = logits.argmax(-1)
        change = logits.gather(1, targets[:, None])[:, 0] - model(torch.zeros_like(images)).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(attributions.sum((1, 2, 3)), change, atol=2e-3, rtol=1e-2)
    nodes, weights = gauss_legendre(3)
    torch.testing.assert_close(weights.sum(), torch.tensor(1.0))
    torch.testing.assert_close(nodes, torch.tensor([0.5 - 0.5 * 0.6**0.5, 0.5, 0.5 + 0.5 * 0.6**0.5]))
    with pytest.raises(HeadlessModelError):
        integrated_gradients(tiny(num_classes=0), images)
