"""Load timm ``VisionTransformer`` weights into vitkit and back.

The only layout difference is the patch projection: timm's ``Conv2d`` weight ``[D, C, p1, p2]``
is vitkit's ``Linear`` weight ``[D, p1*p2*C]`` over ``(p1 p2 c)``-ordered patches, i.e. the conv
weight permuted to ``[D, p1, p2, C]`` and flattened. Every other key is shared: the class,
distillation and register tokens, the position embedding (with or without prefix rows, as
``no_embed_class`` says), ``norm_pre``, ``fc_norm``, ``attn_pool`` and ``head_dist``.
timm's RoPE ViTs are its ``Eva`` class, whose own key map is in :mod:`.timm_eva`.

:func:`timm_features_vitkit_lacks` is the one place that decides whether a timm model converts:
it inspects the module tree (types and attributes, never the model's name) before anything is
built, and :func:`from_timm` refuses a model with one :class:`UnsupportedModelError` naming what
vitkit lacks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import timm
import torch
from timm.layers import GELU as TimmGELU
from timm.layers import AttentionPoolLatent, GELUTanh, LayerScale, Mlp, PatchEmbed, QuickGELU
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import Attention, Block
from timm.models.vision_transformer import VisionTransformer as TimmVisionTransformer
from torch import nn

from ..errors import UnsupportedModelError
from ..layers.lora import merge_lora_state_dict
from ..preprocessing import PREPROCESSING_KEYS
from .config import ViTConfig
from .registry import MODEL_CONFIGS
from .timm_eva import (
    eva_config_and_state,
    eva_state_dict,
    eva_twin,
    eva_unsupported,
    is_eva,
    is_eva_state_dict,
    timm_geometry,
)
from .vision_transformer import VisionTransformer

PATCH_WEIGHT = "patch_embed.proj.weight"

#: Block classes of timm's ViTs that vitkit has no equal of, by what they are.
_BLOCK_FEATURES = {
    "ResPostBlock": "residual post-norm blocks (res-post-norm)",
    "ParallelThingsBlock": "parallel blocks (several attention and MLP branches side by side)",
    "ParallelScalingBlock": "parallel blocks (attention and MLP side by side, fused projections)",
    "ResPostRelPosBlock": "residual post-norm blocks (res-post-norm)",
    "RelPosBlock": "relative position bias",
    "EvaBlockPostNorm": "residual post-norm blocks (res-post-norm)",
}


def _activation_name(act: nn.Module) -> str | None:
    """vitkit's :data:`~vitkit.layers.mlp.ActLayer` name of a timm MLP activation, or ``None``."""
    if isinstance(act, QuickGELU):
        return "quick_gelu"
    if isinstance(act, GELUTanh) or (isinstance(act, nn.GELU) and act.approximate == "tanh"):
        return "gelu_tanh"
    if isinstance(act, TimmGELU) or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    return None


def _is_layer_norm(norm: nn.Module) -> bool:
    return isinstance(norm, nn.LayerNorm)  # torch's or timm's subclass; RmsNorm is neither


def _block_lacks(block: nn.Module) -> list[str]:
    """What one timm ``Block`` has that vitkit's :class:`~vitkit.layers.EncoderBlock` lacks."""
    kind = type(block).__name__
    if type(block) is not Block:
        return [_BLOCK_FEATURES.get(kind, f"its {kind} blocks (vitkit has pre-norm ViT blocks only)")]
    lacks = []
    if not (_is_layer_norm(block.norm1) and _is_layer_norm(block.norm2)):
        lacks.append(f"{type(block.norm1).__name__} norms (vitkit's norms are LayerNorms)")
    attn, mlp = block.attn, block.mlp
    if type(attn) is not Attention:
        lacks.append(f"{type(attn).__name__} attention")
    else:
        if not isinstance(attn.norm, nn.Identity):
            lacks.append("a norm inside the attention (scale_attn_norm, BEiT-3's sub-LN)")
        if attn.proj.bias is None:
            lacks.append("an attention output projection without bias")
        if not isinstance(attn.q_norm, (nn.Identity, nn.LayerNorm)):
            lacks.append(f"{type(attn.q_norm).__name__} query-key norms")
    if type(mlp) is not Mlp:
        lacks.append(f"a gated MLP ({type(mlp).__name__}: SwiGLU-style; vitkit's MLP is Linear-act-Linear)")
    else:
        if not isinstance(mlp.norm, nn.Identity):
            lacks.append("a norm inside the MLP (scale_mlp_norm)")
        if mlp.fc1.bias is None or mlp.fc2.bias is None:
            lacks.append("MLP projections without bias")
        if _activation_name(mlp.act) is None:
            lacks.append(f"the {type(mlp.act).__name__} activation (vitkit has gelu, quick_gelu, gelu_tanh)")
    if not isinstance(block.ls1, (nn.Identity, LayerScale)):
        lacks.append(f"{type(block.ls1).__name__} layer scale")
    return lacks


