"""Attention-head importance, gating and physical pruning (Michel et al. 2019,
https://arxiv.org/abs/1905.10650).

``head_importance`` scores heads, ``prune_heads`` removes them for good (saved and reloaded by
``vitkit.save_model`` / ``load_model``), ``iterative_pruning`` traces accuracy, parameters,
FLOPs and speed as heads go, ``recover_steps`` fine-tunes pruned models through a caller's
``recover`` (such as ``RecipeRecovery``, a training recipe run from the pruned weights) and
measures them before and after, ``recover_model`` fine-tunes one pruned model with a recipe, and ``redundancy_test`` is the quick "halve the
heads" check. ``prepare_pruning(model_file, out, PruneOptions(...)).run(out)`` is the whole run of
``vitkit prune``: scored, traced, chosen, saved and (optionally) recovered.
"""

from .importance import attention_entropy, head_importance
from .iterative import (
    PruningStep,
    Scorer,
    entropy_scorer,
    importance_scorer,
    iterative_pruning,
    least_scored,
    one_shot_pruning,
    random_scorer,
    within_budget,
)
from .measure import evaluate_accuracy, time_forward
from .model_file import PRUNE_ORDERS, PruneOptions, PruneResult, PruningJob, prepare_pruning
from .pruning import Gates, full_gates, gated_off, prune_heads, pruned_copy
from .recovery import RecipeRecovery, Recover, RecoveredStep, pruning_record, recover_model, recover_steps
from .redundancy import RedundancyResult, redundancy_test

__all__ = [
    "PRUNE_ORDERS",
    "Gates",
    "PruneOptions",
    "PruneResult",
    "PruningJob",
    "PruningStep",
    "RecipeRecovery",
    "Recover",
    "RecoveredStep",
    "RedundancyResult",
    "Scorer",
    "attention_entropy",
    "entropy_scorer",
    "evaluate_accuracy",
    "full_gates",
    "gated_off",
    "head_importance",
    "importance_scorer",
    "iterative_pruning",
    "one_shot_pruning",
    "prepare_pruning",
    "least_scored",
    "prune_heads",
    "pruned_copy",
    "pruning_record",
    "random_scorer",
    "recover_model",
    "recover_steps",
    "redundancy_test",
    "time_forward",
    "within_budget",
]
