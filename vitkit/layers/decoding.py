"""Causal self-attention with a KV cache, for incremental (token-by-token) decoding.

:class:`CausalSelfAttention` is :class:`~vitkit.layers.attention.AttentionBase` with a causal
mask aligned bottom-right (the queries are the last positions of the sequence) and an optional
:class:`KVCache`: each call appends its keys and values and attends to everything cached, so
decoding ``T`` tokens one at a time equals one causal pass over all ``T``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import AttentionBase
from .attention_masks import causal_mask, without_diagonal
from .positions import TokenPositions


@dataclass
class KVCache:
    """Keys and values of the positions decoded so far, each ``[B, H, T, d]``.

    Pass the same cache to successive calls of a :class:`CausalSelfAttention`; each call appends
    its own keys and values and attends to everything cached. With RoPE the keys are stored
    rotated (each by its own position), so earlier positions are never needed again.
    """

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k, v`` ``[B, H, n, d]`` and return all keys and values ``[B, H, T + n, d]``."""
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v


class CausalSelfAttention(AttentionBase):
    """Self-attention in which token ``i`` sees tokens ``0..i`` (and everything cached before
    them); construction as :class:`~vitkit.layers.attention.AttentionBase`."""

    def forward(
        self,
        x: torch.Tensor,
        *,
        kv_cache: KVCache | None = None,
        attn_bias: torch.Tensor | None = None,
        positions: TokenPositions | None = None,
        head_gates: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The next ``N`` tokens ``x`` ``[B, N, D]`` attend to the cached ones and to themselves, causally.

        Args:
            x: tokens ``[B, N, D]`` (one token per step when decoding, a chunk when prefilling).
            kv_cache: receives this call's keys and values; the queries attend to all of it.
            attn_bias: further mask or bias, broadcastable to ``[B, H, N, T + N]`` (``T`` cached).
            positions: with RoPE, the positions of ``x``'s tokens (their place in the whole sequence).
            head_gates: ``[H]`` or ``[B, H]`` multiplying each head's output before ``W_o``.
            need_weights: also return the post-softmax weights ``[B, H, N, T + N]``.
        """
        self.check_tokens(x)
        cached = len(kv_cache) if kv_cache is not None else 0
        if self.num_heads == 0:
            out, weights = self.no_heads(x, cached + x.shape[1], need_weights)
            return (out, weights) if need_weights else out  # type: ignore[return-value]
        q, k, v = self.project_qkv(x)
        q, k = self.rotate([self.q_norm(q), self.k_norm(k)], positions)  # the cache holds rotated keys
        if kv_cache is not None:
            k, v = kv_cache.extend(k, v)
        if self.locality:  # LSA: no token attends to itself, cached or not
            attn_bias = without_diagonal(attn_bias, x.shape[1], x.device, num_keys=k.shape[-2])
        causal = causal_mask(x.shape[1], k.shape[-2], x.device)
        if attn_bias is None or attn_bias.dtype == torch.bool:
            bias = causal if attn_bias is None else attn_bias.to(x.device) & causal
        else:
            bias = attn_bias.to(x.device).masked_fill(~causal, float("-inf"))
        out, weights = self.attend(q, k, v, bias, head_gates, need_weights)
        return (out, weights) if need_weights else out  # type: ignore[return-value]
