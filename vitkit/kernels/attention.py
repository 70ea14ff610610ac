"""Attention kernels and the policy that picks one per call.

Two exact implementations of ``softmax(q k^T / sqrt(d)) v`` are available:

* ``"sdpa"``: :func:`torch.nn.functional.scaled_dot_product_attention` (flash / memory-efficient
  kernels). Never materialises the weights.
* ``"explicit"``: matmul, masked softmax, matmul. Materialises the ``[B, H, N, M]`` weights, which
  it can return (attention maps, rollout) and to which attention dropout is applied.

A module resolves its policy once, when it is built (:func:`resolve_attn_impl`): ``"sdpa"`` and
``"explicit"`` pin a kernel, and so does ``VITKIT_ATTN_IMPL=sdpa|explicit`` for every ``"auto"``
module built while it is set. ``"auto"`` asks the synthetic measurement (:mod:`.autotune`): the
first call of each shape bucket, dtype and mode times both and keeps the faster. A training run
sets the policy of its ``"auto"`` modules step by step from timings of its own steps instead
(:mod:`vitkit.train.kernel_trial`). Requesting the weights always runs the explicit kernel. While
``torch.compile`` or ``torch.jit.trace`` records a graph, ``"auto"`` is SDPA: nothing is measured
inside a graph.
"""

from __future__ import annotations

import os
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode  # private, but no public twin

from ..errors import VitkitError
from .autotune import AutotuneKey, Autotuner

AttnImpl = Literal["auto", "sdpa", "explicit"]
ATTN_IMPLS: tuple[str, ...] = get_args(AttnImpl)
#: Environment variable that pins the kernel of every ``attn_impl="auto"`` module built while it is set.
IMPL_ENV = "VITKIT_ATTN_IMPL"


def resolve_attn_impl(impl: AttnImpl) -> AttnImpl:
    """A module's kernel policy, decided once at construction: ``impl`` itself, except that
    ``"auto"`` follows ``VITKIT_ATTN_IMPL`` when it is set.

    Raises:
        ValueError: ``impl`` is not one of :data:`ATTN_IMPLS`.
        VitkitError: ``VITKIT_ATTN_IMPL`` holds something other than a kernel's name.
    """
    if impl not in ATTN_IMPLS:
        raise ValueError(f"attn_impl must be one of {ATTN_IMPLS}, got {impl!r}.")
    return _impl_from_env() if impl == "auto" else impl


def choose_attn_impl(
    policy: AttnImpl,
    q: torch.Tensor,
    need_weights: bool,
    *,
    k: torch.Tensor | None = None,
    masked: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> str:
    """Resolve a module's ``policy`` to ``"sdpa"`` or ``"explicit"`` for this call.

    Args:
        policy: the module's kernel policy (:func:`resolve_attn_impl`); ``"auto"``: the
            autotuner's measured choice for this call's key.
        q: queries ``[B, H, N, d]``.
        need_weights: the caller wants the post-softmax weights, which only "explicit" produces.
        k: keys ``[B, H, M, d]`` (default: self-attention, shaped like ``q``).
        masked: the call passes a mask or bias; dropout_p: its attention dropout; scale: its
            softmax scale (default ``d ** -0.5``). These shape the measurement.
    """
    if need_weights:
        return "explicit"
    if policy != "auto":
        return policy
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return "sdpa"
    k = q if k is None else k
    if not _measurable(q):
        return AUTOTUNER.cached(AutotuneKey.of(q, k, masked, dropout_p)) or "sdpa"
    return AUTOTUNER.choose(q, k, masked, dropout_p, q.shape[-1] ** -0.5 if scale is None else scale)


def autotune_report() -> list[dict[str, Any]]:
    """The kernel chosen for each key so far in this process, with the measurement behind it:
    one row per key (device, dtype, training, head_dim, bucketed queries / keys / batch x heads,
    masked, dropout; kernel, sdpa_ms and explicit_ms = best milliseconds per call, speedup = SDPA
    time / explicit time, cost_ms of the measurement, measured shape ``[BH, N, M, d]``, source =
    "measured" or "cache"). ``train`` writes it to ``summary.json`` as ``attention_kernels``."""
    return AUTOTUNER.report()


def format_autotune_report(rows: list[dict[str, Any]]) -> str:
    """``rows`` of :func:`autotune_report` as a Markdown table (device and dtype included)."""
    lines = [
        "| device | dtype | mode | d | N | M | BH | mask | dropout | kernel | sdpa ms | explicit ms | sdpa/explicit | cost ms | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        mode = "train" if row["training"] else "infer"
        lines.append(
            f"| {row['device']} | {row['dtype']} | {mode} | {row['head_dim']} | {row['queries']} | {row['keys']} "
            f"| {row['batch_heads']} | {row['masked']} | {row['dropout']} | {row['kernel']} | {row['sdpa_ms']:.3f} "
            f"| {row['explicit_ms']:.3f} | {row['speedup']:.2f} | {row['cost_ms']:.0f} | {row['source']} |"
        )
    return "\n".join(lines)


def set_autotune_cache(path: str | os.PathLike | None) -> None:
    """Keep measured choices in the JSON file ``path`` across processes (``None``: in memory
    only); overrides ``VITKIT_AUTOTUNE_CACHE``. Entries are keyed by CPU/GPU model and torch version."""
    AUTOTUNER.set_cache_path(path)


def _impl_from_env() -> str:
    value = os.environ.get(IMPL_ENV, "auto") or "auto"
    if value not in ATTN_IMPLS:
        raise VitkitError(
            f"environment variable {IMPL_ENV}={value!r} is not an attention kernel; use one of "
            f"{', '.join(ATTN_IMPLS)}, or unset it to let vitkit measure."
        )
    return value


def _measurable(q: torch.Tensor) -> bool:
    """A plain tensor on a device that can be timed, outside any dispatch mode (FLOP counting,
    fake tensors): a measurement there would be meaningless or would be recorded."""
    return (
        type(q) is torch.Tensor
        and _get_current_dispatch_mode() is None
        and hasattr(getattr(torch, q.device.type, None), "synchronize")
    )


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    dropout_p: float,
    scale: float,
) -> torch.Tensor:
    """Fused attention. ``allowed`` is a boolean mask (True = may attend) or an additive float bias,
    broadcastable to ``[B, H, N, M]``, in which every query row has at least one allowed (finite)
    key. Returns ``[B, H, N, d]``."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, scale=scale)


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    dropout_p: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialised attention with the same contract as :func:`sdpa_attention`.

    Returns:
        ``(out [B, H, N, d], weights [B, H, N, M])``; ``weights`` are post-softmax and taken
        before dropout, which is applied to the copy that multiplies ``v``.
    """
    scores = (q * scale) @ k.transpose(-2, -1)
    if allowed is not None and allowed.dtype == torch.bool:
        scores = scores.masked_fill(~allowed, float("-inf"))
    elif allowed is not None:
        scores = scores + allowed
    weights = scores.softmax(dim=-1)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    return dropped @ v, weights


#: The kernels ``"auto"`` chooses between, and the process-wide autotuner over them.
KERNELS = {"sdpa": sdpa_attention, "explicit": explicit_attention}
AUTOTUNER = Autotuner(KERNELS)
