"""timm's ``Eva`` class (its RoPE ViTs: ``vit_*_patch16_rope_*``, ``*_rope_mixed_*``, ``*_rope_*_ape_*``)
to vitkit and back: the Eva-specific half of :mod:`.timm_interop`, which calls it.

An Eva block is vitkit's :class:`~vitkit.layers.EncoderBlock` under other names, and its RoPE is
vitkit's (:mod:`vitkit.layers.rope` uses timm's layout), so the weights map 1:1:

* ``blocks.i.gamma_1`` / ``gamma_2`` (LayerScale) are ``blocks.i.ls1.gamma`` / ``ls2.gamma``;
* ``EvaAttention``'s ``q_bias`` and ``v_bias`` (its key bias is fixed at zero) are ``qkv.bias``;
* mixed RoPE's one ``rope.freqs`` ``[2, depth, H, d/2]`` is each block's ``attn.rope.freqs``
  ``[2, H, d/2]`` (a block owns its heads' frequencies, so heads prune with them);
* with RoPE, vitkit's absolute embedding is on the patches only (timm's ``no_embed_class``, as
  Heo et al.'s ``+APE`` models); an Eva with prefix rows has them folded into its tokens.

Every Eva feature outside that map is refused before anything is built (:func:`eva_unsupported`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from timm.layers import LayerNorm, Mlp
from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingMixed
from timm.models.eva import Eva, EvaBlock
from torch import nn

from ..layers.rope import DEFAULT_ROPE_THETA
from .config import ViTConfig

#: Keys only an Eva checkpoint holds (a state dict cannot say which RoPE form it was trained with).
EVA_KEY_SUFFIXES = (".gamma_1", ".gamma_2", ".q_bias", "rope.freqs")


def is_eva(model: nn.Module) -> bool:
    """Whether ``model`` is a timm ``Eva`` (every model of ``timm.models.eva``)."""
    return isinstance(model, Eva)


def is_eva_state_dict(state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state`` holds keys of an Eva model rather than of a ``VisionTransformer``."""
    return any(key.endswith(EVA_KEY_SUFFIXES) for key in state)


def eva_unsupported(model: Eva) -> list[str]:
    """What an Eva model uses that vitkit lacks, each in a few words (empty: it converts)."""
    block, rope = model.blocks[0], model.rope
    attn = block.attn
    grid = tuple(model.patch_embed.grid_size)
    mlp = block.mlp
    found = {
        "residual post-norm blocks": not isinstance(block, EvaBlock),
        "separate q/k/v projections": getattr(attn, "qkv", None) is None,
        "grouped-query attention": getattr(attn, "num_kv_groups", 1) > 1,
        "a norm inside the attention (scale_attn_inner)": not isinstance(getattr(attn, "norm", None), nn.Identity),
        "gated attention": getattr(attn, "gate", None) is not None,
        "SwiGLU or a normed MLP": type(mlp) is not Mlp or not isinstance(mlp.norm, nn.Identity),
        "an MLP activation other than exact GELU": type(mlp) is Mlp and not (
            type(mlp.act) is nn.GELU and mlp.act.approximate == "none"
        ),
        "norms other than LayerNorm": not isinstance(block.norm1, nn.LayerNorm),
        "LayerScale on the attention branch only": getattr(block, "gamma_1", None) is not None
        and getattr(block, "gamma_2", None) is None,
        "heads narrower than embed_dim / num_heads": attn.num_heads * attn.head_dim != model.embed_dim,
        "an attention-pool head over prefix tokens (global_pool='map' with a class or register token)":
        model.attn_pool is not None and model.num_prefix_tokens > 0,
        "an attention-pool head unlike SigLIP's": model.attn_pool is not None and not _pool_like_siglip(model),
        f"global_pool={model.global_pool!r}": model.global_pool not in ("token", "avg", "map"),
        "both or neither of a final norm and fc_norm": isinstance(model.norm, nn.Identity)
        == isinstance(model.fc_norm, nn.Identity),
        "patch dropout": model.patch_drop is not None,
        "a patch embedding with a norm or padding, or a bias with pre-norm": not isinstance(
            model.patch_embed.norm, nn.Identity
        )
        or model.patch_embed.dynamic_img_pad
        or (model.patch_embed.proj.bias is None) != (not isinstance(model.norm_pre, nn.Identity)),
        "half-rotation RoPE layout": getattr(attn, "rotate_half", False),
    }
    if rope is not None and not isinstance(rope, (RotaryEmbeddingCat, RotaryEmbeddingMixed)):
        found[f"{type(rope).__name__} (RoPE other than axial or mixed)"] = True
    if isinstance(rope, RotaryEmbeddingCat):
        found.update({
            "pixel-frequency RoPE (in_pixels)": rope.in_pixels or rope.grid_type != "index",
            "a RoPE grid offset": rope.grid_offset != 0,
            "RoPE rescaled to a reference grid (ref_feat_shape) other than the model's": rope.ref_feat_shape
            is not None and (model.dynamic_img_size or tuple(rope.ref_feat_shape) != grid),
        })
    if isinstance(rope, RotaryEmbeddingMixed):
        found["mixed RoPE with grid_indexing='ij'"] = rope.grid_indexing != "xy"
    if rope is not None:
        found["RoPE coordinate augmentation (shift / jitter / rescale)"] = rope.aug_active
    return [name for name, present in found.items() if present]


