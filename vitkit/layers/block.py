"""Pre-norm transformer encoder block with stochastic depth and LayerScale."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from timm.layers import DropPath
from torch import nn

from .attention import AttentionBase, AttentionOptions, MultiHeadSelfAttention
from .mlp import ActLayer, Mlp
from .parts import get_part, register_block
from .positions import TokenPositions

#: A merge between a block's attention and its MLP (token merging, :mod:`.token_merging`): the tokens
#: ``[B, N, D]`` after the attention's residual and the metric ``[B, N, C]`` they are matched on (the
#: attention's keys, ``need_keys``) to the merged tokens ``[B, N - r, D]``.
TokenMerge = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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


@register_block("encoder")
class EncoderBlock(nn.Module):
    """``x + DropPath(LS(Attn(LN(x))))`` then ``x + DropPath(LS(MLP(LN(x))))``.

    Disabled features (LayerScale, DropPath) are ``nn.Identity()``: no branches in ``forward`` and
    the same state-dict keys as timm's ``Block`` (``norm1, attn.qkv, attn.proj, norm2, mlp.fc1,
    mlp.fc2``, ``ls1.gamma``).

    Args:
        dim: token width ``D``.
        num_heads: attention heads (may be 0 after pruning, with ``head_dim`` given).
        attention_options: the attention's options (:class:`~vitkit.layers.AttentionOptions`),
            handed to it unchanged; its ``proj_drop`` is also the MLP's dropout and its
            ``norm_eps`` the epsilon of the block's LayerNorms (timm's ViTs use 1e-6).
        mlp_ratio: MLP hidden width / ``D``.
        drop_path: stochastic-depth rate of both residual branches (timm's ``DropPath``: a dropped
            sample's branch is zero, a kept one is divided by ``1 - drop_path``).
        init_values: LayerScale init; ``None`` disables LayerScale.
        act_layer: the MLP's activation (:data:`~vitkit.layers.mlp.ActLayer`).
        attn_layer: the attention class, or its registered name (:mod:`.parts`); default
            :class:`~vitkit.layers.MultiHeadSelfAttention`.
        mlp_layer: the MLP class, or its registered name; default :class:`~vitkit.layers.Mlp`.
        device, dtype: where and in which dtype the parameters are created (as torch's layers).
        **attn_changes: :class:`~vitkit.layers.AttentionOptions` fields overriding
            ``attention_options`` (``EncoderBlock(64, 4, qk_norm=True)``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention_options: AttentionOptions | None = None,
        *,
        mlp_ratio: float = 4.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        act_layer: ActLayer = "gelu",
        attn_layer: type[AttentionBase] | str = MultiHeadSelfAttention,
        mlp_layer: type[nn.Module] | str = Mlp,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **attn_changes: Any,
    ) -> None:
        super().__init__()
        if not 0.0 <= drop_path < 1.0:  # timm's DropPath does not check its rate
            raise ValueError(f"drop_path must lie in [0, 1), got {drop_path}.")
        options = (attention_options or AttentionOptions()).replace(**attn_changes)
        attn_cls = get_part("attention", attn_layer) if isinstance(attn_layer, str) else attn_layer
        mlp_cls = get_part("mlp", mlp_layer) if isinstance(mlp_layer, str) else mlp_layer
        factory = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, eps=options.norm_eps, **factory)
        self.attn = attn_cls(dim, num_heads, options, **factory)
        self.ls1 = LayerScale(dim, init_values, **factory) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=options.norm_eps, **factory)
        self.mlp = mlp_cls(dim, int(dim * mlp_ratio), drop=options.proj_drop, act_layer=act_layer, **factory)
        self.ls2 = LayerScale(dim, init_values, **factory) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        *,
        attn_bias: torch.Tensor | None = None,
        positions: TokenPositions | None = None,
        head_gates: torch.Tensor | None = None,
        need_weights: bool = False,
        merge: TokenMerge | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``[B, N, D] -> [B, N, D]``; with ``need_weights`` also the attention's post-softmax
        weights ``[B, H, N, N]`` (part of the autograd graph).

        ``attn_bias`` (boolean mask or additive bias), ``positions`` (the tokens' positions, for RoPE) and
        ``head_gates`` (``[H]`` or ``[B, H]``) go to the attention, as in
        :meth:`MultiHeadSelfAttention.forward`. A token no query may attend to never changes the
        other tokens' outputs (its own output depends on them: ignore it). With ``merge`` (token
        merging, ToMe's ``ToMeBlock``), the tokens are merged on the attention's keys between the
        two branches, and the block returns ``[B, N - r, D]``.
        """
        kwargs = {"attn_bias": attn_bias, "positions": positions, "head_gates": head_gates, "need_weights": need_weights}
        if merge is None:
            attended = self.attn(self.norm1(x), **kwargs)
            attended, weights = attended if need_weights else (attended, None)
            x = x + self.drop_path1(self.ls1(attended))
        else:
            attended, weights, keys = self.attn(self.norm1(x), need_keys=True, **kwargs)
            x = merge(x + self.drop_path1(self.ls1(attended)), keys)
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return (x, weights) if need_weights else x
