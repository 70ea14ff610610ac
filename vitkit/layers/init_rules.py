"""Initialisation rules for one ``nn.Linear``, shared by the layers' own ``reset_parameters`` and
the model-level schemes of :mod:`vitkit.models.init`. Each rule takes the layer and the
``out_init_scale`` of its block (only :func:`xavier_scaled` uses it) and biases are zeroed unless
the rule says otherwise. :func:`reset_submodules` re-runs every layer's own init (meta-device
building)."""

from __future__ import annotations

import math
from collections.abc import Callable

from timm.layers import lecun_normal_
from torch import nn

#: Rule for one Linear: ``(layer, out_init_scale) -> None``.
LinearRule = Callable[[nn.Linear, float], None]


def trunc_normal(layer: nn.Linear, _: float) -> None:
    """Weights from N(0, 0.02) truncated at +-2 (timm's ViT init)."""
    nn.init.trunc_normal_(layer.weight, std=0.02)
    _zero_bias(layer)


def tiny_normal(layer: nn.Linear, _: float) -> None:
    """Weights from N(0, 2e-5) truncated at +-2: MAE's new classifier for fine-tuning (its
    ``main_finetune.py``), nearly zero logits at the start, unlike 0.02's."""
    nn.init.trunc_normal_(layer.weight, std=2e-5)
    _zero_bias(layer)


def xavier(layer: nn.Linear, _: float) -> None:
    """Xavier-uniform weights (Glorot & Bengio 2010)."""
    nn.init.xavier_uniform_(layer.weight)
    _zero_bias(layer)


def xavier_scaled(layer: nn.Linear, scale: float) -> None:
    """Xavier-uniform weights times ``scale``: W_o, which writes into the residual stream."""
    xavier(layer, scale)
    layer.weight.data.mul_(scale)


def xavier_per_projection(layer: nn.Linear, _: float) -> None:
    """Xavier-uniform on each of W_q, W_k, W_v (``[inner, D]``) of a fused qkv ``[3 inner, D]``,
    so each projection gets the fan of its own shape."""
    inner, dim = layer.weight.shape[0] // 3, layer.weight.shape[1]
    bound = math.sqrt(6.0 / (inner + dim))
    nn.init.uniform_(layer.weight, -bound, bound)
    _zero_bias(layer)


def xavier_mlp(layer: nn.Linear, _: float) -> None:
    """Xavier-uniform weights, biases N(0, 1e-6) (big_vision's MLP)."""
    nn.init.xavier_uniform_(layer.weight)
    if layer.bias is not None:
        nn.init.normal_(layer.bias, std=1e-6)


def torch_default(layer: nn.Linear, _: float) -> None:
    """What ``nn.Linear`` / ``nn.Conv2d`` do by default: kaiming_uniform(a=sqrt(5)), i.e.
    U(+-1/sqrt(fan_in)), for weights and biases."""
    bound = 1.0 / math.sqrt(layer.weight.shape[1])
    nn.init.uniform_(layer.weight, -bound, bound)
    if layer.bias is not None:
        nn.init.uniform_(layer.bias, -bound, bound)


def lecun_normal(layer: nn.Linear, _: float) -> None:
    """LeCun-normal weights (truncated normal, variance 1/fan_in)."""
    lecun_normal_(layer.weight)
    _zero_bias(layer)


def zeros(layer: nn.Linear, _: float) -> None:
    """All zeros (big_vision's classifier head)."""
    nn.init.zeros_(layer.weight)
    _zero_bias(layer)


def _zero_bias(layer: nn.Linear) -> None:
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


def reset_submodules(module: nn.Module) -> None:
    """Call ``reset_parameters()`` of every sub-module of ``module`` (itself excluded), descendants
    before their ancestors, so each module's own rule wins over its children's defaults as it
    does at construction (e.g. the attention's Xavier init over ``nn.Linear``'s).

    With :meth:`torch.nn.Module.to_empty` this initialises a block built on the meta device.
    """
    for child in reversed(list(module.modules())[1:]):
        if hasattr(child, "reset_parameters"):
            child.reset_parameters()
