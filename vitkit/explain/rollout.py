"""Attention rollout and gradient rollout: relevance maps from captured attention weights.

Rollout (Abnar & Zuidema 2020, https://arxiv.org/abs/2005.00928) treats each layer's head-fused
attention, with the residual connection added as the identity, ``A_l = norm_rows((F_l + I) / 2)``,
as a row-stochastic token-to-token mixing matrix (row ``i`` = query token ``i``). The joint
attention after layer ``l`` is ``J_l = A_l · J_{l-1}`` with ``J_1 = A_1``. Rows are normalised,
not columns: vit-explain's column normalisation (``a / a.sum(dim=-1)`` broadcast over the wrong
axis) is a known bug.

Gradient rollout is vit-explain's ``grad_rollout`` (jacobgil/vit-explain): the heads are fused as
``relu(mean_h(A ⊙ ∂y_c/∂A))`` (head mean *before* the ReLU), then rolled out like attention
(identity added, rows renormalised). Chefer et al. 2021 ("Generic Attention-model
Explainability", https://arxiv.org/abs/2103.15679) instead take ``cam = mean_h(relu(∂y_c/∂A ⊙ A))``
(ReLU *before* the head mean) and accumulate ``R = R + cam · R`` from ``R = I`` without
renormalising (:func:`chefer_relevance`). The two differ when heads disagree: a head whose
gradient-weighted attention is negative cancels a positive one in vit-explain's mean, while
Chefer's ReLU drops it first.

Read-out (:func:`read_out`) follows the classifier's pooling: the class token's row for token
pooling, the mean of the patch tokens' rows for average pooling (and when there is no class
token), and for a distilled model (DeiT, whose prediction averages the class head's and the
distillation head's logits) the mean of the class and distillation tokens' rows, each
restricted to the patch columns. A block whose heads were all pruned is the identity
(only its residual path remains): rollout uses ``I`` for it and the gradient methods skip it.

All functions are pure: batched, computed in float32 whatever the input dtype (bf16 included),
inputs never modified.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch

HeadFusion = Literal["mean", "max", "min"]
HEAD_FUSIONS: tuple[str, ...] = get_args(HeadFusion)
Pooling = Literal["token", "avg", "distilled"]
POOLINGS: tuple[str, ...] = get_args(Pooling)


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


def prefix_rows(matrix: torch.Tensor, num_prefix_tokens: int, pooling: Pooling) -> torch.Tensor:
    """The query rows (dimension ``-2``) of ``[..., N, N]`` that the classifier reads, combined as
    it pools, over all ``N`` columns: ``[..., N]``.

    ``'token'`` is the class token's row; ``'distilled'`` the mean of the class and distillation
    tokens' rows (tokens 0 and 1: DeiT averages the two heads' logits); ``'avg'`` the mean of the
    patch tokens' rows (all rows when there is no prefix token).
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}.")
    if pooling == "token" and num_prefix_tokens == 0:
        raise ValueError("token pooling needs a class token (num_prefix_tokens >= 1); use pooling='avg'.")
    if pooling == "distilled" and num_prefix_tokens < 2:
        raise ValueError("distilled pooling reads the class and distillation tokens (num_prefix_tokens >= 2); "
                         "use pooling='token' or 'avg'.")
    if pooling == "token":
        return matrix[..., 0, :]
    if pooling == "distilled":
        return matrix[..., :2, :].mean(dim=-2)
    return matrix[..., num_prefix_tokens:, :].mean(dim=-2)


def read_out(joint: torch.Tensor, num_prefix_tokens: int, pooling: Pooling) -> torch.Tensor:
    """The rows of a ``[B, N, N]`` token-to-token matrix that the classifier reads
    (:func:`prefix_rows`), over the patches. Each map is divided by its maximum; a map with no
    mass on the patches is all zeros.

    Returns:
        ``[B, N - num_prefix_tokens]`` float32.
    """
    patches = prefix_rows(joint, num_prefix_tokens, pooling)[:, num_prefix_tokens:]
    return patches / patches.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(patches.dtype).tiny)


def chain_and_read_out(layers: Sequence[torch.Tensor], num_prefix_tokens: int, pooling: Pooling) -> torch.Tensor:
    """Multiply per-layer ``[B, N, N]`` mixing matrices first to last (``A_L ··· A_2 · A_1``) and
    :func:`read_out` the joint matrix: ``[B, N - num_prefix_tokens]`` maps in ``[0, 1]``."""
    joint = layers[0]
    with torch.autocast(joint.device.type, enabled=False):  # an enclosing autocast would use bf16
        for layer in layers[1:]:
            joint = layer @ joint
    return read_out(joint, num_prefix_tokens, pooling)


def _identity_like(attention: torch.Tensor) -> torch.Tensor:
    """``[B, N, N]`` float32 identities for a ``[B, H, N, N]`` attention tensor."""
    batch, _, n, _ = attention.shape
    return torch.eye(n, device=attention.device).expand(batch, n, n)


def _pooling_for(num_prefix_tokens: int, pooling: Pooling | None) -> Pooling:
    return pooling if pooling is not None else ("token" if num_prefix_tokens > 0 else "avg")


