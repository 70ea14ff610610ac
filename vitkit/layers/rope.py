"""2-D rotary position embeddings (Heo et al. 2024, "Rotary Position Embedding for Vision
Transformer", https://arxiv.org/abs/2403.13298).

RoPE rotates each channel pair ``(2i, 2i+1)`` of a query or key by the angle
``theta_i(p) = x * fx_i + y * fy_i`` of the token's position ``p = (x, y)`` (column, row). A
rotation by ``theta(p_q)`` of the query and ``theta(p_k)`` of the key leaves ``q . k`` a function of
``p_q - p_k`` only: attention sees relative positions, at any grid size.

* ``axial``: fixed frequencies; the first half of the pairs turn with ``x`` at
  ``theta^(-k / (d/4))``, ``k = 0 .. d/4 - 1``, the second half with ``y`` at the same frequencies.
* ``mixed``: every pair has a learnable 2-D frequency ``(fx_i, fy_i)``, per head and per layer
  (each attention owns its own), initialised to the axial magnitudes turned by a random angle per
  head, so a head can attend along diagonals.

The layout (interleaved pairs, ``sin`` then ``cos`` concatenated) and the initialisation are
timm's (``RotaryEmbeddingCat`` with ``in_pixels=False``, ``RotaryEmbeddingMixed``,
``apply_rot_embed_cat``), so timm's weights map 1:1.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from timm.layers.pos_embed_sincos import apply_rot_embed_cat, freq_bands, init_random_2d_freqs
from torch import nn

RopeKind = Literal["none", "axial", "mixed"]
ROPE_KINDS: tuple[str, ...] = get_args(RopeKind)
#: Heo et al.'s frequency base of each form (timm's RoPE-ViT models use the same).
DEFAULT_ROPE_THETA = {"axial": 100.0, "mixed": 10.0}
#: Which position coordinate turns the first half of the axial pairs: ``x`` (Heo et al.) or ``y``.
RopeAxes = Literal["xy", "ij"]


def patch_coords(
    grid: tuple[int, int], *, device: torch.device | str | None = None, start: float = 0.0
) -> torch.Tensor:
    """``(x, y)`` = (column, row) of every cell of a ``gh x gw`` patch grid, row-major: ``[gh*gw, 2]``
    float32, counting from ``start``."""
    rows = torch.arange(grid[0], device=device, dtype=torch.float32) + start
    cols = torch.arange(grid[1], device=device, dtype=torch.float32) + start
    y, x = torch.meshgrid(rows, cols, indexing="ij")
    return torch.stack([x, y], dim=-1).reshape(-1, 2)


def rotate_tokens(x: torch.Tensor, embedding: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Rotate the tokens of ``x`` ``[B, H, N, d]`` after its ``num_prefix`` prefix tokens (class
    token, registers: never rotated) by ``embedding`` ``[..., N - num_prefix, 2d]``
    (:meth:`Rope2d.forward` of their positions). Returns ``[B, H, N, d]`` in ``x``'s dtype."""
    if num_prefix < 0 or x.shape[-2] != num_prefix + embedding.shape[-2]:
        raise ValueError(
            f"the positions name {embedding.shape[-2]} patch tokens after {num_prefix} prefix tokens, but the "
            f"sequence holds {x.shape[-2]} tokens; keep the positions with the tokens (TokenPositions.select)."
        )
    rotated = apply_rot_embed_cat(x[..., num_prefix:, :], embedding)
    return torch.cat([x[..., :num_prefix, :], rotated], dim=-2) if num_prefix else rotated


class Rope2d(nn.Module):
    """The rotation angles of one attention's heads, from token positions.

    Args:
        head_dim: per-head width ``d`` (divisible by 4: ``d/2`` pairs, a quarter per axis).
        num_heads: heads ``H`` (mixed keeps one set of frequencies per head).
        kind: ``"axial"`` (fixed) or ``"mixed"`` (learnable ``freqs`` ``[2, H, d/2]``).
        theta: frequency base; default :data:`DEFAULT_ROPE_THETA` of the kind.
        axes: ``"xy"``: the first half of the axial pairs turns with ``x``; ``"ij"``: with ``y``
            (timm's ``grid_indexing``).
        device, dtype: where and in which dtype ``freqs`` is created (mixed).
    """

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        kind: Literal["axial", "mixed"] = "axial",
        theta: float | None = None,
        *,
        axes: RopeAxes = "xy",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if kind not in ("axial", "mixed"):
            raise ValueError(f"rope must be 'axial' or 'mixed', got {kind!r}.")
        if head_dim % 4 != 0:
            raise ValueError(
                f"2-D RoPE needs head_dim divisible by 4 (a quarter of the channels per axis and "
                f"rotation component), got {head_dim}."
            )
        self.kind = kind
        self.head_dim = head_dim
        self.theta = float(theta if theta is not None else DEFAULT_ROPE_THETA[kind])
        self.axes = axes
        if kind == "mixed":
            self.freqs = nn.Parameter(torch.empty(2, num_heads, head_dim // 2, device=device, dtype=dtype))
        else:
            self.freqs = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Mixed: timm's (and Heo et al.'s) init, axial magnitudes turned by a random angle per head."""
        if self.freqs is not None:
            with torch.no_grad():
                heads = self.freqs.shape[1]
                drawn = init_random_2d_freqs(self.head_dim, 1, heads, self.theta, device=self.freqs.device)
                self.freqs.copy_(drawn[:, 0])

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, head_dim={self.head_dim}, theta={self.theta}, axes={self.axes!r}"

    def frequencies(self, device: torch.device | None = None) -> torch.Tensor:
        """``(fx, fy)`` of every pair, ``[2, H, d/2]`` (mixed) or ``[2, 1, d/2]`` (axial), float32."""
        if self.freqs is not None:
            return self.freqs.float()
        bands = freq_bands(self.head_dim // 4, float(self.theta), step=1).to(device)
        zeros = torch.zeros_like(bands)
        first, second = torch.cat([bands, zeros]), torch.cat([zeros, bands])
        fx, fy = (first, second) if self.axes == "xy" else (second, first)
        return torch.stack([fx, fy]).unsqueeze(1)

    @torch.no_grad()
    def select_heads(self, index: torch.Tensor) -> None:
        """Keep the frequencies of the heads ``index`` (head pruning); axial ones are shared."""
        if self.freqs is not None:
            self.freqs = nn.Parameter(self.freqs.index_select(1, index.to(self.freqs.device)))

    @property
    def learnable(self) -> bool:
        """Mixed RoPE learns its frequencies per layer; axial angles depend on the positions only."""
        return self.freqs is not None

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """Positions ``[..., n, 2]`` (``x, y``) to ``sin ‖ cos`` of every channel's angle,
        ``[..., H or 1, n, 2d]`` float32 (:func:`rotate_tokens` applies it)."""
        if positions.shape[-1] != 2:
            raise ValueError(f"positions must be [..., n, 2] (x, y) coordinates, got {tuple(positions.shape)}.")
        fx, fy = self.frequencies(positions.device).unbind(0)
        coords = positions.float().unsqueeze(-3)  # [..., 1, n, 2]: one position for all heads
        angles = coords[..., 0:1] * fx.unsqueeze(-2) + coords[..., 1:2] * fy.unsqueeze(-2)
        angles = angles.repeat_interleave(2, dim=-1)  # the two channels of a pair share its angle
        return torch.cat([angles.sin(), angles.cos()], dim=-1)