def _pool_like_siglip(model: Eva) -> bool:
    """Whether an Eva's attention pool is vitkit's (one latent query, the blocks' head width and
    MLP ratio, no position embedding or qk-norm)."""
    pool, block = model.attn_pool, model.blocks[0]
    return (
        pool.latent_len == 1 and pool.pos_embed is None and isinstance(pool.q_norm, nn.Identity)
        and pool.mlp is not None and pool.head_dim == block.attn.head_dim
        and pool.mlp.fc1.out_features == block.mlp.fc1.out_features
    )


def timm_geometry(model: nn.Module) -> dict[str, Any]:
    """The :class:`ViTConfig` fields that timm's ``VisionTransformer`` and ``Eva`` store alike:
    image and patch size, channels, classes, width, depth, heads and MLP ratio."""
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
    )


def eva_config_and_state(model: Eva) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """:class:`ViTConfig` fields and the state dict, in timm ``VisionTransformer``'s key layout,
    of a timm Eva model.

    The caller checks it first (:func:`eva_unsupported`, through ``timm_interop.refuse_unsupported``).
    """
    block, rope = model.blocks[0], model.rope
    kind = "none" if rope is None else "mixed" if isinstance(rope, RotaryEmbeddingMixed) else "axial"
    values: dict[str, Any] = dict(
        **timm_geometry(model),
        qkv_bias=block.attn.qkv.bias is not None or getattr(block.attn, "q_bias", None) is not None,
        qk_norm=not isinstance(block.attn.q_norm, nn.Identity),
        class_token=model.cls_token is not None,
        reg_tokens=0 if model.reg_token is None else model.reg_token.shape[1],
        global_pool=model.global_pool,
        pos_embed="none" if model.pos_embed is None else "learn",
        dynamic_img_size=model.dynamic_img_size,
        init_values=1.0 if block.gamma_1 is not None else None,
        norm_eps=block.norm1.eps,
        pre_norm=not isinstance(model.norm_pre, nn.Identity),
        fc_norm=not isinstance(model.fc_norm, nn.Identity),
        no_embed_class=rope is None and model.no_embed_class and model.pos_embed is not None,
    )
    if rope is not None:
        values.update(rope=kind, rope_theta=float(rope.temperature), rope_axes=rope.grid_indexing)
    return values, _vitkit_keys(model)