def _attention_pool_lacks(model: nn.Module) -> list[str]:
    """What a ``global_pool='map'`` head has beyond SigLIP's (one latent query, no position
    embedding, a query projection, no qk-norm, the blocks' head width and MLP ratio)."""
    pool, block = model.attn_pool, model.blocks[0]
    if type(pool) is not AttentionPoolLatent:
        return [f"a {type(pool).__name__} pooling head"]
    head_dim = block.attn.head_dim
    like_siglip = (
        pool.latent_len == 1
        and pool.pos_embed is None
        and isinstance(pool.q, nn.Linear)
        and isinstance(pool.q_norm, nn.Identity)
        and pool.mlp is not None
        and pool.head_dim == head_dim
        and pool.mlp.fc1.out_features == block.mlp.fc1.out_features
        and _is_layer_norm(pool.norm)
        and type(pool.mlp.act) is type(block.mlp.act)
    )
    return [] if like_siglip else ["an attention-pooling head unlike SigLIP's (latent count, width or norms)"]


def _vit_lacks(model: nn.Module) -> list[str]:
    """What a timm ``VisionTransformer`` (or DeiT's distilled subclass) has that vitkit lacks."""
    lacks = []
    embed = model.patch_embed
    if type(embed) is not PatchEmbed:
        lacks.append(f"a CNN stem ({type(embed).__name__}: hybrid ResNet + ViT)")
    else:
        conv = embed.proj
        if not isinstance(conv, nn.Conv2d) or conv.stride != conv.kernel_size or conv.padding != (0, 0):
            lacks.append("an overlapping patch stem")
        if not isinstance(embed.norm, nn.Identity):
            lacks.append("a norm in the patch embedding")
        if getattr(embed, "dynamic_img_pad", False):
            lacks.append("dynamic image padding")
        if conv.in_channels not in (1, 3):
            lacks.append(f"{conv.in_channels} input channels (vitkit reads 1 or 3)")
    if model.pos_embed is None:
        lacks.append("no absolute position embedding (pos_embed='none')")
    if not isinstance(model.patch_drop, nn.Identity):
        lacks.append("patch dropout (patch_drop_rate)")
    if model.global_pool not in ("token", "avg", "map"):
        lacks.append(f"global_pool={model.global_pool!r} (vitkit has 'token', 'avg', 'map')")
    elif model.global_pool == "map":
        lacks.extend(_attention_pool_lacks(model))
    if getattr(model, "pool_include_prefix", False):
        lacks.append("pooling that includes the prefix tokens")
    if isinstance(model.norm, nn.Identity) and isinstance(model.fc_norm, nn.Identity):
        lacks.append("no final norm (final_norm=False)")
    for name in ("norm_pre", "norm", "fc_norm"):
        norm = getattr(model, name)
        if not isinstance(norm, nn.Identity) and not _is_layer_norm(norm):
            lacks.append(f"{type(norm).__name__} norms (vitkit's norms are LayerNorms)")
    block_lacks = [feature for block in model.blocks for feature in _block_lacks(block)]
    lacks.extend(block_lacks)
    if not block_lacks and len({_block_signature(block) for block in model.blocks}) > 1:
        lacks.append("blocks that differ in width, heads, biases or layer scale")
    return list(dict.fromkeys(lacks))  # each feature once, in order


