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


def test_a_float64_model_equals_captum_to_1e_9_and_keeps_the_images_dtype() -> None:
    captum = pytest.importorskip("captum.attr")
    from captum.attr._utils.approximation_methods import approximation_parameters

    model, steps = tiny().double(), 8
    images, targets = torch.randn(3, 3, 16, 16, dtype=torch.float64), torch.tensor([0, 1, 2])
    # captum casts its step sizes to float32; its float64 path gradients, one quadrature node at a
    # time (a step size of 1.0 is exact), weighted by its own float64 step sizes, are float64 throughout
    sizes, alphas = (method(steps) for method in approximation_parameters("gausslegendre"))
    ig, zeros = captum.IntegratedGradients(model), torch.zeros_like(images)
    theirs = sum(size * ig._attribute((images,), (zeros,), targets, n_steps=steps,
                                      step_sizes_and_alphas=([float(i == k) for i in range(steps)], alphas))[0]
                 for k, size in enumerate(sizes))
    for batch_size in (7, 1000):
        ours = integrated_gradients(model, images, targets, steps=steps, batch_size=batch_size)
        assert ours.dtype == torch.float64
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9 * float(theirs.abs().max()))
    nodes, weights = gauss_legendre(5, torch.float64)
    assert nodes.dtype == weights.dtype == torch.float64 and abs(float(weights.sum()) - 1.0) < 1e-15
    assert integrated_gradients(model, images.float(), targets, steps=4).dtype == torch.float32  # the input's dtype


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
