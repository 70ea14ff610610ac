"""Weight initialisation schemes of a :class:`~vitkit.models.VisionTransformer`, by part.

A scheme assigns one rule to each part of the model (:data:`INIT_PARTS`):

========  =====================================  ==========================  =========================
part      ``vitkit``                             ``timm`` (timm's default)   ``jax`` (big_vision/Flax)
========  =====================================  ==========================  =========================
patch     Xavier-uniform                         torch's Conv2d default      LeCun-normal
qkv       Xavier-uniform, per W_q, W_k, W_v      trunc. normal, std 0.02     Xavier-uniform (fused)
proj      Xavier-uniform x ``out_init_scale``    trunc. normal, std 0.02     Xavier-uniform
mlp       Xavier-uniform                         trunc. normal, std 0.02     Xavier-uniform
head      trunc. normal, std 0.02                trunc. normal, std 0.02     zeros
========  =====================================  ==========================  =========================

Biases are zero except the patch projection's under ``timm`` (torch's default, uniform) and the
MLP's under ``jax`` (normal, std 1e-6). All schemes draw the learned position embedding from a
truncated normal (std 0.02) and the class token from N(0, 1e-6), as timm does.

``vitkit`` is Xavier-uniform throughout with a scaled-down ``W_o`` (it writes into the residual
stream; ``out_init_scale`` is ``1/sqrt(2 * depth)`` in models), and the Xavier patch projection
of MAE. The README's initialisation ablation compares it with the other schemes and with timm's
own model at equal steps. :func:`init_parts` re-initialises chosen parts only, which is how that
ablation swaps one part at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Literal, get_args

from timm.layers import lecun_normal_
from torch import nn

InitScheme = Literal["vitkit", "timm", "jax"]
INIT_SCHEMES: tuple[str, ...] = get_args(InitScheme)
InitPart = Literal["patch", "qkv", "proj", "mlp", "head"]
INIT_PARTS: tuple[str, ...] = get_args(InitPart)

#: Rule for one Linear: ``(layer, out_init_scale) -> None``.
LinearRule = Callable[[nn.Linear, float], None]


def _trunc_normal(layer: nn.Linear, _: float) -> None:
    nn.init.trunc_normal_(layer.weight, std=0.02)
    _zero_bias(layer)


def _xavier(layer: nn.Linear, _: float) -> None:
    nn.init.xavier_uniform_(layer.weight)
    _zero_bias(layer)


def _xavier_scaled(layer: nn.Linear, scale: float) -> None:
    _xavier(layer, scale)
    layer.weight.data.mul_(scale)


def _xavier_per_projection(layer: nn.Linear, _: float) -> None:
    # Xavier-uniform on each of W_q, W_k, W_v ([inner, D]) rather than on the fused [3 inner, D].
    inner, dim = layer.weight.shape[0] // 3, layer.weight.shape[1]
    bound = math.sqrt(6.0 / (inner + dim))
    nn.init.uniform_(layer.weight, -bound, bound)
    _zero_bias(layer)


def _xavier_mlp(layer: nn.Linear, _: float) -> None:
    nn.init.xavier_uniform_(layer.weight)
    if layer.bias is not None:
        nn.init.normal_(layer.bias, std=1e-6)


def _torch_default(layer: nn.Linear, _: float) -> None:
    # What nn.Linear / nn.Conv2d.reset_parameters do: kaiming_uniform(a=sqrt(5)) = U(+-1/sqrt(fan_in)).
    bound = 1.0 / math.sqrt(layer.weight.shape[1])
    nn.init.uniform_(layer.weight, -bound, bound)
    if layer.bias is not None:
        nn.init.uniform_(layer.bias, -bound, bound)


def _lecun_normal(layer: nn.Linear, _: float) -> None:
    lecun_normal_(layer.weight)
    _zero_bias(layer)


def _zeros(layer: nn.Linear, _: float) -> None:
    nn.init.zeros_(layer.weight)
    _zero_bias(layer)


def _zero_bias(layer: nn.Linear) -> None:
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


SCHEMES: dict[str, dict[str, LinearRule]] = {
    "vitkit": {"patch": _xavier, "qkv": _xavier_per_projection, "proj": _xavier_scaled, "mlp": _xavier,
               "head": _trunc_normal},
    "timm": {"patch": _torch_default, "qkv": _trunc_normal, "proj": _trunc_normal, "mlp": _trunc_normal,
             "head": _trunc_normal},
    "jax": {"patch": _lecun_normal, "qkv": _xavier, "proj": _xavier, "mlp": _xavier_mlp, "head": _zeros},
}


def part_layers(model: nn.Module, part: str) -> Iterable[tuple[nn.Linear, float]]:
    """The Linears of ``part`` in a VisionTransformer, each with its block's ``out_init_scale``."""
    if part == "patch":
        yield model.patch_embed.proj, 1.0
    elif part == "head":
        if isinstance(model.head, nn.Linear):
            yield model.head, 1.0
    else:
        for block in model.blocks:
            attn = block.attn
            if part == "qkv":
                yield attn.qkv, attn.out_init_scale
            elif part == "proj":
                yield attn.proj, attn.out_init_scale
            else:
                yield block.mlp.fc1, attn.out_init_scale
                yield block.mlp.fc2, attn.out_init_scale


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
