"""Image to patch tokens: linear patches (Dosovitskiy et al. 2021, https://arxiv.org/abs/2010.11929)
or a convolutional stem (Xiao et al. 2021, https://arxiv.org/abs/2106.14881)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops.layers.torch import Rearrange
from timm.layers import ConvNormAct, to_2tuple
from torch import nn


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
        bias: give the projection a bias (CLIP's models, whose tokens are LayerNormed next, have none).
        shifted: Shifted Patch Tokenization (Lee et al. 2021, https://arxiv.org/abs/2112.13492):
            the image and four copies shifted by half a patch diagonally (zero-filled) are
            stacked on the channels, so every token also sees its neighbours' borders; the
            ``5 * C * p1 * p2`` patch vectors are LayerNormed before the projection.
        device, dtype: where and in which dtype the parameters are created (as torch's layers).
    """

    def __init__(
        self,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        norm: bool = False,
        shifted: bool = False,
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.patch_size: tuple[int, int] = to_2tuple(patch_size)
        self.in_chans = in_chans
        self.shifted = shifted
        p1, p2 = self.patch_size
        patch_dim = p1 * p2 * in_chans * (1 + len(DIAGONAL_SHIFTS) if shifted else 1)
        self.to_patches = Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p1, p2=p2)
        self.patch_norm = nn.LayerNorm(patch_dim, eps=1e-6, **factory) if shifted else nn.Identity()
        self.proj = nn.Linear(patch_dim, embed_dim, bias=bias, **factory)
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6, **factory) if norm else nn.Identity()

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
        if self.shifted:
            images = torch.cat([images, *shift_diagonally(images, self.patch_size)], dim=1)
        return self.norm(self.proj(self.patch_norm(self.to_patches(images))))


class ConvPatchEmbed(nn.Module):
    """Convolutional stem of Xiao et al. 2021 ("Early Convolutions Help Transformers See Better",
    https://arxiv.org/abs/2106.14881): ``log2(p)`` stride-2 3x3 convolutions, each followed by
    BatchNorm and ReLU, then a 1x1 convolution to ``embed_dim``; total stride ``p``, so the tokens
    form the same ``H/p x W/p`` grid as :class:`PatchEmbed`'s.

    The widths double up to ``embed_dim`` at the last 3x3 convolution (their ViT_C-1GF stem is
    24, 48, 96, 192 for width 192), never below 8 channels.

    Args:
        patch_size: total stride, a power of two >= 2 (an int or an equal pair).
        in_chans: image channels ``C``.
        embed_dim: token width ``D``.
        device, dtype: where and in which dtype the parameters are created (as torch's layers).
    """

    def __init__(
        self,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.patch_size: tuple[int, int] = to_2tuple(patch_size)
        self.in_chans = in_chans
        if not conv_stem_reaches(self.patch_size):
            raise ValueError(
                f"a convolutional stem needs a square patch size that is a power of two >= 2 (its stride-2 "
                f"convolutions multiply to it), got {self.patch_size[0]}x{self.patch_size[1]}."
            )
        widths = conv_stem_widths(self.patch_size[0], embed_dim)
        self.stem = nn.Sequential(
            *(
                ConvNormAct(c_in, c_out, 3, stride=2, padding=1, bias=False, **factory)
                for c_in, c_out in zip([in_chans, *widths[:-1]], widths)
            )
        )
        self.proj = nn.Conv2d(widths[-1], embed_dim, 1, **factory)
        self.to_tokens = Rearrange("b d h w -> b (h w) d")

    grid_size = PatchEmbed.grid_size

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` images to ``[B, (H/p)(W/p), D]`` tokens, row-major over the grid."""
        if images.dim() != 4 or images.shape[1] != self.in_chans:
            raise ValueError(
                f"ConvPatchEmbed expects images [B, {self.in_chans}, H, W], got shape {tuple(images.shape)}."
            )
        self.grid_size(images.shape[2], images.shape[3])
        return self.to_tokens(self.proj(self.stem(images)))


def conv_stem_widths(patch_size: int, embed_dim: int) -> list[int]:
    """Output channels of the stem's ``log2(patch_size)`` stride-2 3x3 convolutions: doubling up to
    ``embed_dim`` at the last, never below 8."""
    convs = patch_size.bit_length() - 1
    return [max(8, embed_dim >> (convs - 1 - i)) for i in range(convs)]


def conv_stem_reaches(patch_size: tuple[int, int]) -> bool:
    """Whether a stack of stride-2 convolutions has total stride ``patch_size``: a square power of two >= 2."""
    p1, p2 = patch_size
    return p1 == p2 and p1 >= 2 and not p1 & (p1 - 1)


#: The four diagonal directions of Shifted Patch Tokenization, as (down, right) signs.
DIAGONAL_SHIFTS: tuple[tuple[int, int], ...] = ((-1, -1), (-1, 1), (1, -1), (1, 1))


def shift_diagonally(images: torch.Tensor, patch_size: tuple[int, int]) -> list[torch.Tensor]:
    """``[B, C, H, W]`` images moved by half a patch along each of :data:`DIAGONAL_SHIFTS`,
    uncovered pixels zero: four ``[B, C, H, W]`` tensors."""
    half_h, half_w = patch_size[0] // 2, patch_size[1] // 2
    height, width = images.shape[-2:]
    padded = F.pad(images, (half_w, half_w, half_h, half_h))
    # Moving the content down by s rows means reading the padded image from row (half - s).
    return [
        padded[..., half_h - down * half_h : half_h - down * half_h + height,
               half_w - right * half_w : half_w - right * half_w + width]
        for down, right in DIAGONAL_SHIFTS
    ]
