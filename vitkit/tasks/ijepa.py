"""Joint-embedding predictive architecture (``task.name: ijepa``; Assran et al. 2023, I-JEPA,
https://arxiv.org/abs/2301.08243).

Each image gets a few target blocks and one context block less the targets (:mod:`.ijepa_masks`).
The context encoder (the model being trained) runs on the context patches only, through
:meth:`~vitkit.models.VisionTransformer.forward_features`'s ``keep`` (positions go with the tokens,
as in MAE). A narrow predictor of the task's own (:class:`JepaPredictor`) takes the context tokens
and, for each target block, mask tokens at the block's positions, and predicts the features the
target encoder gives those patches when it sees the whole image. The target encoder is an
exponential moving average of the context encoder (a part of this task, no gradient, like DINO's
teacher); its features are layer-normalised without affine parameters, and the loss is the smooth
L1 distance to the predictions, averaged over every target patch and feature. No pixels are
reconstructed and no augmented views are compared: one view of each image, one encoder pass on a
part of it and one on all of it a step.

:class:`JepaPredictor`, :func:`jepa_targets`, :func:`jepa_loss` and :func:`target_momentum` follow
facebookresearch/ijepa's ``VisionTransformerPredictor`` (``src/models/vision_transformer.py``),
``forward_target`` and ``loss_fn`` (``src/train.py``) and its momentum schedule, raised linearly
from ``momentum_start`` (0.996) to ``momentum_end`` (1.0) over the run's steps. The paper evaluates
the *target* encoder, and so does this task: it is what the run's k-NN measures and what
``model.safetensors`` releases (:meth:`IjepaTask.exported_model`). The encoder's prefix tokens (a
class token, registers) run with the context but are not handed to the predictor, whose inputs are
patches; ``global_pool: avg`` reads the features I-JEPA trains (the paper's linear probes average
the patch tokens).

Not here: the reference's weight-decay schedule (0.04 raised to 0.4 on a cosine), since the
optimiser is the trainer's (``optim.weight_decay`` stays constant).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from einops import rearrange
from timm.layers import trunc_normal_
from torch import nn

from ..layers import EncoderBlock, sincos_2d_pos_embed
from ..models import ViTConfig
from ..models.config import MAX_DEPTH, MAX_PARAMETERS
from ..schema import Config, FieldError, bounds
from .base import StepOutput, Task
from .dino import ema_update
from .ijepa_masks import MultiBlockMasks
from .mae import check_encoder, decoder_weights
from .registry import register_task

Batch = tuple[torch.Tensor, Any]
#: Seed of the masks of validation and test batches: the same masks every epoch, so losses compare.
EVAL_MASK_SEED = 0
Range = tuple[float, float]


def target_momentum(step: int, total_steps: int, start: float, end: float) -> float:
    """The target encoder's EMA momentum of step ``step`` (0-based) of ``total_steps``: ``start``
    raised linearly to ``end`` at ``total_steps``, the reference's ``start + i (end - start) / total``."""
    return start + min(step, total_steps) * (end - start) / max(1, total_steps)


