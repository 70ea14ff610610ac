"""Attention kernels and the policy that picks one.

Two exact implementations of ``softmax(q k^T / sqrt(d)) v`` are available:

* ``"sdpa"``: :func:`torch.nn.functional.scaled_dot_product_attention` (flash / memory-efficient
  kernels). Never materialises the weights.
* ``"explicit"``: matmul, masked softmax, matmul. Materialises the ``[B, H, N, M]`` weights, which
  it can return (attention maps, rollout) and to which attention dropout is applied.

``"auto"`` picks the faster one per call. Measured on a 2-core AMX CPU (torch 2.14, head_dim 64,
``python tools/benchmark.py --sections kernels``; table in the README): in float32 SDPA wins
(1.4-2.2x), while for bfloat16/float16 activations the explicit path wins, by 1.5-2.1x in
inference and 1.9-5x in training, where SDPA's reduced-precision CPU backward is slow. On CUDA and
every other device SDPA is used.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

AttnImpl = Literal["auto", "sdpa", "explicit"]
ATTN_IMPLS: tuple[str, ...] = ("auto", "sdpa", "explicit")


def choose_attn_impl(impl: AttnImpl, q: torch.Tensor, need_weights: bool) -> str:
    """Resolve ``impl`` to ``"sdpa"`` or ``"explicit"`` for this call.

    Args:
        impl: the requested implementation; ``"auto"`` applies the measured policy above.
        q: queries ``[B, H, N, d]`` (their device and dtype decide the policy).
        need_weights: the caller wants the post-softmax weights, which only "explicit" produces.
    """
    if need_weights or impl == "explicit":
        return "explicit"
    if impl == "auto" and q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        return "explicit"
    return "sdpa"


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    dropout_p: float,
    scale: float,
) -> torch.Tensor:
    """Fused attention. ``allowed`` is a boolean mask broadcastable to ``[B, H, N, M]`` (True = may
    attend) in which every query row has at least one allowed key. Returns ``[B, H, N, d]``."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, scale=scale)


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    dropout_p: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialised attention with the same contract as :func:`sdpa_attention`.

    Returns:
        ``(out [B, H, N, d], weights [B, H, N, M])``; ``weights`` are post-softmax and taken
        before dropout, which is applied to the copy that multiplies ``v``.
    """
    scores = (q * scale) @ k.transpose(-2, -1)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(dim=-1)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    return dropped @ v, weights
