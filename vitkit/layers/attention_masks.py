"""Turn the user-facing mask arguments of attention into one boolean "allowed" mask.

Conventions: ``attn_mask`` True = may attend, as in
:func:`torch.nn.functional.scaled_dot_product_attention`; ``key_padding_mask`` True = padding (may
not be attended), as in :class:`torch.nn.MultiheadAttention`. ``is_causal`` differs from SDPA's
when there are more keys than queries: here the mask is aligned bottom-right (the last query sees
every key, right for decoding with a KV cache), while SDPA's ``is_causal`` is aligned top-left
(query ``i`` sees keys ``0..i``). With as many keys as queries the two agree.
"""

from __future__ import annotations

import torch


def _check_broadcast(mask: torch.Tensor, target: tuple[int, ...], name: str) -> None:
    try:
        shape = torch.broadcast_shapes(tuple(mask.shape), target)
    except RuntimeError:
        shape = None
    if shape != target:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to the attention shape "
            f"[B, H, N, M] = {list(target)}; give a boolean mask of shape [N, M], [B, 1, N, M] "
            "or [B, H, N, M] (True = may attend)."
        )


def causal_mask(num_queries: int, num_keys: int, device: torch.device) -> torch.Tensor:
    """Boolean ``[N, M]`` mask where query ``i`` sees keys ``j <= i + (M - N)``.

    With ``M == N`` this is the usual lower-triangular mask; with ``M > N`` the queries are the
    last ``N`` positions of the sequence (incremental decoding with a KV cache).
    """
    offset = num_keys - num_queries
    rows = torch.arange(num_queries, device=device).unsqueeze(1)
    cols = torch.arange(num_keys, device=device).unsqueeze(0)
    return cols <= rows + offset


def build_allowed_mask(
    shape: tuple[int, int, int, int],
    device: torch.device,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor | None:
    """Combine the mask arguments into one boolean mask broadcastable to ``shape``.

    Args:
        shape: the attention shape ``(B, H, N, M)``.
        attn_mask: boolean, broadcastable to ``[B, H, N, M]``, True = may attend.
        key_padding_mask: boolean ``[B, M]``, True = padding.
        is_causal: add the causal constraint of :func:`causal_mask`.

    Returns:
        ``None`` when nothing is masked, else a boolean tensor broadcastable to ``shape``.
    """
    batch, _, num_queries, num_keys = shape
    allowed = None
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool:
            raise ValueError(
                f"attn_mask must be boolean (True = may attend), got dtype {attn_mask.dtype}; "
                "convert an additive float mask with `mask == 0`."
            )
        _check_broadcast(attn_mask, shape, "attn_mask")
        allowed = attn_mask.to(device)
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (batch, num_keys):
            raise ValueError(
                f"key_padding_mask must be a boolean tensor of shape [B, M] = [{batch}, {num_keys}] "
                f"(True = padding), got {key_padding_mask.dtype} of shape {tuple(key_padding_mask.shape)}."
            )
        keep = ~key_padding_mask.to(device)[:, None, None, :]
        allowed = keep if allowed is None else allowed & keep
    if is_causal:
        causal = causal_mask(num_queries, num_keys, device)
        allowed = causal if allowed is None else allowed & causal
    return allowed


def split_empty_rows(allowed: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Make every query row attend to something, and remember which rows had no allowed key.

    A row with no allowed key gives NaN in a softmax over ``-inf``; such rows are opened to all
    keys (so neither kernel sees an empty row, forward or backward) and their output is zeroed
    afterwards with the returned ``row_has_key`` mask.

    Returns:
        ``(safe_allowed, row_has_key)``: ``row_has_key`` (``[..., N, 1]`` boolean) is ``None``
        when every row already has a key.
    """
    if allowed is None:
        return None, None
    row_has_key = allowed.any(dim=-1, keepdim=True)
    if bool(row_has_key.all()):
        return allowed, None
    return allowed | ~row_has_key, row_has_key
