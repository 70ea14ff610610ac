"""The recipe's ``optim`` section (:class:`OptimConfig`) and what it builds: AdamW without weight
decay on norms, biases, position embeddings and the class token (or, as DINO, on norms and biases
only), with an optional layer-wise learning-rate decay (BEiT, Bao et al. 2021,
https://arxiv.org/abs/2106.08254, as timm), a linear-warmup + cosine learning-rate schedule stepped
every iteration, and an optional cosine weight-decay schedule (DINO, Caron et al. 2021,
https://arxiv.org/abs/2104.14294: 0.04 to 0.4)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from timm.optim import param_groups_layer_decay, param_groups_weight_decay
from torch import nn
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from ..schema import Config, bounds


@dataclass
class OptimConfig(Config):
    """AdamW, a per-iteration linear-warmup + cosine schedule, and the loss's regularisers.

    Attributes:
        lr: peak learning rate (reached after warmup), for ``trainer.batch_size`` per device.
        weight_decay: AdamW decoupled decay; norms, biases, ``pos_embed`` and ``cls_token`` get none
            (the latter two do with ``decay_embeddings``).
        weight_decay_end: the decay at the last step, reached on a half cosine from ``weight_decay``
            over the run's steps (no warm-up), as DINO's ``cosine_scheduler`` (0.04 to 0.4);
            ``null``: ``weight_decay`` throughout.
        decay_embeddings: decay the parameters the model exempts (its ``no_weight_decay()``:
            ``pos_embed``, ``cls_token``, register and distillation tokens, mixed-RoPE
            frequencies) like any weight matrix, leaving only 1-d parameters (norms, LayerScale)
            and biases undecayed: DINO's ``get_params_groups``.
        betas: AdamW betas.
        eps: AdamW epsilon.
        warmup_epochs: linear warmup length (fractions allowed).
        min_lr: learning rate at the end of the cosine decay.
        layer_decay: layer-wise learning-rate decay for fine-tuning (BEiT's, as timm's
            ``param_groups_layer_decay``): a parameter of layer ``i`` learns at
            ``lr * layer_decay ** (depth + 1 - i)``, with the embeddings at layer 0, block ``k`` at
            layer ``k + 1`` (the final norm with the last block) and the head at ``depth + 1``
            (scale 1); ``min_lr`` is scaled alike. Typical values 0.65-0.75; ``null``: one learning
            rate for every layer. Mixed-RoPE frequencies are each block's own parameters and decay
            with their block (BEiT's rule, as freezing ``blocks:N`` freezes them with it); timm's
            Eva keeps them in one model-level tensor that learns at scale 1, up to
            ``layer_decay ** -depth`` times faster.
        clip_grad: the largest gradient norm left unscaled; ``null`` disables clipping.
        clip_mode: ``norm``: the norm of all gradients together (timm's and Lightning's default);
            ``per_param``: each parameter's own gradient norm, as DINO's ``clip_gradients``.
        label_smoothing: target smoothing (also applied to mixed targets).
        mixup: Mixup alpha (0 disables); cutmix: CutMix alpha (0 disables).
        mixup_prob: probability of mixing a batch; mixup_switch_prob: of CutMix instead of Mixup.
        ema: keep an exponential moving average of the weights and evaluate/export it.
        ema_decay: EMA decay per step.
    """

    lr: float = field(default=1e-3, metadata=bounds(gt=0))
    weight_decay: float = field(default=0.05, metadata=bounds(ge=0))
    weight_decay_end: float | None = field(default=None, metadata=bounds(ge=0))
    decay_embeddings: bool = False
    betas: tuple[float, float] = field(default=(0.9, 0.999), metadata=bounds(ge=0, lt=1))
    eps: float = field(default=1e-8, metadata=bounds(gt=0))
    warmup_epochs: float = field(default=0.0, metadata=bounds(ge=0))
    min_lr: float = field(default=1e-6, metadata=bounds(ge=0))
    layer_decay: float | None = field(default=None, metadata=bounds(gt=0, le=1))
    clip_grad: float | None = field(default=1.0, metadata=bounds(gt=0))
    clip_mode: Literal["norm", "per_param"] = "norm"
    label_smoothing: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    mixup: float = field(default=0.0, metadata=bounds(ge=0))
    cutmix: float = field(default=0.0, metadata=bounds(ge=0))
    mixup_prob: float = field(default=1.0, metadata=bounds(ge=0, le=1))
    mixup_switch_prob: float = field(default=0.5, metadata=bounds(ge=0, le=1))
    ema: bool = False
    ema_decay: float = field(default=0.9998, metadata=bounds(gt=0, lt=1))

    def validate(self) -> None:
        """``min_lr`` at most ``lr``; a weight-decay schedule starts from a decay."""
        if self.min_lr > self.lr:
            raise ValueError(f"optim.min_lr ({self.min_lr:g}) exceeds optim.lr ({self.lr:g}); lower min_lr.")
        if self.weight_decay_end is not None and self.weight_decay == 0:
            raise ValueError(
                f"optim.weight_decay_end ({self.weight_decay_end:g}) schedules the decayed parameters' decay, but "
                "optim.weight_decay is 0, so none is decayed; set optim.weight_decay (DINO's 0.04), or "
                "optim.weight_decay_end=null."
            )

    @property
    def mixes(self) -> bool:
        """Whether batches are mixed (Mixup or CutMix)."""
        return (self.mixup > 0 or self.cutmix > 0) and self.mixup_prob > 0


def param_groups(
    model: nn.Module, weight_decay: float, layer_decay: float | None = None, *, decay_embeddings: bool = False
) -> list[dict]:
    """timm's parameter groups over the parameters that require a gradient (frozen ones are in none).

    Without ``layer_decay``, timm's ``param_groups_weight_decay``: decayed weight matrices, and
    undecayed 1-d parameters (norm scales, biases, LayerScale) plus the names in
    ``model.no_weight_decay()`` (``pos_embed``, ``cls_token``), in timm's order (undecayed first;
    :func:`vitkit.io.upgrade_checkpoint` reorders checkpoints written in vitkit's former order).
    ``weight_decay=0`` gives one group. ``decay_embeddings`` leaves ``no_weight_decay()`` out: only
    1-d parameters and biases go undecayed, DINO's ``get_params_groups``.

    With ``layer_decay``, timm's ``param_groups_layer_decay`` over ``model.group_matcher()``: a
    decayed and an undecayed group per layer, in timm's order, each with ``lr_scale =
    layer_decay ** (depth + 1 - layer id)``: 1 for the head (layer ``depth + 1``), ``layer_decay``
    for the last block, ``layer_decay ** (depth + 1)`` for the embeddings (layer 0). A block's
    mixed-RoPE frequencies are its own and take its scale (timm's Eva leaves its shared frequency
    tensor at 1; see :class:`~vitkit.train.config.OptimConfig`).
    """
    skip = set() if decay_embeddings else getattr(model, "no_weight_decay", set)()
    if layer_decay is not None:
        return param_groups_layer_decay(model, weight_decay, no_weight_decay_list=skip, layer_decay=layer_decay)
    return param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip)


def fused_supported(params: list[torch.Tensor]) -> bool:
    """Whether torch has a fused AdamW kernel for every parameter's device and dtype.

    torch's own rule (floating-point tensors on a device with fused kernels: CPU from torch 2.4,
    CUDA, XPU, MPS, ...), asked of the same helper that ``torch.optim`` uses for its defaults.
    """
    devices = _get_fused_kernels_supported_devices()
    return bool(params) and all(p.is_floating_point() and p.device.type in devices for p in params)


def build_optimizer(
    model: nn.Module, config: OptimConfig, *, extra: nn.Module | None = None, allow_fused: bool = True
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` (each group's learning rate ``config.lr`` times its
    ``lr_scale`` under ``config.layer_decay``), fused (one kernel over all parameters) wherever torch supports
    it and ``allow_fused``, else torch's default multi-tensor (foreach) implementation. The
    trainable parameters of ``extra`` (a task's decoder or projection head) follow in groups of
    their own at the full rate, norms and biases undecayed (and what ``extra.no_weight_decay()``
    names, unless ``config.decay_embeddings``); a module without any adds no group.

    The fused step applies the same update as the foreach one to float rounding (tested), in a
    fraction of its time (docs/benchmarks.md has the measurement).
    """
    groups = param_groups(model, config.weight_decay, config.layer_decay, decay_embeddings=config.decay_embeddings)
    if extra is not None and any(p.requires_grad for p in extra.parameters()):
        groups += param_groups(extra, config.weight_decay, decay_embeddings=config.decay_embeddings)
    for group in groups:  # each group's own peak; warmup_cosine's factor then scales it (min_lr too)
        group["lr"] = config.lr * group.get("lr_scale", 1.0)
    fused = allow_fused and fused_supported([p for group in groups for p in group["params"]])
    return torch.optim.AdamW(
        groups, lr=config.lr, betas=tuple(config.betas), eps=config.eps, fused=True if fused else None
    )


