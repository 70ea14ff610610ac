"""FLOP and parameter counts of a Vision Transformer, from its config alone (no weights, no memory:
blocks are counted by torch's FLOP counter on the meta device)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..layers import TokenPositions
from ..layers.patch_embed import conv_stem_widths
from ..layers.token_merging import MergeState, MergeStep, token_counts
from .config import ViTConfig
from .vision_transformer import build_block


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (trainable or not)."""
    return sum(p.numel() for p in model.parameters())


def vit_flops(config: ViTConfig, heads_per_layer: Sequence[int] | None = None) -> int:
    """Multiply-accumulate-based FLOPs (2 per MAC) of one forward pass on one ``img_size`` image.

    Counts every matrix product and convolution that runs (what ``torch.utils.flop_counter``
    counts): the tokenizer (the linear patch projection, or the conv stem's 3x3 convolutions and
    its 1x1), each block at its head count, the attention-pooling head (``'map'``), and the
    classifier (two with ``distilled``); norms, softmax, activations and RoPE's rotations are
    elementwise and left out. A block is counted by torch's FLOP counter on the meta device (no
    memory, no init), so a registered block, attention or MLP counts whatever its layers are
    named (a SwiGLU MLP's three projections, a block without ``.mlp``). With token merging
    (``config.merge_tokens``), each block is counted on the tokens it sees, its similarity
    product included, and the attention pool on the merged patch tokens.
    """
    heads = list(heads_per_layer) if heads_per_layer is not None else config.heads_per_layer()
    dim = config.embed_dim
    hidden = int(dim * config.mlp_ratio)
    macs = _tokenizer_macs(config)
    schedule = config.merge_per_block()
    counts = token_counts(config.num_tokens, config.num_prefix_tokens, schedule)
    if any(schedule):
        macs += sum(_merging_block_macs(config, h, n, r) for h, n, r in zip(heads, counts, schedule))
    else:
        measured = {h: _block_macs(config, h) for h in set(heads)}
        macs += sum(measured[h] for h in heads)
    patches = counts[-1] - config.num_prefix_tokens
    if config.global_pool == "map":  # one latent query over the patches: q, kv, QK^T and AV, proj, MLP
        macs += dim * dim + patches * dim * 2 * dim + 2 * patches * dim + dim * dim + 2 * dim * hidden
    macs += dim * config.num_classes * (1 + int(config.distilled))
    return 2 * macs


def _block_macs(config: ViTConfig, num_heads: int) -> int:
    """MACs of one block with ``num_heads`` heads on one image's ``config.num_tokens`` tokens,
    counted by torch's ``FlopCounterMode`` on the meta device (explicit attention kernel)."""
    block = build_block(config, num_heads, attn_impl="explicit", device="meta")
    tokens = torch.empty(1, config.num_tokens, config.embed_dim, device="meta")
    positions = TokenPositions.of_grid(config.grid_size, config.num_prefix_tokens, device="meta")
    with FlopCounterMode(display=False) as counter:
        block(tokens, positions=positions)
    return counter.get_total_flops() // 2


def _merging_block_macs(config: ViTConfig, num_heads: int, num_tokens: int, r: int) -> int:
    """MACs of one block with ``num_heads`` heads merging ``r`` of one image's ``num_tokens`` tokens
    (a :class:`~vitkit.layers.token_merging.MergeStep` as its ``merge``), counted on the meta device."""
    block = build_block(config, num_heads, attn_impl="explicit", device="meta")
    tokens = torch.empty(1, num_tokens, config.embed_dim, device="meta")
    positions = TokenPositions(torch.zeros(1, num_tokens - config.num_prefix_tokens, 2, device="meta"),
                               config.num_prefix_tokens, config.grid_size)
    with FlopCounterMode(display=False) as counter:
        block(tokens, positions=positions, merge=MergeStep(MergeState(positions, config.num_prefix_tokens), r))
    return counter.get_total_flops() // 2


def _tokenizer_macs(config: ViTConfig) -> int:
    """MACs of the patch embedding of one ``img_size`` image."""
    if config.patch_embed != "conv":
        return config.num_patches * config.patch_dim * config.embed_dim
    widths = conv_stem_widths(config.patch_size[0], config.embed_dim)
    (height, width), macs = config.img_size, 0
    for c_in, c_out in zip([config.in_chans, *widths[:-1]], widths):
        height, width = (height + 1) // 2, (width + 1) // 2  # 3x3, stride 2, padding 1
        macs += height * width * c_in * c_out * 9
    return macs + config.num_patches * widths[-1] * config.embed_dim
