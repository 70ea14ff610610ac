"""A quick redundancy test: halve every layer's heads, see if accuracy holds.

If accuracy holds with half the heads, the model is redundant and can be compressed. Here the
least important half of each layer (by :func:`head_importance`, so the choice is per layer and
no layer loses all its heads) is pruned and the accuracy compared with the full model's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..evaluation import Batch
from ..models import VisionTransformer
from .importance import head_importance
from .iterative import least_scored
from .measure import evaluate_accuracy
from .pruning import full_gates, gated_off, pruned_copy


@dataclass
class RedundancyResult:
    """Accuracy (percent) before and after pruning a fraction of every layer's heads."""

    accuracy_full: float
    accuracy_pruned: float
    heads_before: int
    heads_after: int
    pruned: dict[int, list[int]]

    @property
    def change(self) -> float:
        """Accuracy change in percentage points (negative = worse)."""
        return self.accuracy_pruned - self.accuracy_full


def redundancy_test(
    model: VisionTransformer,
    dataloader: Iterable[Batch],
    *,
    eval_loader: Iterable[Batch],
    fraction: float = 0.5,
    max_batches: int | None = None,
) -> RedundancyResult:
    """Prune the least important ``floor(fraction * H_l)`` heads of every layer and re-evaluate.

    Args:
        model: trained model (not modified).
        dataloader: data for the importance scores (training images without augmentation).
        eval_loader: held-out data for the accuracies; never defaulted to ``dataloader``.
        fraction: share of each layer's heads to remove, in ``[0, 1]``.
        max_batches: cap on the batches of each pass.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must lie in [0, 1], got {fraction}.")
    scores = head_importance(model, dataloader, max_batches=max_batches)
    gates = full_gates(model)
    for layer, layer_gates in enumerate(gates):
        only_this_layer = [g if i == layer else g * 0 for i, g in enumerate(gates)]
        for _, head in least_scored(scores, only_this_layer, int(fraction * len(layer_gates))):
            layer_gates[head] = 0.0
    pruned = pruned_copy(model, gates)
    return RedundancyResult(
        accuracy_full=evaluate_accuracy(model, eval_loader, max_batches=max_batches),
        accuracy_pruned=evaluate_accuracy(pruned, eval_loader, max_batches=max_batches),
        heads_before=sum(model.heads_per_layer()),
        heads_after=sum(pruned.heads_per_layer()),
        pruned=gated_off(gates),
    )
