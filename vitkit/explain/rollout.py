"""Attention rollout and gradient rollout: relevance maps from captured attention weights.

Rollout (Abnar & Zuidema 2020, https://arxiv.org/abs/2005.00928) treats each layer's head-fused
attention, with the residual connection added as the identity, ``A_l = norm_rows((F_l + I) / 2)``,
as a row-stochastic token-to-token mixing matrix (row ``i`` = query token ``i``). The joint
attention after layer ``l`` is ``J_l = A_l · J_{l-1}`` with ``J_1 = A_1``; the class token's row of
``J_L`` over the patch tokens is the map. Rows are normalised, not columns: vit-explain's column
normalisation (``a / a.sum(dim=-1)`` broadcast over the wrong axis) is a known bug.

Gradient rollout (vit-explain's ``grad_rollout``, after Chefer et al. 2021,
https://arxiv.org/abs/2012.09838) fuses the heads as ``mean_h(A ⊙ ∂y_c/∂A)`` with negatives
clipped, so only attention that raises the target logit ``y_c`` counts.

All functions are pure: batched, computed in float32 whatever the input dtype (bf16 included),
inputs never modified.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

HeadFusion = Literal["mean", "max", "min"]
HEAD_FUSIONS: tuple[str, ...] = ("mean", "max", "min")


def fuse_heads(attention: torch.Tensor, head_fusion: HeadFusion = "mean") -> torch.Tensor:
    """``[B, H, N, N]`` weights to ``[B, N, N]`` float32 by ``mean``, ``max`` or ``min`` over heads."""
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}.")
    attention = attention.float()
    if head_fusion == "mean":
        return attention.mean(dim=1)
    return attention.amax(dim=1) if head_fusion == "max" else attention.amin(dim=1)


def discard_smallest(fused: torch.Tensor, discard_ratio: float, keep_cls_self: bool) -> torch.Tensor:
    """Zero the ``k = int(N·N·discard_ratio)`` smallest entries of each ``[N, N]`` matrix.

    Args:
        fused: ``[B, N, N]``.
        discard_ratio: share of entries to drop, in ``[0, 1)``.
        keep_cls_self: keep entry ``[0, 0]`` (class token to itself) even when it is among the
            ``k`` smallest, in which case only ``k - 1`` entries are zeroed.

    Returns:
        A new ``[B, N, N]`` tensor. Ties are broken by position (stable sort), so an image gives
        the same result alone or in a batch.
    """
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must lie in [0, 1), got {discard_ratio}.")
    batch, n, _ = fused.shape
    k = int(n * n * discard_ratio)
    if k == 0:
        return fused.clone()
    flat = fused.reshape(batch, n * n)
    smallest = flat.sort(dim=-1, stable=True).indices[:, :k]
    drop = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, smallest, True)
    if keep_cls_self:
        drop[:, 0] = False
    return flat.masked_fill(drop, 0.0).reshape(batch, n, n)


def add_residual_and_normalize(fused: torch.Tensor) -> torch.Tensor:
    """``(F + I) / 2`` with every row scaled to sum 1 (a row summing to 0 stays 0), ``[B, N, N]``."""
    eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    mixed = (fused + eye) / 2
    return mixed / mixed.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(mixed.dtype).tiny)


def chain_and_read_out(layers: Sequence[torch.Tensor], num_prefix_tokens: int) -> torch.Tensor:
    """Multiply per-layer ``[B, N, N]`` mixing matrices first to last and read the map.

    The joint matrix is ``A_L ··· A_2 · A_1``; the read-out is the class token's row over the
    patch tokens (without prefix tokens, where the head averages all tokens, the mean of all
    rows), divided by its maximum per image. A map with no mass on the patches is all zeros.

    Returns:
        ``[B, N - num_prefix_tokens]`` float32 maps in ``[0, 1]``.
    """
    joint = layers[0]
    with torch.autocast(joint.device.type, enabled=False):  # an enclosing autocast would use bf16
        for layer in layers[1:]:
            joint = layer @ joint
    rows = joint[:, 0] if num_prefix_tokens > 0 else joint.mean(dim=1)
    patches = rows[:, num_prefix_tokens:]
    return patches / patches.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(patches.dtype).tiny)


def _check_stack(attentions: Sequence[torch.Tensor], num_prefix_tokens: int, name: str = "attentions") -> None:
    if len(attentions) == 0:
        raise ValueError(
            f"{name} is empty: pass one [B, H, N, N] tensor per block (forward(x, return_attention=True))."
        )
    for index, attention in enumerate(attentions):
        if attention.dim() != 4 or attention.shape[-1] != attention.shape[-2]:
            raise ValueError(f"{name}[{index}] must have shape [B, H, N, N], got {tuple(attention.shape)}.")
        if attention.shape[-1] <= num_prefix_tokens:
            raise ValueError(
                f"{name}[{index}] has {attention.shape[-1]} tokens, not more than "
                f"num_prefix_tokens={num_prefix_tokens}."
            )


def attention_rollout(
    attentions: Sequence[torch.Tensor],
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Attention rollout of a stack of post-softmax attention weights.

    Args:
        attentions: one ``[B, H, N, N]`` tensor per block, in forward order; token 0 is the class
            token when ``num_prefix_tokens > 0``.
        head_fusion: ``"mean"``, ``"max"`` or ``"min"`` over the heads.
        discard_ratio: zero this share of each fused matrix's smallest entries (the class token's
            attention to itself is always kept) before adding the identity.
        num_prefix_tokens: tokens before the patches (1 for a class token, 0 for none).

    Returns:
        ``[B, N - num_prefix_tokens]`` maps, float32, each divided by its own maximum.
    """
    _check_stack(attentions, num_prefix_tokens)
    layers = [
        add_residual_and_normalize(discard_smallest(fuse_heads(a, head_fusion), discard_ratio, num_prefix_tokens > 0))
        for a in attentions
    ]
    return chain_and_read_out(layers, num_prefix_tokens)


