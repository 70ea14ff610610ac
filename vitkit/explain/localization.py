"""Does a relevance map point at the object? Scores against ground-truth boxes.

* Pointing game (Zhang et al. 2016, https://arxiv.org/abs/1608.00507): the map explains the
  ground-truth class, and it is a hit when its maximum lies within a tolerance of the object's box
  (TorchRay's benchmark uses 15 pixels at 224 px; :func:`pointing_tolerance` scales that to the
  image size: 2 px at 32 px).
* Mass in box: the share of the map's total mass that falls inside the box. A map that carries no
  information scores about the box's share of the image (``box_area``), the chance level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

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


#: TorchRay's pointing-game tolerance (pixels) for 224-px images.
TORCHRAY_TOLERANCE_PX = 15.0


def pointing_tolerance(image_size: tuple[int, int]) -> float:
    """TorchRay's 15 px at 224 px, scaled to the shorter side of ``image_size`` and rounded."""
    return float(round(TORCHRAY_TOLERANCE_PX * min(image_size) / 224))


def localization_scores(maps: torch.Tensor, boxes: torch.Tensor | list, tolerance: float = 0.0) -> LocalizationScores:
    """Score relevance maps against object boxes.

    Args:
        maps: ``[B, H, W]`` non-negative maps at image resolution (e.g. from ``explain``).
        boxes: ``[B, 4]`` ``(x0, y0, x1, y1)`` in pixels of the same image, ``x1``/``y1``
            exclusive (a list of 4-tuples works too).
        tolerance: a pointing-game hit when the maximum's pixel is within this Euclidean
            distance (pixels) of the box; 0: inside it.

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
    peak = flat.argmax(dim=1)
    peak_y, peak_x = (peak // maps.shape[2]).float(), (peak % maps.shape[2]).float()
    x0, y0, x1, y1 = boxes.unbind(1)
    dx = torch.clamp(torch.maximum(x0 - peak_x, peak_x - (x1 - 1)), min=0.0)
    dy = torch.clamp(torch.maximum(y0 - peak_y, peak_y - (y1 - 1)), min=0.0)
    pointing = dx.square() + dy.square() <= tolerance**2
    mass = (maps * inside).flatten(1).sum(1) / flat.sum(1).clamp_min(torch.finfo(flat.dtype).tiny)
    area = inside.flatten(1).float().mean(1)
    return LocalizationScores(pointing=pointing, mass_in_box=mass, box_area=area)


def evaluate_localization(
    model: VisionTransformer,
    dataset: Dataset,
    boxes: torch.Tensor | Sequence,
    method: Method = "rollout",
    *,
    explain_class: Literal["label", "predicted"] = "label",
    tolerance: float = 0.0,
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
        method: any :data:`~vitkit.explain.METHODS` map but ``"heads"``.
        explain_class: the gradient methods explain each image's ground-truth ``"label"`` (the
            pointing game's protocol) or the model's ``"predicted"`` class.
        tolerance: pointing-game tolerance in pixels (see :func:`localization_scores`).
        batch_size: images per forward pass.
        max_images: score only the first ``max_images`` images.
        map_options: ``head_fusion``, ``discard_ratio`` (see :func:`~vitkit.explain.explain`).
    """
    count = len(dataset) if max_images is None else min(max_images, len(dataset))
    boxes = torch.as_tensor(boxes, dtype=torch.float32)[:count]
    parts: list[LocalizationScores] = []
    start = 0
    for images, labels in DataLoader(Subset(dataset, range(count)), batch_size=batch_size):
        target = labels if explain_class == "label" else None
        maps = explain(model, images, method, target, **map_options)
        parts.append(localization_scores(maps, boxes[start : start + len(images)], tolerance))
        start += len(images)
    return LocalizationScores(
        pointing=torch.cat([p.pointing for p in parts]),
        mass_in_box=torch.cat([p.mass_in_box for p in parts]),
        box_area=torch.cat([p.box_area for p in parts]),
    )
