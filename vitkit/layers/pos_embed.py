"""Absolute position embeddings: fixed 2-D sin-cos, and resampling to a new patch grid.

Both are timm's functions behind vitkit's argument checks: timm asserts (sin-cos) or fails inside
a ``reshape`` (resampling) where these raise a ``ValueError`` that says what to change.
"""

from __future__ import annotations

import torch
from timm.layers import build_sincos2d_pos_embed, resample_abs_pos_embed


def sincos_2d_pos_embed(
    dim: int,
    grid: tuple[int, int],
    temperature: float = 10000.0,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Fixed 2-D sin-cos embedding ``[gh * gw, dim]`` (MAE / "Simple ViT", Beyer et al. 2022,
    https://arxiv.org/abs/2205.01580), row-major over the grid.

    A quarter of the channels each hold ``sin(y w), cos(y w), sin(x w), cos(x w)`` (``y`` the row)
    over the frequencies ``w_k = temperature^(-k / (dim / 4))``; ``dim`` must be divisible by 4.
    """
    if dim % 4 != 0:
        raise ValueError(f"sin-cos position embeddings need embed_dim divisible by 4, got {dim}.")
    # Computed in float32 where tensors are created by default (the CPU), so every device gets the same table.
    table = build_sincos2d_pos_embed(list(grid), dim, temperature, interleave_sin_cos=True)
    return table.to(device=device, dtype=dtype)


def resample_pos_embed(
    pos_embed: torch.Tensor, new_grid: tuple[int, int], old_grid: tuple[int, int], num_prefix_tokens: int
) -> torch.Tensor:
    """Bicubically (antialiased) resample the patch part of ``pos_embed`` ``[1, prefix + gh*gw, D]``
    to ``new_grid``, keeping the prefix (class-token) embeddings: timm's ``resample_abs_pos_embed``.
    """
    expected = old_grid[0] * old_grid[1]
    if pos_embed.shape[1] - num_prefix_tokens != expected:
        raise ValueError(
            f"position embedding holds {pos_embed.shape[1] - num_prefix_tokens} patch positions, but the grid "
            f"{old_grid[0]}x{old_grid[1]} needs {expected}."
        )
    return resample_abs_pos_embed(pos_embed, list(new_grid), list(old_grid), num_prefix_tokens=num_prefix_tokens)