def gather_tokens(tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``tokens`` ``[B, N, D]`` at ``indices`` ``[T, B, K]``: ``[T * B, K, D]``, block-major (the
    reference's ``apply_masks``: block 0's ``B`` rows first)."""
    blocks, batch, count = indices.shape
    rows = tokens.unsqueeze(0).expand(blocks, -1, -1, -1).reshape(blocks * batch, *tokens.shape[1:])
    return rows.gather(1, indices.reshape(blocks * batch, count, 1).expand(-1, -1, tokens.shape[-1]))


def jepa_targets(features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """What the predictor must infer: the target encoder's patch ``features`` ``[B, N, D]``
    layer-normalised over ``D`` (no affine parameters), at the ``targets`` ``[T, B, K]``:
    ``[T * B, K, D]``."""
    return gather_tokens(F.layer_norm(features, features.shape[-1:]), targets)


def jepa_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """I-JEPA's loss: the smooth L1 distance (``beta`` 1) averaged over every target patch and feature."""
    return F.smooth_l1_loss(prediction, target)


@dataclass
class IjepaOptions(Config):
    """The recipe's ``task.ijepa`` section. The block options are shares of the patch grid, as the
    reference's, and its defaults are the reference's (4 targets of 15-20% at aspect 0.75-1.5, a
    context of 85-100%) but ``min_keep``: on a 4x4 grid (Fashion-MNIST's 32 px in 8-px patches) the
    size rule draws 1x1 targets (31% of draws), 2x1 (47%), 1x2 (19%) or 2x2 (3%), the nearest the
    grid has to 2.4-3.2 patches, and a context of the whole grid less the targets; a batch of 256
    then keeps 8 of the 16 patches as context (its shortest), about the paper's share. A 1-patch
    target needs ``min_keep`` 0.

    Attributes:
        predictor_depth, predictor_dim, predictor_heads: the predictor's blocks, width and heads
            (the reference's 12 blocks of 384 for ViT-H; ``predictor_dim`` divisible by 4 and by the heads).
        targets: target blocks per image.
        target_scale, target_aspect: a target block's share of the grid and height over width.
        context_scale: the (square) context block's share of the grid, before the targets are removed.
        min_keep: each block keeps more than this many patches (the reference's 10 of 256 patches).
        momentum_start, momentum_end: the target encoder's EMA momentum at the first and last step.
    """

    predictor_depth: int = field(default=2, metadata=bounds(ge=1, le=MAX_DEPTH))
    predictor_dim: int = field(default=64, metadata=bounds(ge=4, le=65536))
    predictor_heads: int = field(default=4, metadata=bounds(ge=1, le=4096))
    targets: int = field(default=4, metadata=bounds(ge=1, le=64))
    target_scale: Range = field(default=(0.15, 0.2), metadata=bounds(gt=0, le=1))
    target_aspect: Range = field(default=(0.75, 1.5), metadata=bounds(gt=0, le=100))
    context_scale: Range = field(default=(0.85, 1.0), metadata=bounds(gt=0, le=1))
    min_keep: int = field(default=0, metadata=bounds(ge=0, le=1 << 20))
    momentum_start: float = field(default=0.996, metadata=bounds(ge=0, le=1))
    momentum_end: float = field(default=1.0, metadata=bounds(ge=0, le=1))

    def validate(self) -> None:
        """Ordered ranges and a width the heads and the sin-cos embedding divide."""
        for key in ("target_scale", "target_aspect", "context_scale"):
            low, high = getattr(self, key)
            if low > high:
                raise FieldError(key, f"must be a range (low, high) with low <= high, got ({low:g}, {high:g}).")
        if self.predictor_dim % 4 or self.predictor_dim % self.predictor_heads:
            raise FieldError(
                "predictor_dim", f"must be divisible by 4 (its sin-cos position embedding) and by predictor_heads "
                f"({self.predictor_heads}), got {self.predictor_dim}."
            )

    def masks(self, grid: tuple[int, int]) -> MultiBlockMasks:
        """The mask sampler of these options on a patch ``grid``."""
        return MultiBlockMasks(grid, self.targets, tuple(self.target_scale), tuple(self.target_aspect),
                               tuple(self.context_scale), self.min_keep)


class JepaPredictor(nn.Module):
    """I-JEPA's predictor: context tokens and target positions to predicted target features.

    Args:
        encoder_dim: width of the encoder's tokens (in and out).
        grid: the patch grid ``(gh, gw)``.
        dim, depth, num_heads: the predictor's width (divisible by 4), blocks and heads.
        mlp_ratio: its blocks' MLP width over ``dim``.
    """

    def __init__(
        self, encoder_dim: int, grid: tuple[int, int], *, dim: int, depth: int, num_heads: int, mlp_ratio: float = 4.0
    ) -> None:
        super().__init__()
        self.embed = nn.Linear(encoder_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        # The reference's fixed table (never saved): its first half of the channels encodes the column, the second
        # the row (MAE's get_2d_sincos_pos_embed), where vitkit's encodes the row first: its table of the transposed grid.
        table = rearrange(sincos_2d_pos_embed(dim, grid[::-1]), "(w h) d -> (h w) d", w=grid[1])
        self.register_buffer("pos_embed", table, persistent=False)
        self.blocks = nn.ModuleList(EncoderBlock(dim, num_heads, mlp_ratio=mlp_ratio, norm_eps=1e-6) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.proj = nn.Linear(dim, encoder_dim)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The reference's init: truncated-normal (std 0.02) Linears with zero biases, unit
        LayerNorms, the mask token likewise, and block ``l``'s (1-based) output projections of
        attention and MLP divided by ``sqrt(2 l)``."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        trunc_normal_(self.mask_token, std=0.02)
        for layer, block in enumerate(self.blocks, start=1):
            for weight in (block.attn.proj.weight, block.mlp.fc2.weight):
                weight.div_(math.sqrt(2.0 * layer))

    def forward(self, context: torch.Tensor, context_index: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Predict each target block's features from the context.

        Args:
            context: ``[B, Kc, D]`` the encoder's tokens of the context patches.
            context_index: ``[B, Kc]`` their patch indices (row-major).
            targets: ``[T, B, Kt]`` each target block's patch indices.

        Returns:
            ``[T * B, Kt, D]``, block-major: each block predicted from the context and its own mask
            tokens (the blocks never attend to each other).
        """
        blocks, batch, count = targets.shape
        pos = self.pos_embed.to(context.dtype)
        x = self.embed(context) + pos[context_index]
        x = x.unsqueeze(0).expand(blocks, -1, -1, -1).reshape(blocks * batch, *x.shape[1:])
        queries = self.mask_token.to(x.dtype) + pos[targets.reshape(blocks * batch, count)]
        x = torch.cat([x, queries], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.proj(self.norm(x)[:, -count:])


@register_task("ijepa")
class IjepaTask(Task):
    """I-JEPA pre-training of a headless encoder on ``(images [B, C, H, W], anything)`` batches
    (the labels are ignored). The predictor is the task's child: it trains and is checkpointed
    with the model, never exported. The target encoder, a copy of the model made in :meth:`prepare`,
    is checkpointed under ``task.target_encoder.*``, follows the model after each optimiser step and
    is the encoder the run releases.

    Args:
        config: the encoder's :class:`~vitkit.models.ViTConfig` (patch grid, width, prefix tokens).
        options: the predictor, the blocks and the momenta (:class:`IjepaOptions`).

    Raises:
        FieldError: options or an encoder I-JEPA cannot train (:meth:`check_model`).
    """

    Options: ClassVar[type[Config]] = IjepaOptions
    uses_labels: ClassVar[bool] = False
    releases_encoder: ClassVar[bool] = True

    def __init__(self, config: ViTConfig, options: IjepaOptions | None = None) -> None:
        super().__init__()
        options = options if options is not None else IjepaOptions()
        self.check_model(options, config)
        self.masks = options.masks(config.grid_size)
        self.num_prefix = config.num_prefix_tokens
        self.momentum = (options.momentum_start, options.momentum_end)
        self.predictor = JepaPredictor(config.embed_dim, config.grid_size, dim=options.predictor_dim,
                                       depth=options.predictor_depth, num_heads=options.predictor_heads)
        self.target_encoder: nn.Module | None = None  # the model's copy (prepare)
        # Optimiser steps taken, checkpointed: the seed of each batch's block sizes, as the reference's step counter.
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    # ------------------------------------------------------------------------------ the recipe
    @classmethod
    def check_model(cls, options: IjepaOptions, model: ViTConfig) -> None:
        """An encoder whose tokens each see one patch (:func:`~vitkit.tasks.mae.check_encoder`: the
        context encoder must not see the targets' pixels), blocks that can keep more than
        ``min_keep`` patches on its grid, and a predictor and two encoders within
        :data:`~vitkit.models.config.MAX_PARAMETERS`.

        Raises:
            FieldError: keyed by the recipe key (``model.patch_embed``, ``task.ijepa.*``).
        """
        try:
            check_encoder(model)
        except FieldError as error:
            raise FieldError(f"model.{error.key}", f"{error.problem} (I-JEPA's context encoder, like MAE's encoder, "
                             "sees only some patches)") from None
        try:
            options.masks(model.grid_size)
        except ValueError as error:
            raise FieldError("task.ijepa.min_keep", f"is {options.min_keep}, but {error} Lower min_keep, or raise "
                             "target_scale or context_scale.") from None
        predictor = decoder_weights(model.embed_dim, model.embed_dim, dim=options.predictor_dim,
                                    depth=options.predictor_depth)
        if predictor + 2 * model.num_weights() > MAX_PARAMETERS:
            raise FieldError(
                "task.ijepa.predictor_dim", f"is {options.predictor_dim} with predictor_depth {options.predictor_depth}: "
                f"a predictor of about {predictor:.3g} weights, which with the context and target encoders' exceeds "
                f"the limit of {MAX_PARAMETERS:.3g}; lower task.ijepa.predictor_dim or predictor_depth."
            )

    @classmethod
    def conflicts(cls, options: IjepaOptions, recipe: Any) -> list[str]:
        """Besides the labelled options: those the target encoder and the context's ``keep`` rule out."""
        found = ["optim.ema=true (the target encoder is the average I-JEPA keeps and releases)"] if recipe.optim.ema else []
        found += [f"model.impl={recipe.model.impl} (I-JEPA encodes the context through vitkit's "
                  "forward_features(keep=))"] if recipe.model.impl != "vitkit" else []
        found += ["trainer.strategy=fsdp (the target encoder is not sharded)"] if recipe.trainer.strategy.startswith("fsdp") else []
        return found

    # ----------------------------------------------------------------------- the Task contract
    def prepare(self, model: nn.Module) -> None:
        """The target encoder starts as a copy of the model (the reference's ``deepcopy(encoder)``)."""
        self.target_encoder = copy.deepcopy(model).requires_grad_(False).eval()

    def train(self, mode: bool = True) -> IjepaTask:
        """The predictor in ``mode``; the target encoder always in evaluation mode (no dropout or
        stochastic depth in the targets)."""
        super().train(mode)
        if self.target_encoder is not None:
            self.target_encoder.eval()
        return self

    def exported_model(self, model: nn.Module) -> nn.Module:
        """The target encoder: what the paper evaluates, and what the run measures and releases."""
        return self.target_encoder

    def training_step(self, model: nn.Module, batch: Batch) -> StepOutput:
        images = batch[0]
        sizes = torch.Generator().manual_seed(int(self.steps))
        context, targets = self.masks.sample(len(images), sizes)
        return StepOutput(self.loss(model, images, context, targets), len(images),
                          {"context_patches": torch.tensor(float(context.shape[1]))})

    @torch.no_grad()
    def evaluation_step(self, model: nn.Module, batch: Batch, stage: str) -> StepOutput:
        """The loss with the same masks every epoch (seeded by :data:`EVAL_MASK_SEED`)."""
        images = batch[0]
        generator = torch.Generator().manual_seed(EVAL_MASK_SEED)
        context, targets = self.masks.sample(len(images), generator, generator)
        return StepOutput(self.loss(model, images, context, targets), len(images))

    @torch.no_grad()
    def after_optimizer_step(self, model: nn.Module, step: int, total_steps: int) -> None:
        """The target encoder follows the model with the momentum of the step just taken (``step``
        is the count of steps done)."""
        ema_update(self.target_encoder, model, target_momentum(step - 1, total_steps, *self.momentum))
        self.steps.fill_(step)

    # ----------------------------------------------------------------------------- forwards
    def loss(self, model: nn.Module, images: torch.Tensor, context: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """:func:`jepa_loss` of ``images`` ``[B, C, H, W]`` with ``context`` ``[B, Kc]`` and
        ``targets`` ``[T, B, Kt]`` patch indices (:meth:`~.ijepa_masks.MultiBlockMasks.sample`)."""
        context, targets = context.to(images.device), targets.to(images.device)
        with torch.no_grad():
            target = jepa_targets(self.target_encoder.forward_features(images)[:, self.num_prefix :], targets)
        encoded = model.forward_features(images, keep=context)[:, self.num_prefix :]
        prediction = self.predictor(encoded, context, targets)
        return jepa_loss(prediction.float(), target.float())