def _vitkit_keys(model: Eva) -> dict[str, torch.Tensor]:
    state = {
        key.replace(".gamma_1", ".ls1.gamma").replace(".gamma_2", ".ls2.gamma"): value
        for key, value in model.state_dict().items()
    }
    for i, block in enumerate(model.blocks):
        attn = block.attn
        if getattr(attn, "q_bias", None) is not None:
            prefix = f"blocks.{i}.attn."
            q_bias = state.pop(prefix + "q_bias")  # timm's k_bias is a zero, non-persistent buffer (meta on a meta model)
            state[prefix + "qkv.bias"] = torch.cat([q_bias, torch.zeros_like(q_bias), state.pop(prefix + "v_bias")])
    if isinstance(model.rope, RotaryEmbeddingMixed):
        freqs = state.pop("rope.freqs")
        state.update({f"blocks.{i}.attn.rope.freqs": freqs[:, i] for i in range(len(model.blocks))})
    prefix = model.num_prefix_tokens
    if model.rope is not None and not model.no_embed_class and model.pos_embed is not None and prefix:
        # vitkit's absolute embedding with RoPE is on the patches only: the prefix rows are constants
        # added to constant tokens, so they fold into the tokens (the same model, also when resized).
        pos = state["pos_embed"]
        state["pos_embed"] = pos[:, prefix:]
        rows = pos[:, :prefix]
        if model.cls_token is not None:
            state["cls_token"], rows = state["cls_token"] + rows[:, :1], rows[:, 1:]
        if model.reg_token is not None:
            state["reg_token"] = state["reg_token"] + rows
    return state


def eva_state_dict(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """A vitkit RoPE model's ``state`` (patch weight already timm's) in the key layout of
    :func:`eva_twin`'s model."""
    state = {
        key.replace(".ls1.gamma", ".gamma_1").replace(".ls2.gamma", ".gamma_2"): value for key, value in state.items()
    }
    if config.rope == "mixed":
        state["rope.freqs"] = torch.stack([state.pop(f"blocks.{i}.attn.rope.freqs") for i in range(config.depth)], 1)
    return state


def eva_twin(config: ViTConfig) -> nn.Module:
    """A freshly initialised timm ``Eva`` of the shape of ``config``, a vitkit RoPE model (the
    caller, :func:`~vitkit.models.timm_twin`, has refused what Eva cannot express)."""
    twin = Eva(
        img_size=config.img_size,
        patch_size=config.patch_size,
        in_chans=config.in_chans,
        num_classes=config.num_classes,
        global_pool=config.global_pool,
        embed_dim=config.embed_dim,
        depth=config.depth,
        num_heads=config.heads_per_layer()[0],
        qkv_bias=config.qkv_bias,
        qk_norm=config.qk_norm,
        mlp_ratio=config.mlp_ratio,
        attn_type="rope",  # timm's fused qkv with a key bias, as vitkit's
        drop_rate=config.drop_rate,
        pos_drop_rate=config.pos_drop_rate,
        proj_drop_rate=config.proj_drop_rate,
        attn_drop_rate=config.attn_drop_rate,
        drop_path_rate=config.drop_path_rate,
        norm_layer=partial(LayerNorm, eps=config.norm_eps),
        init_values=config.init_values,
        class_token=config.class_token,
        num_reg_tokens=config.reg_tokens,
        no_embed_class=True,  # with RoPE, vitkit's absolute embedding is on the patches only
        use_abs_pos_emb=config.resolved_pos_embed != "none",
        use_rot_pos_emb=True,
        use_pre_transformer_norm=config.pre_norm,
        use_fc_norm=config.use_fc_norm,
        attn_pool_num_heads=config.pool_heads,
        attn_pool_mlp_ratio=config.mlp_ratio,
        rope_type="mixed" if config.rope == "mixed" else "cat",
        rope_grid_indexing=config.rope_axes if config.rope == "axial" else "xy",  # mixed frequencies are 2-D
        rope_temperature=config.rope_theta or DEFAULT_ROPE_THETA[config.rope],
        dynamic_img_size=config.dynamic_img_size,
    )
    if config.resolved_pos_embed == "sincos":  # vitkit's fixed table, loaded into Eva's parameter and frozen
        twin.pos_embed.requires_grad_(False)
    return twin
