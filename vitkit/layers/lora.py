"""Low-rank adapters (LoRA; Hu et al. 2021, arXiv 2106.09685) on a ViT's linear projections.

A targeted ``nn.Linear`` ``y = x W^T + b`` becomes ``y = x W^T + b + s * (dropout(x) A^T B^T)`` with
``A [r, in]`` (Kaiming-uniform, as the authors' ``loralib``), ``B [out, r]`` (zeros, so a fresh
adapter changes nothing) and ``s = alpha / r``; ``W`` and ``b`` stay frozen. :class:`LoRALinear`
keeps the base layer's parameter names (``qkv.weight``, ``qkv.bias``), so weight decay, pruning
and layer-decay name rules see the same model, and adds ``lora_A``, ``lora_B`` and the scale as a
buffer, so that a state dict merges without its config (:func:`merge_lora_state_dict`).
:func:`merge_lora` folds ``W + s B A`` back into plain ``nn.Linear`` layers: what a run exports,
which every tool then takes as an ordinary model.

Written here rather than taken from ``peft``: peft requires ``transformers`` and ``accelerate``
(and through them ``huggingface_hub``, ``tokenizers``, ``safetensors``, ...) for a few dozen lines
of arithmetic, and its ``get_peft_model`` wraps layers in a ``base_layer`` that renames every
state-dict key vitkit's tools read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import VitkitError
from ..schema import Config, FieldError, bounds

#: The projections an adapter can sit on: the attention's fused qkv and output projection, the
#: MLP's two layers (their names in every vitkit and timm ViT block).
LoraTarget = Literal["qkv", "proj", "fc1", "fc2"]
_PATHS: dict[str, str] = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
_SUFFIXES = ("lora_A", "lora_B", "lora_scale")


class LoraError(VitkitError, ValueError):
    """Adapters that do not fit a layer or a state dict, or an operation that needs them merged first."""


@dataclass
class LoraConfig(Config):
    """Where adapters go and how large they are.

    Attributes:
        rank: the adapters' rank ``r``.
        alpha: the scale's numerator: updates are scaled by ``alpha / rank``.
        dropout: dropout on the adapter's input (the base path has none).
        targets: which projections of every block get an adapter; the default, the attention's
            qkv and output projection, adapts all four attention matrices of Hu et al.'s study.
    """

    rank: int = field(default=8, metadata=bounds(ge=1, le=4096))
    alpha: float = field(default=16.0, metadata=bounds(gt=0))
    dropout: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    targets: list[LoraTarget] = field(default_factory=lambda: ["qkv", "proj"])

    def validate(self) -> None:
        """At least one target, each once."""
        if not self.targets or len(set(self.targets)) != len(self.targets):
            raise FieldError("targets", f"must name each of qkv, proj, fc1, fc2 at most once, and one at least; got {self.targets}.")


class LoRALinear(nn.Linear):
    """A frozen ``nn.Linear`` plus a trainable low-rank update ``scale * B A``.

    Args:
        base: the layer to adapt; its ``weight`` and ``bias`` parameters are taken over (same
            tensors), and stop requiring grad; so is its training or eval mode.
        rank, alpha, dropout: as :class:`LoraConfig`.

    Shapes: input ``[..., in_features]``, output ``[..., out_features]``.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        nn.Module.__init__(self)
        _check_rank(rank, base)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **factory))
        self.lora_B = nn.Parameter(torch.empty(base.out_features, rank, **factory))
        self.register_buffer("lora_scale", torch.tensor(alpha / rank, **factory))
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.train(base.training)  # an adapter added to a model in eval mode does not drop
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A fresh adapter (``A`` Kaiming-uniform, ``B`` zero); the base weights are left as loaded."""
        if hasattr(self, "lora_A"):
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B)

    def forward_rows(self, x: torch.Tensor, rows: slice) -> torch.Tensor:
        """Output features ``rows`` only, adapter (and its dropout) included: ``[..., in] -> [..., len(rows)]``."""
        bias = None if self.bias is None else self.bias[rows]
        update = F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B[rows])
        return F.linear(x, self.weight[rows], bias) + self.lora_scale * update

    def delta_weight(self) -> torch.Tensor:
        """``scale * B A``, ``[out_features, in_features]``."""
        return self.lora_scale * (self.lora_B @ self.lora_A)

    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` holding ``W + scale * B A`` (and the bias)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.weight + self.delta_weight())
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_rows(x, slice(None))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.lora_A.shape[0]}, scale={self.lora_scale.item():g}"


def _check_rank(rank: int, layer: nn.Linear, name: str = "the layer") -> None:
    if rank > min(layer.in_features, layer.out_features):
        raise LoraError(
            f"LoRA rank {rank} exceeds {name}'s {layer.in_features} inputs or {layer.out_features} outputs; "
            f"use a rank of at most {min(layer.in_features, layer.out_features)}."
        )


def add_lora(model: nn.Module, config: LoraConfig) -> list[str]:
    """Put an adapter on ``config.targets`` of every block of ``model`` (a vitkit or timm ViT: its
    ``blocks[i].attn.qkv``, ``.attn.proj``, ``.mlp.fc1``, ``.mlp.fc2``), in place. Returns the
    adapted layers' names. Every other parameter is left as it is (freezing is the caller's).

    Raises:
        LoraError: a target is no plain ``nn.Linear`` or is smaller than ``config.rank`` (a pruned
            layer's ``proj``); every layer is checked before any is changed.
    """
    chosen: list[tuple[str, nn.Module, str, nn.Linear]] = []
    for index, block in enumerate(model.blocks):
        for target in config.targets:
            parent_name, _, name = _PATHS[target].rpartition(".")
            path = f"blocks.{index}.{_PATHS[target]}"
            try:
                parent = block.get_submodule(parent_name)
                layer = getattr(parent, name)
            except AttributeError:  # a registered block or MLP that names its layers otherwise
                raise LoraError(
                    f"this model has no {path} (its block is {type(block).__name__}, a registered part that names "
                    f"its layers otherwise), so LoRA target {target!r} cannot be adapted; choose among "
                    f"{', '.join(t for t in _PATHS if _PATHS[t].startswith('attn.'))} for its attention."
                ) from None
            if not isinstance(layer, nn.Linear) or isinstance(layer, LoRALinear):
                raise LoraError(f"{path} is not a plain nn.Linear, so it takes no adapter.")
            if 0 in (layer.in_features, layer.out_features):  # a pruned block without heads has nothing to adapt
                continue
            _check_rank(config.rank, layer, path)
            chosen.append((path, parent, name, layer))
    for _, parent, name, layer in chosen:
        setattr(parent, name, LoRALinear(layer, config.rank, config.alpha, config.dropout))
    return [path for path, *_ in chosen]


def linear_rows(linear: nn.Linear, x: torch.Tensor, rows: slice) -> torch.Tensor:
    """``linear(x)[..., rows]`` without computing the other output features, a :class:`LoRALinear`'s
    adapter and its dropout included (cross-attention takes queries and keys from different rows
    of one fused projection)."""
    if isinstance(linear, LoRALinear):
        return linear.forward_rows(x, rows)
    return F.linear(x, linear.weight[rows], None if linear.bias is None else linear.bias[rows])


def has_lora(source: nn.Module | Mapping[str, object]) -> bool:
    """Whether a module holds a :class:`LoRALinear`, or a state dict holds ``lora_*`` tensors."""
    if isinstance(source, nn.Module):
        return any(isinstance(module, LoRALinear) for module in source.modules())
    return any(isinstance(key, str) and key.endswith(_SUFFIXES) for key in source)


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every :class:`LoRALinear` of ``model`` by the plain ``nn.Linear`` it computes, in
    place (same outputs, no adapter code left); returns ``model``."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, child_name, child.merged())
    return model


def merge_lora_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every adapter folded into its layer's weight (``W + scale * B A``, summed in
    the weight's dtype or float32 if that is wider, and returned in the weight's dtype) and the
    ``lora_*`` entries dropped; a state dict without adapters comes back unchanged.

    Raises:
        LoraError: an adapter lacks one of its tensors (``weight``, ``lora_A``, ``lora_B``,
            ``lora_scale``) or their shapes do not fit (``[out, in]``, ``[r, in]``, ``[out, r]``, ``[]``).
    """
    if not has_lora(state):
        return state
    merged = {key: value for key, value in state.items() if not (isinstance(key, str) and key.endswith(_SUFFIXES))}
    prefixes = {key.rpartition(".")[0] + "." for key in state if isinstance(key, str) and key.endswith(_SUFFIXES)}
    for prefix in sorted(prefixes):
        names = [prefix + suffix for suffix in ("weight", *_SUFFIXES)]
        missing = [name for name in names if not isinstance(state.get(name), torch.Tensor)]
        if missing:
            raise LoraError(f"the LoRA adapter of {prefix}weight lacks the tensor(s) {', '.join(missing)}.")
        weight, a, b, scale = (state[name] for name in names)
        if scale.dim() != 0 or a.dim() != 2 or b.dim() != 2 or (b.shape[0], a.shape[1]) != tuple(weight.shape) \
                or b.shape[1] != a.shape[0]:
            raise LoraError(
                f"the LoRA adapter of {prefix}weight {list(weight.shape)} has lora_A {list(a.shape)}, lora_B "
                f"{list(b.shape)}, lora_scale {list(scale.shape)}; they must be [r, in], [out, r] and []."
            )
        work = torch.promote_types(weight.dtype, torch.float32)  # float64 stays float64, half precision sums in float32
        merged[prefix + "weight"] = (weight.to(work) + scale.to(work) * (b.to(work) @ a.to(work))).to(weight.dtype)
    return merged