def _block_signature(block: nn.Module) -> tuple[Any, ...]:
    """What must be equal in every block: vitkit builds them all from one config."""
    attn, mlp = block.attn, block.mlp
    return (
        attn.num_heads, attn.qkv.bias is not None, type(attn.q_norm), mlp.fc1.out_features, type(mlp.act),
        type(block.ls1), block.norm1.eps,
    )


def timm_features_vitkit_lacks(model: nn.Module) -> list[str]:
    """The architectural features of a timm model that vitkit's :class:`VisionTransformer`
    lacks, in plain words (empty when :func:`from_timm` converts it exactly).

    Decided from the module tree alone (classes and attributes, not the model's name), without
    building anything.
    """
    if isinstance(model, TimmVisionTransformer):
        return _vit_lacks(model)
    if is_eva(model):
        return eva_unsupported(model)
    if any("relative_position" in name for name, _ in model.named_parameters()) or any(
        "RelPos" in type(module).__name__ for module in model.modules()
    ):
        return ["relative position bias (BEiT, vit_relpos_*)"]
    return [f"the {type(model).__name__} architecture (vitkit converts timm's VisionTransformer family)"]


@dataclass(frozen=True)
class TwinGap:
    """One thing a :class:`ViTConfig` asks for that its timm twin (:func:`timm_twin`) cannot do.

    Attributes:
        feature: what it is, in a few words.
        fix: the fields whose values remove it (empty: the model has no timm twin at all).
    """

    feature: str
    fix: dict[str, Any] = field(default_factory=dict)


def timm_twin_lacks(config: ViTConfig) -> list[TwinGap]:
    """What the model of ``config`` does that its timm twin (a ``VisionTransformer``, ``Eva`` with
    RoPE) cannot express, in plain words with the fields that remove it; empty when
    :func:`to_timm` gives exactly the same logits. The converse of :func:`timm_features_vitkit_lacks`,
    and the one rule behind :func:`timm_twin`, :func:`to_timm` and ``model.impl: timm`` recipes.
    """
    heads = config.heads_per_layer()
    gaps = [
        TwinGap("shifted patch tokenization", {"shifted_patches": False}) if config.shifted_patches else None,
        TwinGap("locality self-attention", {"locality": False}) if config.locality else None,
        TwinGap("a convolutional stem", {"patch_embed": "linear"}) if config.patch_embed != "linear" else None,
        TwinGap("token merging (timm's ViTs merge no tokens)", {"merge_tokens": 0}) if any(config.merge_per_block()) else None,
        TwinGap("a BatchNorm before the classifier (head_bn)", {"head_bn": False}) if config.head_bn else None,
        TwinGap(f"per-layer or narrow heads (timm needs the same full head count in every layer; this model has "
                f"{heads} of width {config.resolved_head_dim()})")
        if len(set(heads)) != 1 or config.resolved_head_dim() * heads[0] != config.embed_dim else None,
        *(
            TwinGap(f"a custom {name}={getattr(config, name)!r} (timm's blocks are its own)", {name: default})
            for name, default in (("block", "encoder"), ("attn_layer", "self_attention"), ("mlp_layer", "mlp"))
            if getattr(config, name) != default
        ),
    ]
    if config.rope != "none":  # timm's RoPE ViTs are its Eva class
        gaps += [
            TwinGap(f"act_layer={config.act_layer!r} with RoPE (timm's Eva blocks are exact GELU)", {"act_layer": "gelu"})
            if config.act_layer != "gelu" else None,
            TwinGap("global_pool='map' with prefix tokens and RoPE (timm's Eva pools over the prefix tokens too)",
                    {"class_token": False, "reg_tokens": 0})
            if config.global_pool == "map" and config.num_prefix_tokens else None,
            TwinGap("a distillation token with RoPE (timm's Eva has none)", {"distilled": False})
            if config.distilled else None,
        ]
    return [gap for gap in gaps if gap is not None]


