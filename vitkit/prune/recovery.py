"""Prune, then recover: fine-tune pruned models briefly and measure accuracy before and after.

Michel et al. (2019, https://arxiv.org/abs/1905.10650) and Torch-Pruning's ViT examples prune a
trained model and then win back most of the lost accuracy with a short fine-tune. The fine-tune
itself is the caller's (``vitkit prune`` trains the model's recipe through ``vitkit.train``);
this module only rebuilds each step's pruned model, hands it over and measures the result.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..evaluation import Batch
from ..models import VisionTransformer
from .evaluate import evaluate_accuracy
from .iterative import PruningStep
from .pruning import prune_heads

#: ``recover(pruned model, its step) -> fine-tuned model`` (same head counts, weights trained on).
Recover = Callable[[VisionTransformer, PruningStep], VisionTransformer]


@dataclass
class RecoveredStep:
    """Accuracies of one pruning step's model before and after recovery.

    Attributes:
        step: the step as :func:`~vitkit.prune.iterative_pruning` measured it (before recovery).
        val_acc: validation top-1 (percent), ``(before, after)``.
        test_acc: test top-1 (percent), ``(before, after)``; None without a test loader.
    """

    step: PruningStep
    val_acc: tuple[float, float]
    test_acc: tuple[float, float] | None


def recover_steps(
    model: VisionTransformer,
    steps: Sequence[PruningStep],
    recover: Recover,
    *,
    val_loader: Iterable[Batch],
    test_loader: Iterable[Batch] | None = None,
    max_batches: int | None = None,
) -> list[RecoveredStep]:
    """Recover each of ``steps``' pruned models of ``model`` and measure both.

    Args:
        model: the unpruned model the steps were measured on (not modified).
        steps: steps of :func:`~vitkit.prune.iterative_pruning` on ``model`` with ``val_loader``
            as its ``eval_loader`` and the same ``max_batches``: their ``accuracy`` is the
            validation accuracy before recovery.
        recover: fine-tunes a pruned model (given a copy of it, free to change).
        val_loader: validation images ``(images [B, C, H, W], labels [B])``.
        test_loader: held-out test images, or None (no test accuracy).
        max_batches: cap on the batches of each evaluation pass.
    """
    results = []
    for step in steps:
        pruned = prune_heads(copy.deepcopy(model), step.pruned).eval()
        test_before = None if test_loader is None else evaluate_accuracy(pruned, test_loader, max_batches=max_batches)
        recovered = recover(pruned, step).eval()
        if recovered.heads_per_layer() != step.heads_per_layer:
            raise RuntimeError(f"recovery changed the head counts {step.heads_per_layer} to {recovered.heads_per_layer()}.")
        val_after = evaluate_accuracy(recovered, val_loader, max_batches=max_batches)
        test_acc = None
        if test_loader is not None and test_before is not None:
            test_acc = (test_before, evaluate_accuracy(recovered, test_loader, max_batches=max_batches))
        results.append(RecoveredStep(step=step, val_acc=(step.accuracy, val_after), test_acc=test_acc))
    return results
