"""The transformer's position-wise feed-forward network."""

from __future__ import annotations

from typing import Literal

import torch
from timm.layers import get_act_layer
from torch import nn

from ..kernels import linear_gelu
from .init_rules import xavier
from .parts import register_mlp

#: The MLP activations, by timm's names: exact GELU, CLIP's ``x * sigmoid(1.702 x)`` (OpenAI's
#: original CLIP models) and the tanh approximation of GELU (big_vision, SigLIP).
ActLayer = Literal["gelu", "quick_gelu", "gelu_tanh"]


@register_mlp("mlp")
class Mlp(nn.Module):
    """``Linear(D, hidden) -> activation -> Dropout -> Linear(hidden, D) -> Dropout``.

    Args:
        dim: token width ``D``.
        hidden_dim: inner width (``mlp_ratio * D`` in the blocks).
        drop: dropout after the activation and after the second projection.
        act_layer: the activation (:data:`ActLayer`, timm's layer of that name; exact GELU by default).
        device, dtype: where and in which dtype the parameters are created (as torch's layers).
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        drop: float = 0.0,
        *,
        act_layer: ActLayer = "gelu",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, device=device, dtype=dtype)
        self.act = get_act_layer(act_layer)()
        self.drop1 = nn.Dropout(drop) if drop > 0 else nn.Identity()
        self.fc2 = nn.Linear(hidden_dim, dim, device=device, dtype=dtype)
        self.drop2 = nn.Dropout(drop) if drop > 0 else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights and zero biases for both projections."""
        for fc in (self.fc1, self.fc2):
            xavier(fc, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., D] -> [..., D]``. In CPU inference ``fc1`` and an exact GELU run as one fused
        call (:mod:`vitkit.kernels.linear_gelu`: the same values, 1.05-1.14x the ViT-S/16 forward)."""
        if linear_gelu.fusable(x, self.fc1, self.act):
            return self.drop2(self.fc2(self.drop1(linear_gelu.linear_gelu(x, self.fc1))))
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))
