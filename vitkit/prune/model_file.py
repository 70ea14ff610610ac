"""Prune the attention heads of a model file: score, trace the orders, choose a depth, save the
pruned model and its summary, and (optionally) recover it with its recipe. What ``vitkit prune``
runs; its module docstring describes the protocol and the files written.

:func:`prepare_pruning` reads the model and checks every option (the target, the recovery's
recipe) before any work; :meth:`PruningJob.run` does the work into an output folder.

Recovery trains through :mod:`vitkit.train`, imported when a recovery is prepared, so that
``import vitkit.prune`` does not load Lightning.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm import tqdm

from ..data import build_datasets, check_model_fits, data_config_for
from ..errors import UsageError
from ..evaluation import evaluate_model
from ..files import write_csv, write_json
from ..io import load_model_and_extra, save_model
from ..models import VisionTransformer, count_parameters, vit_flops
from .iterative import (
    PruningStep,
    entropy_scorer,
    importance_scorer,
    iterative_pruning,
    one_shot_pruning,
    random_scorer,
    within_budget,
)
from .measure import EvalSplits, eval_loaders, time_forward
from .plan import BatchCost, estimate, format_duration, iterative_steps, measure_batch_cost
from .pruning import prune_heads
from .recovery import RecipeRecovery, RecoveredStep, pruning_record, recover_steps
from .report import curve_rows, plot_pruning_curves

#: The orders a run can trace; importance gives the pruned model, the others only feed the plot.
PRUNE_ORDERS = ("importance", "importance-l2", "random", "entropy")
#: ``max_drop`` of an iterative run that gives none (percentage points).
DEFAULT_MAX_DROP = 1.0


@dataclass(frozen=True)
class PruneOptions:
    """What a pruning run does (``vitkit prune``'s options, one field each).

    Attributes:
        orders: the orders traced (:data:`PRUNE_ORDERS`); must include ``"importance"``.
        heads: one shot: keep this many heads, the most important.
        ratio: one shot: prune this share of the heads, the least important.
        max_drop: iterative: the accuracy budget in percentage points (``None``: :data:`DEFAULT_MAX_DROP`).
        step_fraction: the share of the remaining heads each iterative step removes.
        random_seeds: random orders averaged.
        entropy_order: ``"high"``: the most uniform heads go first; ``"low"``: the most focused.
        batch_size: of scoring, evaluation and timing.
        max_batches: a cap on the batches of every pass, the test pass too.
        rounds: interleaved timing rounds for the speed-up.
        data: ``key=value`` changes to the data options saved with the model (recovery's too).
        recover_epochs: fine-tune pruned models for this many epochs (``None``: no recovery).
        recover_at: ``"end"`` (the chosen step; the default) or ``"each"`` (every step).
        recipe: the recovery's recipe (``None``: the ``config.yaml`` of the model's run directory).
        recover_lr: the recovery's peak learning rate (``None``: a tenth of the recipe's).
    """

    orders: tuple[str, ...] = PRUNE_ORDERS
    heads: int | None = None
    ratio: float | None = None
    max_drop: float | None = None
    step_fraction: float = 0.1
    random_seeds: int = 5
    entropy_order: Literal["high", "low"] = "high"
    batch_size: int = 256
    max_batches: int | None = None
    rounds: int = 50
    data: tuple[str, ...] = ()
    recover_epochs: int | None = None
    recover_at: Literal["end", "each"] | None = None
    recipe: str | None = None
    recover_lr: float | None = None


@dataclass(frozen=True)
class PruneResult:
    """What a pruning run wrote and measured: ``summary`` is ``summary.json``'s content (heads,
    val/test accuracy as ``[unpruned, pruned]``, parameters, FLOPs, speed-up, recovery), ``out``
    the folder holding it, ``curves.csv``, ``curves.png`` and ``pruned.safetensors``."""

    summary: dict[str, Any]
    out: Path


def prepare_pruning(model_file: str | os.PathLike, out: str | os.PathLike, options: PruneOptions) -> PruningJob:
    """Read ``model_file`` and check ``options`` against it before any work: the target, and the
    recovery's recipe (read, and built once against the unpruned weights).

    Raises:
        UsageError: a target or recovery option the model or the orders cannot take.
        RecipeError, ConfigError: the recovery's recipe or ``data`` do not load.
    """
    model, extra = load_model_and_extra(model_file)
    model.eval()
    target_pruned, max_drop = resolve_target(options, model)
    recovery = plan_recovery(options, Path(model_file), Path(out), extra)
    return PruningJob(Path(model_file), options, model, extra, target_pruned, max_drop, recovery)


def resolve_target(options: PruneOptions, model: VisionTransformer) -> tuple[int | None, float | None]:
    """The heads a one-shot run removes (``None``: an iterative run) and the accuracy budget."""
    if "importance" not in options.orders:
        raise UsageError("--orders must include importance: the pruned model follows the importance order; "
                         "the other orders only feed the plot.")
    total = sum(model.heads_per_layer())
    if options.heads is not None and options.heads > total:
        raise UsageError(f"--heads {options.heads} keeps more heads than the model has ({total}); give 0 to {total}.")
    target = (total - options.heads if options.heads is not None
              else round(options.ratio * total) if options.ratio is not None else None)
    max_drop = DEFAULT_MAX_DROP if options.max_drop is None and target is None else options.max_drop
    return target, max_drop


def recovery_recipe(options: PruneOptions, model_file: Path) -> Path | None:
    """The recipe to recover with: ``options.recipe``, else the ``config.yaml`` of the model's run
    directory (beside the model file, or beside its ``checkpoints/``); ``None`` without
    ``recover_epochs``, whose companions are refused alone."""
    if options.recover_epochs is None:
        given = [flag for flag, value in (("--recover-at", options.recover_at), ("--recipe", options.recipe),
                                          ("--recover-lr", options.recover_lr)) if value is not None]
        if given:
            raise UsageError(f"{given[0]} only applies to recovery; add --recover-epochs N, or leave {given[0]} out.")
        return None
    if options.recipe is not None:
        return Path(options.recipe)
    from ..train.artifacts import CONFIG_FILE

    run_dir = model_file.parent.parent if model_file.parent.name == "checkpoints" else model_file.parent
    if not (run_dir / CONFIG_FILE).is_file():
        raise UsageError(
            f"--recover-epochs fine-tunes with the model's recipe, but {run_dir} holds no {CONFIG_FILE} (the model "
            "is not in a training run directory); give the recipe with --recipe FILE."
        )
    return run_dir / CONFIG_FILE


def plan_recovery(options: PruneOptions, model_file: Path, out: Path, extra: dict[str, Any]) -> RecipeRecovery | None:
    """The recovery of ``options`` (the model's metadata ``extra`` go into each pruned file), its
    recipe read and checked before any pruning work."""
    recipe = recovery_recipe(options, model_file)
    if recipe is None:
        return None
    from ..train import load_recipe
    from ..train.model_builder import build_model, load_starting_weights, pretrained_data

    plan = RecipeRecovery.from_recipe(recipe, epochs=options.recover_epochs, out=out, lr=options.recover_lr,
                                      data=options.data, extra=extra, source=str(model_file))
    # The recipe against the unpruned weights, as train() will check each pruned model: a bad data
    # change or lr, another architecture or class count is one line now, not after the pruning.
    config = load_recipe(recipe, plan.overrides(model_file, out / "recover"))
    weights = load_starting_weights(config.model)
    if weights is not None:  # always: the overrides name the checkpoint
        data, _ = pretrained_data(config.data, weights)
        build_model(config, build_datasets(data).info, weights)
    return plan


def describe_plan(plan: dict[str, int], cost: BatchCost) -> str:
    """One line: what the run does and its estimated length, from one timed batch."""
    orders = ", ".join(f"{order} ({steps} step{'s' * (steps != 1)})" for order, steps in plan.items())
    faster = "" if list(plan) == ["one-shot"] else "; --orders importance --heads N is the fastest path"
    return (f"plan: {orders}; {cost.train_batches} scoring and {cost.eval_batches} evaluation batches per step; "
            f"estimated {format_duration(estimate(plan, cost))} ({cost.train_s:.2f} s per scoring batch here){faster}")


@dataclass
class PruningJob:
    """A pruning run of a model file whose options were checked (:func:`prepare_pruning`)."""

    model_file: Path
    options: PruneOptions
    model: VisionTransformer
    extra: dict[str, Any]
    #: heads a one-shot run removes; ``None``: an iterative run
    target_pruned: int | None
    #: the accuracy budget (points) the depth is chosen within; ``None`` for a one-shot run without one
    max_drop: float | None
    recovery: RecipeRecovery | None

    def plan(self) -> dict[str, int]:
        """Scoring steps per order this run makes (``one-shot`` for a heads or ratio target)."""
        options = self.options
        steps = iterative_steps(sum(self.model.heads_per_layer()), options.step_fraction)
        plan = {"one-shot": 1} if self.target_pruned is not None else {"importance": steps}
        for order in options.orders:
            if order != "importance":
                plan[order] = steps * (options.random_seeds if order == "random" else 1)
        return plan

    def run(self, out: str | os.PathLike, notify: Callable[[str], object] = print) -> PruneResult:
        """Score, trace, choose and save into ``out`` (the folder :func:`prepare_pruning` was
        given, claimed by the caller); ``notify`` gets the plan's line and any note before the work."""
        options, model, out = self.options, self.model, Path(out)
        splits = eval_loaders(data_config_for(self.extra, options.data, model), options.batch_size)
        check_model_fits(model, splits.info)
        if splits.test is None:
            notify(f"note: {splits.info.name!r} has no held-out test split; test accuracy is not reported (null), "
                   "since the validation split already chose the pruning depth.")
        timing_batch = next(iter(splits.val))[0]
        plan = self.plan()
        notify(describe_plan(plan, measure_batch_cost(model, splits.train, splits.val, options.max_batches)))
        curves = self.trace(plan, splits, timing_batch)
        importance = curves["importance"][0]
        chosen = importance[-1] if "one-shot" in plan else within_budget(importance, self.max_drop)
        recovered = None
        if self.recovery is not None:  # after every curve: training reseeds the random generators
            each = options.recover_at == "each"
            steps = [r for r in importance if r is chosen or (each and r.step > 0)]
            recovered = recover_steps(model, steps, self.recovery, val_loader=splits.val, test_loader=splits.test,
                                      max_batches=options.max_batches)
        self.write_curves(out, curves, chosen, recovered, splits.info.name)
        pruning, summary = self.save_pruned(out, chosen, importance[0], splits, timing_batch, one_shot="one-shot" in plan)
        if self.recovery is not None and recovered is not None:
            summary.update(save_recovered(self.recovery, recovered, chosen, importance[0], pruning, out))
        write_json(out / "summary.json", summary)
        return PruneResult(summary, out)

    def trace(self, plan: dict[str, int], splits: EvalSplits, timing_batch: torch.Tensor) -> dict[str, list[list[PruningStep]]]:
        """The steps of each order of ``plan`` (random: one run per seed), under one progress bar."""
        options, model, train = self.options, self.model, splits.train
        total_heads = sum(model.heads_per_layer())
        bar_total = sum(self.target_pruned if order == "one-shot" else total_heads * (options.random_seeds
                        if order == "random" else 1) for order in plan)  # heads each order removes
        curves: dict[str, list[list[PruningStep]]] = {}
        with tqdm(total=bar_total, desc="prune", unit="head") as bar:
            common = dict(eval_loader=splits.val, max_batches=options.max_batches, progress=bar)
            raw = importance_scorer(train, normalize_layers=False, max_batches=options.max_batches)
            if "one-shot" in plan:
                curves["importance"] = [one_shot_pruning(model, train, self.target_pruned, scorer=raw, speed_batch=timing_batch,
                                                         desc="importance, one shot", **common)]
            else:
                curves["importance"] = [iterative_pruning(model, train, options.step_fraction, scorer=raw,
                                                          speed_batch=timing_batch, desc="importance", **common)]
            iterative = dict(step_fraction=options.step_fraction, **common)
            if "importance-l2" in plan:
                michel = importance_scorer(train, normalize_layers=True, max_batches=options.max_batches)
                curves["importance, per-layer L2"] = [
                    iterative_pruning(model, train, scorer=michel, desc="per-layer L2", **iterative)
                ]
            if "random" in plan:
                curves["random"] = [iterative_pruning(model, train, scorer=random_scorer(seed), desc=f"random, seed {seed}",
                                                      **iterative) for seed in range(options.random_seeds)]
            if "entropy" in plan:
                entropy = entropy_scorer(train, highest_first=options.entropy_order == "high",
                                         max_batches=options.max_batches)
                label = f"entropy ({options.entropy_order}est first)"
                curves[label] = [iterative_pruning(model, train, scorer=entropy, desc=label, **iterative)]
        return curves

    def write_curves(self, out: Path, curves: dict[str, list[list[PruningStep]]], chosen: PruningStep,
                     recovered: list[RecoveredStep] | None, dataset: str) -> None:
        """``curves.csv`` (a row per step of every order) and ``curves.png``."""
        unrecovered = None if recovered is None else []  # the recovery columns in every row, or in none
        rows = [row for label, runs in curves.items() for seed, records in enumerate(runs)
                for row in curve_rows(label, seed if label == "random" else None, records,
                                      recovered if label == "importance" else unrecovered)]
        write_csv(out / "curves.csv", rows)
        recipe = self.extra.get("recipe", "model")
        name = recipe if recipe == dataset else f"{recipe} ({dataset})"  # not "digits on digits"
        title = f"{name}: pruning {sum(self.model.heads_per_layer())} heads"
        figure = {}
        if self.recovery is not None:
            figure = dict(recovery=recovered, speed_curve=curves["importance"][0],
                          recovery_label=f"after {self.recovery.epochs} epoch(s) of recovery at lr {self.recovery.lr:g}")
        plot_pruning_curves(curves, out / "curves.png", max_drop=self.max_drop, chosen=chosen, title=title, **figure)

    def save_pruned(self, out: Path, chosen: PruningStep, unpruned: PruningStep, splits: EvalSplits,
                    timing_batch: torch.Tensor, *, one_shot: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """Save the chosen step's model as ``pruned.safetensors``; its ``pruning`` metadata, and the
        summary of both models: test accuracy (where there is a test split), parameters, FLOPs and
        the timed speed-up."""
        model, options = self.model, self.options
        pruned = prune_heads(copy.deepcopy(model), chosen.pruned)
        test_acc, test_images = None, None
        if splits.test is not None:
            tests = [evaluate_model(m, splits.test, max_batches=options.max_batches) for m in (model, pruned)]
            test_acc, test_images = [t.top1 for t in tests], [tests[0].num_images, len(splits.test.dataset)]
        seconds_full, seconds_pruned = time_forward([model, pruned], timing_batch, rounds=options.rounds)
        pruning = {"max_drop": self.max_drop, "one_shot": one_shot,  # the source resolved: not a moving latest/ link
                   **pruning_record(str(self.model_file.resolve()), chosen.pruned, pruned)}
        save_model(pruned, out / "pruned.safetensors", extra={**self.extra, "pruning": pruning})
        return pruning, {
            **pruning,
            "heads": [sum(model.heads_per_layer()), chosen.heads_left],
            "fraction_pruned": round(chosen.fraction_pruned, 4),
            "scored_on": "train",
            "selected_on": "val",
            "reported_on": "test" if test_acc is not None else None,
            "val_acc": [unpruned.accuracy, chosen.accuracy],
            "test_acc": test_acc,
            "test_images": test_images,
            "parameters": [count_parameters(model), count_parameters(pruned)],
            "flops": [vit_flops(model.config), vit_flops(pruned.config)],
            "timing_batch": len(timing_batch),
            "num_threads": torch.get_num_threads(),
            "median_forward_s": [round(seconds_full, 6), round(seconds_pruned, 6)],
            "speedup": round(seconds_full / seconds_pruned, 3),
        }


def save_recovered(
    recovery: RecipeRecovery, recovered: list[RecoveredStep], chosen: PruningStep, unpruned: PruningStep,
    pruning: dict[str, Any], out: Path,
) -> dict[str, Any]:
    """Save the chosen step's recovered model as ``pruned_recovered.safetensors`` (its run's model
    file with the ``pruning`` and ``recovery`` metadata added) and return the summary's entries."""
    speed = unpruned.images_per_s
    steps = [
        {
            "step": r.step.step,
            "heads_left": r.step.heads_left,
            "speedup": round(r.step.images_per_s / speed, 3) if r.step.images_per_s and speed else None,
            "val_acc": list(r.val_acc),
            "test_acc": list(r.test_acc) if r.test_acc is not None else None,
            "run_dir": str(recovery.runs[r.step.step]),
        }
        for r in recovered
    ]
    entry = {"recipe": str(recovery.recipe), "epochs": recovery.epochs, "lr": recovery.lr, "min_lr": recovery.min_lr,
             "warmup_epochs": 0, "model": "pruned_recovered.safetensors", "steps": steps}
    model, extra = load_model_and_extra(recovery.runs[chosen.step] / "model.safetensors")
    save_model(model, out / "pruned_recovered.safetensors", extra={**extra, "pruning": pruning, "recovery": entry})
    (mine,) = [r for r in recovered if r.step is chosen]
    return {
        "recovery": entry,
        "val_acc_recovered": mine.val_acc[1],
        "test_acc_recovered": mine.test_acc[1] if mine.test_acc is not None else None,
    }
