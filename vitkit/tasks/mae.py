"""Masked autoencoders (``task.name: mae``; He et al. 2021, https://arxiv.org/abs/2111.06377).

Each image loses a random ``mask_ratio`` of its patches; the encoder (the model being trained) runs
on the visible patches only, through :meth:`~vitkit.models.VisionTransformer.forward_features`'s
``keep`` (the position embedding is added before the patches are dropped, and their positions go
with them). A light decoder of the task's own, built from :class:`~vitkit.layers.EncoderBlock`\\ s,
puts a shared mask token in every dropped place, adds a fixed 2-D sin-cos position embedding and
predicts each patch's pixels. The loss is the mean squared error over the masked patches only,
optionally against per-patch normalised pixels (``norm_pix_loss``, the paper's default).

:func:`random_masking` and :func:`masked_patch_loss` are facebookresearch/mae's ``random_masking``
and ``forward_loss`` (``models_mae.py``): the same noise keeps the same patches, in the same
shuffled order, and gives the same loss. :func:`patchify` orders each patch's pixels as
``(p1 p2 c)``, MAE's ``patchify`` and vitkit's :class:`~vitkit.layers.PatchEmbed`. Prefix tokens
(class token, registers) are always visible, and pass through the decoder (with a zero position,
as MAE's class token) without being predicted.

The patches are hidden by dropping their tokens after the tokenizer, so the tokenizer must see one
patch per token (:func:`check_encoder`): the convolutional stem (``patch_embed: conv``), whose 3x3
convolutions cross patch borders and whose BatchNorm averages over the whole image, and Shifted
Patch Tokenization, which gives each token half of its neighbours, would hand the encoder about
half of the hidden pixels (42.5% of them for a 32-px image in 8-px patches at mask ratio 0.75).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from einops import rearrange
from torch import nn

from ..layers import EncoderBlock, sincos_2d_pos_embed
from ..models import ViTConfig
from ..models.config import MAX_DEPTH, MAX_PARAMETERS
from ..schema import Config, FieldError, bounds
from .base import StepOutput, Task
from .registry import register_task

Batch = tuple[torch.Tensor, Any]
#: Seed of the masks of validation and test batches: the same masks every epoch, so losses compare.
EVAL_MASK_SEED = 0


def kept_count(num_patches: int, mask_ratio: float) -> int:
    """Visible patches of an image: ``int(num_patches * (1 - mask_ratio))``, as MAE rounds."""
    return int(num_patches * (1 - mask_ratio))


def check_encoder(config: ViTConfig, norm_pix_loss: bool = False) -> None:
    """Refuse an encoder MAE cannot train: one through which a hidden patch's pixels would reach a
    visible token (a tokenizer that mixes neighbouring patches before MAE drops the hidden ones),
    one that merges tokens (the decoder puts each visible token back in its own place), one whose
    final norm comes after pooling (``fc_norm``: the decoder would read unnormalised tokens; MAE
    pre-trains with the norm on every token and moves it after average pooling to fine-tune), and
    ``norm_pix_loss`` on patches of one value (its variance is 0).

    Raises:
        FieldError: naming the :class:`ViTConfig` field (or ``norm_pix_loss``) and what to use instead.
    """
    if any(config.merge_per_block()):
        raise FieldError(
            "merge_tokens", f"is {config.merge_tokens}, but MAE's decoder puts every visible token back in its own "
            "place, and merged tokens have none: pre-train with merge_tokens=0 (merge at inference, in the fine-tuned model)."
        )
    if norm_pix_loss and patch_pixels(config) < 2:
        raise FieldError(
            "norm_pix_loss", f"normalises each patch's {patch_pixels(config)} pixel value by its variance, which one value "
            "does not have: use a patch of 2 or more pixels (patch_size), or norm_pix_loss=false."
        )
    if config.patch_embed == "conv":
        raise FieldError(
            "patch_embed", "is 'conv', whose 3x3 convolutions and BatchNorm run on the whole image before MAE hides "
            "patches, so the hidden pixels reach the visible tokens: pre-train with patch_embed=linear (one patch "
            "per token)."
        )
    if config.shifted_patches:
        raise FieldError(
            "shifted_patches", "is true, which gives each token half of its neighbouring patches before MAE hides "
            "patches, so the hidden pixels reach the visible tokens: pre-train with shifted_patches=false."
        )
    if config.use_fc_norm:
        key, value = ("fc_norm", "true") if config.fc_norm else ("global_pool", repr(config.global_pool))
        raise FieldError(
            key, f"is {value}, which puts the final norm after pooling, so MAE's decoder would read unnormalised "
            "tokens: pre-train with the norm on every token (global_pool=token, fc_norm unset), then fine-tune with "
            "model.global_pool=avg, as MAE does.",
        )


def patch_pixels(config: ViTConfig) -> int:
    """Values of a patch's pixel target, ``p1 * p2 * C``."""
    return config.patch_size[0] * config.patch_size[1] * config.in_chans