def grad_rollout(
    attentions: Sequence[torch.Tensor],
    gradients: Sequence[torch.Tensor],
    discard_ratio: float = 0.0,
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Gradient-weighted rollout: per layer ``F = relu(mean_h(A ⊙ G))``, then as rollout.

    Args:
        attentions: one ``[B, H, N, N]`` tensor per block, in forward order.
        gradients: ``gradients[l]`` = ∂(target logit)/∂``attentions[l]``, same shapes.
        discard_ratio: zero this share of each fused matrix's smallest entries (no exemption).
        num_prefix_tokens: tokens before the patches.

    Returns:
        ``[B, N - num_prefix_tokens]`` maps, float32, each divided by its own maximum.
    """
    _check_stack(attentions, num_prefix_tokens)
    _check_stack(gradients, num_prefix_tokens, "gradients")
    if len(gradients) != len(attentions):
        raise ValueError(f"need one gradient per attention tensor: got {len(gradients)} for {len(attentions)} blocks.")
    for index, (attention, gradient) in enumerate(zip(attentions, gradients)):
        if attention.shape != gradient.shape:
            raise ValueError(
                f"gradients[{index}] has shape {tuple(gradient.shape)} but attentions[{index}] has "
                f"{tuple(attention.shape)}; each gradient must belong to its own block's attention."
            )
    fused = [(a.float() * g.float()).mean(dim=1).clamp_min(0.0) for a, g in zip(attentions, gradients)]
    layers = [add_residual_and_normalize(discard_smallest(f, discard_ratio, keep_cls_self=False)) for f in fused]
    return chain_and_read_out(layers, num_prefix_tokens)


def per_head_maps(attentions: Sequence[torch.Tensor], layer: int, num_prefix_tokens: int = 1) -> torch.Tensor:
    """Each head's class-token attention over the patch tokens in block ``layer``.

    Args:
        attentions: one ``[B, H, N, N]`` tensor per block.
        layer: block index (negative counts from the end).
        num_prefix_tokens: tokens before the patches; with none, the mean of all query rows.

    Returns:
        ``[B, H, N - num_prefix_tokens]`` float32 raw attention weights.
    """
    _check_stack(attentions, num_prefix_tokens)
    if not -len(attentions) <= layer < len(attentions):
        raise ValueError(f"layer {layer} is out of range for a model with {len(attentions)} blocks.")
    attention = attentions[layer].float()
    rows = attention[:, :, 0] if num_prefix_tokens > 0 else attention.mean(dim=2)
    return rows[:, :, num_prefix_tokens:].clone()
