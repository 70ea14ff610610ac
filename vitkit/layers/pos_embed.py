"""Absolute position embeddings: fixed 2-D sin-cos, and resampling to a new patch grid."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sincos_2d_pos_embed(dim: int, grid: tuple[int, int], temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sin-cos embedding ``[gh * gw, dim]`` (MAE / "Simple ViT", Beyer et al. 2022).

    A quarter of the channels each hold ``sin(y w), cos(y w), sin(x w), cos(x w)`` over
    geometrically spaced frequencies ``w``; ``dim`` must be divisible by 4.
    """
    if dim % 4 != 0:
        raise ValueError(f"sin-cos position embeddings need embed_dim divisible by 4, got {dim}.")
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float32), torch.arange(gw, dtype=torch.float32), indexing="ij")
    omega = 1.0 / temperature ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    ys = ys.flatten()[:, None] * omega[None, :]
    xs = xs.flatten()[:, None] * omega[None, :]
    return torch.cat([ys.sin(), ys.cos(), xs.sin(), xs.cos()], dim=1)


def resample_pos_embed(
    pos_embed: torch.Tensor, new_grid: tuple[int, int], old_grid: tuple[int, int], num_prefix_tokens: int
) -> torch.Tensor:
    """Bicubically resample the patch part of ``pos_embed`` ``[1, prefix + gh*gw, D]`` to ``new_grid``.

    The prefix (class-token) embeddings are kept as they are. Matches timm's
    ``resample_abs_pos_embed`` (bicubic, antialiased), so resampled timm weights agree.
    """
    if tuple(new_grid) == tuple(old_grid):
        return pos_embed
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    expected = old_grid[0] * old_grid[1]
    if patches.shape[1] != expected:
        raise ValueError(
            f"position embedding holds {patches.shape[1]} patch positions, but the grid "
            f"{old_grid[0]}x{old_grid[1]} needs {expected}."
        )
    dim = patches.shape[-1]
    grid = patches.float().reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", antialias=True, align_corners=False)
    patches = grid.permute(0, 2, 3, 1).reshape(1, -1, dim).to(pos_embed.dtype)
    return torch.cat([prefix, patches], dim=1)
