"""Prune, then recover: fine-tune pruned models briefly and measure accuracy before and after.

Michel et al. (2019, https://arxiv.org/abs/1905.10650) and Torch-Pruning's ViT examples prune a
trained model and then win back most of the lost accuracy with a short fine-tune.
:func:`recover_steps` rebuilds each step's pruned model, hands it to a ``recover`` function and
measures the result. :class:`RecipeRecovery` is the recovery ``vitkit prune --recover-epochs``
uses: a training recipe run from the pruned weights at a fine-tuning learning rate, without
warm-up; :func:`recover_model` runs it on any pruned model (another pruner's too).

Recovery trains through :mod:`vitkit.train`, imported when a recovery starts, so that
``import vitkit.prune`` does not load Lightning.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..evaluation import Batch
from ..io import save_model
from ..models import VisionTransformer
from .iterative import PruningStep
from .measure import evaluate_accuracy
from .pruning import prune_heads

if TYPE_CHECKING:
    from ..train import RunResult

#: Recovery's default learning rate, as a share of the recipe's peak ``optim.lr``.
DEFAULT_LR_SHARE = 0.1

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


def pruning_record(source: str, heads: dict[int, list[int]], pruned: VisionTransformer) -> dict[str, Any]:
    """The ``pruning`` metadata of a pruned model file: where from, which heads went, what is left."""
    return {
        "source": source,
        "heads_pruned": {str(layer): indices for layer, indices in heads.items()},
        "heads_per_layer": pruned.heads_per_layer(),
    }


@dataclass
class RecipeRecovery:
    """A :data:`Recover` that fine-tunes with a training recipe: each step's pruned model is saved
    in ``out/recover/step_<k>/pruned.safetensors`` and the recipe trains from it there (the changes
    of :meth:`overrides`); ``runs`` records each step's run directory. :meth:`from_recipe` chooses
    the learning rates.

    Attributes:
        recipe: the recipe (a YAML file, a shipped recipe's name or an equivalent dict).
        epochs: epochs of fine-tuning (the recipe's other trainer limits apply).
        lr: the peak learning rate, reached at once (no warm-up) and cosine-decayed to ``min_lr``.
        min_lr: the learning rate at the end; at most ``lr``.
        out: the folder the runs go under.
        data: ``data.`` overrides of the recipe (``["seed=3"]``).
        extra: metadata saved in each pruned model file (a model file's ``extra``: mean, std, ...).
        source: the unpruned model's name or path, recorded in each pruned file's ``pruning`` entry.
    """

    recipe: str | os.PathLike | dict[str, Any]
    epochs: int
    lr: float
    min_lr: float
    out: Path
    data: Sequence[str] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    runs: dict[int, Path] = field(default_factory=dict)

    @classmethod
    def from_recipe(
        cls,
        recipe: str | os.PathLike | dict[str, Any],
        *,
        epochs: int,
        out: str | os.PathLike,
        lr: float | None = None,
        data: Sequence[str] = (),
        extra: dict[str, Any] | None = None,
        source: str = "",
    ) -> RecipeRecovery:
        """The recovery of ``recipe`` at ``lr`` (default :data:`DEFAULT_LR_SHARE` of the recipe's
        ``optim.lr``: the weights are trained already, and the recipe's peak would undo much of
        them), decayed to the recipe's ``optim.min_lr`` or to ``lr`` if that is lower.

        Raises:
            RecipeError: the recipe does not load.
        """
        from ..train import load_recipe

        optim = load_recipe(recipe).optim
        lr = optim.lr * DEFAULT_LR_SHARE if lr is None else lr
        return cls(recipe=recipe, epochs=epochs, lr=lr, min_lr=min(optim.min_lr, lr), out=Path(out), data=tuple(data),
                   extra=dict(extra or {}), source=source)

    def overrides(self, pretrained: Path, folder: Path) -> list[str]:
        """The recipe's changes: the pruned weights as they are (classifier kept, no timm options),
        the fine-tuning schedule, ``folder`` for the run and the ``data`` changes."""
        return [  # paths as JSON strings, which YAML reads whole ('#', ': ', '[' and all)
            f"model.pretrained={json.dumps(str(pretrained))}", "model.pretrained_file=null", "model.pretrained_kwargs={}",
            "model.reset_head=false", "model.impl=vitkit",
            f"optim.lr={self.lr!r}", f"optim.min_lr={self.min_lr!r}", "optim.warmup_epochs=0",
            f"trainer.max_epochs={self.epochs}", f"output.dir={json.dumps(str(folder))}",
            *(f"data.{item}" for item in self.data),
        ]

    def fine_tune(self, model: VisionTransformer, folder: Path, extra: dict[str, Any] | None = None) -> RunResult:
        """Save ``model`` as ``folder/pruned.safetensors`` (with :attr:`extra` and ``extra``) and
        train the recipe from it, the run directory under ``folder``."""
        from ..train import train

        path = save_model(model, folder / "pruned.safetensors", extra={**self.extra, **(extra or {})})
        return train(self.recipe, self.overrides(path, folder))

    def __call__(self, pruned: VisionTransformer, step: PruningStep) -> VisionTransformer:
        result = self.fine_tune(pruned, self.out / "recover" / f"step_{step.step}",
                                {"pruning": pruning_record(self.source, step.pruned, pruned)})
        self.runs[step.step] = result.run_dir
        return result.model


def recover_model(
    model: VisionTransformer,
    recipe: str | os.PathLike | dict[str, Any],
    *,
    epochs: int,
    out: str | os.PathLike,
    lr: float | None = None,
    data: Sequence[str] = (),
    extra: dict[str, Any] | None = None,
) -> RunResult:
    """Fine-tune a pruned ``model`` (any pruner's: its head counts are kept) with ``recipe`` for
    ``epochs`` epochs, as ``vitkit prune --recover-epochs`` does (:meth:`RecipeRecovery.from_recipe`
    chooses ``lr`` and ``min_lr``): ``model`` is saved as ``out/pruned.safetensors`` with
    ``extra`` and the run goes under ``out``. The recipe's architecture must be the model's.

    Returns:
        The run (``run_dir``, ``summary``, and the recovered ``model`` in eval mode).
    """
    recovery = RecipeRecovery.from_recipe(recipe, epochs=epochs, out=out, lr=lr, data=data, extra=extra)
    return recovery.fine_tune(model, recovery.out)
