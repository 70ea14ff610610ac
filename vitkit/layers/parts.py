"""Registries of the swappable parts of a ViT: blocks, attention layers and MLPs, by name.

A model records the names of its parts in its :class:`~vitkit.models.ViTConfig` (``block``,
``attn_layer``, ``mlp_layer``), so a model file says which classes rebuild it; register your own
class under a new name (import the module that registers it before loading such a file)::

    @register_mlp("glu")
    class GluMlp(nn.Module):
        def __init__(self, dim, hidden_dim, drop=0.0, *, act_layer="gelu", device=None, dtype=None): ...

What each kind must accept (the built-in part is the reference):

* block (:class:`~vitkit.layers.EncoderBlock`): ``(dim, num_heads, attention_options, *, mlp_ratio,
  drop_path, init_values, act_layer, attn_layer, mlp_layer, device, dtype)``; ``forward(x, *,
  attn_bias=None, positions=None, head_gates=None, need_weights=False)``; its attention as ``.attn``.
  For token merging (:func:`vitkit.merge_tokens`) its forward also takes ``merge=None`` and, when
  given one, calls ``x = merge(x, metric)`` once between its attention and its MLP, ``metric``
  ``[B, N, C]`` being the attention's keys (``need_keys=True``); a block without it is refused in
  one line when merging is turned on.
* attention (:class:`~vitkit.layers.MultiHeadSelfAttention`): an
  :class:`~vitkit.layers.attention.AttentionBase` subclass, so head gates, pruning, maps and kernel
  choice work; ``forward`` as the block's, without the residuals, plus ``need_keys=False`` (with
  it, the triple ``(out, weights or None, keys [B, N, C])``) for the encoder block's token merging.
* MLP (:class:`~vitkit.layers.Mlp`): ``(dim, hidden_dim, drop=0.0, *, act_layer, device, dtype)``
  and ``forward(x [..., D]) -> [..., D]``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Literal, TypeVar

from torch import nn

from ..errors import VitkitError

PartKind = Literal["block", "attention", "mlp"]
_REGISTRIES: dict[str, dict[str, type[nn.Module]]] = {"block": {}, "attention": {}, "mlp": {}}
#: The config field that names each kind of part.
PART_FIELDS: dict[str, str] = {"block": "block", "attention": "attn_layer", "mlp": "mlp_layer"}

ModuleT = TypeVar("ModuleT", bound=type[nn.Module])


class UnknownPartError(VitkitError, ValueError):
    """A block, attention or MLP name that no class is registered under."""


def _register(kind: str, name: str) -> Callable[[ModuleT], ModuleT]:
    def add(cls: ModuleT) -> ModuleT:
        known = _REGISTRIES[kind].get(name)
        if known is not None and known is not cls:
            raise ValueError(f"{kind} name {name!r} is already registered to {known.__qualname__}; choose another name.")
        _REGISTRIES[kind][name] = cls
        cls.part_name = name  # type: ignore[attr-defined]
        return cls

    return add


def register_block(name: str) -> Callable[[ModuleT], ModuleT]:
    """Class decorator: make a block class buildable by ``ViTConfig(block=name)``."""
    return _register("block", name)


def register_attention(name: str) -> Callable[[ModuleT], ModuleT]:
    """Class decorator: make an attention class buildable by ``ViTConfig(attn_layer=name)``."""
    return _register("attention", name)


def register_mlp(name: str) -> Callable[[ModuleT], ModuleT]:
    """Class decorator: make an MLP class buildable by ``ViTConfig(mlp_layer=name)``."""
    return _register("mlp", name)


def registered(kind: PartKind) -> list[str]:
    """Names registered for ``kind``, sorted."""
    return sorted(_REGISTRIES[kind])


def get_part(kind: PartKind, name: str) -> type[nn.Module]:
    """The class registered as ``name`` for ``kind``; a one-line :class:`UnknownPartError` otherwise."""
    try:
        return _REGISTRIES[kind][name]
    except KeyError:
        names = registered(kind)
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownPartError(
            f"{PART_FIELDS[kind]} {name!r} is not a registered {kind} (known: {', '.join(names)}).{hint} "
            f"Register your class with vitkit.layers.register_{'attention' if kind == 'attention' else kind}"
            f"({name!r}) and import it before building or loading the model."
        ) from None
