"""Multi-head self-attention (Vaswani et al. 2017, https://arxiv.org/abs/1706.03762).

``MultiHeadSelfAttention`` computes ``softmax(Q K^T / sqrt(d_k)) V`` per head from one fused qkv
projection, merges the heads and applies the output projection ``W_o``. Beyond timm's
``Attention`` it returns the attention weights on request, takes padding / causal / arbitrary
boolean masks (a query with no allowed key gives zeros, never NaN), attends to a ``context``
(cross-attention), gates heads (ablations, head importance), prunes heads physically and
decodes incrementally with a :class:`KVCache` and rotates queries and keys by 2-D RoPE
(:mod:`.rope`) before either kernel runs.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange
from torch import nn

from ..kernels import ATTN_IMPLS, AttnImpl, choose_attn_impl, explicit_attention, resolve_attn_impl, sdpa_attention
from .attention_masks import build_allowed_mask, split_empty_rows
from .init_rules import xavier_per_projection, xavier_scaled
from .lora import LoraError, has_lora, linear_rows
from .rope import ROPE_KINDS, Rope2d, RopeAxes, RopeKind, rotate_tokens

#: W_o's Xavier-init scale for a standalone module, whose depth is unknown (see ``out_init_scale``).
DEFAULT_OUT_INIT_SCALE = 0.5


def _linear(in_features: int, out_features: int, bias: bool = True, **factory: object) -> nn.Linear:
    """``nn.Linear`` that may be zero-sized (every head pruned) without torch's init warning;
    ``factory`` holds torch's ``device`` / ``dtype`` keywords."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
        return nn.Linear(in_features, out_features, bias=bias, **factory)


def _without_diagonal(attn_mask: torch.Tensor | None, num_tokens: int, device: torch.device) -> torch.Tensor:
    """``attn_mask`` (True = may attend) with every token's attention to itself removed."""
    off_diagonal = ~torch.eye(num_tokens, dtype=torch.bool, device=device)
    return off_diagonal if attn_mask is None else attn_mask & off_diagonal


@dataclass
class KVCache:
    """Keys and values of the positions decoded so far, each ``[B, H, T, d]``.

    Pass the same cache to successive calls of a causal ``MultiHeadSelfAttention``; each call
    appends its own keys and values and attends to everything cached. With RoPE the keys are
    stored rotated (each by its own position), so earlier positions are never needed again.
    """

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k, v`` ``[B, H, n, d]`` and return all keys and values ``[B, H, T + n, d]``."""
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v


@dataclass(frozen=True)
class AttentionOptions:
    """How a :class:`MultiHeadSelfAttention` attends: every option but its size (``dim``, ``num_heads``).

    Adding an attention option takes one field here and its use in ``MultiHeadSelfAttention``;
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
            :mod:`vitkit.kernels`), ``"sdpa"`` or ``"explicit"``. Resolved once, here, into
            :attr:`kernel_policy` (``VITKIT_ATTN_IMPL`` pins ``"auto"``); a training run sets
            that attribute of ``"auto"`` modules step by step.
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
            (learnable frequencies per head). The forward then takes ``positions``.
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


