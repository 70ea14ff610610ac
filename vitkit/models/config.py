"""The hyper-parameters that define a :class:`~vitkit.models.VisionTransformer`, with the limits
every model, whether built in code, from a recipe or from a model file, must respect."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..kernels import AttnImpl
from ..schema import Config, ConfigError, FieldError, bounds
from .init import InitScheme

#: Image channels vitkit's data pipeline produces: grayscale or RGB.
Channels = Literal[1, 3]

#: Generous but finite limits, checked before anything is allocated (ViT-22B, the largest ViT
#: published, has 48 layers, width 6144, 48 heads: Dehghani et al. 2023, arXiv:2302.05442).
MAX_IMG_SIDE = 4096
MAX_DEPTH = 512
MAX_EMBED_DIM = 16384
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_CLASSES = 1_000_000
#: Patches per image (1024x1024 pixels at patch 4, or 4096x4096 at patch 16).
MAX_TOKENS = 65536
#: Weights of the whole model (about 16 GB in float32).
MAX_PARAMETERS = 4_000_000_000


@dataclass
class ViTConfig(Config):
    """Everything needed to rebuild a model; saved next to its weights by ``save_model``.

    ``num_heads`` is an int (every layer) or one count per layer (pruned models); ``head_dim``
    defaults to ``embed_dim // num_heads`` and is recorded explicitly once heads are pruned.
    ``out_init_scale`` defaults to ``1/sqrt(2 * depth)``, GPT-2's residual-projection scaling.
    ``shifted_patches`` and ``locality_attention`` are Lee et al. 2021's small-dataset techniques
    (Shifted Patch Tokenization, Locality Self-Attention; arXiv:2112.13492); timm has no equal, so
    such models do not convert to timm.
    ``init`` names the weight initialisation scheme (:mod:`vitkit.models.init`): ``'vitkit'``
    (Xavier-uniform, scaled-down ``W_o``), ``'timm'`` or ``'jax'``.
    Each field's allowed range is in its metadata (``MAX_*`` above); :meth:`validate` adds the
    cross-field rules (divisibility, :data:`MAX_TOKENS`, :data:`MAX_PARAMETERS`).
    """

    img_size: tuple[int, int] = field(default=(224, 224), metadata=bounds(ge=1, le=MAX_IMG_SIDE))
    patch_size: tuple[int, int] = field(default=(16, 16), metadata=bounds(ge=1, le=MAX_IMG_SIDE))
    in_chans: Channels = 3
    num_classes: int = field(default=1000, metadata=bounds(ge=0, le=MAX_CLASSES))
    embed_dim: int = field(default=768, metadata=bounds(ge=1, le=MAX_EMBED_DIM))
    depth: int = field(default=12, metadata=bounds(ge=1, le=MAX_DEPTH))
    #: A pruned model's per-layer list may hold 0 (a layer without attention); an int is >= 1.
    num_heads: int | list[int] = field(default=12, metadata=bounds(ge=0, le=MAX_HEADS))
    head_dim: int | None = field(default=None, metadata=bounds(ge=1, le=MAX_HEAD_DIM))
    mlp_ratio: float = field(default=4.0, metadata=bounds(gt=0, le=64))
    qkv_bias: bool = True
    qk_norm: bool = False
    class_token: bool = True
    global_pool: Literal["token", "avg"] = "token"
    pos_embed: Literal["learn", "sincos"] = "learn"
    dynamic_img_size: bool = False
    init_values: float | None = None
    drop_rate: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    proj_drop_rate: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    attn_drop_rate: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    drop_path_rate: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    attn_impl: AttnImpl = "auto"
    out_init_scale: float | None = field(default=None, metadata=bounds(gt=0))
    init: InitScheme = "vitkit"
    shifted_patches: bool = False
    locality_attention: bool = False
    norm_eps: float = field(default=1e-6, metadata=bounds(gt=0, le=1))

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first inconsistent hyper-parameter."""
        heads = self.heads_per_layer()
        if isinstance(self.num_heads, int) and self.num_heads < 1:
            raise FieldError("num_heads", f"is out of range: got {self.num_heads}, must be >= 1 and <= {MAX_HEADS}.")
        if self.head_dim is None and (heads[0] < 1 or self.embed_dim % heads[0] != 0):
            raise ValueError(
                f"embed_dim ({self.embed_dim}) must be divisible by num_heads ({heads[0]}); "
                "choose a head count among its divisors."
            )
        for size, patch, axis in zip(self.img_size, self.patch_size, ("height", "width")):
            if size % patch != 0:
                raise ValueError(f"img_size {axis} {size} is not divisible by patch_size {patch}.")
        tokens = self.grid_size[0] * self.grid_size[1]
        if tokens > MAX_TOKENS:
            raise ValueError(
                f"img_size {list(self.img_size)} at patch_size {list(self.patch_size)} gives {tokens:,} patches, "
                f"more than the limit of {MAX_TOKENS:,}; use a larger patch_size or a smaller img_size."
            )
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without it.")
        weights = self.num_weights()
        if weights > MAX_PARAMETERS:
            raise ValueError(
                f"this model would hold about {weights:.3g} weights, more than the limit of {MAX_PARAMETERS:.3g}; "
                "reduce depth, embed_dim, num_heads x head_dim, mlp_ratio or num_classes."
            )

    def heads_per_layer(self) -> list[int]:
        """Head count of every block, ``[depth]``."""
        if isinstance(self.num_heads, list):
            if len(self.num_heads) != self.depth:
                raise FieldError(
                    "num_heads",
                    f"lists {len(self.num_heads)} layers but depth is {self.depth}; "
                    "give one head count per layer or a single int.",
                )
            return list(self.num_heads)
        return [self.num_heads] * self.depth

    def resolved_head_dim(self) -> int:
        """Per-head width ``d``."""
        return self.head_dim if self.head_dim is not None else self.embed_dim // self.heads_per_layer()[0]

    @property
    def grid_size(self) -> tuple[int, int]:
        """Patch grid of ``img_size``."""
        return self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1]

    def num_weights(self) -> int:
        """Weights of the matrices and embeddings the model will hold (biases and norms, a small
        fraction, left out): computed from the config, before anything is allocated."""
        dim, head_dim = self.embed_dim, self.resolved_head_dim()
        patch_in = self.patch_size[0] * self.patch_size[1] * self.in_chans * (5 if self.shifted_patches else 1)
        tokens = self.grid_size[0] * self.grid_size[1] + int(self.class_token)
        blocks = sum(
            4 * dim * heads * head_dim + 2 * dim * int(dim * self.mlp_ratio) for heads in self.heads_per_layer()
        )
        return (patch_in + tokens + self.num_classes) * dim + blocks

    @classmethod
    def from_dict(
        cls, values: Any, *, source: str = "the given dict", error: type[ConfigError] = ConfigError
    ) -> ViTConfig:
        """Build from a mapping (inverse of :meth:`to_dict`), validated like every vitkit config.
        Files written before ``extra`` was removed carry an always-empty ``extra`` key: it is dropped."""
        if isinstance(values, dict) and values.get("extra") == {}:
            values = {key: value for key, value in values.items() if key != "extra"}
        return super().from_dict(values, source=source, error=error)
