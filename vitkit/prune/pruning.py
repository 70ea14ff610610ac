"""Head gates and physical head pruning of a :class:`~vitkit.models.VisionTransformer`.

A *gate set* holds one ``[H_l]`` tensor of 0/1 gates per block (``model.heads_per_layer()``
decides ``H_l``, which may differ between blocks once heads are pruned); it is what
``model(x, head_gates=gates)`` takes. :func:`prune_heads` removes heads for good: the qkv rows and
``W_o`` columns go, parameters and FLOPs shrink, and the config records the per-layer head counts
so that :func:`vitkit.save_model` / :func:`vitkit.load_model` round-trip the pruned model.

Gating and pruning agree exactly (up to float rounding) except in one case: when *every* head
of a block is gated off, the gated block still adds ``W_o``'s bias to the residual stream, while
a block whose heads are all pruned adds nothing (its attention returns zeros). A
constant added before ``norm2`` cannot be folded into another layer, so the two models differ
there; :func:`pruned_copy` is what the accuracy curves of :mod:`vitkit.prune.iterative` measure,
so they always describe the model you would deploy.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence

import torch

from ..models import VisionTransformer

#: One ``[H_l]`` gate tensor per block (1 = head kept, 0 = head off).
Gates = list[torch.Tensor]


def full_gates(model: VisionTransformer) -> Gates:
    """All-ones gates, one ``[H_l]`` tensor per block."""
    return [torch.ones(heads) for heads in model.heads_per_layer()]


def check_gates(model: VisionTransformer, gates: Sequence[torch.Tensor]) -> Gates:
    """``gates`` as a list of float ``[H_l]`` tensors after checking they match ``model``'s heads."""
    heads = model.heads_per_layer()
    if len(gates) != len(heads) or any(g.shape != (h,) for g, h in zip(gates, heads)):
        raise ValueError(
            f"gates must hold one [H_l] tensor per block with H_l = {heads}, got shapes "
            f"{[tuple(g.shape) for g in gates]}; build them with vitkit.prune.full_gates(model)."
        )
    return [g.detach().float().cpu() for g in gates]


def gated_off(gates: Sequence[torch.Tensor]) -> dict[int, list[int]]:
    """``{layer: [heads whose gate is 0]}`` for the layers that have any."""
    off = {layer: torch.nonzero(g == 0).flatten().tolist() for layer, g in enumerate(gates)}
    return {layer: heads for layer, heads in off.items() if heads}


def prune_heads(model: VisionTransformer, heads: Mapping[int, Iterable[int]]) -> VisionTransformer:
    """Physically remove ``heads`` (``{layer: [head indices into that layer's current heads]}``).

    Works in place and returns ``model``. ``model.config.num_heads`` becomes the per-layer list
    (``head_dim`` is recorded explicitly), so ``vit_flops(model.config)`` and ``save_model`` see
    the pruned architecture. A layer may lose all its heads (see the module docstring).

    Raises:
        ValueError: a layer index outside ``[0, depth)`` or a head index outside ``[0, H_l)``.
    """
    depth = len(model.blocks)
    for layer in heads:
        if not 0 <= int(layer) < depth:
            raise ValueError(f"layer index {layer} is outside [0, {depth}) for this {depth}-block model.")
    for layer, layer_heads in heads.items():
        model.blocks[int(layer)].attn.prune_heads(layer_heads)
    model.config = model.config.replace(
        num_heads=model.heads_per_layer(), head_dim=model.config.resolved_head_dim()
    )
    return model


def pruned_copy(model: VisionTransformer, gates: Sequence[torch.Tensor]) -> VisionTransformer:
    """A deep copy of ``model`` with the heads whose gate is 0 pruned away; ``model`` is untouched."""
    return prune_heads(copy.deepcopy(model), gated_off(check_gates(model, gates)))
