"""The hyper-parameters that define a :class:`~vitkit.models.VisionTransformer`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from ..layers.attention_kernels import ATTN_IMPLS, AttnImpl
from .init import INIT_SCHEMES, InitScheme


@dataclass
class ViTConfig:
    """Everything needed to rebuild a model; saved next to its weights by ``save_model``.

    ``num_heads`` is an int (every layer) or one count per layer (pruned models); ``head_dim``
    defaults to ``embed_dim // num_heads`` and is recorded explicitly once heads are pruned.
    ``out_init_scale`` defaults to ``1/sqrt(2 * depth)``, GPT-2's residual-projection scaling.
    ``shifted_patches`` and ``locality_attention`` are Lee et al. 2021's small-dataset techniques
    (Shifted Patch Tokenization, Locality Self-Attention; https://arxiv.org/abs/2112.13492); timm
    has no equal, so such models do not convert to timm.
    ``init`` names the weight initialisation scheme (:mod:`vitkit.models.init`): ``'vitkit'``
    (Xavier-uniform, scaled-down ``W_o``), ``'timm'`` or ``'jax'``.
    """

    img_size: tuple[int, int] = (224, 224)
    patch_size: tuple[int, int] = (16, 16)
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int | list[int] = 12
    head_dim: int | None = None
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    qk_norm: bool = False
    class_token: bool = True
    global_pool: Literal["token", "avg"] = "token"
    pos_embed: Literal["learn", "sincos"] = "learn"
    dynamic_img_size: bool = False
    init_values: float | None = None
    drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    attn_impl: AttnImpl = "auto"
    out_init_scale: float | None = None
    init: InitScheme = "vitkit"
    shifted_patches: bool = False
    locality_attention: bool = False
    norm_eps: float = 1e-6
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.img_size = _pair(self.img_size, "img_size")
        self.patch_size = _pair(self.patch_size, "patch_size")
        if isinstance(self.num_heads, (list, tuple)):
            self.num_heads = [int(h) for h in self.num_heads]
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first inconsistent hyper-parameter."""
        heads = self.heads_per_layer()
        if self.depth < 1 or self.embed_dim < 1 or self.num_classes < 0 or self.in_chans < 1:
            raise ValueError(
                f"depth, embed_dim and in_chans must be positive and num_classes >= 0; got depth={self.depth}, "
                f"embed_dim={self.embed_dim}, in_chans={self.in_chans}, num_classes={self.num_classes}."
            )
        if self.head_dim is None:
            if heads[0] <= 0 or self.embed_dim % heads[0] != 0:
                raise ValueError(
                    f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({heads[0]}); "
                    "choose a head count among its divisors."
                )
        for size, patch, axis in zip(self.img_size, self.patch_size, ("height", "width")):
            if size % patch != 0:
                raise ValueError(f"img_size {axis} {size} is not divisible by patch_size {patch}.")
        if self.global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool must be 'token' or 'avg', got {self.global_pool!r}.")
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without it.")
        if self.pos_embed not in ("learn", "sincos"):
            raise ValueError(f"pos_embed must be 'learn' or 'sincos', got {self.pos_embed!r}.")
        if self.init not in INIT_SCHEMES:
            raise ValueError(f"init must be one of {INIT_SCHEMES}, got {self.init!r}.")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {ATTN_IMPLS}, got {self.attn_impl!r}.")
        for name in ("drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {value}.")

    def heads_per_layer(self) -> list[int]:
        """Head count of every block, ``[depth]``."""
        if isinstance(self.num_heads, list):
            if len(self.num_heads) != self.depth:
                raise ValueError(
                    f"num_heads lists {len(self.num_heads)} layers but depth is {self.depth}; "
                    "give one head count per layer or a single int."
                )
            return list(self.num_heads)
        return [int(self.num_heads)] * self.depth

    def resolved_head_dim(self) -> int:
        """Per-head width ``d``."""
        return self.head_dim if self.head_dim is not None else self.embed_dim // self.heads_per_layer()[0]

    @property
    def grid_size(self) -> tuple[int, int]:
        """Patch grid of ``img_size``."""
        return self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict (tuples become lists)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ViTConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ViTConfig field(s) {unknown}; valid fields: {sorted(known)}.")
        return cls(**values)

    def replace(self, **overrides: Any) -> ViTConfig:
        """A copy with ``overrides`` applied (validated)."""
        return ViTConfig.from_dict({**self.to_dict(), **overrides})


def _pair(value: Any, name: str) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    try:
        first, second = value
        return int(first), int(second)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}.") from None
