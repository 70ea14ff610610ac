"""Multi-head self-attention (Vaswani et al. 2017, https://arxiv.org/abs/1706.03762).

:class:`AttentionBase` holds what every vitkit attention layer shares: the fused qkv projection,
the optional q/k norms, per-head LSA temperatures and 2-D RoPE, the output projection ``W_o``,
head gates, physical head pruning and the kernel dispatch (:mod:`vitkit.kernels`) with the one
mask contract ``attn_bias`` (:mod:`.attention_masks`). :class:`MultiHeadSelfAttention` is the
ViT's self-attention on top of it, about as long as timm's ``Attention``; cross-attention
(:mod:`.cross_attention`) and causal decoding with a KV cache (:mod:`.decoding`) are their own
layers on the same base, off the ViT's path.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from einops import rearrange
from torch import nn

from ..kernels import ATTN_IMPLS, AttnImpl, choose_attn_impl, explicit_attention, resolve_attn_impl, sdpa_attention
from .attention_masks import prepare_bias, without_diagonal
from .init_rules import xavier_per_projection, xavier_scaled
from .lora import LoraError, has_lora
from .parts import register_attention
from .positions import TokenPositions
from .rope import ROPE_KINDS, Rope2d, RopeAxes, RopeKind, rotate_tokens

#: W_o's Xavier-init scale for a standalone module, whose depth is unknown (see ``out_init_scale``).
DEFAULT_OUT_INIT_SCALE = 0.5


def _linear(in_features: int, out_features: int, bias: bool = True, **factory: object) -> nn.Linear:
    """``nn.Linear`` that may be zero-sized (every head pruned) without torch's init warning;
    ``factory`` holds torch's ``device`` / ``dtype`` keywords."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
        return nn.Linear(in_features, out_features, bias=bias, **factory)