def _check_stack(attentions: Sequence[torch.Tensor], num_prefix_tokens: int, name: str = "attentions") -> None:
    if len(attentions) == 0:
        raise ValueError(
            f"{name} is empty: pass one [B, H, N, N] tensor per block "
            "(model.forward_intermediates(x, return_attention=True).attentions)."
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
    pooling: Pooling | None = None,
) -> torch.Tensor:
    """Attention rollout of a stack of post-softmax attention weights.

    Args:
        attentions: one ``[B, H, N, N]`` tensor per block, in forward order; token 0 is the class
            token when ``num_prefix_tokens > 0``.
        head_fusion: ``"mean"``, ``"max"`` or ``"min"`` over the heads.
        discard_ratio: zero this share of each fused matrix's smallest entries (the class token's
            attention to itself is always kept) before adding the identity.
        num_prefix_tokens: tokens before the patches (1 for a class token, 0 for none).
        pooling: the model's ``global_pool`` (see :func:`read_out`); ``None``: token pooling
            with a class token, average pooling without.

    Returns:
        ``[B, N - num_prefix_tokens]`` maps, float32, each divided by its own maximum. Blocks
        without heads (all pruned) count as the identity.
    """
    _check_stack(attentions, num_prefix_tokens)
    layers = [
        _identity_like(a) if a.shape[1] == 0 else
        add_residual_and_normalize(discard_smallest(fuse_heads(a, head_fusion), discard_ratio, num_prefix_tokens > 0))
        for a in attentions
    ]
    return chain_and_read_out(layers, num_prefix_tokens, _pooling_for(num_prefix_tokens, pooling))


def grad_rollout(
    attentions: Sequence[torch.Tensor],
    gradients: Sequence[torch.Tensor],
    discard_ratio: float = 0.0,
    num_prefix_tokens: int = 1,
    pooling: Pooling | None = None,
) -> torch.Tensor:
    """vit-explain's gradient rollout: per layer ``F = relu(mean_h(A ⊙ G))``, then as rollout.

    Args:
        attentions: one ``[B, H, N, N]`` tensor per block, in forward order.
        gradients: ``gradients[l]`` = ∂(target logit)/∂``attentions[l]``, same shapes.
        discard_ratio: zero this share of each fused matrix's smallest entries (no exemption).
        num_prefix_tokens: tokens before the patches.
        pooling: the model's ``global_pool`` (see :func:`attention_rollout`).

    Returns:
        ``[B, N - num_prefix_tokens]`` maps, float32, each divided by its own maximum. Blocks
        without heads count as the identity (the same as skipping them).
    """
    _check_pairs(attentions, gradients, num_prefix_tokens)
    layers = [
        _identity_like(a) if a.shape[1] == 0 else add_residual_and_normalize(
            discard_smallest((a.float() * g.float()).mean(dim=1).clamp_min(0.0), discard_ratio, keep_cls_self=False)
        )
        for a, g in zip(attentions, gradients)
    ]
    return chain_and_read_out(layers, num_prefix_tokens, _pooling_for(num_prefix_tokens, pooling))


def chefer_relevance(
    attentions: Sequence[torch.Tensor],
    gradients: Sequence[torch.Tensor],
    num_prefix_tokens: int = 1,
    pooling: Pooling | None = None,
) -> torch.Tensor:
    """Chefer et al. 2021 relevance (arXiv 2103.15679, Eq. 5-6 for self-attention encoders).

    For each block in forward order: ``cam = mean_h(relu(G ⊙ A))`` and ``R = R + cam · R``,
    from ``R = I``, with no row renormalisation; then :func:`read_out` by ``pooling``.

    Args:
        attentions: one ``[B, H, N, N]`` tensor per block, in forward order.
        gradients: ∂(target logit)/∂``attentions[l]``, same shapes.
        num_prefix_tokens: tokens before the patches.
        pooling: the model's ``global_pool`` (see :func:`attention_rollout`).

    Returns:
        ``[B, N - num_prefix_tokens]`` maps, float32, each divided by its own maximum. Blocks
        without heads leave ``R`` unchanged.
    """
    _check_pairs(attentions, gradients, num_prefix_tokens)
    relevance = _identity_like(attentions[0]).clone()
    with torch.autocast(relevance.device.type, enabled=False):
        for attention, gradient in zip(attentions, gradients):
            if attention.shape[1] == 0:
                continue
            cam = (gradient.float() * attention.float()).clamp_min(0.0).mean(dim=1)
            relevance = relevance + cam @ relevance
    return read_out(relevance, num_prefix_tokens, _pooling_for(num_prefix_tokens, pooling))


def _check_pairs(attentions: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor], num_prefix_tokens: int) -> None:
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


def per_head_maps(
    attentions: Sequence[torch.Tensor], layer: int, num_prefix_tokens: int = 1, pooling: Pooling | None = None
) -> torch.Tensor:
    """Each head's attention over the patch tokens in block ``layer``, read as the classifier
    pools (:func:`prefix_rows`).

    Args:
        attentions: one ``[B, H, N, N]`` tensor per block.
        layer: block index (negative counts from the end).
        num_prefix_tokens: tokens before the patches.
        pooling: the model's ``global_pool`` (see :func:`attention_rollout`).

    Returns:
        ``[B, H, N - num_prefix_tokens]`` float32 raw attention weights.
    """
    _check_stack(attentions, num_prefix_tokens)
    if not -len(attentions) <= layer < len(attentions):
        raise ValueError(f"layer {layer} is out of range for a model with {len(attentions)} blocks.")
    attention = attentions[layer].float()
    if attention.shape[1] == 0:
        raise ValueError(f"block {layer % len(attentions)} has no heads left (all pruned): it has no attention to show.")
    rows = prefix_rows(attention, num_prefix_tokens, _pooling_for(num_prefix_tokens, pooling))
    return rows[:, :, num_prefix_tokens:].clone()