def refuse_twin_gaps(config: ViTConfig) -> None:
    """Raise one :class:`~vitkit.errors.UnsupportedModelError` naming what ``config``'s timm twin
    cannot express (:func:`timm_twin_lacks`) and the fields that would remove it."""
    gaps = timm_twin_lacks(config)
    if gaps:
        raise UnsupportedModelError(twin_gaps_message(config, gaps) + ".")


def twin_gaps_message(config: ViTConfig, gaps: list[TwinGap], key_prefix: str = "") -> str:
    """One sentence (without the full stop) naming the non-empty ``gaps`` of ``config`` and the
    overrides that remove them (:func:`fix_overrides`, keys after ``key_prefix``)."""
    twin = "Eva (its RoPE ViT)" if config.rope != "none" else "VisionTransformer"
    text = f"timm's {twin} cannot express {'; '.join(gap.feature for gap in gaps)}"
    fixes = fix_overrides(gaps, key_prefix)
    return text + (f"; also set {' '.join(fixes)}" if fixes else "") + (
        "; no option of the model removes that" if any(not gap.fix for gap in gaps) else ""
    )


def fix_overrides(gaps: list[TwinGap], key_prefix: str = "") -> list[str]:
    """The ``key=value`` overrides (keys after ``key_prefix``, e.g. ``"model."``) that remove ``gaps``."""
    return [f"{key_prefix}{key}={str(value).lower() if isinstance(value, bool) else value}"
            for gap in gaps for key, value in gap.fix.items()]


def refuse_unsupported(model: nn.Module) -> None:
    """Raise one :class:`~vitkit.errors.UnsupportedModelError` naming every feature of the timm
    ``model`` that vitkit lacks (:func:`timm_features_vitkit_lacks`); nothing is built."""
    found = timm_features_vitkit_lacks(model)
    if found:
        raise UnsupportedModelError(
            f"this timm model ({type(model).__name__}) uses {'; '.join(found)}, which vitkit lacks; "
            "see the table of timm families in docs/timm.md."
        )


def _config_from_timm_model(model: nn.Module) -> dict[str, Any]:
    """Hyper-parameters of a timm ``VisionTransformer`` instance (checked by :func:`refuse_unsupported`)."""
    block = model.blocks[0]
    return dict(
        **timm_geometry(model),
        qkv_bias=block.attn.qkv.bias is not None,
        qk_norm=not isinstance(block.attn.q_norm, nn.Identity),
        class_token=model.has_class_token,
        global_pool=model.global_pool,
        dynamic_img_size=bool(getattr(model, "dynamic_img_size", False)),
        init_values=1.0 if hasattr(block.ls1, "gamma") else None,
        norm_eps=block.norm1.eps,
        reg_tokens=model.num_reg_tokens,
        no_embed_class=model.no_embed_class,
        pre_norm=not isinstance(model.norm_pre, nn.Identity),
        fc_norm=not isinstance(model.fc_norm, nn.Identity),
        act_layer=_activation_name(block.mlp.act),
        distilled=getattr(model, "dist_token", None) is not None,
    )


