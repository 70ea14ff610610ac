"""Multi-head cross-attention: queries from one sequence, keys and values from another.

:class:`CrossAttention` shares :class:`~vitkit.layers.attention.AttentionBase` with the ViT's
self-attention (one fused ``qkv`` projection whose query rows read ``x`` and key/value rows read
``context``, so a self-attention's weights load into it unchanged), and with it the mask contract,
head gates, head pruning, LSA temperatures, RoPE and the kernel dispatch.
"""

from __future__ import annotations

import torch
from einops import rearrange

from .attention import AttentionBase
from .lora import linear_rows
from .positions import TokenPositions


class CrossAttention(AttentionBase):
    """Attend from the tokens of ``x`` to those of ``context`` (construction as
    :class:`~vitkit.layers.attention.AttentionBase`)."""

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        *,
        attn_bias: torch.Tensor | None = None,
        positions: TokenPositions | None = None,
        context_positions: TokenPositions | None = None,
        head_gates: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[B, N, D]`` attends to ``context`` ``[B, M, D]``.

        Args:
            x: the queries' tokens ``[B, N, D]``.
            context: the keys' and values' tokens ``[B, M, D]``.
            attn_bias: boolean mask (True = may attend) or additive float bias, broadcastable to
                ``[B, H, N, M]``.
            positions, context_positions: with RoPE, the positions of ``x``'s and of ``context``'s tokens,
                by which the queries and the keys are rotated.
            head_gates: ``[H]`` or ``[B, H]`` multiplying each head's output before ``W_o``.
            need_weights: also return the post-softmax weights ``[B, H, N, M]``.

        Returns:
            ``[B, N, D]``, or the pair (output, weights) with ``need_weights``.
        """
        self.check_tokens(x, "x")
        self.check_tokens(context, "context")
        if self.num_heads == 0:
            out, weights = self.no_heads(x, context.shape[1], need_weights)
        else:
            inner = self.num_heads * self.head_dim
            q = self.split_heads(linear_rows(self.qkv, x, slice(None, inner)))  # a LoRA adapter's update included
            kv = linear_rows(self.qkv, context, slice(inner, None))
            k, v = rearrange(kv, "b m (two h d) -> two b h m d", two=2, h=self.num_heads).unbind(0)
            (q,) = self.rotate([self.q_norm(q)], positions, "positions")
            (k,) = self.rotate([self.k_norm(k)], context_positions, "context_positions")
            out, weights = self.attend(q, k, v, attn_bias, head_gates, need_weights)
        return (out, weights) if need_weights else out  # type: ignore[return-value]
