"""Integrated Gradients (Sundararajan et al. 2017, arXiv 1703.01365) for vitkit's ViTs.

The attribution of pixel ``x_i`` is ``(x_i - x'_i)`` times the target logit's gradient averaged
along the straight path from a baseline ``x'`` to the image, the average taken by Gauss-Legendre
quadrature as captum's ``IntegratedGradients`` does by default (equal to it, tested). The
attributions add up to ``logit(x) - logit(x')`` up to the quadrature's error (completeness). The
default baseline, zeros in normalised space, is the dataset mean: the image the deletion test
fills deleted patches with.
"""

from __future__ import annotations

import numpy as np
import torch

from ..models import VisionTransformer
from .targets import HeadlessModelError, Target, resolve_targets


def gauss_legendre(steps: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes ``alpha`` in ``(0, 1)`` and weights (summing to 1) of ``steps``-point Gauss-Legendre
    quadrature, in ``dtype`` (computed in float64)."""
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    return torch.from_numpy(0.5 * (nodes + 1)).to(dtype), torch.from_numpy(0.5 * weights).to(dtype)


def integrated_gradients(
    model: VisionTransformer,
    images: torch.Tensor,
    target: Target = None,
    *,
    baseline: torch.Tensor | None = None,
    steps: int = 50,
    batch_size: int = 256,
) -> torch.Tensor:
    """Integrated Gradients ``[B, C, H, W]`` of ``images`` ``[B, C, H, W]`` for class ``target``
    (``None``: each image's prediction; an int; or ``[B]`` indices), in ``images``' dtype. The
    quadrature's nodes, weights and sums are in the model's dtype, or float32 if that is wider
    (a float64 model's attributions are float64 throughout).

    Args:
        baseline: the path's start, broadcastable to ``images`` (default zeros: the dataset mean).
        steps: quadrature points along the path.
        batch_size: path points per forward pass (images x steps are split into such chunks).
    """
    if model.config.num_classes == 0:
        raise HeadlessModelError("integrated gradients explain a class's logit; this model has no classifier.")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    parameter = next(model.parameters())
    given = images.dtype
    work = torch.promote_types(parameter.dtype, torch.float32)  # the nodes, weights and sums
    images = images.detach().to(device=parameter.device, dtype=parameter.dtype)
    start = torch.zeros_like(images) if baseline is None else baseline.to(images).expand_as(images)
    with torch.no_grad():
        targets = resolve_targets(target, model(images).to(work))
    alphas, weights = (t.to(images.device) for t in gauss_legendre(steps, work))
    count = len(images)
    # every (step, image) pair, step-major, with its target and quadrature weight
    path_alphas = alphas.repeat_interleave(count)
    path_targets = targets.repeat(steps)
    path_images = torch.arange(count, device=images.device).repeat(steps)
    path_weights = weights.repeat_interleave(count)
    total = torch.zeros_like(images, dtype=work)
    for first in range(0, steps * count, batch_size):
        chunk = slice(first, first + batch_size)
        which, alpha = path_images[chunk], path_alphas[chunk].view(-1, 1, 1, 1).to(images.dtype)
        points = (start[which] + alpha * (images[which] - start[which])).requires_grad_(True)
        with torch.enable_grad():
            logits = model(points)
            (gradient,) = torch.autograd.grad(logits.gather(1, path_targets[chunk, None]).sum(), points)
        total.index_add_(0, which, gradient.to(work) * path_weights[chunk].view(-1, 1, 1, 1))
    return ((images - start).to(work) * total).to(given)