def half_cosine(progress: float, start: float, end: float) -> float:
    """``start`` at ``progress`` 0 to ``end`` at 1 on a half cosine: ``end + (start - end) (1 +
    cos(pi progress)) / 2``."""
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class Horizon:
    """Where a linear warm-up + cosine schedule turns and ends, in optimiser steps, and its floor
    (``min_lr / lr``). Mutable: a time budget's plan (:mod:`vitkit.train.time_budget`) moves it
    once the step time is measured; the scheduler reads it at every step."""

    warmup_steps: int
    total_steps: int
    floor: float

    def factor(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based) as a share of the peak: ``(step + 1) /
        warmup_steps`` during the warm-up, then a cosine from 1 down to :attr:`floor`, reached at
        ``total_steps`` and kept after it."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return half_cosine(progress, 1.0, self.floor)


def warmup_cosine(optimizer: torch.optim.Optimizer, horizon: Horizon) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup from ~0 to each group's peak over ``horizon.warmup_steps``, then cosine decay
    to ``horizon.floor`` times it at ``horizon.total_steps``; call ``step()`` after every optimiser step.

    The schedule is a factor on each group's own learning rate: a group built at ``s * lr`` (layer
    decay's ``lr_scale``) peaks at ``s * lr`` and ends at ``s * min_lr``, as timm's schedulers scale
    the whole value by ``lr_scale``. The factor depends on the step alone, so a scheduler and
    optimiser restored from their ``state_dict()`` continue every group where it was. The horizon
    is not part of that state (``LambdaLR`` saves no function's): a resumed run takes it from its
    recipe, or from its time budget's stored plan.
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: horizon.factor(step))


