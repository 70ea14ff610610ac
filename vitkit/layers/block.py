"""Pre-norm transformer encoder block with stochastic depth and LayerScale."""

from __future__ import annotations

from typing import Any

import torch
from timm.layers import DropPath
from torch import nn

from .attention import AttentionOptions, MultiHeadSelfAttention
from .mlp import ActLayer, Mlp


class LayerScale(nn.Module):
    """Per-channel learnable scale of a residual branch (Touvron et al. 2021, CaiT,
    https://arxiv.org/abs/2103.17239), initialised to ``init_values``."""

    def __init__(
        self,
        dim: int,
        init_values: float,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.init_values = float(init_values)
        self.gamma = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every channel's scale to ``init_values``."""
        nn.init.constant_(self.gamma, self.init_values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., D] -> [..., D]``."""
        return x * self.gamma


class EncoderBlock(nn.Module):
    """``x + DropPath(LS(MSA(LN(x))))`` then ``x + DropPath(LS(MLP(LN(x))))``.

    Disabled features (LayerScale, DropPath) are ``nn.Identity()``: no branches in ``forward`` and
    the same state-dict keys as timm's ``Block`` (``norm1, attn.qkv, attn.proj, norm2, mlp.fc1,
    mlp.fc2``, ``ls1.gamma``).

    Args:
        dim: token width ``D``.
        num_heads: attention heads (may be 0 after pruning, with ``head_dim`` given).
        attn: the attention's options (:class:`~vitkit.layers.AttentionOptions`), handed to it
            unchanged; its ``proj_drop`` is also the MLP's dropout and its ``norm_eps`` the
            epsilon of the block's LayerNorms (timm's ViTs use 1e-6).
        mlp_ratio: MLP hidden width / ``D``.
        drop_path: stochastic-depth rate of both residual branches (timm's ``DropPath``: a dropped
            sample's branch is zero, a kept one is divided by ``1 - drop_path``).
        init_values: LayerScale init; ``None`` disables LayerScale.
        act_layer: the MLP's activation (:data:`~vitkit.layers.mlp.ActLayer`).
        device, dtype: where and in which dtype the parameters are created (as torch's layers).
        **attn_changes: :class:`~vitkit.layers.AttentionOptions` fields overriding ``attn``
            (``EncoderBlock(64, 4, qk_norm=True)``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attn: AttentionOptions | None = None,
        *,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        act_layer: ActLayer = "gelu",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **attn_changes: Any,
    ) -> None:
        super().__init__()
        if not 0.0 <= drop_path < 1.0:  # timm's DropPath does not check its rate
            raise ValueError(f"drop_path must lie in [0, 1), got {drop_path}.")
        attn = (attn or AttentionOptions()).replace(**attn_changes)
        factory = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, eps=attn.norm_eps, **factory)
        self.attn = MultiHeadSelfAttention(dim, num_heads, attn, **factory)
        self.ls1 = LayerScale(dim, init_values, **factory) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=attn.norm_eps, **factory)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=attn.proj_drop, act_layer=act_layer, **factory)
        self.ls2 = LayerScale(dim, init_values, **factory) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        head_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, N, D] -> [B, N, D]``.

        ``attn_mask`` (True = may attend), ``key_padding_mask`` (``[B, N]``, True = padding),
        ``is_causal``, ``head_mask`` (gates ``[H]`` or ``[B, H]``) and ``positions`` (RoPE: the
        ``(x, y)`` of the last ``n`` tokens, ``[n, 2]``) go to the attention, as in
        :meth:`MultiHeadSelfAttention.forward`. A padded token is never attended to, so its values
        do not change the other tokens' outputs (its own output depends on them: ignore it).
        """
        masks = {"attn_mask": attn_mask, "key_padding_mask": key_padding_mask, "is_causal": is_causal}
        return self._residuals(x, self.attn(self.norm1(x), head_mask=head_mask, positions=positions, **masks))

    def forward_with_attention(self, x: torch.Tensor, **masks: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` (same keyword arguments) that also returns the attention's post-softmax
        weights ``[B, H, N, N]``, part of the autograd graph. As a named method it skips this
        block's own forward hooks (its sub-modules' hooks run)."""
        attended, weights = self.attn.forward_with_attention(self.norm1(x), **masks)
        return self._residuals(x, attended), weights

    def _residuals(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Both residual branches, given the attention's output on ``norm1(x)``."""
        x = x + self.drop_path1(self.ls1(attended))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
