"""Token merging (ToMe: Bolya et al. 2022, "Token Merging: Your ViT But Faster",
https://arxiv.org/abs/2210.09461; code at facebookresearch/ToMe, ``tome/merge.py``).

Between the attention and the MLP of a block, ``r`` pairs of similar tokens are merged:

* **bipartite soft matching** (:func:`bipartite_soft_matching`): the tokens alternate between two
  sets A and B; each A token's most similar B token (cosine similarity of the attention keys,
  averaged over the heads) is its edge, and the ``r`` A tokens with the strongest edges merge
  into their B tokens. The prefix tokens (class, distillation, registers) are protected: never
  merged away, never merged into;
* **size-weighted average** (:meth:`MergeState.merged`): a token holds ``size`` patches, and a
  merged token is the size-weighted mean of its parts (ToMe's ``merge_wavg``);
* **proportional attention** (:meth:`MergeState.attn_bias`): ``log(size)`` added to every key's
  score through the attention's float ``attn_bias``, so a merged token counts as the patches it holds;
* **source** (ToMe's ``merge_source``): ``[B, N, N0]`` which of the ``N0`` tokens the block
  first saw each of the ``N`` tokens holds, traced only when asked (attention maps go back to
  the patches through it: :func:`unmerge_attention`); positions merge as sizes do, so RoPE rotates
  a merged token by the centroid of its patches.

A block merges through its own forward: it takes ``merge`` (a :class:`MergeStep`), which it calls
between its attention and its MLP on the attention's keys (``need_keys``), as ToMe's ``ToMeBlock``
does in timm's ``Block``; :class:`~.block.EncoderBlock` does, and so may any registered block
(:mod:`.parts`). :func:`check_mergeable` refuses, in one line, a block whose forward takes no ``merge``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ..errors import UnsupportedModelError
from .block import EncoderBlock
from .positions import TokenPositions

MergeMode = Literal["sum", "mean", "amax"]
Schedule = Literal["constant", "decreasing"]


def merge_schedule(r: int | Sequence[int], depth: int, schedule: Schedule = "constant") -> list[int]:
    """Tokens to merge in each of ``depth`` blocks (ToMe's ``parse_r``).

    Args:
        r: one count for every block, or one per block (a list as long as ``depth``).
        depth: number of blocks.
        schedule: with an int ``r``, ``"constant"`` (``r`` in every block) or ``"decreasing"``
            (ToMe's ``(r, -1)``: from ``2r`` in the first block down to 0 in the last, about
            ``r * depth`` tokens in all).

    Raises:
        ValueError: a negative count, a list of another length than ``depth``, an unknown schedule.
    """
    if schedule not in ("constant", "decreasing"):
        raise ValueError(f"schedule must be 'constant' or 'decreasing', got {schedule!r}.")
    if not isinstance(r, int):
        counts = [int(value) for value in r]
        if len(counts) != depth:
            raise ValueError(f"r lists {len(counts)} blocks, but the model has {depth}; give one count per block.")
        if schedule != "constant":
            raise ValueError("a list of r gives every block's count: it takes no schedule.")
    elif schedule == "decreasing":
        step = -2 * r / max(depth - 1, 1)
        counts = [int(2 * r + step * index) for index in range(depth)]
    else:
        counts = [r] * depth
    if any(count < 0 for count in counts):
        raise ValueError(f"r must be >= 0 tokens per block, got {counts if not isinstance(r, int) else r}.")
    return counts


def merge_limit(num_tokens: int, num_protected: int) -> int:
    """Most tokens one block can merge among ``num_tokens`` (``num_protected`` of them never
    merge): half of the others, as ToMe's balanced matching allows."""
    return max(num_tokens - num_protected, 0) // 2


def token_counts(num_tokens: int, num_protected: int, schedule: Sequence[int]) -> list[int]:
    """Tokens each block attends over, and after the last, ``[depth + 1]``: ToMe's counts, each
    block merging ``min(r, merge_limit)``."""
    counts = [num_tokens]
    for r in schedule:
        counts.append(counts[-1] - min(r, merge_limit(counts[-1], num_protected)))
    return counts


@dataclass(frozen=True)
class TokenMerge:
    """One block's bipartite matching: which A tokens merge into which B tokens.

    Kept as row indices into the flattened ``[B * N, C]`` tokens (``index_select`` and
    ``index_add_`` on rows are many times faster on a CPU than ``gather`` and ``scatter_reduce``
    with an index expanded over the channels), from ToMe's ``unm_idx``, ``src_idx`` and ``dst_idx``.

    Attributes:
        kept: ``[B * (N - r)]`` rows of the output, in ToMe's order: the protected tokens, the
            unmerged A tokens, then the B tokens.
        moved: ``[B * r]`` rows of the A tokens merged away.
        into: ``[B * r]`` output rows they merge into (their B tokens').
        r: tokens it removes from each image.
    """

    kept: torch.Tensor
    moved: torch.Tensor
    into: torch.Tensor
    r: int

    def __call__(self, x: torch.Tensor, mode: MergeMode = "mean") -> torch.Tensor:
        """``[B, N, C]`` to ``[B, N - r, C]``: each merged A token reduced into its B token by
        ``mode`` (``"sum"``, ``"mean"`` or ``"amax"``, the B token included, as ToMe's
        ``scatter_reduce``); the protected tokens first and unchanged, then the unmerged A tokens,
        then the B tokens (ToMe's order)."""
        batch, _, channels = x.shape
        rows = x.reshape(-1, channels)
        out = rows.index_select(0, self.kept)
        moved = rows.index_select(0, self.moved)
        if mode == "sum":
            out = out.index_add(0, self.into, moved)
        else:
            with warnings.catch_warnings():  # torch calls index_reduce beta; it is exact
                warnings.filterwarnings("ignore", message="index_reduce\\(\\) is in beta")
                out = out.index_reduce(0, self.into, moved, mode, include_self=True)
        return out.view(batch, -1, channels)


def bipartite_soft_matching(metric: torch.Tensor, r: int, num_protected: int = 0) -> TokenMerge:
    """ToMe's balanced bipartite soft matching on ``metric`` ``[B, N, C]`` (the keys).

    Args:
        metric: per token, the features whose cosine similarity decides the merges.
        r: tokens to remove; at most :func:`merge_limit` are (ToMe clamps it, as here).
        num_protected: leading tokens (class, distillation, registers) that are never merged.
            ToMe protects its class token (``class_token``) and distillation token
            (``distill_token``): with 1 and 2 this matching is ToMe's to the index.

    Returns:
        The :class:`TokenMerge`, applied to any ``[B, N, C]`` tensor of the same tokens.
    """
    batch, tokens, _ = metric.shape
    r = min(r, merge_limit(tokens, num_protected))
    if r == 0:  # ToMe's do_nothing: every token kept, in its order
        rows = torch.arange(batch * tokens, device=metric.device)
        return TokenMerge(kept=rows, moved=rows[:0], into=rows[:0], r=0)
    protected_a, protected_b = (num_protected + 1) // 2, num_protected // 2
    with torch.no_grad():
        metric = metric / metric.norm(dim=-1, keepdim=True)
        # Only the unprotected tokens are scored: ToMe's -inf rows and columns of the protected ones
        # never win a max and sort last, so leaving them out gives the same edges and order.
        a, b = metric[:, 2 * protected_a :: 2], metric[:, 2 * protected_b + 1 :: 2]
        best, best_index = (a @ b.transpose(-1, -2)).max(dim=-1)
        order = best.argsort(dim=-1, descending=True)
        unmerged, source = order[:, r:], order[:, :r]
        if num_protected:  # ToMe sorts when there is a class token: the unmerged A tokens by index
            unmerged = unmerged.sort(dim=1).values
        # ToMe's output order as token indices: protected, unmerged A (2i), B (2j + 1)
        device = metric.device
        kept = torch.cat([
            torch.arange(num_protected, device=device).expand(batch, -1),
            unmerged * 2 + 2 * protected_a,
            torch.arange(2 * protected_b + 1, tokens, 2, device=device).expand(batch, -1),
        ], dim=1)
        into = best_index.gather(1, source) + (num_protected + unmerged.shape[1])  # the B tokens' output rows
        moved = source * 2 + 2 * protected_a
        if batch > 1:  # rows of the flattened batch: image i's tokens start at row i * tokens
            image = torch.arange(batch, device=device)[:, None]
            kept, moved, into = kept + image * tokens, moved + image * tokens, into + image * kept.shape[1]
    return TokenMerge(kept=kept.flatten(), moved=moved.flatten(), into=into.flatten(), r=r)


@dataclass
class MergeState:
    """What travels with merged tokens from block to block.

    Attributes:
        positions: the tokens' positions, or ``None`` where no block reads them (no RoPE); a merged
            token's is the size-weighted mean of its parts'.
        num_protected: leading tokens never merged (a ViT's prefix tokens).
        size: ``[B, N, 1]`` patches per token, ``None`` before the first merge (all ones).
        source: ``[B, N, N0]`` ToMe's source matrix (1 where token ``n`` holds the block-0 token),
            or ``None`` when not traced.
        trace_source: keep ``source`` (for maps); it starts as the identity at the first merge.
    """

    positions: TokenPositions | None
    num_protected: int
    size: torch.Tensor | None = None
    source: torch.Tensor | None = None
    trace_source: bool = False

    def attn_bias(self) -> torch.Tensor | None:
        """Proportional attention: ``log(size)`` of every key, ``[B, 1, 1, N]``; ``None`` before
        any merge (every size is 1). Sizes are counts >= 1, so the bias is finite by construction."""
        return None if self.size is None else self.size.log()[:, None, None, :, 0]

    def current_source(self, num_tokens: int, like: torch.Tensor) -> torch.Tensor:
        """``[B, N, N0]`` source of the current tokens (the identity before any merge)."""
        if self.source is not None:
            return self.source
        eye = torch.eye(num_tokens, device=like.device, dtype=like.dtype)
        return eye.expand(like.shape[0], num_tokens, num_tokens)

    def merged(self, x: torch.Tensor, metric: torch.Tensor, r: int) -> tuple[torch.Tensor, MergeState]:
        """Merge ``r`` tokens of ``x`` ``[B, N, D]`` matched on ``metric`` ``[B, N, C]``: the
        merged tokens (ToMe's ``merge_wavg``) and the state that goes with them.

        The size-weighted tokens, the sizes and the size-weighted positions are summed by one
        merge of their concatenation (one gather and one scatter in place of three of each)."""
        merge = bipartite_soft_matching(metric, r, self.num_protected)
        if merge.r == 0:
            return x, self
        width = x.shape[-1]
        size = torch.ones_like(x[..., :1]) if self.size is None else self.size
        parts = [x if self.size is None else x * size, size]
        if self.positions is not None:
            parts.append(self._padded_xy(size) * size)
        summed = merge(torch.cat(parts, dim=-1), "sum")
        # Each channel is summed on its own, so the sizes and positions hold no gradient of x: detached,
        # they stay out of the autograd graph (and the next block's bias needs no gradient) as in ToMe.
        counted = summed[..., width:].detach()
        new_size = counted[..., :1]
        source = None
        if self.trace_source:
            source = merge(self.current_source(size.shape[1], x), "amax")
        positions = None
        if self.positions is not None:
            prefix = self.num_protected
            centroids = counted[:, prefix:, 1:] / new_size[:, prefix:]
            positions = TokenPositions(centroids, self.positions.num_prefix, self.positions.grid)
        state = MergeState(positions, self.num_protected, new_size, source, self.trace_source)
        return summed[..., :width] / new_size, state

    def _padded_xy(self, size: torch.Tensor) -> torch.Tensor:
        """``[B, N, 2]`` positions of every token, the prefix tokens' zero (they have none and never merge)."""
        xy = self.positions.xy.expand(size.shape[0], -1, -1).to(size.dtype)
        return torch.cat([xy.new_zeros(xy.shape[0], self.num_protected, 2), xy], dim=1)


class MergeStep:
    """One block's merge, handed to the block's forward as ``merge`` (:data:`~.block.TokenMerge`),
    which calls it between its attention and its MLP: ``r`` tokens merged from the state
    ``before``; ``after`` is the state of the merged tokens once it ran (``before`` until then).

    Called again (gradient checkpointing runs a block's forward again in the backward pass), it
    merges from ``before`` again, so the recomputed tokens are the ones of the first call.
    """

    def __init__(self, before: MergeState, r: int) -> None:
        self.before, self.after, self.r = before, before, r

    def __call__(self, x: torch.Tensor, metric: torch.Tensor) -> torch.Tensor:
        """``[B, N, D]`` tokens matched on ``metric`` ``[B, N, C]`` to ``[B, N - r, D]``."""
        x, self.after = self.before.merged(x, metric, self.r)
        return x


def check_mergeable(block: nn.Module) -> None:
    """Raise :class:`~vitkit.errors.UnsupportedModelError` (one line) unless ``block`` merges tokens:
    its forward takes ``merge`` (:mod:`.parts`), and an encoder block's attention returns its keys
    (``need_keys``)."""
    name = type(block).__name__
    if "merge" not in inspect.signature(block.forward).parameters:
        raise UnsupportedModelError(
            f"token merging hands every block a merge to call between its attention and its MLP, but "
            f"{name}.forward takes no merge= (see vitkit.layers.parts for the block contract)."
        )
    attn = getattr(block, "attn", None)
    if type(block).forward is EncoderBlock.forward and "need_keys" not in inspect.signature(attn.forward).parameters:
        raise UnsupportedModelError(
            f"token merging matches tokens on the attention's keys, but {name}'s attention "
            f"{type(attn).__name__}.forward takes no need_keys= (see vitkit.layers.parts for the attention contract)."
        )


def unmerge_tokens(tokens: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """Merged tokens ``[B, N, D]`` back on the ``N0`` tokens they hold, ``[B, N0, D]``: each
    original token takes the features of the token that holds it (``source`` ``[B, N, N0]``)."""
    return source.transpose(1, 2).to(tokens.dtype) @ tokens


def unmerge_attention(attention: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """Attention weights over merged tokens ``[B, H, N, N]`` on the original tokens,
    ``[B, H, N0, N0]``: every token held by a query takes its row, and a key's weight is shared
    evenly among the tokens it holds, so each row still sums to 1 and the weight a query puts on
    a group of patches is unchanged."""
    source = source.to(attention.dtype)
    spread = source / source.sum(dim=-1, keepdim=True)
    return torch.einsum("bqi,bhqk,bkj->bhij", source, attention, spread)


def unmerge_gradient(gradient: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """The gradient of a logit with respect to merged attention ``[B, H, N, N]`` on the original
    tokens ``[B, H, N0, N0]``: every entry copied to the pairs of tokens it joins, so that
    ``unmerge_attention(A) * unmerge_gradient(G)`` sums over a group of keys to ``A * G``."""
    source = source.to(gradient.dtype)
    return torch.einsum("bqi,bhqk,bkj->bhij", source, gradient, source)
