"""The timm model families vitkit imports (imported by test modules): the ``VisionTransformer``
families and the RoPE ViTs of timm's ``Eva`` class, each named by one timm model."""

from __future__ import annotations

#: timm ``VisionTransformer`` families (plain, gap, CLIP, SigLIP, DINOv2, registers, DeiT, DeiT III, FlexiViT).
FAMILIES = [
    "vit_small_patch16_224",
    "vit_base_patch32_224",
    "vit_small_patch8_224",
    "vit_base_patch16_gap_224",
    "vit_medium_patch16_gap_240",
    "vit_base_patch16_clip_224",
    "vit_base_patch16_clip_quickgelu_224",
    "vit_base_patch16_siglip_224",
    "vit_base_patch16_siglip_gap_224",
    "vit_small_patch14_dinov2",
    "vit_small_patch14_reg4_dinov2",
    "vit_medium_patch16_reg4_gap_256",
    "deit_small_patch16_224",
    "deit_small_distilled_patch16_224",
    "deit3_small_patch16_224",
    "flexivit_small",
]

#: timm's RoPE ViTs (its ``Eva`` class): axial and mixed frequencies, with and without an absolute embedding.
ROPE_FAMILIES = [
    "vit_small_patch16_rope_224",  # axial, base 100, no absolute embedding
    "vit_small_patch16_rope_mixed_224",  # mixed, learnable frequencies in every block
    "vit_small_patch16_rope_mixed_ape_224",  # mixed + absolute embedding on the patches only
    "vit_small_patch16_rope_ape_224",  # axial + absolute embedding on the patches only
    "vit_base_patch16_rope_224",
]
