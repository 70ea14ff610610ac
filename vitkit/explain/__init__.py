"""Explaining ViT predictions: attention rollout, gradient rollout, Chefer et al. relevance,
per-head maps, head diagnostics and localisation scores.

Pure functions work on captured ``[B, H, N, N]`` attention tensors (:mod:`.rollout`,
:mod:`.head_stats`, :mod:`.localization`); :mod:`.maps` runs a model to capture them and returns
maps at image resolution; :mod:`.render` draws figures.
"""

from .head_stats import HeadStats, HeadThresholds, attention_statistics, head_warnings, model_head_stats
from .localization import LocalizationScores, evaluate_localization, localization_scores
from .maps import (
    GRADIENT_METHODS,
    METHODS,
    AttentionCapture,
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
    "AttentionCapture",
    "HeadStats",
    "HeadThresholds",
    "LocalizationScores",
    "attention_rollout",
    "attention_statistics",
    "capture_attention",
    "chefer_relevance",
    "evaluate_localization",
    "explain",
    "grad_rollout",
    "head_warnings",
    "localization_scores",
    "maps_from_capture",
    "model_head_stats",
    "per_head_maps",
    "read_out",
    "to_image_grid",
]
