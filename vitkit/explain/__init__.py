"""Explaining ViT predictions: attention rollout, gradient rollout, Chefer et al. relevance,
AttnLRP, per-head maps, head diagnostics, localisation scores and faithfulness tests.

Pure functions work on captured ``[B, H, N, N]`` attention tensors (:mod:`.rollout`,
:mod:`.head_stats`, :mod:`.localization`); :mod:`.maps` runs a model to capture them and returns
maps at image resolution; :mod:`.lrp` propagates relevance; :mod:`.faithfulness` perturbs patches
in a map's order and :mod:`.faithfulness_report` measures methods side by side; :mod:`.render` draws figures; :mod:`.explorer` writes one
self-contained HTML page to click through every layer, head and patch.
"""

from .explorer import DEFAULT_MAX_BYTES, ExplorerError, ExplorerHTML, explorer_html, explorer_size
from .faithfulness import TESTS, PerturbationCurves, perturbation_curves
from .faithfulness_report import FaithfulnessReport, MethodResult, faithfulness
from .gradients import integrated_gradients
from .head_stats import HeadStats, HeadThresholds, attention_statistics, head_warnings, model_head_stats
from .localization import LocalizationScores, evaluate_localization, localization_scores
from .lrp import LRPRules, Relevance, lrp_relevance, lrp_rules
from .lrp_choice import LRP_PRESETS, LRPChoice, choose_lrp_rules
from .map_methods import BUILTIN_METHODS, MapMethod, map_method
from .maps import (
    CLASS_METHODS,
    GRADIENT_METHODS,
    METHODS,
    AttentionCapture,
    HeadlessModelError,
    capture_attention,
    explain,
    image_maps,
    maps_from_capture,
    patch_maps,
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
    "BUILTIN_METHODS",
    "CLASS_METHODS",
    "TESTS",
    "FaithfulnessReport",
    "LRPRules",
    "LRPChoice",
    "LRP_PRESETS",
    "MapMethod",
    "MethodResult",
    "PerturbationCurves",
    "Relevance",
    "faithfulness",
    "integrated_gradients",
    "lrp_relevance",
    "choose_lrp_rules",
    "lrp_rules",
    "map_method",
    "patch_maps",
    "perturbation_curves",
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
    "image_maps",
    "localization_scores",
    "maps_from_capture",
    "model_head_stats",
    "per_head_maps",
    "read_out",
    "to_image_grid",
]
