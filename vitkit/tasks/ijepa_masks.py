"""I-JEPA's multi-block masks (Assran et al. 2023, https://arxiv.org/abs/2301.08243, Section 3):
for each image, a few rectangular *target* blocks of patches whose features the predictor must
infer, and one large *context* block, less every target, that the context encoder sees.

:class:`MultiBlockMasks` samples them as facebookresearch/ijepa's ``MaskCollator``
(``src/masks/multiblock.py``) does, draw for draw: one block size per batch for the targets and one
for the context, each from a single uniform draw of ``size_generator`` that sets both the block's
share of the grid and its aspect ratio (the reference seeds that generator with the step, so every
process of a run draws the same sizes); then, per image, each block's top-left corner from
``generator``; a context block sampled again until it keeps more than ``min_keep`` patches outside
the targets (after 20 tries, one target fewer constrains it); last, every image's indices cut to
the batch's shortest list (the first ones in grid order), so that they stack.

Two changes, both about the grid's edges, which a 4x4 grid cannot afford to lose: the reference
draws the corner with ``torch.randint(0, H - h)``, whose upper end is exclusive, so no block ever
touches the last row or column; and it shrinks a block of the grid's full height or width by one
(``randint(0, 0)`` would fail). On ImageNet's 14x14 or 16x16 grids that costs a row and a column;
on Fashion-MNIST's 4x4 grid the context block (85-100% of the grid) would always be the top-left
3x3 and the last row and column would never be seen. Here the corner is drawn over every placement
(``randint(0, H - h + 1)``) and a block may span the grid (or be one patch, on which the
reference's ``squeeze`` fails). Where the reference's blocks fit (smaller
than the grid), the same draws give the same blocks but for that upper end (tested against the
reference with it moved).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: Tries of a constrained block before one constraint less applies (the reference's ``timeout``).
TRIES_PER_CONSTRAINT = 20
#: Draws at which :meth:`MultiBlockMasks.smallest_blocks` evaluates the size rule (its steps lie far apart).
SIZE_SWEEP = 10_001

Range = tuple[float, float]


def block_size(draw: float, scale: Range, aspect: Range, grid: tuple[int, int]) -> tuple[int, int]:
    """The reference's ``_sample_block_size`` for one uniform ``draw`` in [0, 1): ``int(H W s)``
    patches at share ``s = scale[0] + draw (scale[1] - scale[0])`` and aspect ratio ``r`` likewise,
    ``h = round(sqrt(n r))``, ``w = round(sqrt(n / r))``, each at least 1 and at most the grid's."""
    height, width = grid
    count = int(height * width * (scale[0] + draw * (scale[1] - scale[0])))
    ratio = aspect[0] + draw * (aspect[1] - aspect[0])
    h = min(max(int(round(math.sqrt(count * ratio))), 1), height)
    w = min(max(int(round(math.sqrt(count / ratio))), 1), width)
    return h, w


@dataclass(frozen=True)
class MultiBlockMasks:
    """The reference's multi-block sampler on a ``grid`` of patches (see the module docstring).

    Attributes:
        grid: ``(H, W)`` patches.
        targets: target blocks per image (the reference's ``npred``, 4).
        target_scale, target_aspect: a target block's share of the grid and its height over width
            (the reference's ``pred_mask_scale`` (0.15, 0.2), ``aspect_ratio`` (0.75, 1.5)).
        context_scale: the context block's share, square (``enc_mask_scale`` (0.85, 1.0)).
        min_keep: a block keeps more than this many patches (the reference's ``min_keep``, 10 on
            ImageNet's 256 patches); every block the size rule can draw must have more.
    """

    grid: tuple[int, int]
    targets: int = 4
    target_scale: Range = (0.15, 0.2)
    target_aspect: Range = (0.75, 1.5)
    context_scale: Range = (0.85, 1.0)
    min_keep: int = 0

    def __post_init__(self) -> None:
        """Refuse blocks that could never keep more than ``min_keep`` patches: the reference
        would sample them forever.

        Raises:
            ValueError: naming the block (``target`` or ``context``) and its fewest patches.
        """
        for name, patches in zip(("target", "context"), self.smallest_blocks()):
            if patches <= self.min_keep:
                raise ValueError(f"{name} blocks of {patches} patches on the {self.grid[0]}x{self.grid[1]} grid can "
                                 f"never keep more than min_keep={self.min_keep}.")

    def smallest_blocks(self) -> tuple[int, int]:
        """The fewest patches a target block and a context block can have on :attr:`grid`, over
        :data:`SIZE_SWEEP` draws of the size rule (:func:`block_size`)."""
        draws = [index / SIZE_SWEEP for index in range(SIZE_SWEEP)]
        target = min(math.prod(block_size(d, self.target_scale, self.target_aspect, self.grid)) for d in draws)
        context = min(math.prod(block_size(d, self.context_scale, (1.0, 1.0), self.grid)) for d in draws)
        return target, context

    def sample(
        self, batch: int, size_generator: torch.Generator, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Masks for ``batch`` images.

        Args:
            batch: images in the batch.
            size_generator: draws the two block sizes of the batch (the reference seeds it with the step).
            generator: draws the corners (``None``: torch's global generator, as the reference).

        Returns:
            ``context`` ``[B, Kc]`` and ``targets`` ``[T, B, Kt]``: row-major patch indices, each
            list ascending, cut to the batch's shortest.
        """
        target_size = block_size(torch.rand(1, generator=size_generator).item(), self.target_scale,
                                 self.target_aspect, self.grid)
        context_size = block_size(torch.rand(1, generator=size_generator).item(), self.context_scale, (1.0, 1.0),
                                  self.grid)
        contexts, targets = [], []
        for _ in range(batch):
            blocks = [self._block(target_size, generator, []) for _ in range(self.targets)]
            targets.append([indices for indices, _ in blocks])
            contexts.append(self._block(context_size, generator, [outside for _, outside in blocks])[0])
        shortest = min(len(indices) for image in targets for indices in image)
        shortest_context = min(len(indices) for indices in contexts)
        context = torch.stack([indices[:shortest_context] for indices in contexts])
        target = torch.stack([torch.stack([indices[:shortest] for indices in image]) for image in targets], dim=1)
        return context, target

    def _block(
        self, size: tuple[int, int], generator: torch.Generator | None, allowed: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block of ``size`` placed at random, its cells outside every ``allowed`` mask removed:
        its ascending indices and the grid's ``[H, W]`` complement of the whole block (the region
        a later block may use). ``allowed`` are relaxed one by one (the last first) after every
        :data:`TRIES_PER_CONSTRAINT` blocks that keep ``min_keep`` patches or fewer."""
        (height, width), (h, w) = self.grid, size
        tries, failures = 0, 0
        while True:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            block = torch.zeros(self.grid, dtype=torch.int32)
            block[top : top + h, left : left + w] = 1
            for region in allowed[: max(len(allowed) - tries, 0)]:
                block *= region
            indices = torch.nonzero(block.flatten()).squeeze(1)
            if len(indices) > self.min_keep:
                break
            failures += 1
            if failures == TRIES_PER_CONSTRAINT:
                tries, failures = tries + 1, 0
        outside = torch.ones(self.grid, dtype=torch.int32)
        outside[top : top + h, left : left + w] = 0
        return indices, outside
