"""Image to patch tokens (Dosovitskiy et al. 2021, https://arxiv.org/abs/2010.11929)."""

from __future__ import annotations

import torch
from einops.layers.torch import Rearrange
from torch import nn

from .utils import Pair, to_pair


class PatchEmbed(nn.Module):
    """Cut an image into non-overlapping ``p1 x p2`` patches and project each to ``embed_dim``.

    ``Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)')`` then ``Linear``: the same function as
    a stride-``p`` convolution (timm's ``PatchEmbed``), written as what it is. Any input size
    divisible by the patch size works, non-square included.

    Args:
        patch_size: patch height and width (an int or a pair).
        in_chans: image channels ``C``.
        embed_dim: token width ``D``.
        norm: apply a LayerNorm to the tokens.
    """

    def __init__(self, patch_size: Pair = 16, in_chans: int = 3, embed_dim: int = 768, norm: bool = False) -> None:
        super().__init__()
        self.patch_size = to_pair(patch_size)
        self.in_chans = in_chans
        p1, p2 = self.patch_size
        self.to_patches = Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p1, p2=p2)
        self.proj = nn.Linear(p1 * p2 * in_chans, embed_dim)
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6) if norm else nn.Identity()

    def grid_size(self, height: int, width: int) -> tuple[int, int]:
        """Patch grid ``(H / p1, W / p2)`` of an image; a clear error if it does not divide."""
        p1, p2 = self.patch_size
        if height % p1 or width % p2:
            raise ValueError(
                f"image size {height}x{width} is not divisible by the patch size {p1}x{p2}; "
                f"resize or crop to a multiple (e.g. {height // p1 * p1}x{width // p2 * p2})."
            )
        return height // p1, width // p2

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` images to ``[B, (H/p1)(W/p2), D]`` tokens, row-major over the grid."""
        if images.dim() != 4:
            raise ValueError(f"PatchEmbed expects images [B, C, H, W], got shape {tuple(images.shape)}.")
        if images.shape[1] != self.in_chans:
            raise ValueError(
                f"expected {self.in_chans} image channels, got {images.shape[1]} (shape "
                f"{tuple(images.shape)}); convert the images or build the model with in_chans={images.shape[1]}."
            )
        self.grid_size(images.shape[2], images.shape[3])
        return self.norm(self.proj(self.to_patches(images)))
