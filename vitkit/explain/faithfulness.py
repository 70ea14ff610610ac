"""Faithfulness of attribution maps, measured by perturbing patches in the map's order.

Deletion and insertion (Petsiuk et al. 2018, "RISE", arXiv 1806.07421): the patches a map ranks
first are replaced by a baseline (deletion) or revealed on the baseline (insertion), a fraction at
a time, and the probability of the explained class is read after each step. A map that explains
the prediction makes the deletion curve fall early (low area under it) and the insertion curve
rise early (high area). Chefer et al.'s positive and negative perturbation tests (arXiv 2012.09838,
section 4) read the accuracy instead, deleting the most relevant patches first (positive: it should
fall early, low area) or the least relevant first (negative: it should hold, high area).

The curves run on the model's own patch grid, so a map is ``[B, gh, gw]`` (one value per patch:
:func:`vitkit.explain.maps_from_capture` before upsampling, or any attribution pooled per patch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

#: Steps of the per-image deletion and insertion scores that ``vitkit maps`` and the explorer show
#: (fewer when the grid has fewer patches).
SCORE_STEPS = 16
#: What replaces a deleted patch: zeros in the normalised input (the dataset mean) or a blurred image.
Baseline = Literal["mean", "blur"]


@dataclass(frozen=True)
class PerturbationCurves:
    """Per image and step ``[B, steps + 1]``: the explained class's probability as the most relevant
    patches are deleted (``deletion``) or revealed on the baseline (``insertion``), and 1 where the
    prediction still equals the reference class as the most (``positive``) or least (``negative``)
    relevant patches are deleted, else 0; ``fractions`` ``[steps + 1]``: the share of patches
    perturbed at each step, from 0 to 1."""

    deletion: torch.Tensor
    insertion: torch.Tensor
    positive: torch.Tensor
    negative: torch.Tensor
    fractions: torch.Tensor

    def auc(self) -> dict[str, torch.Tensor]:
        """Area under each curve over the perturbed fraction (trapezoid rule), ``[B]`` each: in
        ``[0, 1]`` for ``deletion`` and ``insertion``, in percent for ``positive`` and ``negative``
        (the accuracy's area, as Chefer et al. report it)."""
        return {name: torch.trapezoid(getattr(self, name), self.fractions, dim=-1) * (100 if name in PERCENT else 1)
                for name in TESTS}


#: The four tests, and whether a faithful map makes each area high (True) or low.
TESTS: tuple[str, ...] = ("deletion", "insertion", "positive", "negative")
HIGHER_IS_BETTER: dict[str, bool] = {"deletion": False, "insertion": True, "positive": False, "negative": True}
PERCENT = ("positive", "negative")


def pool_per_patch(pixels: torch.Tensor, patch_size: tuple[int, int], reduce: Literal["sum", "mean"] = "sum") -> torch.Tensor:
    """Pixel maps ``[B, H, W]`` to one value per patch ``[B, H / ph, W / pw]``: summed (an
    attribution, whose sum is what the patch contributes) or averaged (a CAM) over each patch."""
    return F.avg_pool2d(pixels[:, None], patch_size, divisor_override=1 if reduce == "sum" else None)[:, 0]


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
    reference: torch.Tensor | None = None,
    steps: int | None = None,
    baseline: Baseline = "mean",
) -> PerturbationCurves:
    """Deletion, insertion, positive and negative perturbation curves of ``maps`` for ``model``.

    Args:
        model: ``[B, C, H, W]`` normalised images to ``[B, K]`` logits (in eval mode).
        images: ``[B, C, H, W]``.
        maps: one relevance per patch, ``[B, gh, gw]`` with ``gh = H / patch_size[0]``.
        patch_size: ``(ph, pw)`` of the model's patches.
        target: the class explained per image ``[B]``; default the model's prediction.
        reference: the class the positive and negative tests count as correct ``[B]`` (the
            true labels, when known); default ``target``.
        steps: perturbation steps (default one patch per step).
        baseline: what replaces a deleted patch (:func:`baseline_images`).

    Returns:
        :class:`PerturbationCurves`; step 0 is the unperturbed image (deletion, positive, negative)
        or the baseline alone (insertion).
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
    reference = target if reference is None else reference
    order = patch_order(maps)
    ranks = torch.empty_like(order).scatter_(1, order, torch.arange(patches).expand(batch, -1))  # rank of each patch
    fill = baseline_images(images, baseline)
    counts = [round(k * patches / steps) for k in range(steps + 1)]

    def curve(first_removed: Callable[[int], torch.Tensor], removed_from_image: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, steps + 1]`` target probability and 1 where the prediction is the reference."""
        probabilities, correct = [], []
        for count in counts:
            hidden = first_removed(count).view(batch, 1, *grid).float()  # 1: the patch shows the baseline
            if not removed_from_image:
                hidden = 1 - hidden  # insertion: the first `count` patches show the image
            mask = F.interpolate(hidden, scale_factor=(ph, pw), mode="nearest")
            logits = model(images * (1 - mask) + fill * mask).float()
            probabilities.append(logits.softmax(dim=-1).gather(1, target[:, None])[:, 0])
            correct.append((logits.argmax(dim=-1) == reference).float())
        return torch.stack(probabilities, dim=-1), torch.stack(correct, dim=-1)

    deletion, positive = curve(lambda count: ranks < count, True)
    insertion, _ = curve(lambda count: ranks < count, False)
    _, negative = curve(lambda count: ranks >= patches - count, True)
    return PerturbationCurves(
        deletion=deletion, insertion=insertion, positive=positive, negative=negative,
        fractions=torch.tensor(counts, dtype=torch.float32) / patches,
    )


def map_scores(
    model: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    maps: dict[str, torch.Tensor],
    patch_size: tuple[int, int],
    target: torch.Tensor,
    steps: int = SCORE_STEPS,
) -> dict[str, dict[str, torch.Tensor]]:
    """Deletion and insertion areas ``[B]`` of each named map ``[B, gh, gw]`` of ``images``
    ``[B, C, H, W]`` for class ``target`` ``[B]`` (mean baseline, ``steps`` steps, at most one per
    patch): the per-image scores ``vitkit maps`` and the explorer show, every map's curves in one batch."""
    count, patches = len(images), next(iter(maps.values()))[0].numel()
    areas = perturbation_curves(model, images.repeat(len(maps), 1, 1, 1), torch.cat(list(maps.values())), patch_size,
                                target.repeat(len(maps)), steps=min(steps, patches)).auc()
    return {name: {test: areas[test][k * count : (k + 1) * count] for test in ("deletion", "insertion")}
            for k, name in enumerate(maps)}

