"""Attention kernels and how one is chosen: the two exact kernels (:mod:`.attention`) and the
synthetic measurement behind ``attn_impl="auto"`` (:mod:`.autotune`); the MLP's projection and
GELU fused for CPU inference (:mod:`.linear_gelu`).

The floor below the layers: it imports nothing of vitkit but :mod:`vitkit.errors`,
:mod:`vitkit.timing` and :mod:`vitkit.files`.
"""

from .attention import (
    ATTN_IMPLS,
    AUTOTUNER,
    IMPL_ENV,
    KERNELS,
    AttnImpl,
    autotune_report,
    choose_attn_impl,
    explicit_attention,
    format_autotune_report,
    resolve_attn_impl,
    sdpa_attention,
    set_autotune_cache,
)
from .autotune import CACHE_ENV, AutotuneChoice, AutotuneKey, Autotuner, bucket, cpu_model, device_name

__all__ = [
    "ATTN_IMPLS",
    "AUTOTUNER",
    "CACHE_ENV",
    "IMPL_ENV",
    "KERNELS",
    "AttnImpl",
    "AutotuneChoice",
    "AutotuneKey",
    "Autotuner",
    "autotune_report",
    "bucket",
    "choose_attn_impl",
    "cpu_model",
    "device_name",
    "explicit_attention",
    "format_autotune_report",
    "resolve_attn_impl",
    "sdpa_attention",
    "set_autotune_cache",
]
