"""Faithfulness of attribution maps, measured by perturbing patches in the map's order.

Deletion and insertion (Petsiuk et al. 2018, "RISE", arXiv 1806.07421): the patches a map ranks
first are replaced by a baseline (deletion) or revealed on the baseline (insertion), a fraction at
a time, and the probability of the explained class is read after each step. A map that explains
the prediction makes the deletion curve fall early (low area under it) and the insertion curve
rise early (high area). Deleting the *least* relevant patches first is Chefer et al.'s negative
perturbation test (arXiv 2012.09838, section 4: the probability should hold, high area).

The curves run on the model's own patch grid, so a map is ``[B, gh, gw]`` (one value per patch:
:func:`vitkit.explain.maps_from_capture` before upsampling, or any attribution pooled per patch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

#: What replaces a deleted patch: zeros in the normalised input (the dataset mean) or a blurred image.
Baseline = Literal["mean", "blur"]


@dataclass(frozen=True)
class PerturbationCurves:
    """The explained class's probability after each step, ``[B, steps + 1]`` per test, and the
    fraction of patches perturbed at each step ``[steps + 1]`` (from 0 to 1)."""

    deletion: torch.Tensor
    insertion: torch.Tensor
    negative: torch.Tensor
    fractions: torch.Tensor

    def auc(self) -> dict[str, torch.Tensor]:
        """Area under each curve over the perturbed fraction (trapezoid rule), ``[B]`` each."""
        return {name: torch.trapezoid(getattr(self, name), self.fractions, dim=-1)
                for name in ("deletion", "insertion", "negative")}


def patch_order(maps: torch.Tensor) -> torch.Tensor:
    """Patch indices ``[B, gh*gw]`` (row-major) from the most to the least relevant of ``maps``
    ``[B, gh, gw]``; ties keep the lower index first."""
    flat = maps.flatten(1).float()
    return torch.sort(-flat, dim=-1, stable=True).indices


def baseline_images(images: torch.Tensor, baseline: Baseline) -> torch.Tensor:
    """What a deleted patch shows: zeros (the mean of normalised data) or the image blurred by an
    11x11 box filter (edges replicated), ``[B, C, H, W]``."""
    if baseline == "mean":
        return torch.zeros_like(images)
    if baseline == "blur":
        padded = F.pad(images, (5, 5, 5, 5), mode="replicate")
        return F.avg_pool2d(padded, 11, stride=1)
    raise ValueError(f"baseline must be 'mean' or 'blur', got {baseline!r}.")


@torch.no_grad()
def perturbation_curves(
    model: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    maps: torch.Tensor,
    patch_size: tuple[int, int],
    target: torch.Tensor | None = None,
    *,
    steps: int | None = None,
    baseline: Baseline = "mean",
) -> PerturbationCurves:
    """Deletion, insertion and negative-deletion curves of ``maps`` for ``model``.

    Args:
        model: ``[B, C, H, W]`` normalised images to ``[B, K]`` logits (in eval mode).
        images: ``[B, C, H, W]``.
        maps: one relevance per patch, ``[B, gh, gw]`` with ``gh = H / patch_size[0]``.
        patch_size: ``(ph, pw)`` of the model's patches.
        target: the class explained per image ``[B]``; default the model's prediction.
        steps: perturbation steps (default one patch per step).
        baseline: what replaces a deleted patch (:func:`baseline_images`).

    Returns:
        :class:`PerturbationCurves`; step 0 is the unperturbed image (deletion) or the baseline alone (insertion).
    """
    batch, _, height, width = images.shape
    ph, pw = patch_size
    grid = (height // ph, width // pw)
    if height % ph or width % pw or tuple(maps.shape) != (batch, *grid):
        raise ValueError(f"maps must be [B, gh, gw] = [{batch}, {grid[0]}, {grid[1]}] for {height}x{width} images "
                         f"and {ph}x{pw} patches, got {list(maps.shape)}.")
    patches = grid[0] * grid[1]
    steps = patches if steps is None else steps
    if not 1 <= steps <= patches:
        raise ValueError(f"steps must lie in [1, {patches}] (the patches), got {steps}.")
    if target is None:
        target = model(images).argmax(dim=-1)
    order = patch_order(maps)
    ranks = torch.empty_like(order).scatter_(1, order, torch.arange(patches).expand(batch, -1))  # rank of each patch
    fill = baseline_images(images, baseline)
    counts = [round(k * patches / steps) for k in range(steps + 1)]

    def probability(shown: torch.Tensor) -> torch.Tensor:
        return model(shown).float().softmax(dim=-1).gather(1, target[:, None])[:, 0]

    def curve(first_removed: Callable[[int], torch.Tensor], removed_from_image: bool) -> torch.Tensor:
        values = []
        for count in counts:
            hidden = first_removed(count).view(batch, 1, *grid).float()  # 1: the patch shows the baseline
            if not removed_from_image:
                hidden = 1 - hidden  # insertion: the first `count` patches show the image
            mask = F.interpolate(hidden, scale_factor=(ph, pw), mode="nearest")
            values.append(probability(images * (1 - mask) + fill * mask))
        return torch.stack(values, dim=-1)

    return PerturbationCurves(
        deletion=curve(lambda count: ranks < count, True),
        insertion=curve(lambda count: ranks < count, False),
        negative=curve(lambda count: ranks >= patches - count, True),
        fractions=torch.tensor(counts, dtype=torch.float32) / patches,
    )
