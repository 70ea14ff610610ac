"""Stochastic depth (Huang et al. 2016, https://arxiv.org/abs/1603.09382)."""

from __future__ import annotations

import torch
from torch import nn


class DropPath(nn.Module):
    """Drop a residual branch per sample with probability ``drop_prob`` during training.

    Kept samples are divided by the keep probability, so the expected output equals the input;
    in eval mode the module is the identity. Blocks use ``nn.Identity()`` when the rate is 0.
    """

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        if not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"drop_prob must lie in [0, 1), got {drop_prob}.")
        self.drop_prob = drop_prob

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` of shape ``[B, ...]``; one keep/drop decision per sample."""
        if not self.training or self.drop_prob == 0.0:
            return x
        keep_prob = 1.0 - self.drop_prob
        keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep_prob)
        return x * keep.div_(keep_prob)
