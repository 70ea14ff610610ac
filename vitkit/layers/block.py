"""Pre-norm transformer encoder block with stochastic depth and LayerScale."""

from __future__ import annotations

from typing import Literal, overload

import torch
from timm.layers import DropPath
from torch import nn

from ..kernels import AttnImpl
from .attention import DEFAULT_OUT_INIT_SCALE, MultiHeadSelfAttention
from .mlp import Mlp


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
        head_dim: per-head width; default ``dim // num_heads``.
        mlp_ratio: MLP hidden width / ``D``.
        qkv_bias, qk_norm, attn_drop, attn_impl, out_init_scale, locality: see ``MultiHeadSelfAttention``.
        proj_drop: dropout after the attention output projection and inside the MLP.
        drop_path: stochastic-depth rate of both residual branches (timm's ``DropPath``: a dropped
            sample's branch is zero, a kept one is divided by ``1 - drop_path``).
        init_values: LayerScale init; ``None`` disables LayerScale.
        norm_eps: LayerNorm epsilon (timm's ViTs use 1e-6).
        device, dtype: where and in which dtype the parameters are created (as torch's layers).
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
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= drop_path < 1.0:  # timm's DropPath does not check its rate
            raise ValueError(f"drop_path must lie in [0, 1), got {drop_path}.")
        factory = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, **factory)
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
            **factory,
        )
        self.ls1 = LayerScale(dim, init_values, **factory) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps, **factory)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop, **factory)
        self.ls2 = LayerScale(dim, init_values, **factory) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    @overload
    def forward(
        self,
        x: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        head_mask: torch.Tensor | None = None,
        return_attention: Literal[False] = False,
    ) -> torch.Tensor: ...

    @overload
    def forward(
        self,
        x: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        head_mask: torch.Tensor | None = None,
        return_attention: Literal[True],
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self,
        x: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        head_mask: torch.Tensor | None = None,
        return_attention: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``[B, N, D] -> [B, N, D]``; with ``return_attention`` also the ``[B, H, N, N]`` weights.

        ``attn_mask`` (True = may attend), ``key_padding_mask`` (``[B, N]``, True = padding),
        ``is_causal`` and ``head_mask`` (gates ``[H]`` or ``[B, H]``) go to the attention, as in
        :meth:`MultiHeadSelfAttention.forward`. A padded token is never attended to, so its values
        do not change the other tokens' outputs (its own output depends on them: ignore it).
        """
        attended = self.attn(
            self.norm1(x),
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            is_causal=is_causal,
            head_mask=head_mask,
            return_attention=return_attention,
        )
        weights = None
        if return_attention:
            attended, weights = attended
        x = x + self.drop_path1(self.ls1(attended))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return (x, weights) if return_attention else x
