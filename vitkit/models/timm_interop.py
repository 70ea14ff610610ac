"""Load timm ``VisionTransformer`` weights into vitkit and back.

The only layout difference is the patch projection: timm's ``Conv2d`` weight ``[D, C, p1, p2]``
is vitkit's ``Linear`` weight ``[D, p1*p2*C]`` over ``(p1 p2 c)``-ordered patches, i.e. the conv
weight permuted to ``[D, p1, p2, C]`` and flattened. Every other key is shared, the class token's
position embedding included (timm's ``no_embed_class=False`` layout). timm's RoPE ViTs are its
``Eva`` class, whose own key map is in :mod:`.timm_eva`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..errors import UnsupportedModelError
from .config import ViTConfig
from .registry import MODEL_CONFIGS
from .timm_eva import eva_config_and_state, eva_state_dict, eva_twin, is_eva, is_eva_state_dict
from .vision_transformer import VisionTransformer

PATCH_WEIGHT = "patch_embed.proj.weight"


def _config_from_timm_model(model: nn.Module) -> dict[str, Any]:
    """Hyper-parameters of a timm ``VisionTransformer`` instance; unsupported features raise."""
    unsupported = {
        "register tokens": getattr(model, "num_reg_tokens", 0) > 0,
        "no_embed_class": getattr(model, "no_embed_class", False),
        "global_pool other than 'token'/'avg'": model.global_pool not in ("token", "avg"),
        "pre-norm before the blocks": not isinstance(getattr(model, "norm_pre", nn.Identity()), nn.Identity),
        "average pooling without fc_norm": model.global_pool == "avg" and isinstance(model.fc_norm, nn.Identity),
    }
    found = [name for name, present in unsupported.items() if present]
    if found:
        raise ValueError(f"this timm model uses {', '.join(found)}, which vitkit's VisionTransformer does not support.")
    block = model.blocks[0]
    return dict(
        img_size=tuple(model.patch_embed.img_size),
        patch_size=tuple(model.patch_embed.patch_size),
        in_chans=model.patch_embed.proj.in_channels,
        num_classes=model.num_classes,
        embed_dim=model.embed_dim,
        depth=len(model.blocks),
        num_heads=block.attn.num_heads,
        mlp_ratio=block.mlp.fc1.out_features / model.embed_dim,
        qkv_bias=block.attn.qkv.bias is not None,
        qk_norm=not isinstance(block.attn.q_norm, nn.Identity),
        class_token=model.has_class_token,
        global_pool=model.global_pool,
        dynamic_img_size=bool(getattr(model, "dynamic_img_size", False)),
        init_values=1.0 if hasattr(block.ls1, "gamma") else None,
        norm_eps=block.norm1.eps,
    )


def _config_from_state_dict(
    state: dict[str, torch.Tensor], name: str | None, img_size: Any = None
) -> dict[str, Any]:
    """Hyper-parameters readable off a timm ViT state dict; the head count is not among them, so
    it comes from ``name`` (a vitkit/timm variant name) or the caller's ``num_heads`` override.
    A non-square patch grid cannot be read off ``pos_embed`` either: it comes from ``img_size``."""
    weight = state[PATCH_WEIGHT]
    dim, in_chans, p1, p2 = weight.shape
    depth = 1 + max(int(key.split(".")[1]) for key in state if key.startswith("blocks."))
    class_token = "cls_token" in state
    grid_tokens = state["pos_embed"].shape[1] - (1 if class_token else 0)
    side = math.isqrt(grid_tokens)
    grid = (side, side) if side * side == grid_tokens else _non_square_grid(grid_tokens, (p1, p2), img_size)
    values: dict[str, Any] = dict(MODEL_CONFIGS.get(name, {})) if name else {}
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
        global_pool="avg" if "fc_norm.weight" in state else "token",
        init_values=1.0 if "blocks.0.ls1.gamma" in state else None,
    )
    return values


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


def from_timm(source: nn.Module | dict[str, torch.Tensor], name: str | None = None, **overrides: Any) -> VisionTransformer:
    """A vitkit model with the weights of a timm ``VisionTransformer`` (instance or state dict) or
    of a timm ``Eva`` RoPE ViT (instance; :mod:`.timm_eva` lists what converts).

    Args:
        source: a timm model, or its ``state_dict()`` (e.g. loaded with
            ``safetensors.torch.load_file`` from a checkpoint on disk).
        name: variant name, needed with a state dict unless ``num_heads`` is in ``overrides``.
        overrides: :class:`ViTConfig` fields; ``img_size`` resamples the position embedding
            (bicubic) to the new grid, except for a state dict with a non-square grid, whose own
            size it then gives. A ``num_classes`` other than the source's keeps a freshly
            initialised classifier (fine-tuning), as ``timm.create_model(pretrained=True,
            num_classes=...)`` does.
    """
    if isinstance(source, nn.Module) and is_eva(source):
        values, state = eva_config_and_state(source)
    elif isinstance(source, nn.Module):
        values, state = _config_from_timm_model(source), source.state_dict()
    else:
        state = dict(source)
        if is_eva_state_dict(state):
            raise UnsupportedModelError(
                "this state dict is a timm Eva (RoPE ViT) checkpoint, whose RoPE form its weights do not record; "
                "build the timm model (timm.create_model(name), then load_state_dict) and pass the model to from_timm."
            )
        values = _config_from_state_dict(state, name, overrides.get("img_size"))
        if "num_heads" not in values and "num_heads" not in overrides:
            raise ValueError(
                "a state dict does not record the head count: pass name='vit_small_patch16_224' (or another "
                "variant from vitkit.list_models()) or num_heads=... to from_timm."
            )
    source_config = ViTConfig(**{**values, **{k: v for k, v in overrides.items() if k == "num_heads"}})
    model = VisionTransformer(source_config.replace(**overrides))
    weight = state[PATCH_WEIGHT]
    state[PATCH_WEIGHT] = weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1)
    if model.config.num_classes != source_config.num_classes:
        state = {key: value for key, value in state.items() if not key.startswith("head.")}
        state.update({key: value for key, value in model.state_dict().items() if key.startswith("head.")})
    model.load_weights(state, source_grid=source_config.grid_size)
    return model


def to_timm_state_dict(model: VisionTransformer) -> dict[str, torch.Tensor]:
    """The state dict of the equivalent timm model (``timm.create_model(name).load_state_dict``).
    Models with pruned (unequal) head counts have no timm equivalent and raise ``ValueError``."""
    heads = model.heads_per_layer()
    if len(set(heads)) != 1 or heads[0] * model.config.resolved_head_dim() != model.embed_dim:
        raise ValueError(f"timm's ViT needs the same full head count in every layer; this model has {heads}.")
    if model.config.patch_embed != "linear":
        raise ValueError("timm's VisionTransformer has no convolutional stem (patch_embed='conv').")
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    p1, p2 = model.config.patch_size
    weight = state[PATCH_WEIGHT]
    state[PATCH_WEIGHT] = weight.reshape(weight.shape[0], p1, p2, model.config.in_chans).permute(0, 3, 1, 2).contiguous()
    if "pos_embed" not in state and model.pos_embed is not None:  # fixed sin-cos table: timm stores it as a (frozen) parameter
        state["pos_embed"] = model.pos_embed.detach().clone()
    return eva_state_dict(state, model.config) if model.config.rope != "none" else state


def timm_twin(config: ViTConfig) -> nn.Module:
    """A freshly initialised timm ``VisionTransformer`` (timm's own init) of the shape ``config``
    describes: the reference that benchmarks and ``model.impl: timm`` recipes train side by side
    with vitkit. Per-layer head counts (pruned models) have no timm equal and raise."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    if config.shifted_patches or config.locality_attention or config.patch_embed != "linear":
        raise ValueError(
            "timm's VisionTransformer has no shifted patch tokenization, locality self-attention or convolutional stem."
        )
    heads = config.heads_per_layer()
    if len(set(heads)) != 1 or config.resolved_head_dim() * heads[0] != config.embed_dim:
        raise ValueError(f"timm's VisionTransformer needs one head count dividing embed_dim; this model has {heads}.")
    if config.rope != "none":
        return eva_twin(config)
    return TimmViT(
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
        pos_embed="none" if config.pos_embed == "none" else "learn",
        dynamic_img_size=config.dynamic_img_size,
        drop_rate=config.drop_rate,
        proj_drop_rate=config.proj_drop_rate,
        attn_drop_rate=config.attn_drop_rate,
        drop_path_rate=config.drop_path_rate,
    )


def to_timm(model: VisionTransformer) -> nn.Module:
    """A timm ``VisionTransformer`` (an ``Eva`` for RoPE models) with the same hyper-parameters and
    weights as ``model`` (for side-by-side comparisons and for handing a trained model to timm-based code)."""
    twin = timm_twin(model.config)
    twin.load_state_dict(to_timm_state_dict(model))
    return twin