def _config_from_state_dict(
    state: dict[str, torch.Tensor], name: str | None, img_size: Any = None, no_embed_class: bool | None = None
) -> dict[str, Any]:
    """Hyper-parameters readable off a timm ViT state dict; the head count is not among them, so
    it comes from ``name`` (a vitkit/timm variant name) or the caller's ``num_heads`` override.
    A non-square patch grid cannot be read off ``pos_embed`` either: it comes from ``img_size``.
    Whether the table has prefix rows is read off its length unless ``no_embed_class`` says."""
    lacking = [key for key in (PATCH_WEIGHT, "pos_embed", "blocks.0.mlp.fc1.weight") if key not in state]
    if lacking:
        raise UnsupportedModelError(
            f"this state dict has no {', '.join(lacking)}: it is not a timm VisionTransformer with a learned "
            "position embedding; convert the timm model instance instead to learn which feature vitkit lacks."
        )
    weight = state[PATCH_WEIGHT]
    dim, in_chans, p1, p2 = weight.shape
    depth = 1 + max(int(key.split(".")[1]) for key in state if key.startswith("blocks."))
    class_token = "cls_token" in state
    reg_tokens = state["reg_token"].shape[1] if "reg_token" in state else 0
    distilled = "dist_token" in state
    prefix = int(class_token) + reg_tokens + int(distilled)
    rows = state["pos_embed"].shape[1]
    if no_embed_class is None:
        no_embed_class = _reads_as_no_embed_class(rows, prefix, (p1, p2), img_size)
    grid_tokens = rows - (0 if no_embed_class else prefix)
    side = math.isqrt(grid_tokens)
    grid = (side, side) if side * side == grid_tokens else _non_square_grid(grid_tokens, (p1, p2), img_size)
    values: dict[str, Any] = dict(MODEL_CONFIGS.get(name, {})) if name else {}
    if name and name not in MODEL_CONFIGS and timm.is_model(name):
        values.update(_named_timm_hyper_parameters(name))
    values.update(
        img_size=(grid[0] * p1, grid[1] * p2),
        patch_size=(p1, p2),
        in_chans=in_chans,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        embed_dim=dim,
        depth=depth,
        mlp_ratio=state["blocks.0.mlp.fc1.weight"].shape[0] / dim,
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        qk_norm="blocks.0.attn.q_norm.weight" in state,
        class_token=class_token,
        global_pool="map" if "attn_pool.latent" in state else ("token" if class_token else "avg"),
        fc_norm="fc_norm.weight" in state,
        init_values=1.0 if "blocks.0.ls1.gamma" in state else None,
        reg_tokens=reg_tokens,
        distilled=distilled,
        no_embed_class=no_embed_class,
        pre_norm="norm_pre.weight" in state,
    )
    return values


def _named_timm_hyper_parameters(name: str) -> dict[str, Any]:
    """What a state dict does not record (head count, activation, norm epsilon), read off timm's
    model ``name`` built on the meta device (no memory, no init), which must convert."""
    with torch.device("meta"):
        source = timm.create_model(name, pretrained=False)
    refuse_unsupported(source)  # a family vitkit lacks a feature of (BEiT) is one line, not an AttributeError
    block = source.blocks[0]
    return dict(num_heads=block.attn.num_heads, act_layer=_activation_name(block.mlp.act), norm_eps=block.norm1.eps)


