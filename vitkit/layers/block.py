"""Pre-norm transformer encoder block with stochastic depth and LayerScale."""

from __future__ import annotations

import torch
from torch import nn

from .attention import DEFAULT_OUT_INIT_SCALE, MultiHeadSelfAttention
from .attention_kernels import AttnImpl
from .drop_path import DropPath
from .mlp import Mlp


class LayerScale(nn.Module):
    """Per-channel learnable scale of a residual branch (Touvron et al. 2021, CaiT,
    https://arxiv.org/abs/2103.17239), initialised to ``init_values``."""

    def __init__(self, dim: int, init_values: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

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
        head_dim: per-head width; default ``dim // num_heads``.
        mlp_ratio: MLP hidden width / ``D``.
        qkv_bias, qk_norm, attn_drop, attn_impl, out_init_scale, locality: see ``MultiHeadSelfAttention``.
        proj_drop: dropout after the attention output projection and inside the MLP.
        drop_path: stochastic-depth rate of both residual branches.
        init_values: LayerScale init; ``None`` disables LayerScale.
        norm_eps: LayerNorm epsilon (timm's ViTs use 1e-6).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        attn_impl: AttnImpl = "auto",
        out_init_scale: float = DEFAULT_OUT_INIT_SCALE,
        norm_eps: float = 1e-6,
        locality: bool = False,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = MultiHeadSelfAttention(
            dim,
            num_heads,
            head_dim=head_dim,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            qk_norm=qk_norm,
            attn_impl=attn_impl,
            out_init_scale=out_init_scale,
            norm_eps=norm_eps,
            locality=locality,
        )
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        *,
        head_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        return_attention: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``[B, N, D] -> [B, N, D]``; with ``return_attention`` also the ``[B, H, N, N]`` weights.

        ``head_mask`` (``[H]`` or ``[B, H]``) and ``attn_mask`` are passed to the attention.
        """
        attended = self.attn(self.norm1(x), attn_mask=attn_mask, head_mask=head_mask, return_attention=return_attention)
        weights = None
        if return_attention:
            attended, weights = attended
        x = x + self.drop_path1(self.ls1(attended))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return (x, weights) if return_attention else x
