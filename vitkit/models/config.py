"""The hyper-parameters that define a :class:`~vitkit.models.VisionTransformer`, with the limits
every model, whether built in code, from a recipe or from a model file, must respect."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from ..kernels import AttnImpl
from ..layers.attention import AttentionOptions
from ..layers.mlp import ActLayer
from ..layers.parts import PART_FIELDS, get_part
from ..layers.patch_embed import conv_stem_reaches
from ..layers.rope import RopeAxes, RopeKind
from ..layers.token_merging import merge_limit, merge_schedule
from ..schema import MAX_IMG_SIDE, Channels, Config, FieldError, bounds
from .init import InitScheme

#: Generous but finite limits, checked before anything is allocated (ViT-22B, the largest ViT
#: published, has 48 layers, width 6144, 48 heads: Dehghani et al. 2023, arXiv:2302.05442).
MAX_DEPTH = 512
MAX_EMBED_DIM = 16384
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_CLASSES = 1_000_000
#: Register tokens (Darcet et al. 2023 use 4 to 16; DINOv2 ships 4).
MAX_REG_TOKENS = 256
#: Patches per image (1024x1024 pixels at patch 4, or 4096x4096 at patch 16).
MAX_TOKENS = 65536
#: Weights of the whole model (about 16 GB in float32).
MAX_PARAMETERS = 4_000_000_000

#: The :class:`~vitkit.layers.AttentionOptions` whose ViTConfig field has another name; every
#: other option is the ViTConfig field of its own name (:meth:`ViTConfig.attention_options`).
ATTENTION_OPTION_FIELDS = {"attn_drop": "attn_drop_rate", "proj_drop": "proj_drop_rate"}


@dataclass
class ViTConfig(Config):
    """Everything needed to rebuild a model; saved next to its weights by ``save_model``.

    ``num_heads`` is an int (every layer) or one count per layer (pruned models); ``head_dim``
    defaults to ``embed_dim // num_heads`` and is recorded explicitly once heads are pruned.
    ``out_init_scale`` defaults to ``1/sqrt(2 * depth)``, GPT-2's residual-projection scaling.
    ``shifted_patches`` and ``locality`` are Lee et al. 2021's small-dataset techniques
    (Shifted Patch Tokenization, Locality Self-Attention; arXiv:2112.13492); timm has no equal, so
    such models do not convert to timm.
    Token, pooling and norm options follow timm's ``VisionTransformer`` of the same names:
    ``reg_tokens`` learnable register tokens after the class token (Darcet et al. 2023,
    arXiv:2309.16588); ``no_embed_class`` adds the position embedding to the patches only;
    ``pre_norm`` is CLIP's LayerNorm before the blocks (the patch projection then has no bias);
    ``fc_norm`` moves the final norm after pooling (``None``: when ``global_pool == 'avg'``);
    ``head_bn`` puts a ``BatchNorm1d(affine=False, eps=1e-6)`` between the pooled features and the
    classifier, MAE's linear probe (He et al. 2021, arXiv 2111.06377, ``main_linprobe.py``; timm
    has no such head);
    ``global_pool='map'`` is SigLIP's attention-pooling head (timm's ``AttentionPoolLatent``);
    ``act_layer`` is the MLPs' activation; ``distilled`` adds DeiT's distillation token and head
    (Touvron et al. 2021, arXiv:2012.12877).
    ``pos_embed`` is the absolute position embedding (``learn``, fixed ``sincos`` or ``none``;
    unset: ``learn`` without RoPE, ``none`` with it) and ``rope`` the rotary one of every attention
    (:mod:`vitkit.layers.rope`: ``axial`` or ``mixed``, base ``rope_theta``, axis order
    ``rope_axes`` for ``axial``). Heo et al.'s RoPE ViTs (arXiv:2403.13298) have no absolute
    embedding; their ``+APE`` variants (timm's ``*_rope_*_ape_*``) add one to the patches only, as
    ``pos_embed='learn'`` with RoPE does here.
    ``drop_rate`` is the classifier's dropout and ``pos_drop_rate`` the tokens' after the position
    embedding, as in timm.
    ``patch_embed`` is the tokenizer: ``linear`` patches (einops + ``Linear``) or Xiao et al. 2021's
    ``conv`` stem (stride-2 3x3 convolutions with BatchNorm/ReLU, then a 1x1; arXiv:2106.14881),
    whose patch size must be a square power of two; timm's ``VisionTransformer`` has neither SPT
    nor this stem.
    ``block``, ``attn_layer`` and ``mlp_layer`` name the classes the blocks are built from, as
    registered in :mod:`vitkit.layers.parts` (timm's ``block_fn``, ``attn_layer``, ``mlp_layer``);
    a model file records them, so a custom block round-trips once its module is imported.
    ``init`` names the weight initialisation scheme (:mod:`vitkit.models.init`): ``'vitkit'``
    (Xavier-uniform, scaled-down ``W_o``), ``'timm'`` or ``'jax'``.
    ``merge_tokens`` is an inference option, not a weight: ToMe's ``r``, the tokens each block
    merges (one count for all, or one per block; :func:`vitkit.merge_tokens` sets it, 0 = none).
    ``merge_prop_attn`` is ToMe's ``prop_attn``: while merging, ``log(size)`` of each key is added
    to the attention scores (proportional attention); ``False`` leaves the scores as they are, the
    sizes still weighting the merged averages. It applies only while ``merge_tokens`` merges.
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
    global_pool: Literal["token", "avg", "map"] = "token"
    pos_embed: Literal["learn", "sincos", "none"] | None = None
    rope: RopeKind = "none"
    rope_theta: float | None = field(default=None, metadata=bounds(gt=0))
    rope_axes: RopeAxes = "xy"
    dynamic_img_size: bool = False
    init_values: float | None = None
    drop_rate: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    pos_drop_rate: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    proj_drop_rate: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    attn_drop_rate: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    drop_path_rate: float = field(default=0.0, metadata=bounds(ge=0, lt=1))
    attn_impl: AttnImpl = "auto"
    out_init_scale: float | None = field(default=None, metadata=bounds(gt=0))
    init: InitScheme = "vitkit"
    patch_embed: Literal["linear", "conv"] = "linear"
    shifted_patches: bool = False
    locality: bool = False
    norm_eps: float = field(default=1e-6, metadata=bounds(gt=0, le=1))
    reg_tokens: int = field(default=0, metadata=bounds(ge=0, le=MAX_REG_TOKENS))
    no_embed_class: bool = False
    pre_norm: bool = False
    fc_norm: bool | None = None
    head_bn: bool = False
    act_layer: ActLayer = "gelu"
    distilled: bool = False
    block: str = "encoder"
    attn_layer: str = "self_attention"
    mlp_layer: str = "mlp"
    merge_tokens: int | list[int] = field(default=0, metadata=bounds(ge=0, le=MAX_TOKENS))
    merge_prop_attn: bool = True

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first inconsistent hyper-parameter."""
        for kind in ("block", "attention", "mlp"):
            get_part(kind, getattr(self, PART_FIELDS[kind]))
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
        if self.patch_embed == "conv":
            if not conv_stem_reaches(self.patch_size):
                raise FieldError(
                    "patch_size",
                    f"must be a square power of two >= 2 with patch_embed='conv' (its stride-2 convolutions multiply "
                    f"to it), got {list(self.patch_size)}; use e.g. 4 or 8, or patch_embed='linear'.",
                )
            if self.shifted_patches:
                raise ValueError("shifted_patches and patch_embed='conv' are two tokenizers; choose one.")
        tokens = self.num_patches
        if tokens > MAX_TOKENS:
            raise ValueError(
                f"img_size {list(self.img_size)} at patch_size {list(self.patch_size)} gives {tokens:,} patches, "
                f"more than the limit of {MAX_TOKENS:,}; use a larger patch_size or a smaller img_size."
            )
        if self.rope != "none" and self.resolved_head_dim() % 4 != 0:
            raise FieldError(
                "rope",
                f"needs head_dim divisible by 4 (2-D RoPE turns a quarter of each head's channels per axis and "
                f"component), got head_dim {self.resolved_head_dim()}; change embed_dim, num_heads or head_dim.",
            )
        self._validate_positions()
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without it.")
        self._validate_prefix_tokens()
        self._validate_merging()
        weights = self.num_weights()
        if weights > MAX_PARAMETERS:
            raise ValueError(
                f"this model would hold about {weights:.3g} weights, more than the limit of {MAX_PARAMETERS:.3g}; "
                "reduce depth, embed_dim, num_heads x head_dim, mlp_ratio or num_classes."
            )

    def _validate_positions(self) -> None:
        """Refuse a position option that would do nothing in this combination."""
        if self.rope == "none" and self.rope_theta is not None:
            raise FieldError("rope_theta", "only applies with rope='axial' or 'mixed'; set rope too, or remove rope_theta.")
        if self.rope != "axial" and self.rope_axes != "xy":
            raise FieldError(
                "rope_axes",
                f"only applies with rope='axial' (mixed RoPE learns its own 2-D frequencies), got rope={self.rope!r}; "
                "remove rope_axes or set rope='axial'.",
            )
        if self.no_embed_class and self.resolved_pos_embed == "none":
            raise FieldError("no_embed_class", "only applies with an absolute position embedding (pos_embed='learn' or "
                             "'sincos'); remove it.")
        if self.no_embed_class and self.rope != "none":
            raise FieldError("no_embed_class", "is implied with RoPE: an absolute embedding is added to the patches only "
                             "(Heo et al.'s +APE models); remove it.")

    def _validate_prefix_tokens(self) -> None:
        """The distillation token's rules (those of timm's ``VisionTransformerDistilled``)."""
        if self.distilled and (not self.class_token or self.global_pool != "token"):
            raise ValueError("distilled=True reads the class and distillation tokens: it needs class_token=True "
                             "and global_pool='token'.")
        if self.distilled and self.fc_norm:
            raise FieldError("fc_norm", "cannot be set with distilled=True: timm's DeiT (VisionTransformerDistilled) reads "
                             "its two tokens without fc_norm, so no twin would match; leave fc_norm unset.")
        if self.distilled and self.head_bn:
            raise FieldError("head_bn", "cannot be set with distilled=True: it normalises the one head's input, and a "
                             "distilled model has two heads; leave head_bn false.")
        if self.distilled and (self.reg_tokens or self.no_embed_class):
            raise ValueError("distilled=True has no register tokens or no_embed_class (timm's DeiT has neither); "
                             "set reg_tokens=0 and no_embed_class=False.")
        if self.global_pool == "map" and self.embed_dim % self.pool_heads:
            raise ValueError(f"global_pool='map' splits embed_dim ({self.embed_dim}) into {self.pool_heads} heads; "
                             "choose an embed_dim divisible by the head width.")

    def _validate_merging(self) -> None:
        """Token merging's count per block, and a first block that can merge that many tokens
        (later blocks merge at most half of what is left, as ToMe)."""
        schedule = self.merge_per_block()
        limit = merge_limit(self.num_tokens, self.num_prefix_tokens)
        if schedule and schedule[0] > limit:
            raise FieldError(
                "merge_tokens",
                f"asks the first block to merge {schedule[0]} tokens, but at most {limit} of its {self.num_tokens} "
                f"tokens ({self.num_prefix_tokens} never merge) can merge in one block; lower r.",
            )

    def merge_per_block(self) -> list[int]:
        """Tokens each block merges, ``[depth]`` (all zeros without token merging)."""
        try:
            return merge_schedule(self.merge_tokens, self.depth)
        except ValueError as problem:
            raise FieldError("merge_tokens", str(problem).removeprefix("r ")) from None

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

    def resolved_out_init_scale(self) -> float:
        """``W_o``'s init factor: ``out_init_scale``, or ``1/sqrt(2 * depth)`` (GPT-2) when unset."""
        return self.out_init_scale if self.out_init_scale is not None else (2 * self.depth) ** -0.5

    def attention_options(self) -> AttentionOptions:
        """Every block's :class:`~vitkit.layers.AttentionOptions`: each option is the field of
        its name (or of its :data:`ATTENTION_OPTION_FIELDS` name), with ``head_dim`` and
        ``out_init_scale`` resolved."""
        values = {
            option.name: getattr(self, ATTENTION_OPTION_FIELDS.get(option.name, option.name))
            for option in dataclasses.fields(AttentionOptions)
        }
        values.update(head_dim=self.resolved_head_dim(), out_init_scale=self.resolved_out_init_scale())
        return AttentionOptions(**values)

    @property
    def grid_size(self) -> tuple[int, int]:
        """Patch grid of ``img_size``."""
        return self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1]

    @property
    def num_patches(self) -> int:
        """Patch tokens of an ``img_size`` image, ``gh * gw``."""
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches, in this order: the class token, the distillation token, the
        registers. What pooling, the explain read-out, the head diagnostics and pruning skip to
        reach the patch grid."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def resolved_pos_embed(self) -> Literal["learn", "sincos", "none"]:
        """The absolute position embedding: ``pos_embed``, or when unset ``learn`` without RoPE
        and ``none`` with it (Heo et al.'s RoPE ViTs)."""
        if self.pos_embed is not None:
            return self.pos_embed
        return "learn" if self.rope == "none" else "none"

    @property
    def num_pos_embed_prefix_tokens(self) -> int:
        """Prefix tokens that have a position embedding: none with ``no_embed_class`` or RoPE
        (whose absolute embedding is on the patches only)."""
        return 0 if self.no_embed_class or self.rope != "none" else self.num_prefix_tokens

    @property
    def use_fc_norm(self) -> bool:
        """Whether the final norm comes after pooling: ``fc_norm``, or timm's rule when unset."""
        return self.global_pool == "avg" if self.fc_norm is None else self.fc_norm

    @property
    def pool_heads(self) -> int:
        """Heads of the ``'map'`` pooling head: ``embed_dim`` over the head width, which stays the
        first layer's head count after heads are pruned (``head_dim`` is then recorded)."""
        return max(1, self.embed_dim // self.resolved_head_dim())

    @property
    def num_tokens(self) -> int:
        """Sequence length ``N`` the blocks see on an ``img_size`` image: prefix and patch tokens."""
        return self.num_prefix_tokens + self.num_patches

    @property
    def patch_dim(self) -> int:
        """Input width of the patch projection: pixels of a patch times channels (five shifted
        copies of the image with ``shifted_patches``)."""
        return self.patch_size[0] * self.patch_size[1] * self.in_chans * (5 if self.shifted_patches else 1)

    def num_weights(self) -> int:
        """Weights of the matrices and embeddings the model will hold (biases and norms, a small
        fraction, left out): computed from the config, before anything is allocated."""
        dim, head_dim = self.embed_dim, self.resolved_head_dim()
        blocks = sum(
            4 * dim * heads * head_dim + 2 * dim * int(dim * self.mlp_ratio) for heads in self.heads_per_layer()
        )
        heads = self.num_classes * (1 + int(self.distilled))
        pool = (4 * dim + 2 * int(dim * self.mlp_ratio)) * dim if self.global_pool == "map" else 0
        positions = 0 if self.resolved_pos_embed == "none" else self.num_pos_embed_prefix_tokens + self.num_patches
        return (self.patch_dim + self.num_prefix_tokens + positions + heads) * dim + blocks + pool
