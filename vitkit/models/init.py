"""Weight initialisation schemes of a :class:`~vitkit.models.VisionTransformer`, by part.

A scheme assigns one rule to each part of the model (:data:`INIT_PARTS`):

========  ==================================  ========================  =======================  =========================
part      ``vitkit``                          ``timm`` (timm's default)  ``jax`` (big_vision/Flax)  ``mae`` (MAE's code)
========  ==================================  ========================  =======================  =========================
patch     Xavier-uniform                      torch's Conv2d default    LeCun-normal             Xavier-uniform
qkv       Xavier-uniform, per W_q, W_k, W_v   trunc. normal, std 0.02   Xavier-uniform (fused)   Xavier-uniform (fused)
proj      Xavier-uniform x ``out_init_scale`` trunc. normal, std 0.02   Xavier-uniform           Xavier-uniform
mlp       Xavier-uniform                      trunc. normal, std 0.02   Xavier-uniform           Xavier-uniform
head      trunc. normal, std 0.02             trunc. normal, std 0.02   zeros                    trunc. normal, std 2e-5
tokens    N(0, 1e-6)                          N(0, 1e-6)                N(0, 1e-6)               N(0, 0.02)
========  ==================================  ========================  =======================  =========================

Biases are zero except the patch projection's under ``timm`` (torch's default, uniform) and the
MLP's under ``jax`` (normal, std 1e-6). All schemes draw a learned position embedding from a
truncated normal (std 0.02). ``tokens`` are the class and register tokens (:data:`TOKEN_STD`):
timm's N(0, 1e-6), or MAE's N(0, 0.02) (He et al. 2021, arXiv 2111.06377: facebookresearch/mae's
``models_mae.py`` ``initialize_weights``; its head rule is ``main_finetune.py``'s). MAE's fixed 2-D
sin-cos position embedding is the model's ``pos_embed='sincos'``, set beside ``init='mae'`` in the
MAE recipes.

``vitkit`` is Xavier-uniform throughout with a scaled-down ``W_o`` (it writes into the residual
stream; ``out_init_scale`` is ``1/sqrt(2 * depth)`` in models), and the Xavier patch projection
of MAE. The initialisation ablation in docs/results.md compares it with the other schemes and
with timm's own model at equal steps. :func:`init_parts` re-initialises chosen parts only, which is how that
ablation swaps one part at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

from torch import nn

from ..layers.init_rules import (
    LinearRule,
    lecun_normal,
    tiny_normal,
    torch_default,
    trunc_normal,
    xavier,
    xavier_mlp,
    xavier_per_projection,
    xavier_scaled,
    zeros,
)

InitScheme = Literal["vitkit", "timm", "jax", "mae"]
INIT_SCHEMES: tuple[str, ...] = get_args(InitScheme)
InitPart = Literal["patch", "qkv", "proj", "mlp", "head"]
INIT_PARTS: tuple[str, ...] = get_args(InitPart)

SCHEMES: dict[str, dict[str, LinearRule]] = {
    "vitkit": {"patch": xavier, "qkv": xavier_per_projection, "proj": xavier_scaled, "mlp": xavier,
               "head": trunc_normal},
    "timm": {"patch": torch_default, "qkv": trunc_normal, "proj": trunc_normal, "mlp": trunc_normal,
             "head": trunc_normal},
    "jax": {"patch": lecun_normal, "qkv": xavier, "proj": xavier, "mlp": xavier_mlp, "head": zeros},
    "mae": {"patch": xavier, "qkv": xavier, "proj": xavier, "mlp": xavier, "head": tiny_normal},
}

#: The std of the normal that draws the class and register tokens, by scheme.
TOKEN_STD: dict[str, float] = {"vitkit": 1e-6, "timm": 1e-6, "jax": 1e-6, "mae": 0.02}


def part_layers(model: nn.Module, part: str) -> Iterable[tuple[nn.Linear, float]]:
    """The Linears of ``part`` in a VisionTransformer, each with its block's ``out_init_scale``:
    ``qkv`` and ``proj`` are the attention's (:class:`~vitkit.layers.attention.AttentionBase`'s
    contract), ``mlp`` every other Linear of a block (a registered MLP or block may name its
    layers as it likes)."""
    if part == "patch":
        yield model.patch_embed.proj, 1.0
    elif part == "head":  # the distillation head (DeiT) is a second classifier, initialised alike
        for head in (model.head, getattr(model, "head_dist", None)):
            if isinstance(head, nn.Linear):
                yield head, 1.0
    else:
        for block in model.blocks:
            attn = block.attn
            if part == "qkv":
                yield attn.qkv, attn.out_init_scale
            elif part == "proj":
                yield attn.proj, attn.out_init_scale
            else:  # every Linear outside the attention: the MLP's, whatever a registered part names them
                inside_attention = set(attn.modules())
                for layer in block.modules():
                    if isinstance(layer, nn.Linear) and layer not in inside_attention:
                        yield layer, attn.out_init_scale


def init_parts(model: nn.Module, scheme: str, parts: Iterable[str] = INIT_PARTS) -> None:
    """Re-initialise ``parts`` of a VisionTransformer ``model`` by ``scheme`` (in place).

    Raises:
        ValueError: an unknown scheme or part.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown init scheme {scheme!r}; choose one of {INIT_SCHEMES}.")
    rules = SCHEMES[scheme]
    for part in parts:
        if part not in rules:
            raise ValueError(f"unknown init part {part!r}; parts are {INIT_PARTS}.")
        for layer, scale in part_layers(model, part):
            if layer.weight.numel() > 0:
                rules[part](layer, scale)
