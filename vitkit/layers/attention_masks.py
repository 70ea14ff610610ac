"""The one mask contract of vitkit's attention layers: ``attn_bias``.

``attn_bias`` is either a **boolean mask** (True = may attend, as in
:func:`torch.nn.functional.scaled_dot_product_attention`) or an **additive float bias** added to
the scaled scores before the softmax (``-inf`` forbids a key; token merging's log-size term,
ALiBi-like distance biases), broadcastable to ``[B, H, N, M]``: ``[N, M]``, ``[B, 1, N, M]`` or
``[B, H, N, M]``. A query with no allowed key gets zero output and zero weights, never NaN.

Helpers build the usual masks: :func:`padding_mask` from a key-padding mask (True = padding, as
:class:`torch.nn.MultiheadAttention`), :func:`causal_mask`; combine boolean masks with ``&`` and a
boolean mask with a bias by ``bias.masked_fill(~mask, float("-inf"))``. :func:`causal_mask` is
aligned bottom-right when there are more keys than queries (the last query sees every key, right
for decoding with a KV cache), while SDPA's ``is_causal`` is aligned top-left.
"""

from __future__ import annotations

import torch


def _check_broadcast(mask: torch.Tensor, target: tuple[int, ...], name: str) -> None:
    # Compared in Python, not by torch.broadcast_shapes (a Python reference implementation that took
    # 7% of a merged model's batch-1 forward under cProfile, once per block).
    shape = mask.shape
    fits = len(shape) <= len(target) and all(size in (1, full) for size, full in zip(reversed(shape), reversed(target)))
    if not fits:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to the attention shape "
            f"[B, H, N, M] = {list(target)}; give a boolean mask (True = may attend) or a float bias "
            "of shape [N, M], [B, 1, N, M] or [B, H, N, M]."
        )


def causal_mask(num_queries: int, num_keys: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``[N, M]`` mask where query ``i`` sees keys ``j <= i + (M - N)``.

    With ``M == N`` this is the usual lower-triangular mask; with ``M > N`` the queries are the
    last ``N`` positions of the sequence (incremental decoding with a KV cache).
    """
    offset = num_keys - num_queries
    rows = torch.arange(num_queries, device=device).unsqueeze(1)
    cols = torch.arange(num_keys, device=device).unsqueeze(0)
    return cols <= rows + offset


def padding_mask(key_padding: torch.Tensor) -> torch.Tensor:
    """A key-padding mask ``[B, M]`` (True = padding) as an ``attn_bias`` ``[B, 1, 1, M]``
    (True = may attend)."""
    if key_padding.dtype != torch.bool or key_padding.dim() != 2:
        raise ValueError(
            f"key_padding must be a boolean tensor [B, M] (True = padding), got {key_padding.dtype} "
            f"of shape {tuple(key_padding.shape)}."
        )
    return ~key_padding[:, None, None, :]


def without_diagonal(
    attn_bias: torch.Tensor | None, num_tokens: int, device: torch.device, num_keys: int | None = None
) -> torch.Tensor:
    """``attn_bias`` with every token's attention to itself forbidden (Locality Self-Attention).

    With ``num_keys`` keys for ``num_tokens`` queries (a KV cache: the queries are the last
    positions), query ``i``'s own key is key ``i + num_keys - num_tokens``, aligned bottom-right
    as :func:`causal_mask`.
    """
    keys = num_tokens if num_keys is None else num_keys
    rows = torch.arange(num_tokens, device=device).unsqueeze(1)
    diagonal = torch.arange(keys, device=device).unsqueeze(0) == rows + (keys - num_tokens)
    if attn_bias is None:
        return ~diagonal
    if attn_bias.dtype == torch.bool:
        return attn_bias & ~diagonal
    return attn_bias.masked_fill(diagonal, float("-inf"))


def prepare_bias(
    attn_bias: torch.Tensor | None, shape: tuple[int, int, int, int], like: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Check ``attn_bias`` against the attention ``shape`` ``(B, H, N, M)`` and make every query
    row attend to something.

    A row with no allowed key gives NaN in a softmax over ``-inf``; such rows are opened to all
    keys (so neither kernel sees an empty row, forward or backward) and their output is zeroed
    afterwards with the returned ``row_has_key`` mask.

    Args:
        attn_bias: boolean mask or float bias broadcastable to ``shape``, or ``None``.
        shape: ``(B, H, N, M)``.
        like: the queries; a float bias is cast to their dtype and moved to their device.

    Returns:
        ``(bias, row_has_key)``: the mask or bias for the kernels and ``[..., N, 1]`` booleans;
        ``(None, None)`` without ``attn_bias``.
    """
    if attn_bias is None:
        return None, None
    if attn_bias.dtype != torch.bool and not attn_bias.is_floating_point():
        raise ValueError(
            f"attn_bias must be boolean (True = may attend) or a float bias, got dtype {attn_bias.dtype}."
        )
    _check_broadcast(attn_bias, shape, "attn_bias")
    if attn_bias.device != like.device:
        attn_bias = attn_bias.to(like.device)
    # No branch on the data: reading it is a host sync on an accelerator, and no Python branch on the
    # data may run while a graph is recorded (torch.compile, torch.export / ONNX). The empty-row
    # guard is always applied (the same values, one multiply more).
    if attn_bias.dtype == torch.bool:
        row_has_key = attn_bias.any(dim=-1, keepdim=True)
        return attn_bias | ~row_has_key, row_has_key
    # One reduction answers both questions: a row's maximum is NaN or +inf where the row holds one
    # (amax propagates NaN), and -inf where the row forbids every key.
    row_max = attn_bias.amax(dim=-1, keepdim=True)
    check_finite_bias(row_max)
    row_has_key = row_max > float("-inf")
    attn_bias = attn_bias.to(like.dtype)
    return attn_bias.masked_fill(~row_has_key, 0.0), row_has_key


def check_finite_bias(attn_bias: torch.Tensor) -> None:
    """Refuse a float bias holding NaN or +inf, on its device and without a host read
    (``torch._assert_async``): on a CPU the ``RuntimeError`` comes at once, on an accelerator the
    assertion fails in the device's queue and surfaces at the next sync. Skipped while a graph is
    recorded (an exported graph has no assertion op to run it with)."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing():
        return
    finite_or_forbidden = (attn_bias < float("inf")).all()  # NaN and +inf both fail "< +inf"
    torch._assert_async(finite_or_forbidden, "attn_bias holds NaN or +inf; use -inf to forbid a key and finite values otherwise.")
