"""Freezing part of a pretrained ViT for fine-tuning: ``'backbone'`` (a linear probe: only the
classifier trains) or ``'blocks:N'`` (the embeddings and the first N blocks stay as loaded).

"The first N blocks" are the layers of the model's ``group_matcher()`` (timm's contract, read by
timm's ``group_parameters``), the same layers as layer-wise learning-rate decay
(:func:`vitkit.train.optim.param_groups`): one definition of what a layer is, for vitkit's and
timm's ViTs alike.
"""

from __future__ import annotations

import re

from timm.models import group_parameters
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..schema import FieldError

#: The modules a linear probe (``'backbone'``) keeps training: the classifiers and the norm between
#: the pooling and them (timm's ``fc_norm``, present with average pooling).
PROBE_MODULES = ("head", "head_dist", "fc_norm")

_BLOCKS = re.compile(r"blocks:(\d+)")


def check_freeze(spec: str, depth: int) -> None:
    """Raise one :class:`~vitkit.schema.FieldError` line unless ``spec`` is ``'none'``,
    ``'backbone'`` or ``'blocks:N'`` with ``0 <= N <= depth`` (the model's block count)."""
    match = _BLOCKS.fullmatch(spec) if isinstance(spec, str) else None
    if spec in ("none", "backbone") or (match is not None and int(match[1]) <= depth):
        return
    raise FieldError(
        "freeze", f"must be 'none', 'backbone' or 'blocks:N' with N in [0, {depth}], got {spec!r}."
    )


def freeze(model: nn.Module, spec: str) -> list[str]:
    """Freeze part of ``model`` in place for fine-tuning; returns the frozen parameters' names.

    Frozen parameters stop requiring a gradient, so they get no gradient, and
    :func:`~vitkit.train.optim.param_groups` leaves them out of every optimiser group (no state, no
    weight decay). Frozen BatchNorm layers (the ``patch_embed='conv'`` stem's) normalise by their
    running statistics and keep them, in training mode too.

    Args:
        model: a ViT with timm's ``group_matcher()`` and ``blocks`` (vitkit's
            :class:`~vitkit.models.VisionTransformer`, timm's ``VisionTransformer``).
        spec: ``'none'``; ``'backbone'``: everything but :data:`PROBE_MODULES` (a linear probe);
            ``'blocks:N'``: layers 0 to N of ``group_matcher()``, i.e. the embeddings and the first
            N blocks (``'blocks:0'`` the embeddings alone; with ``N = depth`` the final ``norm`` too,
            which timm groups with the last block).
    """
    check_freeze(spec, len(model.blocks))
    if spec == "none":
        return []
    named = dict(model.named_parameters())
    if spec == "backbone":
        frozen = [name for name in named if name.split(".")[0] not in PROBE_MODULES]
    else:
        last = int(spec.removeprefix("blocks:"))
        layer = group_parameters(model, model.group_matcher(), reverse=True)
        frozen = [name for name in named if layer[name] <= last]
    for name in frozen:
        named[name].requires_grad_(False)
    for module in model.modules():
        affine = list(module.parameters(recurse=False))
        if isinstance(module, _BatchNorm) and affine and not any(p.requires_grad for p in affine):
            module.register_forward_pre_hook(_normalise_by_running_statistics)
    return frozen


def _normalise_by_running_statistics(module: nn.Module, args: tuple) -> None:
    """Forward pre-hook of a frozen BatchNorm: evaluation mode whatever ``model.train()`` set, so it
    normalises by its running statistics and leaves them as they are.

    Not timm's ``freeze_batch_norm_2d``: its ``FrozenBatchNorm2d`` turns the affine parameters into
    buffers and drops ``num_batches_tracked``, so the model's state dict would no longer load into a
    fresh :class:`~vitkit.models.VisionTransformer` (strict); this keeps the layer and its keys.
    """
    module.eval()