def decoder_weights(encoder_dim: int, patch_pixels: int, *, dim: int, depth: int, mlp_ratio: float = 4.0) -> int:
    """Parameters of a :class:`MaeDecoder` (Linears' weights and biases, LayerNorms, the mask
    token), counted before it is built."""
    hidden = int(dim * mlp_ratio)
    block = 4 * dim + (3 * dim * dim + 3 * dim) + (dim * dim + dim) + (dim * hidden + hidden) + (hidden * dim + dim)
    return (encoder_dim + 2) * dim + depth * block + 2 * dim + (dim + 1) * patch_pixels


def random_masking(noise: torch.Tensor, mask_ratio: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MAE's per-image random masking, driven by ``noise``: the patches of lowest noise stay.

    Args:
        noise: ``[B, L]`` one value per patch (``torch.rand``); ascending order decides.
        mask_ratio: share of the patches to drop.

    Returns:
        ``keep`` ``[B, k]`` the visible patches' indices in shuffled order (the order the encoder
        sees them), ``mask`` ``[B, L]`` 1 for a dropped patch and 0 for a visible one (grid order),
        and ``restore`` ``[B, L]``, which puts the shuffled sequence back in grid order.
    """
    batch, length = noise.shape
    shuffle = torch.argsort(noise, dim=1)
    restore = torch.argsort(shuffle, dim=1)
    count = kept_count(length, mask_ratio)
    mask = torch.ones(batch, length, device=noise.device)
    mask[:, :count] = 0
    return shuffle[:, :count], torch.gather(mask, 1, restore), restore


def patchify(images: torch.Tensor, patch_size: tuple[int, int]) -> torch.Tensor:
    """``[B, C, H, W]`` to ``[B, (H/p1)(W/p2), p1*p2*C]`` pixel patches, row-major, each ``(p1 p2 c)``."""
    p1, p2 = patch_size
    return rearrange(images, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p1, p2=p2)


def unpatchify(patches: torch.Tensor, patch_size: tuple[int, int], grid: tuple[int, int]) -> torch.Tensor:
    """The inverse of :func:`patchify`: ``[B, gh*gw, p1*p2*C]`` to ``[B, C, gh*p1, gw*p2]``."""
    p1, p2 = patch_size
    return rearrange(patches, "b (h w) (p1 p2 c) -> b c (h p1) (w p2)", h=grid[0], w=grid[1], p1=p1, p2=p2)


def pixel_targets(patches: torch.Tensor, norm_pix_loss: bool) -> torch.Tensor:
    """What the decoder predicts: the patches' pixels, or each patch normalised by its own mean
    and (unbiased) variance, as MAE's ``norm_pix_loss``."""
    if not norm_pix_loss:
        return patches
    mean = patches.mean(dim=-1, keepdim=True)
    var = patches.var(dim=-1, keepdim=True)
    return (patches - mean) / (var + 1.0e-6) ** 0.5


