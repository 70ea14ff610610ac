"""Does a relevance map point at the object? Scores against ground-truth boxes.

* Pointing game (Zhang et al. 2016, https://arxiv.org/abs/1608.00507): a hit when the map's
  maximum lies inside the object's box.
* Mass in box: the share of the map's total mass that falls inside the box. A map that carries no
  information scores about the box's share of the image (``box_area``), the chance level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from ..models import VisionTransformer
from .maps import Method, explain


@dataclass
class LocalizationScores:
    """Per-image scores, each ``[B]``: ``pointing`` (bool), ``mass_in_box`` and ``box_area``
    (share of the image the box covers) in ``[0, 1]``."""

    pointing: torch.Tensor
    mass_in_box: torch.Tensor
    box_area: torch.Tensor

    def summary(self) -> dict[str, float]:
        """Means in percent: ``pointing_game``, ``mass_in_box``, ``box_area`` (chance level)."""
        return {
            "pointing_game": 100.0 * self.pointing.float().mean().item(),
            "mass_in_box": 100.0 * self.mass_in_box.mean().item(),
            "box_area": 100.0 * self.box_area.mean().item(),
        }


def box_masks(boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``[B, 4]`` pixel boxes ``(x0, y0, x1, y1)``, ``x1``/``y1`` exclusive, to ``[B, H, W]``
    boolean masks of an ``H x W`` image."""
    height, width = size
    ys = torch.arange(height, device=boxes.device)[None, :, None]
    xs = torch.arange(width, device=boxes.device)[None, None, :]
    x0, y0, x1, y1 = (boxes[:, i, None, None] for i in range(4))
    return (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)


def localization_scores(maps: torch.Tensor, boxes: torch.Tensor | list) -> LocalizationScores:
    """Score relevance maps against object boxes.

    Args:
        maps: ``[B, H, W]`` non-negative maps at image resolution (e.g. from ``explain``).
        boxes: ``[B, 4]`` ``(x0, y0, x1, y1)`` in pixels of the same image, ``x1``/``y1``
            exclusive (a list of 4-tuples works too).

    Returns:
        :class:`LocalizationScores`; the pointing game breaks ties by the first maximum in
        row-major order, and an all-zero map scores 0 mass.
    """
    boxes = torch.as_tensor(boxes, dtype=torch.float32, device=maps.device).reshape(-1, 4)
    if maps.dim() != 3 or len(boxes) != len(maps):
        raise ValueError(
            f"need maps [B, H, W] and boxes [B, 4] with the same B; got {tuple(maps.shape)} and {tuple(boxes.shape)}."
        )
    maps = maps.float()
    inside = box_masks(boxes, (maps.shape[1], maps.shape[2]))
    flat = maps.flatten(1)
    pointing = inside.flatten(1).gather(1, flat.argmax(dim=1, keepdim=True)).squeeze(1)
    mass = (maps * inside).flatten(1).sum(1) / flat.sum(1).clamp_min(torch.finfo(flat.dtype).tiny)
    area = inside.flatten(1).float().mean(1)
    return LocalizationScores(pointing=pointing, mass_in_box=mass, box_area=area)


def evaluate_localization(
    model: VisionTransformer,
    dataset: Dataset,
    boxes: torch.Tensor | Sequence,
    method: Method = "rollout",
    *,
    batch_size: int = 64,
    max_images: int | None = None,
    **map_options: Any,
) -> LocalizationScores:
    """Localisation scores of ``model``'s maps over ``dataset`` (e.g. ``ShapesDataset``, whose
    ``boxes`` are in pixels of the returned images).

    Args:
        model: a vitkit ``VisionTransformer`` in eval mode.
        dataset: yields ``(image [C, H, W], label)``.
        boxes: ``[len(dataset), 4]`` ``(x0, y0, x1, y1)``, ``x1``/``y1`` exclusive.
        method: ``"rollout"`` or ``"grad_rollout"`` (for the predicted class).
        batch_size: images per forward pass.
        max_images: score only the first ``max_images`` images.
        map_options: ``head_fusion``, ``discard_ratio`` (see :func:`~vitkit.explain.explain`).
    """
    count = len(dataset) if max_images is None else min(max_images, len(dataset))
    boxes = torch.as_tensor(boxes, dtype=torch.float32)[:count]
    parts: list[LocalizationScores] = []
    start = 0
    for images, _ in DataLoader(Subset(dataset, range(count)), batch_size=batch_size):
        maps = explain(model, images, method, **map_options)
        parts.append(localization_scores(maps, boxes[start : start + len(images)]))
        start += len(images)
    return LocalizationScores(
        pointing=torch.cat([p.pointing for p in parts]),
        mass_in_box=torch.cat([p.mass_in_box for p in parts]),
        box_area=torch.cat([p.box_area for p in parts]),
    )