def _every_row_attends(row_has_key: torch.Tensor) -> bool:
    """Whether every query has a key: then the weights are returned as they multiplied the values,
    in the graph (gradient maps through a bias, such as token merging's sizes). Only the maps ask
    for weights, so the host sync is off the hot path; while a graph is recorded, ``False``."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    return bool(row_has_key.all())


@dataclass(frozen=True)
class AttentionOptions:
    """How an attention layer (:class:`AttentionBase`) attends: every option but its size (``dim``, ``num_heads``).

    Adding an attention option takes one field here and its use in :class:`AttentionBase`;
    a :class:`~vitkit.models.ViTConfig` field of the same name then reaches every block of a
    model (:meth:`~vitkit.models.ViTConfig.attention_options`), with no signature in between.

    Attributes:
        head_dim: width ``d`` of each head; default ``dim // num_heads`` (pruned modules keep
            their head width while losing heads).
        qkv_bias: bias in the fused qkv projection.
        attn_drop: dropout on the post-softmax attention weights (training only).
        proj_drop: dropout on the output (an :class:`~vitkit.layers.EncoderBlock` also uses it
            inside its MLP, as timm's ``Block`` does).
        qk_norm: LayerNorm on each head's queries and keys (stabilises small head widths).
        attn_impl: ``"auto"`` (the exact kernel measured fastest on this machine, see
            :mod:`vitkit.kernels`), ``"sdpa"`` or ``"explicit"``. The module resolves it once
            into its own ``attn_impl`` attribute (``VITKIT_ATTN_IMPL`` pins ``"auto"``); a
            training run sets that attribute of ``"auto"`` modules step by step.
        out_init_scale: factor applied to ``W_o``'s Xavier init, because ``W_o`` writes into the
            residual stream. Models pass ``1/sqrt(2 * depth)`` (GPT-2); standalone the default is
            0.5.
        norm_eps: epsilon of the q/k LayerNorms (and of an ``EncoderBlock``'s own norms).
        locality: Locality Self-Attention (Lee et al. 2021, "Vision Transformer for Small-Size
            Datasets", https://arxiv.org/abs/2112.13492) as the authors' code parameterises it
            (aanna0701/SPT_LSA_ViT, ``models/vit.py``): one learnable temperature per head
            (``temperature [H]``, initialised to ``1/sqrt(d)``, multiplying ``Q K^T`` directly in
            place of the fixed scale) and, in self-attention, no token attends to itself (the
            diagonal is masked), which sharpens attention on small datasets.
        rope: 2-D rotary position embedding of the queries and keys (:mod:`.rope`): ``"none"``,
            ``"axial"`` (fixed frequencies, x and y halves of each head) or ``"mixed"``
            (learnable frequencies per head). The forward then takes ``positions``, the tokens'
            :class:`~vitkit.layers.TokenPositions`.
        rope_theta: RoPE's frequency base; default 100 (axial) or 10 (mixed), Heo et al.'s.
        rope_axes: ``"xy"`` (the first half of the axial pairs turns with x, Heo et al.) or
            ``"ij"`` (with y, timm's default ``grid_indexing``).
    """

    head_dim: int | None = None
    qkv_bias: bool = True
    attn_drop: float = 0.0
    proj_drop: float = 0.0
    qk_norm: bool = False
    attn_impl: AttnImpl = "auto"
    out_init_scale: float = DEFAULT_OUT_INIT_SCALE
    norm_eps: float = 1e-6
    locality: bool = False
    rope: RopeKind = "none"
    rope_theta: float | None = None
    rope_axes: RopeAxes = "xy"

    def __post_init__(self) -> None:
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {ATTN_IMPLS}, got {self.attn_impl!r}.")
        if self.rope not in ROPE_KINDS:
            raise ValueError(f"rope must be one of {ROPE_KINDS}, got {self.rope!r}.")
        if not 0.0 <= self.attn_drop < 1.0 or not 0.0 <= self.proj_drop < 1.0:
            raise ValueError(
                f"dropout rates must lie in [0, 1), got attn_drop={self.attn_drop}, proj_drop={self.proj_drop}."
            )

    def replace(self, **changes: Any) -> AttentionOptions:
        """A copy with ``changes`` applied (an unknown option name raises ``TypeError``)."""
        return dataclasses.replace(self, **changes) if changes else self


class AttentionBase(nn.Module):
    """What every attention layer shares; subclasses project their queries, keys and values and
    call :meth:`attend`.

    Args:
        dim: token width ``D`` of the input (and of the output).
        num_heads: number of heads ``H``; ``dim`` must be divisible by it unless
            ``options.head_dim`` is given.
        options: how the heads attend (:class:`AttentionOptions`); default all defaults.
        device, dtype: where and in which dtype the parameters are created (as torch's layers).
        **changes: :class:`AttentionOptions` fields overriding ``options``
            (``MultiHeadSelfAttention(64, 4, qk_norm=True)``).

    Attributes:
        attn_impl: the kernel policy, resolved once from ``options.attn_impl`` (``"auto"``,
            ``"sdpa"`` or ``"explicit"``); a training run may set it step by step.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        options: AttentionOptions | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **changes: Any,
    ) -> None:
        super().__init__()
        options = (options or AttentionOptions()).replace(**changes)
        factory = {"device": device, "dtype": dtype}
        head_dim = options.head_dim
        if head_dim is None:
            if num_heads <= 0 or dim % num_heads != 0:
                raise ValueError(
                    f"dim ({dim}) must be divisible by num_heads ({num_heads}): each head gets "
                    f"dim / num_heads channels. Choose num_heads among the divisors of {dim}, "
                    "or pass head_dim explicitly."
                )
            head_dim = dim // num_heads
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.attn_impl: AttnImpl = resolve_attn_impl(options.attn_impl)
        self.attn_drop = options.attn_drop
        self.qkv = _linear(dim, 3 * num_heads * head_dim, bias=options.qkv_bias, **factory)
        self.q_norm = nn.LayerNorm(head_dim, eps=options.norm_eps, **factory) if options.qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(head_dim, eps=options.norm_eps, **factory) if options.qk_norm else nn.Identity()
        self.proj = _linear(num_heads * head_dim, dim, **factory)
        self.proj_drop = nn.Dropout(options.proj_drop) if options.proj_drop > 0 else nn.Identity()
        self.out_init_scale = options.out_init_scale
        self.locality = options.locality
        self.temperature = nn.Parameter(torch.empty(num_heads, **factory)) if options.locality else None
        self.rope = (
            Rope2d(head_dim, num_heads, options.rope, options.rope_theta, axes=options.rope_axes, **factory)
            if options.rope != "none"
            else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform ``W_q, W_k, W_v`` (each ``[H*d, D]`` on its own), zero biases, and
        Xavier-uniform ``W_o`` multiplied by :attr:`out_init_scale`.

        This is the standalone module's init; a :class:`~vitkit.models.VisionTransformer`
        re-initialises its blocks by its ``init`` scheme (see :mod:`vitkit.models.init`)."""
        if self.num_heads * self.head_dim > 0:
            xavier_per_projection(self.qkv, self.out_init_scale)
            xavier_scaled(self.proj, self.out_init_scale)
        else:  # every head pruned: only the biases have elements
            for bias in (self.qkv.bias, self.proj.bias):
                if bias is not None:
                    nn.init.zeros_(bias)
        if self.temperature is not None:
            nn.init.constant_(self.temperature, self.head_dim**-0.5)

    def extra_repr(self) -> str:
        locality = ", locality=True" if self.locality else ""
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, attn_impl={self.attn_impl!r}{locality}"

    def check_tokens(self, x: torch.Tensor, name: str = "x") -> None:
        """Raise ``ValueError`` unless ``x`` is ``[B, N, D]`` with this layer's ``D``."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{name} must have shape [B, N, D] with D = {self.dim}, got {tuple(x.shape)}; "
                "flatten images to token sequences first (e.g. with PatchEmbed)."
            )

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values ``[B, H, N, d]`` of tokens ``[B, N, D]``: views of one fused
        projection. Split along the ``three`` axis in place and only then moved to head-major, so
        the backward's ``stack`` of the three gradients lands in the projection's own layout: one
        ``[B, N, 3 H d]`` copy, where splitting a ``three b h n d`` permutation (timm's order)
        needs a clone after it (on 2 CPU cores the step's time moved within the noise)."""
        qkv = rearrange(self.qkv(x), "b n (three h d) -> b n three h d", three=3, h=self.num_heads)
        q, k, v = (rearrange(t, "b n h d -> b h n d") for t in qkv.unbind(2))
        return q, k, v

    def split_heads(self, projected: torch.Tensor) -> torch.Tensor:
        """``[B, N, H*d]`` to ``[B, H, N, d]``."""
        return rearrange(projected, "b n (h d) -> b h n d", h=self.num_heads)

    def rotate(
        self, tokens: list[torch.Tensor], positions: TokenPositions | None, name: str = "positions"
    ) -> list[torch.Tensor]:
        """Queries and/or keys ``[B, H, N, d]`` of the same tokens, rotated by those tokens'
        positions with this layer's RoPE (the angles computed once for all of them); unchanged
        without RoPE (``positions`` are then ignored, so a model may always pass them)."""
        if self.rope is None:
            return tokens
        if positions is None:
            raise ValueError(
                f"rope={self.rope.kind!r} rotates queries and keys by position: pass {name}=TokenPositions(...) "
                "(a ViT passes its own, see VisionTransformer.token_positions)."
            )
        angles = positions.angles(self.rope)
        return [rotate_tokens(x, angles, positions.num_prefix) for x in tokens]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_bias: torch.Tensor | None,
        head_gates: torch.Tensor | None,
        need_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of ``q`` ``[B, H, N, d]`` over ``k, v`` ``[B, H, M, d]`` (normed and rotated),
        merged and projected by ``W_o``.

        Returns:
            ``[B, N, D]`` and, with ``need_weights``, the post-softmax weights ``[B, H, N, M]``
            (before attention dropout, part of the autograd graph), else ``None``. A query with
            no allowed key gets zero output and zero weights.
        """
        batch, _, num_queries, _ = q.shape
        scale: float = self.scale
        if self.temperature is not None:
            # Each head's temperature multiplies its queries, so both kernels take it unchanged.
            q, scale = q * self.temperature.to(q.dtype).view(-1, 1, 1), 1.0
        shape = (batch, self.num_heads, num_queries, k.shape[-2])
        bias, row_has_key = prepare_bias(attn_bias, shape, q)
        dropout_p = self.attn_drop if self.training else 0.0
        impl = choose_attn_impl(
            self.attn_impl, q, need_weights, k=k, masked=bias is not None, dropout_p=dropout_p, scale=scale
        )
        weights = None
        if impl == "sdpa":
            out = sdpa_attention(q, k, v, bias, dropout_p, scale)
        else:
            out, weights = explicit_attention(q, k, v, bias, dropout_p, scale)
        if row_has_key is not None:
            out = out * row_has_key
            if need_weights and not _every_row_attends(row_has_key):
                weights = weights * row_has_key
        if head_gates is not None:
            out = out * self._gates(head_gates, batch).to(out.dtype)
        return self.proj_drop(self.proj(rearrange(out, "b h n d -> b n (h d)"))), weights

    def no_heads(self, x: torch.Tensor, num_keys: int, need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every head pruned: the branch contributes zeros ``[B, N, D]`` (weights ``[B, 0, N, M]``)."""
        batch, num_queries = x.shape[:2]
        weights = x.new_zeros(batch, 0, num_queries, num_keys) if need_weights else None
        return x.new_zeros(batch, num_queries, self.dim), weights

    def _gates(self, head_gates: torch.Tensor, batch: int) -> torch.Tensor:
        """``head_gates`` ``[H]`` or ``[B, H]`` as ``[1 or B, H, 1, 1]``."""
        if head_gates.dim() not in (1, 2) or head_gates.shape[-1] != self.num_heads or (
            head_gates.dim() == 2 and head_gates.shape[0] not in (1, batch)
        ):
            raise ValueError(
                f"head_gates must have shape [H] or [B, H] with H = {self.num_heads}, B = {batch}; "
                f"got {tuple(head_gates.shape)}."
            )
        return head_gates.reshape(-1, self.num_heads, 1, 1)

    @torch.no_grad()
    def prune_heads(self, heads: Iterable[int]) -> None:
        """Remove ``heads`` (indices into the current heads) for good.

        The qkv rows and ``W_o`` columns of those heads are sliced away, so parameters and FLOPs
        shrink; the output equals that of the unpruned module with those heads gated to 0 as long
        as one head remains. Removing every head removes the branch: the output is zero, whereas
        gating every head still adds ``W_o``'s bias.
        """
        if has_lora(self):
            raise LoraError("prune the heads of a model without LoRA adapters: merge them first (vitkit.layers.merge_lora).")
        drop = sorted(set(int(h) for h in heads))
        if any(h < 0 or h >= self.num_heads for h in drop):
            raise ValueError(f"head indices must lie in [0, {self.num_heads}), got {drop}.")
        keep = [h for h in range(self.num_heads) if h not in drop]
        device = self.qkv.weight.device
        index = torch.tensor(keep, dtype=torch.long, device=device)
        d, width = self.head_dim, self.dim

        qkv_w = self.qkv.weight.view(3, self.num_heads, d, width).index_select(1, index)
        factory = {"device": device, "dtype": self.qkv.weight.dtype}
        new_qkv = _linear(width, 3 * len(keep) * d, bias=self.qkv.bias is not None, **factory)
        new_proj = _linear(len(keep) * d, width, **factory)
        new_qkv.weight.copy_(qkv_w.reshape(-1, width))
        if self.qkv.bias is not None:
            new_qkv.bias.copy_(self.qkv.bias.view(3, self.num_heads, d).index_select(1, index).reshape(-1))
        proj_w = self.proj.weight.view(width, self.num_heads, d).index_select(1, index)
        new_proj.weight.copy_(proj_w.reshape(width, -1))
        new_proj.bias.copy_(self.proj.bias)
        self.qkv, self.proj, self.num_heads = new_qkv, new_proj, len(keep)
        if self.temperature is not None:
            self.temperature = nn.Parameter(self.temperature.index_select(0, index))
        if self.rope is not None:
            self.rope.select_heads(index)


@register_attention("self_attention")
class MultiHeadSelfAttention(AttentionBase):
    """Multi-head self-attention over token sequences, a ViT block's attention.

    Construction as :class:`AttentionBase`. Beyond timm's ``Attention`` it returns the attention
    weights on request, and the keys token merging matches on (ToMe), takes a boolean mask or an
    additive bias (``attn_bias``), gates heads (ablations, head importance), prunes heads
    physically, and rotates queries and keys by 2-D RoPE from the tokens' positions.
    """

    @overload
    def forward(
        self, x: torch.Tensor, *, attn_bias: torch.Tensor | None = ..., positions: TokenPositions | None = ...,
        head_gates: torch.Tensor | None = ..., need_weights: Literal[False] = ..., need_keys: Literal[False] = ...,
    ) -> torch.Tensor: ...

    @overload
    def forward(
        self, x: torch.Tensor, *, attn_bias: torch.Tensor | None = ..., positions: TokenPositions | None = ...,
        head_gates: torch.Tensor | None = ..., need_weights: Literal[True], need_keys: Literal[False] = ...,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def forward(
        self, x: torch.Tensor, *, attn_bias: torch.Tensor | None = ..., positions: TokenPositions | None = ...,
        head_gates: torch.Tensor | None = ..., need_weights: bool = ..., need_keys: Literal[True],
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]: ...

    def forward(
        self,
        x: torch.Tensor,
        *,
        attn_bias: torch.Tensor | None = None,
        positions: TokenPositions | None = None,
        head_gates: torch.Tensor | None = None,
        need_weights: bool = False,
        need_keys: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Attend from every token of ``x`` to every token of ``x``.

        Args:
            x: tokens ``[B, N, D]``.
            attn_bias: boolean mask (True = may attend) or additive float bias, broadcastable to
                ``[B, H, N, N]`` (:mod:`.attention_masks`: :func:`~.attention_masks.padding_mask`,
                :func:`~.attention_masks.causal_mask`).
            positions: the tokens' positions (:class:`~vitkit.layers.TokenPositions`), by which RoPE
                rotates queries and keys; ignored without RoPE.
            head_gates: ``[H]`` or ``[B, H]`` multiplying each head's output before ``W_o``.
            need_weights: also return the post-softmax weights (the explicit kernel runs).
            need_keys: also return the keys token merging matches tokens on (ToMe's
                ``ToMeAttention``): each token's keys after the key norm and before RoPE, averaged
                over the heads, ``[B, N, d]``; with every head pruned, the tokens ``x`` themselves.

        Returns:
            ``[B, N, D]``; with ``need_weights`` the pair (output, weights ``[B, H, N, N]``, before
            attention dropout, part of the autograd graph); with ``need_keys`` the triple (output,
            weights or ``None``, keys).
        """
        self.check_tokens(x)
        keys = x  # every head pruned: the tokens are their own keys
        if self.num_heads == 0:
            out, weights = self.no_heads(x, x.shape[1], need_weights)
        else:
            q, k, v = self.project_qkv(x)
            q, k = self.q_norm(q), self.k_norm(k)
            if need_keys:
                keys = k.mean(dim=1)
            q, k = self.rotate([q, k], positions)
            if self.locality:  # LSA: no token attends to itself
                attn_bias = without_diagonal(attn_bias, x.shape[1], x.device)
            out, weights = self.attend(q, k, v, attn_bias, head_gates, need_weights)
        if need_keys:
            return out, weights, keys
        return (out, weights) if need_weights else out  # type: ignore[return-value]