def _reads_as_no_embed_class(rows: int, prefix: int, patch: tuple[int, int], img_size: Any) -> bool:
    """Whether a ``rows``-long ``pos_embed`` holds the patches only (DeiT-3, DINOv2 with
    registers): it is the grid of the given ``img_size``, or else a square count of rows where
    ``rows - prefix`` is not one."""
    if prefix == 0:
        return False
    if img_size is not None:
        height, width = (img_size, img_size) if isinstance(img_size, int) else img_size
        return rows == (height // patch[0]) * (width // patch[1])
    return not _is_square(rows - prefix) and _is_square(rows)


def _is_square(count: int) -> bool:
    return count > 0 and math.isqrt(count) ** 2 == count


def _non_square_grid(tokens: int, patch: tuple[int, int], img_size: Any) -> tuple[int, int]:
    """The patch grid of a checkpoint whose ``pos_embed`` holds a non-square number of ``tokens``,
    taken from the caller's ``img_size`` (an int or ``(H, W)``)."""
    height, width = (img_size, img_size) if isinstance(img_size, int) else (img_size or (0, 0))
    grid = (height // patch[0], width // patch[1])
    if grid[0] * grid[1] != tokens:
        got = f", got img_size={img_size!r}" if img_size is not None else ""
        raise ValueError(
            f"pos_embed holds {tokens} patch positions, not a square grid; pass the checkpoint's "
            f"img_size=(H, W) with (H / {patch[0]}) * (W / {patch[1]}) = {tokens}{got}."
        )
    return grid


def timm_config_and_state(source: nn.Module) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """The :class:`ViTConfig` of a timm ``VisionTransformer`` or ``Eva`` instance and its weights
    in vitkit's layout, without building a vitkit model: what :func:`vitkit.pretrained.read_pretrained`
    reads off a timm model built on the meta device with a file's weights assigned to it.

    Raises:
        UnsupportedModelError: the model uses a feature vitkit lacks.
    """
    refuse_unsupported(source)
    values, state = eva_config_and_state(source) if is_eva(source) else (_config_from_timm_model(source), source.state_dict())
    return ViTConfig(**values), _vitkit_patch_layout(dict(state))


def _vitkit_patch_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with timm's ``[D, C, p1, p2]`` patch convolution as vitkit's ``[D, (p1 p2 c)]`` Linear."""
    weight = state[PATCH_WEIGHT]
    return {**state, PATCH_WEIGHT: weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1)}


def from_timm(source: nn.Module | dict[str, torch.Tensor], name: str | None = None, **overrides: Any) -> VisionTransformer:
    """A vitkit model with the weights of a timm ``VisionTransformer`` (instance or state dict) or
    of a timm ``Eva`` RoPE ViT (instance; :mod:`.timm_eva` lists what converts).

    Args:
        source: a timm model, or its ``state_dict()`` (e.g. loaded with
            ``safetensors.torch.load_file`` from a checkpoint on disk).
        name: vitkit variant or timm model name (``'vit_small_patch14_reg4_dinov2'``), needed with
            a state dict unless ``num_heads`` is in ``overrides``.
        overrides: :class:`ViTConfig` fields; ``img_size`` resamples the position embedding
            (bicubic) to the new grid, except for a state dict with a non-square grid, whose own
            size it then gives. A ``num_classes`` other than the source's keeps a freshly
            initialised classifier (fine-tuning), as ``timm.create_model(pretrained=True,
            num_classes=...)`` does.
    """
    if isinstance(source, nn.Module):
        source_config, state = timm_config_and_state(source)
        values = source_config.to_dict()
    else:
        state = dict(source)
        if is_eva_state_dict(state):
            raise UnsupportedModelError(
                "this state dict is a timm Eva (RoPE ViT) checkpoint, whose RoPE form its weights do not record; "
                "build the timm model (timm.create_model(name), then load_state_dict) and pass the model to from_timm."
            )
        values = _config_from_state_dict(state, name, overrides.get("img_size"), overrides.get("no_embed_class"))
        if "num_heads" not in values and "num_heads" not in overrides:
            raise ValueError(
                "a state dict does not record the head count: pass name='vit_small_patch16_224' (or another "
                "variant from vitkit.list_models()) or num_heads=... to from_timm."
            )
        state = _vitkit_patch_layout(state)
    source_config = ViTConfig(**{**values, **{k: v for k, v in overrides.items() if k == "num_heads"}})
    model = VisionTransformer(source_config.replace(**overrides))
    if model.config.num_classes != source_config.num_classes:
        state = {key: value for key, value in state.items() if not key.startswith("head.")}
        state.update({key: value for key, value in model.state_dict().items() if key.startswith("head.")})
    _check_keys(state, model)
    model.load_weights(state, source_grid=source_config.grid_size)
    model.pretrained_cfg = pretrained_preprocessing(getattr(source, "pretrained_cfg", None), model.config)
    return model


def pretrained_preprocessing(cfg: Any, config: ViTConfig) -> dict[str, Any] | None:
    """The eval preprocessing part of a timm ``pretrained_cfg`` (``model.pretrained_cfg``, a dict,
    or ``timm.get_pretrained_cfg(name)``, a ``PretrainedCfg``; ``None`` gives ``None``), with the
    ``input_size`` ``(C, H, W)`` of the vitkit model of ``config`` (which may be resized).
    :func:`vitkit.preprocessing.preprocessing_extra` turns it into the eval transform's settings."""
    if cfg is None:
        return None
    values = cfg if isinstance(cfg, dict) else cfg.to_dict()
    kept = {key: values[key] for key in PREPROCESSING_KEYS if values.get(key) is not None}
    return {**kept, "input_size": (config.in_chans, *config.img_size)}


def _check_keys(state: dict[str, torch.Tensor], model: VisionTransformer) -> None:
    """Refuse a state dict whose keys are not the model's (a timm architecture vitkit lacks, read
    from its weights) before ``load_state_dict`` would fail on it."""
    expected = set(model.state_dict()) | {"pos_embed"}  # a sin-cos model's table is a buffer
    extra, missing = sorted(set(state) - expected), sorted(set(model.state_dict()) - set(state))
    if extra or missing:
        parts = [f"weights vitkit has no place for ({', '.join(extra[:4])}{', ...' if len(extra) > 4 else ''})"] if extra else []
        parts += [f"no weights for {', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}"] if missing else []
        raise UnsupportedModelError(
            f"this state dict does not describe a model vitkit can build: it has {' and '.join(parts)}; "
            "convert the timm model instance instead (from_timm(timm.create_model(...))) to learn which feature is missing."
        )


def to_timm_state_dict(model: VisionTransformer) -> dict[str, torch.Tensor]:
    """The state dict of the equivalent timm model (``timm.create_model(name).load_state_dict``).
    A model whose twin would differ (:func:`timm_twin_lacks`) raises ``UnsupportedModelError``;
    LoRA adapters are merged into the weights (``model`` keeps them)."""
    refuse_twin_gaps(model.config.replace(num_heads=model.heads_per_layer()))
    state = {key: value.detach().clone() for key, value in merge_lora_state_dict(model.state_dict()).items()}
    p1, p2 = model.config.patch_size
    weight = state[PATCH_WEIGHT]
    state[PATCH_WEIGHT] = weight.reshape(weight.shape[0], p1, p2, model.config.in_chans).permute(0, 3, 1, 2).contiguous()
    if "pos_embed" not in state and model.pos_embed is not None:  # fixed sin-cos table: timm stores it as a (frozen) parameter
        state["pos_embed"] = model.pos_embed.detach().clone()
    return eva_state_dict(state, model.config) if model.config.rope != "none" else state


def timm_twin(config: ViTConfig) -> nn.Module:
    """A freshly initialised timm ``VisionTransformer`` (timm's own init) of the shape ``config``
    describes: the reference that benchmarks and ``model.impl: timm`` recipes train side by side
    with vitkit. A config it would not match (:func:`timm_twin_lacks`) raises ``UnsupportedModelError``."""
    refuse_twin_gaps(config)
    if config.rope != "none":
        return eva_twin(config)
    heads = config.heads_per_layer()
    twin_class = VisionTransformerDistilled if config.distilled else TimmVisionTransformer
    twin = twin_class(
        img_size=config.img_size,
        patch_size=config.patch_size,
        in_chans=config.in_chans,
        num_classes=config.num_classes,
        global_pool=config.global_pool,
        embed_dim=config.embed_dim,
        depth=config.depth,
        num_heads=heads[0],
        mlp_ratio=config.mlp_ratio,
        qkv_bias=config.qkv_bias,
        qk_norm=config.qk_norm,
        init_values=config.init_values,
        class_token=config.class_token,
        pos_embed="none" if config.resolved_pos_embed == "none" else "learn",
        dynamic_img_size=config.dynamic_img_size,
        drop_rate=config.drop_rate,
        pos_drop_rate=config.pos_drop_rate,
        proj_drop_rate=config.proj_drop_rate,
        attn_drop_rate=config.attn_drop_rate,
        drop_path_rate=config.drop_path_rate,
        reg_tokens=config.reg_tokens,
        no_embed_class=config.no_embed_class,
        pre_norm=config.pre_norm,
        fc_norm=config.use_fc_norm,
        act_layer=config.act_layer,
        norm_layer=partial(nn.LayerNorm, eps=config.norm_eps),
    )
    if config.resolved_pos_embed == "sincos":  # vitkit's fixed table, loaded into timm's parameter and frozen
        twin.pos_embed.requires_grad_(False)
    return twin


def to_timm(model: VisionTransformer) -> nn.Module:
    """A timm ``VisionTransformer`` (an ``Eva`` for RoPE models) with the same hyper-parameters and
    weights as ``model`` (for side-by-side comparisons and for handing a trained model to timm-based code)."""
    twin = timm_twin(model.config)
    twin.load_state_dict(to_timm_state_dict(model))
    return twin
