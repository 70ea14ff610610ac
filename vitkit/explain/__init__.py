"""Explaining ViT predictions: attention rollout, gradient rollout, Chefer et al. relevance,
per-head maps, head diagnostics and localisation scores.

Pure functions work on captured ``[B, H, N, N]`` attention tensors (:mod:`.rollout`,
:mod:`.head_stats`, :mod:`.localization`); :mod:`.maps` runs a model to capture them and returns
maps at image resolution; :mod:`.render` draws figures; :mod:`.explorer` writes one
self-contained HTML page to click through every layer, head and patch.
"""

from .explorer import DEFAULT_MAX_BYTES, ExplorerError, ExplorerHTML, explorer_html, explorer_size
from .head_stats import HeadStats, HeadThresholds, attention_statistics, head_warnings, model_head_stats
from .localization import LocalizationScores, evaluate_localization, localization_scores
from .maps import (
    GRADIENT_METHODS,
    METHODS,
    AttentionCapture,
    HeadlessModelError,
    capture_attention,
    explain,
    maps_from_capture,
    to_image_grid,
)
from .rollout import (
    HEAD_FUSIONS,
    POOLINGS,
    attention_rollout,
    chefer_relevance,
    grad_rollout,
    per_head_maps,
    read_out,
)

__all__ = [
    "GRADIENT_METHODS",
    "HEAD_FUSIONS",
    "METHODS",
    "POOLINGS",
    "DEFAULT_MAX_BYTES",
    "AttentionCapture",
    "ExplorerError",
    "ExplorerHTML",
    "HeadStats",
    "HeadThresholds",
    "HeadlessModelError",
    "LocalizationScores",
    "attention_rollout",
    "attention_statistics",
    "capture_attention",
    "chefer_relevance",
    "evaluate_localization",
    "explain",
    "explorer_html",
    "explorer_size",
    "grad_rollout",
    "head_warnings",
    "localization_scores",
    "maps_from_capture",
    "model_head_stats",
    "per_head_maps",
    "read_out",
    "to_image_grid",
]
