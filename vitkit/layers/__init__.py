"""Building blocks to import into your own vision models.

``DropPath`` is timm's (stochastic depth, Huang et al. 2016, https://arxiv.org/abs/1603.09382),
re-exported so blocks built from vitkit and from timm share one class.
"""

from timm.layers import DropPath

from ..kernels import choose_attn_impl
from .attention import AttentionBase, AttentionOptions, MultiHeadSelfAttention
from .attention_masks import causal_mask, padding_mask
from .attention_stats import row_entropy
from .block import EncoderBlock, LayerScale
from .cross_attention import CrossAttention
from .decoding import CausalSelfAttention, KVCache
from .lora import LoraConfig, LoraError, LoRALinear, add_lora, has_lora, merge_lora, merge_lora_state_dict
from .mlp import Mlp
from .parts import UnknownPartError, get_part, register_attention, register_block, register_mlp, registered
from .patch_embed import ConvPatchEmbed, PatchEmbed
from .pos_embed import resample_pos_embed, sincos_2d_pos_embed
from .positions import TokenPositions
from .rope import Rope2d, patch_coords, rotate_tokens

__all__ = [
    "AttentionBase",
    "AttentionOptions",
    "CausalSelfAttention",
    "CrossAttention",
    "TokenPositions",
    "UnknownPartError",
    "get_part",
    "padding_mask",
    "register_attention",
    "register_block",
    "register_mlp",
    "registered",
    "ConvPatchEmbed",
    "DropPath",
    "EncoderBlock",
    "KVCache",
    "LayerScale",
    "LoRALinear",
    "LoraConfig",
    "LoraError",
    "Mlp",
    "MultiHeadSelfAttention",
    "PatchEmbed",
    "Rope2d",
    "add_lora",
    "causal_mask",
    "choose_attn_impl",
    "has_lora",
    "merge_lora",
    "merge_lora_state_dict",
    "patch_coords",
    "resample_pos_embed",
    "rotate_tokens",
    "row_entropy",
    "sincos_2d_pos_embed",
]
