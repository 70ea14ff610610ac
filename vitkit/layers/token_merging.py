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

:func:`run_merging_block` runs an :class:`~.block.EncoderBlock` with the merge between its two
branches, as ToMe's ``ToMeBlock`` runs timm's ``Block`` (whose layout the encoder block shares).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import UnsupportedModelError
from .attention import MultiHeadSelfAttention
from .attention_masks import without_diagonal
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
    protected_a, protected_b = (num_protected + 1) // 2, num_protected // 2
    with torch.no_grad():
        metric = metric / metric.norm(dim=-1, keepdim=True)
        scores = metric[:, ::2] @ metric[:, 1::2].transpose(-1, -2)
        scores[:, :protected_a, :] = -math.inf  # protected A tokens merge into nothing
        scores[:, :, :protected_b] = -math.inf  # and nothing merges into protected B tokens
        best, best_index = scores.max(dim=-1)
        order = best.argsort(dim=-1, descending=True)
        unmerged, source = order[:, r:], order[:, :r]
        destination = best_index.gather(1, source)
        if num_protected:  # ToMe sorts when there is a class token: the protected A tokens first
            unmerged = unmerged.sort(dim=1).values
        # ToMe's output order as token indices: protected, unmerged A (2i), B (2j + 1)
        num_b = tokens // 2
        b_tokens = torch.arange(protected_b, num_b, device=metric.device) * 2 + 1
        kept = torch.cat([
            torch.arange(num_protected, device=metric.device).expand(batch, -1),
            unmerged[:, protected_a:] * 2,
            b_tokens.expand(batch, -1),
        ], dim=1)
        first_b = num_protected + unmerged.shape[1] - protected_a  # output position of B token protected_b
        into = destination - protected_b + first_b
        offsets = torch.arange(batch, device=metric.device)[:, None]
    return TokenMerge(
        kept=(kept + offsets * tokens).flatten(),
        moved=(source * 2 + offsets * tokens).flatten(),
        into=(into + offsets * kept.shape[1]).flatten(),
        r=r,
    )


@dataclass
class MergeState:
    """What travels with merged tokens from block to block.

    Attributes:
        positions: the tokens' positions; a merged token's is the size-weighted mean of its parts'.
        num_protected: leading tokens never merged (a ViT's prefix tokens).
        size: ``[B, N, 1]`` patches per token, ``None`` before the first merge (all ones).
        source: ``[B, N, N0]`` ToMe's source matrix (1 where token ``n`` holds the block-0 token),
            or ``None`` when not traced.
        trace_source: keep ``source`` (for maps); it starts as the identity at the first merge.
    """

    positions: TokenPositions
    num_protected: int
    size: torch.Tensor | None = None
    source: torch.Tensor | None = None
    trace_source: bool = False

    def attn_bias(self) -> torch.Tensor | None:
        """Proportional attention: ``log(size)`` of every key, ``[B, 1, 1, N]``; ``None`` before
        any merge (every size is 1)."""
        return None if self.size is None else self.size.log()[:, None, None, :, 0]

    def current_source(self, num_tokens: int, like: torch.Tensor) -> torch.Tensor:
        """``[B, N, N0]`` source of the current tokens (the identity before any merge)."""
        if self.source is not None:
            return self.source
        eye = torch.eye(num_tokens, device=like.device, dtype=like.dtype)
        return eye.expand(like.shape[0], num_tokens, num_tokens)

    def merged(self, x: torch.Tensor, metric: torch.Tensor, r: int) -> tuple[torch.Tensor, MergeState]:
        """Merge ``r`` tokens of ``x`` ``[B, N, D]`` matched on ``metric`` ``[B, N, C]``: the
        merged tokens (ToMe's ``merge_wavg``) and the state that goes with them."""
        merge = bipartite_soft_matching(metric, r, self.num_protected)
        if merge.r == 0:
            return x, self
        size = torch.ones_like(x[..., :1]) if self.size is None else self.size
        x = merge(x * size, "sum")
        new_size = merge(size, "sum")
        source = None
        if self.trace_source:
            source = merge(self.current_source(size.shape[1], x), "amax")
        return x / new_size, MergeState(
            self._merged_positions(merge, size, new_size), self.num_protected, new_size, source, self.trace_source
        )

    def _merged_positions(self, merge: TokenMerge, size: torch.Tensor, new_size: torch.Tensor) -> TokenPositions:
        positions, prefix = self.positions, self.num_protected
        xy = positions.xy.expand(size.shape[0], -1, -1).to(size.dtype)
        padded = torch.cat([xy.new_zeros(xy.shape[0], prefix, 2), xy], dim=1)  # the prefix has no position
        centroids = merge(padded * size, "sum")[:, prefix:] / new_size[:, prefix:]
        return TokenPositions(centroids, positions.num_prefix, positions.grid)


def check_mergeable(block: object) -> None:
    """Raise :class:`~vitkit.errors.UnsupportedModelError` (one line) unless ``block`` is an
    encoder block with vitkit's self-attention, whose keys and branches :func:`run_merging_block` reads."""
    if type(block) is not EncoderBlock or type(block.attn).forward is not MultiHeadSelfAttention.forward:
        attn = type(getattr(block, "attn", None)).__name__
        raise UnsupportedModelError(
            f"token merging runs vitkit's EncoderBlock with its MultiHeadSelfAttention (ToMe's timm Block layout), "
            f"got {type(block).__name__} with {attn}."
        )


def run_merging_block(
    block: EncoderBlock,
    x: torch.Tensor,
    state: MergeState,
    r: int,
    head_gates: torch.Tensor | None = None,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, MergeState]:
    """``block`` on ``x`` ``[B, N, D]`` with proportional attention and ``r`` tokens merged
    between its attention and its MLP (ToMe's ``ToMeBlock.forward``).

    Returns:
        ``[B, N - r, D]`` tokens, the attention weights ``[B, H, N, N]`` with ``need_weights``
        (else ``None``) and the state of the merged tokens.
    """
    attended, weights, keys = _attention_and_keys(block.attn, block.norm1(x), state, head_gates, need_weights)
    x = x + block.drop_path1(block.ls1(attended))
    if r > 0:
        x, state = state.merged(x, keys, r)
    x = x + block.drop_path2(block.ls2(block.mlp(block.norm2(x))))
    return x, weights, state


def _attention_and_keys(
    attn: MultiHeadSelfAttention,
    x: torch.Tensor,
    state: MergeState,
    head_gates: torch.Tensor | None,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``MultiHeadSelfAttention.forward`` with the size bias, which also returns the matching
    metric: the keys (after the key norm, before RoPE) averaged over the heads, ``[B, N, d]``
    (ToMe's ``ToMeAttention``). A block without heads matches on its normed tokens."""
    attn.check_tokens(x)
    bias = state.attn_bias()
    if attn.num_heads == 0:
        out, weights = attn.no_heads(x, x.shape[1], need_weights)
        return out, weights, x
    q, k, v = attn.project_qkv(x)
    q, k = attn.q_norm(q), attn.k_norm(k)
    keys = k.mean(dim=1)
    q, k = attn.rotate([q, k], state.positions)
    if attn.locality:
        bias = without_diagonal(bias, x.shape[1], x.device)
    out, weights = attn.attend(q, k, v, bias, head_gates, need_weights)
    return out, weights, keys


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