def masked_patch_loss(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MAE's loss: the squared error averaged over each patch's pixels, then over the masked
    patches (``mask`` 1) only. ``prediction`` and ``target`` ``[B, L, P]``, ``mask`` ``[B, L]``."""
    loss = (prediction - target).pow(2).mean(dim=-1)
    return (loss * mask).sum() / mask.sum()


@dataclass
class MaeOptions(Config):
    """The recipe's ``task.mae`` section.

    Attributes:
        mask_ratio: share of each image's patches hidden from the encoder (the paper's 0.75).
        decoder_depth: blocks of the decoder (the paper's 8 for ViT-L; a light one suffices).
        decoder_dim: width of the decoder's tokens (divisible by 4 and by ``decoder_heads``).
        decoder_heads: attention heads of the decoder.
        norm_pix_loss: predict each patch's pixels normalised by its own mean and variance.
    """

    mask_ratio: float = field(default=0.75, metadata=bounds(gt=0, lt=1))
    decoder_depth: int = field(default=2, metadata=bounds(ge=1, le=MAX_DEPTH))
    decoder_dim: int = field(default=128, metadata=bounds(ge=4, le=65536))
    decoder_heads: int = field(default=4, metadata=bounds(ge=1, le=4096))
    norm_pix_loss: bool = True

    def validate(self) -> None:
        """A width the heads and the sin-cos embedding divide."""
        if self.decoder_dim % 4 or self.decoder_dim % self.decoder_heads:
            raise FieldError(
                "decoder_dim", f"must be divisible by 4 (its sin-cos position embedding) and by decoder_heads "
                f"({self.decoder_heads}), got {self.decoder_dim}."
            )


class MaeDecoder(nn.Module):
    """MAE's decoder: encoder tokens to per-patch pixel predictions.

    Args:
        encoder_dim: width of the encoder's tokens.
        grid: the patch grid ``(gh, gw)``.
        num_prefix: the encoder's prefix tokens (class token, registers), passed through.
        patch_pixels: pixels a patch predicts, ``p1 * p2 * C``.
        dim, depth, num_heads: the decoder's width, blocks and heads (``dim`` divisible by 4 for
            the sin-cos embedding).
        mlp_ratio: its blocks' MLP width over ``dim``.
    """

    def __init__(
        self, encoder_dim: int, grid: tuple[int, int], num_prefix: int, patch_pixels: int, *, dim: int, depth: int,
        num_heads: int, mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__()
        self.grid = grid
        self.num_prefix = num_prefix
        self.embed = nn.Linear(encoder_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        table = torch.cat([torch.zeros(num_prefix, dim), sincos_2d_pos_embed(dim, grid)]).unsqueeze(0)
        self.register_buffer("pos_embed", table, persistent=False)  # fixed: rebuilt, never saved
        self.blocks = nn.ModuleList(EncoderBlock(dim, num_heads, mlp_ratio=mlp_ratio, norm_eps=1e-6) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pred = nn.Linear(dim, patch_pixels)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """MAE's init: Xavier-uniform Linears with zero biases, unit LayerNorms, the mask token N(0, 0.02)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(self, latent: torch.Tensor, restore: torch.Tensor) -> torch.Tensor:
        """Predict every patch from the encoder's ``[B, prefix + k, D]`` tokens (visible patches in
        shuffled order) and ``restore`` ``[B, L]`` (:func:`random_masking`): ``[B, L, P]`` in grid order."""
        x = self.embed(latent)
        prefix, visible = x[:, : self.num_prefix], x[:, self.num_prefix :]
        length = restore.shape[1]
        filled = torch.cat([visible, self.mask_token.expand(x.shape[0], length - visible.shape[1], -1)], dim=1)
        filled = filled.gather(1, restore.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        x = torch.cat([prefix, filled], dim=1) + self.pos_embed.to(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.pred(self.norm(x))[:, self.num_prefix :]


@register_task("mae")
class MaeTask(Task):
    """MAE pre-training of a headless encoder on ``(images [B, C, H, W], anything)`` batches (the
    labels are ignored). The decoder is the task's child: it trains and is checkpointed with the
    model, and is never exported.

    Args:
        config: the encoder's :class:`~vitkit.models.ViTConfig` (patch grid, width, prefix tokens).
        options: the mask ratio, the decoder's size and the target (:class:`MaeOptions`).

    Raises:
        FieldError: options or an encoder MAE cannot train (:meth:`check_model`).
    """

    Options: ClassVar[type[Config]] = MaeOptions
    uses_labels: ClassVar[bool] = False
    releases_encoder: ClassVar[bool] = True
    figure: ClassVar[str | None] = "reconstructions.png"

    def __init__(self, config: ViTConfig, options: MaeOptions | None = None) -> None:
        super().__init__()
        options = options if options is not None else MaeOptions()
        self.check_model(options, config)
        self.mask_ratio = options.mask_ratio
        self.norm_pix_loss = options.norm_pix_loss
        self.patch_size: tuple[int, int] = tuple(config.patch_size)
        self.grid: tuple[int, int] = config.grid_size
        self.decoder = MaeDecoder(
            config.embed_dim, self.grid, config.num_prefix_tokens, patch_pixels(config),
            dim=options.decoder_dim, depth=options.decoder_depth, num_heads=options.decoder_heads,
        )

    @classmethod
    def check_model(cls, options: MaeOptions, model: ViTConfig) -> None:
        """An encoder MAE can train (:func:`check_encoder`), a mask ratio that leaves a patch
        visible on its grid, and a decoder that, with the encoder, stays within
        :data:`~vitkit.models.config.MAX_PARAMETERS`.

        Raises:
            FieldError: keyed by the recipe key (``model.patch_embed``, ``task.mae.*``).
        """
        try:
            check_encoder(model, options.norm_pix_loss)
        except FieldError as error:
            raise FieldError(f"task.mae.{error.key}" if error.key == "norm_pix_loss" else f"model.{error.key}",
                             error.problem) from None
        if kept_count(model.num_patches, options.mask_ratio) < 1:
            raise FieldError(
                "task.mae.mask_ratio", f"is {options.mask_ratio:g}, which leaves no visible patch of the "
                f"{model.num_patches} of each image; lower it."
            )
        decoder = decoder_weights(model.embed_dim, patch_pixels(model), dim=options.decoder_dim,
                                  depth=options.decoder_depth)
        if decoder + model.num_weights() > MAX_PARAMETERS:
            raise FieldError(
                "task.mae.decoder_dim", f"is {options.decoder_dim} with decoder_depth {options.decoder_depth}: a "
                f"decoder of about {decoder:.3g} weights, which with the encoder's exceeds the limit of "
                f"{MAX_PARAMETERS:.3g}; lower task.mae.decoder_dim or decoder_depth (MAE's light decoders have a few million)."
            )

    @classmethod
    def check_recipe(cls, options: MaeOptions, recipe: Any) -> None:
        """MAE encodes the visible patches through vitkit's ``forward_features(keep=)``, unsharded.

        Raises:
            FieldError: ``trainer.strategy=fsdp`` or ``model.impl`` other than ``vitkit``.
        """
        if recipe.trainer.strategy == "fsdp":
            raise FieldError(
                "trainer.strategy", "is 'fsdp', but MAE encodes through forward_features, and FSDP gathers a "
                "sharded model's weights for its forward only; pre-train with trainer.strategy=ddp."
            )
        if recipe.model.impl != "vitkit":
            raise FieldError(
                "model.impl", f"is {recipe.model.impl!r}, but MAE runs the encoder on the visible patches only, which "
                "vitkit's model does (forward_features(keep=)): set model.impl=vitkit."
            )

    def encode(
        self, model: nn.Module, images: torch.Tensor, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The encoder on the visible patches: its ``[B, prefix + k, D]`` tokens, ``mask`` and
        ``restore`` (:func:`random_masking` of ``noise``, by default ``torch.rand``)."""
        if noise is None:
            noise = torch.rand(images.shape[0], self.grid[0] * self.grid[1], device=images.device)
        keep, mask, restore = random_masking(noise, self.mask_ratio)
        return model.forward_features(images, keep=keep), mask, restore

    def reconstruct(
        self, model: nn.Module, images: torch.Tensor, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoder's ``[B, L, P]`` prediction, the ``[B, L, P]`` target and the ``[B, L]`` mask."""
        latent, mask, restore = self.encode(model, images, noise)
        prediction = self.decoder(latent, restore)
        return prediction, pixel_targets(patchify(images, self.patch_size), self.norm_pix_loss), mask

    def loss(self, model: nn.Module, images: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        """The masked-patch loss of ``images`` (:func:`masked_patch_loss`)."""
        prediction, target, mask = self.reconstruct(model, images, noise)
        return masked_patch_loss(prediction.float(), target.float(), mask)

    def training_step(self, model: nn.Module, batch: Batch) -> StepOutput:
        images = batch[0]
        return StepOutput(self.loss(model, images), len(images))

    def evaluation_step(self, model: nn.Module, batch: Batch, stage: str) -> StepOutput:
        images = batch[0]
        generator = torch.Generator().manual_seed(EVAL_MASK_SEED)
        noise = torch.rand(images.shape[0], self.grid[0] * self.grid[1], generator=generator).to(images.device)
        return StepOutput(self.loss(model, images, noise), len(images))

    @torch.no_grad()
    def figure_rows(self, model: nn.Module, images: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
        """What the paper's Figure 2 shows, as ``[B, C, H, W]`` images in the input's scale: the
        ``masked`` input (hidden patches zero), the ``reconstruction`` (the prediction in hidden
        places, the input where visible; de-normalised per patch with ``norm_pix_loss``) and the
        ``original``."""
        generator = torch.Generator().manual_seed(seed)
        noise = torch.rand(images.shape[0], self.grid[0] * self.grid[1], generator=generator).to(images.device)
        prediction, _, mask = self.reconstruct(model, images, noise)
        patches = patchify(images, self.patch_size)
        if self.norm_pix_loss:  # back to pixels with each patch's own statistics, as MAE's visualisation
            prediction = prediction * (patches.var(dim=-1, keepdim=True) + 1.0e-6) ** 0.5 + patches.mean(dim=-1, keepdim=True)
        hidden = mask.unsqueeze(-1).to(patches.dtype)
        rows = {"masked": patches * (1 - hidden), "reconstruction": patches * (1 - hidden) + prediction.to(patches.dtype) * hidden}
        return {**{k: unpatchify(v, self.patch_size, self.grid) for k, v in rows.items()}, "original": images}