class MultiHeadSelfAttention(nn.Module):
    """Multi-head (self- or cross-) attention over token sequences.

    Args:
        dim: token width ``D`` of the input (and of the output).
        num_heads: number of heads ``H``; ``dim`` must be divisible by it unless
            ``options.head_dim`` is given.
        options: how the heads attend (:class:`AttentionOptions`); default all defaults.
        device, dtype: where and in which dtype the parameters are created (as torch's layers).
        **changes: :class:`AttentionOptions` fields overriding ``options``
            (``MultiHeadSelfAttention(64, 4, qk_norm=True)``).
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
        self.attn_impl = options.attn_impl
        self.kernel_policy: AttnImpl = resolve_attn_impl(options.attn_impl)
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

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # Model files from before the per-head temperature hold one per-layer scalar in log space;
        # ``exp(log_scale)`` on every head is the same function, so they load exactly.
        old = state_dict.pop(prefix + "log_scale", None)
        if old is not None and self.temperature is not None and prefix + "temperature" not in state_dict:
            state_dict[prefix + "temperature"] = old.exp().expand(self.num_heads).clone()
        elif old is not None:
            state_dict[prefix + "log_scale"] = old  # no LSA here: strict loading reports the key
        super()._load_from_state_dict(state_dict, prefix, *args)

    def extra_repr(self) -> str:
        locality = ", locality=True" if self.locality else ""
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, attn_impl={self.attn_impl!r}{locality}"

    def _rotate(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor | None, context_positions: torch.Tensor | None,
        cross: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q`` rotated by ``positions`` and ``k`` by ``context_positions`` (cross-attention) or
        ``positions``; unchanged without RoPE."""
        if self.rope is None:
            if positions is not None or context_positions is not None:
                raise ValueError("positions were given, but this attention has no RoPE (rope='none').")
            return q, k
        key_positions = context_positions if cross else positions
        if positions is None or key_positions is None:
            needed = "positions and context_positions" if cross else "positions"
            raise ValueError(f"rope={self.rope.kind!r} rotates queries and keys by position: pass {needed} [n, 2].")
        return rotate_tokens(q, self.rope(positions)), rotate_tokens(k, self.rope(key_positions))

    def _project(self, x: torch.Tensor, context: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """Queries from ``x``, keys and values from ``context`` (or ``x``); each ``[B, H, n, d]``."""
        if context is None:
            qkv = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
            return tuple(qkv.unbind(0))
        inner = self.num_heads * self.head_dim
        q = linear_rows(self.qkv, x, slice(None, inner))  # a LoRA adapter's update (and dropout) included
        kv = linear_rows(self.qkv, context, slice(inner, None))
        q = rearrange(q, "b n (h d) -> b h n d", h=self.num_heads)
        k, v = rearrange(kv, "b m (two h d) -> two b h m d", two=2, h=self.num_heads).unbind(0)
        return q, k, v

    def _check_input(self, x: torch.Tensor, name: str) -> None:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{name} must have shape [B, N, D] with D = {self.dim}, got {tuple(x.shape)}; "
                "flatten images to token sequences first (e.g. with PatchEmbed)."
            )

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        head_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        context_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, N, D] -> [B, N, D]``: attend from ``x`` to ``context`` (default ``x`` itself);
        the arguments are :meth:`forward_with_attention`'s."""
        rope = (positions, context_positions)
        return self._attend(x, context, attn_mask, key_padding_mask, is_causal, head_mask, kv_cache, rope, False)[0]

    def forward_with_attention(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        head_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        context_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``x`` to ``context`` (default: to ``x`` itself).

        Args:
            x: queries' tokens ``[B, N, D]``.
            context: keys' and values' tokens ``[B, M, D]`` (cross-attention); default ``x``.
            attn_mask: boolean, broadcastable to ``[B, H, N, M]``; True = may attend.
            key_padding_mask: boolean ``[B, M]``; True = padding.
            is_causal: query ``i`` attends to keys up to its own position.
            head_mask: gates ``[H]`` or ``[B, H]`` multiplying each head's output before ``W_o``.
            kv_cache: self-attention only; this call's keys and values are appended to it and
                the queries attend to all cached positions.
            positions: with RoPE, the ``(x, y)`` positions ``[n, 2]`` (or ``[B, n, 2]``) of the
                last ``n`` tokens of ``x``, which are rotated; the ``N - n`` tokens before them
                (class token, registers) are not. Self-attention rotates the keys alike.
            context_positions: with RoPE and ``context``, the positions of the last tokens of
                ``context``, by which the keys are rotated.

        Returns:
            The output ``[B, N, D]`` and the post-softmax weights ``[B, H, N, M]`` (before
            attention dropout, part of the autograd graph). A query with no allowed key gets
            zero output and zero weights.
        """
        rope = (positions, context_positions)
        out, weights = self._attend(x, context, attn_mask, key_padding_mask, is_causal, head_mask, kv_cache, rope, True)
        assert weights is not None  # asked for: the explicit kernel ran
        return out, weights

    def _attend(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool,
        head_mask: torch.Tensor | None,
        kv_cache: KVCache | None,
        rope: tuple[torch.Tensor | None, torch.Tensor | None],
        return_attention: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output and, when ``return_attention``, the weights (else ``None``)."""
        self._check_input(x, "x")
        if context is not None:
            self._check_input(context, "context")
            if kv_cache is not None:
                raise ValueError("kv_cache is for self-attention decoding; it cannot be combined with context.")
        batch, num_queries = x.shape[:2]
        if self.num_heads == 0:  # every head pruned: the branch contributes nothing
            num_keys = (x if context is None else context).shape[1] + (len(kv_cache) if kv_cache else 0)
            weights = x.new_zeros(batch, 0, num_queries, num_keys) if return_attention else None
            return x.new_zeros(batch, num_queries, self.dim), weights

        q, k, v = self._project(x, context)
        q, k = self.q_norm(q), self.k_norm(k)
        q, k = self._rotate(q, k, *rope, cross=context is not None)  # before caching: the cache holds rotated keys
        if kv_cache is not None:
            k, v = kv_cache.extend(k, v)
        shape = (batch, self.num_heads, num_queries, k.shape[-2])
        scale: float = self.scale
        if self.temperature is not None:
            # Each head's temperature multiplies its queries, so both kernels take it unchanged.
            q, scale = q * self.temperature.to(q.dtype).view(-1, 1, 1), 1.0
            if context is None and kv_cache is None:
                attn_mask = _without_diagonal(attn_mask, num_queries, x.device)
        allowed, row_has_key = split_empty_rows(
            build_allowed_mask(shape, x.device, attn_mask, key_padding_mask, is_causal)
        )
        dropout_p = self.attn_drop if self.training else 0.0
        impl = choose_attn_impl(
            self.kernel_policy, q, return_attention, k=k, masked=allowed is not None, dropout_p=dropout_p, scale=scale
        )
        weights = None
        if impl == "sdpa":
            out = sdpa_attention(q, k, v, allowed, dropout_p, scale)
        else:
            out, weights = explicit_attention(q, k, v, allowed, dropout_p, scale)
        if row_has_key is not None:
            out = out * row_has_key
            weights = None if weights is None else weights * row_has_key
        if head_mask is not None:
            out = out * self._gates(head_mask, batch).to(out.dtype)
        return self.proj_drop(self.proj(rearrange(out, "b h n d -> b n (h d)"))), weights

    def _gates(self, head_mask: torch.Tensor, batch: int) -> torch.Tensor:
        """``head_mask`` ``[H]`` or ``[B, H]`` as ``[1 or B, H, 1, 1]``."""
        if head_mask.dim() not in (1, 2) or head_mask.shape[-1] != self.num_heads or (
            head_mask.dim() == 2 and head_mask.shape[0] not in (1, batch)
        ):
            raise ValueError(
                f"head_mask must have shape [H] or [B, H] with H = {self.num_heads}, B = {batch}; "
                f"got {tuple(head_mask.shape)}."
            )
        return head_mask.reshape(-1, self.num_heads, 1, 1)

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
