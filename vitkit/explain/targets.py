"""Which class an explanation explains: the target per image, and the error of a model without one."""

from __future__ import annotations

import torch

from ..errors import VitkitError

Target = int | torch.Tensor | None


class HeadlessModelError(VitkitError, ValueError):
    """A class to explain was asked of a model without a classifier (``num_classes=0``)."""


def resolve_targets(target: Target, logits: torch.Tensor) -> torch.Tensor:
    """``[B]`` class indices: the argmax of ``logits`` ``[B, K]`` when ``target`` is None, else
    ``target`` (an int or ``[B]`` indices) broadcast and range-checked."""
    batch, num_classes = logits.shape
    if target is None:
        return logits.argmax(dim=-1)
    targets = torch.as_tensor(target, dtype=torch.long, device=logits.device).reshape(-1).expand(batch)
    if targets.min() < 0 or targets.max() >= num_classes:
        raise ValueError(f"target class {target} is out of range for a model with {num_classes} classes.")
    return targets.clone()
