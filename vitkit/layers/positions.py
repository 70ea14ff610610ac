"""Token positions that travel with the tokens through the blocks.

A ViT builds one :class:`TokenPositions` per forward from the patch grid and hands it to every
block (as timm's Eva hands its RoPE embedding), so that:

* RoPE's angles are computed once per forward for the fixed (axial) frequencies, not in every
  block (:meth:`TokenPositions.angles` caches them; mixed RoPE's are per layer by construction);
* a block that drops or merges patch tokens keeps their positions with them
  (:meth:`TokenPositions.select`), and the rotation never assumes that the last ``n`` tokens are
  the full grid;
* read-outs put patch tokens back on the grid from their positions (:meth:`TokenPositions.to_grid`),
  not from a fixed token count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from einops import rearrange

from .rope import Rope2d, patch_coords


@dataclass(eq=False)
class TokenPositions:
    """Grid positions of a sequence's patch tokens.

    Attributes:
        xy: ``[B or 1, n, 2]`` (or ``[n, 2]``) float ``(x, y)`` = (column, row) of the ``n``
            patch tokens, which follow the prefix tokens.
        num_prefix: tokens before the patches (class, distillation, registers): no position,
            never rotated.
        grid: ``(gh, gw)`` of the image's full patch grid (what :meth:`to_grid` fills); ``None``
            for positions that lie on no grid.
        dense: ``xy`` is every cell of ``grid`` in row-major order (what :meth:`of_grid` builds);
            :meth:`select` clears it.
    """

    xy: torch.Tensor
    num_prefix: int = 0
    grid: tuple[int, int] | None = None
    dense: bool = False
    _angles: dict[tuple[object, ...], torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.xy.dim() == 2:
            self.xy = self.xy.unsqueeze(0)
        if self.xy.dim() != 3 or self.xy.shape[-1] != 2:
            raise ValueError(f"positions must be [n, 2] or [B, n, 2] (x, y) coordinates, got {tuple(self.xy.shape)}.")
        if self.num_prefix < 0:
            raise ValueError(f"num_prefix must be >= 0, got {self.num_prefix}.")

    @classmethod
    def of_grid(
        cls, grid: tuple[int, int], num_prefix: int = 0, *, device: torch.device | str | None = None
    ) -> TokenPositions:
        """Every cell of a ``gh x gw`` grid, row-major (a ViT's patch order), after ``num_prefix`` tokens."""
        return cls(patch_coords(grid, device=device).unsqueeze(0), num_prefix, (int(grid[0]), int(grid[1])), dense=True)

    @property
    def num_tokens(self) -> int:
        """Sequence length ``N`` these positions describe: prefix plus patch tokens."""
        return self.num_prefix + self.xy.shape[-2]

    def angles(self, rope: Rope2d) -> torch.Tensor:
        """``rope``'s ``sin ‖ cos`` embedding of the patch tokens, ``[B or 1, H or 1, n, 2d]``; a
        fixed (axial) RoPE's is computed once and shared by every layer with the same settings."""
        if rope.learnable:
            return rope(self.xy)
        key = (rope.head_dim, rope.theta, rope.axes, self.xy.device)
        if key not in self._angles:
            self._angles[key] = rope(self.xy)
        return self._angles[key]

    def select(self, keep: torch.Tensor) -> TokenPositions:
        """The positions of the patch tokens ``keep`` ``[B, k]`` (indices among the patch tokens),
        for a block that keeps only those tokens (token dropping); the prefix is unchanged."""
        if keep.dim() != 2:
            raise ValueError(f"keep must be [B, k] indices of patch tokens, got shape {tuple(keep.shape)}.")
        xy = self.xy.expand(keep.shape[0], -1, -1)
        picked = xy.gather(1, keep.to(xy.device).unsqueeze(-1).expand(-1, -1, 2))
        return TokenPositions(picked, self.num_prefix, self.grid)

    def keep(self, tokens: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, TokenPositions]:
        """Keep the patch tokens ``keep`` of ``tokens`` (the prefix tokens always stay), with their
        positions: MAE's random masking, timm's ``patch_drop``.

        Args:
            tokens: ``[B, num_prefix + n, D]``, described by these positions.
            keep: ``[B, k]`` integer indices among the ``n`` patch tokens (``0 <= keep < n``), in
                the order the kept tokens take (MAE keeps its shuffled order).

        Returns:
            ``[B, num_prefix + k, D]`` tokens and their :class:`TokenPositions` (``[B, k, 2]``).

        Raises:
            ValueError: ``keep`` of another batch size, not 2-d, not integer, or longer than ``n``.
            (An index out of range fails in ``gather``; it is not checked here, which would
            synchronise a GPU.)
        """
        batch, n = tokens.shape[0], tokens.shape[1] - self.num_prefix
        if keep.dim() != 2 or keep.shape[0] != batch or keep.dtype.is_floating_point or keep.dtype == torch.bool:
            raise ValueError(
                f"keep must be integer indices of patch tokens of shape [B={batch}, k], got {keep.dtype} of shape "
                f"{tuple(keep.shape)}."
            )
        if keep.shape[1] > n:
            raise ValueError(f"keep names {keep.shape[1]} patch tokens, but there are {n}.")
        keep = keep.to(device=tokens.device, dtype=torch.long)
        patches = tokens[:, self.num_prefix :].gather(1, keep.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))
        return torch.cat([tokens[:, : self.num_prefix], patches], dim=1), self.select(keep)

    def to_grid(self, patches: torch.Tensor) -> torch.Tensor:
        """Patch tokens ``[B, n, D]`` on the image grid ``[B, D, gh, gw]``; a cell no token holds
        (dropped) is zero, tokens sharing a cell (merged) are summed."""
        if self.grid is None:
            raise ValueError("these positions name no grid (grid=None): build them with TokenPositions.of_grid.")
        gh, gw = self.grid
        if self.dense and patches.shape[1] == gh * gw:
            return rearrange(patches, "b (h w) d -> b d h w", h=gh, w=gw)
        if patches.shape[1] != self.xy.shape[-2]:
            raise ValueError(f"{patches.shape[1]} patch tokens, but positions for {self.xy.shape[-2]}.")
        cells = (self.xy[..., 1].round().long() * gw + self.xy[..., 0].round().long()).expand(patches.shape[0], -1)
        grid = patches.new_zeros(patches.shape[0], gh * gw, patches.shape[-1])
        grid = grid.scatter_add(1, cells.unsqueeze(-1).expand(-1, -1, patches.shape[-1]), patches)
        return rearrange(grid, "b (h w) d -> b d h w", h=gh, w=gw)