class WeightDecaySchedule:
    """The decayed groups' weight decay on a half cosine from ``start`` to ``end`` over
    ``horizon.total_steps`` steps, without warm-up, as DINO's ``wd_schedule`` (``cosine_scheduler(
    0.04, 0.4, epochs, niter_per_ep)``: ``end + (start - end) (1 + cos(pi step / total)) / 2`` at
    step ``step``); the undecayed groups stay at 0. The value depends on the step alone and the
    horizon is read at every step, so a resumed run or a time budget's moved horizon continues it.

    Args:
        optimizer: its groups with a weight decay above 0 are the decayed ones.
        horizon: the learning-rate schedule's, whose ``total_steps`` the decay spans.
        start, end: the decay at step 0 and at ``total_steps`` (and after).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, horizon: Horizon, start: float, end: float) -> None:
        self.optimizer, self.horizon, self.start, self.end = optimizer, horizon, start, end
        self.decayed = [group["weight_decay"] > 0 for group in optimizer.param_groups]

    def value(self, step: int) -> float:
        """The weight decay of step ``step`` (0-based)."""
        return half_cosine(min(1.0, step / max(1, self.horizon.total_steps)), self.start, self.end)

    def apply(self, step: int) -> None:
        """Set the decayed groups' weight decay for step ``step``; call it before that step."""
        decay = self.value(step)
        for group, decayed in zip(self.optimizer.param_groups, self.decayed):
            if decayed:
                group["weight_decay"] = decay


def refresh_lr(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set each group's learning rate anew for the scheduler's current step, after its horizon
    moved (a scheduler sets the rates only when it steps)."""
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)
