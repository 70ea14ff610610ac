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
from dataclasses import dataclass, field
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

    The tokens split as ToMe splits them: the ``num_protected`` leading tokens, then the A tokens
    (every other token from ``2 * ceil(num_protected / 2)``) and the B tokens (every other token
    from ``2 * floor(num_protected / 2) + 1``). The merge is kept as row indices into the A and B
    tokens of the flattened batch, ``[B * N_A, C]`` and ``[B * N_B, C]`` (``index_select`` and
    ``index_add`` on rows are many times faster on a CPU than ``gather`` and ``scatter_reduce``
    with an index expanded over the channels), from ToMe's ``unm_idx``, ``src_idx`` and ``dst_idx``.
    At batch 1 the A and B tokens are strided views of the input: applying a merge builds no index
    and copies none of its input.

    Attributes:
        unmerged: ``[B * (N_A - r)]`` A rows kept, in ToMe's order.
        moved: ``[B * r]`` A rows merged away.
        into: ``[B * r]`` B rows they merge into.
        num_protected: leading tokens never merged.
        r: tokens it removes from each image.
    """

    unmerged: torch.Tensor
    moved: torch.Tensor
    into: torch.Tensor
    num_protected: int
    r: int

    def __call__(self, x: torch.Tensor, mode: MergeMode = "mean") -> torch.Tensor:
        """``[B, N, C]`` to ``[B, N - r, C]``: each merged A token reduced into its B token by
        ``mode`` (``"sum"``, ``"mean"`` or ``"amax"``, the B token included, as ToMe's
        ``scatter_reduce``); the protected tokens first and unchanged, then the unmerged A tokens,
        then the B tokens (ToMe's order)."""
        if self.r == 0:  # ToMe's do_nothing
            return x
        batch, _, channels = x.shape
        protected = self.num_protected
        a = x[:, 2 * ((protected + 1) // 2) :: 2].reshape(-1, channels)  # views at batch 1
        b = x[:, 2 * (protected // 2) + 1 :: 2].reshape(-1, channels)
        moved = a.index_select(0, self.moved)
        if mode == "sum":
            b = b.index_add(0, self.into, moved)
        else:
            with warnings.catch_warnings():  # torch calls index_reduce beta; it is exact
                warnings.filterwarnings("ignore", message="index_reduce\\(\\) is in beta")
                b = b.index_reduce(0, self.into, moved, mode, include_self=True)
        parts = [a.index_select(0, self.unmerged).view(batch, -1, channels), b.view(batch, -1, channels)]
        return torch.cat([x[:, :protected], *parts] if protected else parts, dim=1)


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
    if r == 0:
        empty = torch.empty(0, dtype=torch.long, device=metric.device)
        return TokenMerge(unmerged=empty, moved=empty, into=empty, num_protected=num_protected, r=0)
    with torch.no_grad():
        metric = metric / torch.linalg.vector_norm(metric, dim=-1, keepdim=True)  # not Tensor.norm's Python wrapper
        # Only the unprotected tokens are scored: ToMe's -inf rows and columns of the protected ones
        # never win a max and sort last, so leaving them out gives the same edges and order.
        a = metric[:, 2 * ((num_protected + 1) // 2) :: 2]
        b = metric[:, 2 * (num_protected // 2) + 1 :: 2]
        best, best_index = torch.bmm(a, b.transpose(1, 2)).max(dim=-1)
        order = best.argsort(dim=-1, descending=True)
        unmerged, moved = order[:, r:], order[:, :r]
        if num_protected:  # ToMe sorts when there is a class token: the unmerged A tokens by index
            unmerged = unmerged.sort(dim=1).values
        into = best_index.gather(1, moved)
        if batch > 1:  # rows of the flattened batch: image i's A tokens start at row i * N_A
            image = torch.arange(batch, device=metric.device)[:, None]
            unmerged, moved, into = unmerged + image * a.shape[1], moved + image * a.shape[1], into + image * b.shape[1]
    return TokenMerge(unmerged.flatten(), moved.flatten(), into.flatten(), num_protected, r)


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
    _bias: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def attn_bias(self) -> torch.Tensor | None:
        """Proportional attention: ``log(size)`` of every key, ``[B, 1, 1, N]`` (the shape SDPA
        broadcasts over heads and queries); ``None`` before any merge (every size is 1). Built
        once per merge: the blocks that merge nothing after it reuse it. Sizes are counts >= 1,
        so the bias is finite by construction."""
        if self._bias is None and self.size is not None:
            self._bias = self.size.log().reshape(self.size.shape[0], 1, 1, -1)
        return self._bias

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
        size = x.new_ones(*x.shape[:2], 1) if self.size is None else self.size
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
