"""Statistics of post-softmax attention weights, shared by the head diagnostics and pruning."""

from __future__ import annotations

import math

import torch


def row_entropy(weights: torch.Tensor, *, normalize: bool = False) -> torch.Tensor:
    """Entropy of each query's attention distribution.

    Args:
        weights: post-softmax weights ``[..., N, M]`` (each row sums to 1).
        normalize: divide by ``log M``, the entropy of uniform attention, so rows lie in ``[0, 1]``.

    Returns:
        ``[..., N]``: in nats (``0 log 0 = 0``), or a fraction of ``log M`` with ``normalize``.
    """
    entropy = -torch.special.xlogy(weights, weights).sum(-1)
    return entropy / math.log(weights.shape[-1]) if normalize else entropy
