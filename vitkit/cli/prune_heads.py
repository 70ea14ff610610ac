"""Prune attention heads of a trained model and trace accuracy against the heads removed.

    vitkit prune runs/quickstart/<timestamp>/model.safetensors --out prune/
    vitkit prune best.ckpt --data root=/data/cifar num_workers=0 --max-drop 0.5 --out prune/
    vitkit prune runs/fashion/<timestamp>/model.safetensors --recover-epochs 2 --out prune/

One shot (--heads N keeps the N most important heads, --ratio R prunes that share of them): the
heads are scored once, by importance on the unpruned model, and the lowest are removed together;
no accuracy budget. With --orders importance alone this is one scoring pass: minutes on a ViT-S/16
where the iterative orders take hours. Before any work the run prints its plan and an estimate of
its length, from one batch timed on this machine, and then shows one progress bar.

Orders (--orders, default all), each iterative (every step gates off the lowest-scoring ~10% of the
remaining heads, re-scored under the current gates): importance (Michel et al. 2019, E|dL/d gate|) on raw scores,
and with the paper's per-layer L2 normalisation (which spreads the pruning evenly over layers;
raw scores rank across layers better when layers differ a lot, as in the quickstart ViT);
random (several seeds, mean ± std band); attention entropy, highest first (a near-uniform head
only averages the image's values, which the residual stream and the other heads can stand in
for; --entropy-order low prunes the focused heads first instead).

Protocol: heads are scored on the training images (no augmentation), the curves are validation
accuracy of the physically pruned model, the pruning depth is chosen on the validation split
(the deepest step such that it and every shallower step stay within --max-drop points of the
unpruned model), and accuracy is reported on the test split, which chose nothing. Without a
held-out test split (an image folder without test/) the test accuracy is null, and the tool says
so. The data are rebuilt from the options saved with the model (--data overrides them).

Writes to --out: curves.csv, curves.png, pruned.safetensors (the chosen raw-importance step; the
model's metadata are kept, with a "pruning" entry added) and summary.json (scored_on, selected_on,
reported_on, val_acc and test_acc as [unpruned, pruned], test_images as [used, in the split]
(fewer with --max-batches, which caps every pass, the test pass too), parameters, FLOPs, and the speed-up
measured by timing both models on the same batch, interleaved, median of --rounds).

Recovery (--recover-epochs N; Michel et al. and Torch-Pruning's ViT examples fine-tune a pruned
model briefly to win back accuracy): the chosen step's pruned model (--recover-at end) or every
pruning step's (each) is trained for N epochs with the recipe (--recipe, default the config.yaml
of the model's run directory: its data, augmentation, optimiser and trainer limits) from the
pruned weights (model.pretrained, head counts kept), at a fine-tuning learning rate: --recover-lr,
default a tenth of the recipe's optim.lr, without warm-up, cosine-decayed to the recipe's
optim.min_lr (or the recovery lr if lower). The weights are trained already, so the recipe's peak
lr would undo much of them, and a warm-up would spend a short budget below that lr. --data changes
apply to the recovery runs too. Each run writes --out/recover/step_<k>/ (the step's pruned
model, pruned.safetensors, and the run directory <recipe name>/<timestamp>/). The chosen step is
still chosen before recovery. Adds: pruned_recovered.safetensors (the chosen step recovered),
summary.json "recovery" (recipe, lr, and per recovered step: speed-up, val_acc and test_acc as
[before, after recovery], run_dir) and val_acc_recovered / test_acc_recovered of the chosen step,
curves.csv columns recovered_val_acc and recovered_test_acc (importance rows of recovered steps),
and a second panel of curves.png: validation accuracy before -> after recovery against the
measured speed-up.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from vitkit import save_model
from vitkit.data import build_datasets, check_model_fits, data_config_for
from vitkit.errors import UsageError
from vitkit.evaluation import evaluate_model
from vitkit.files import write_csv
from vitkit.io import load_model_and_extra
from vitkit.models import VisionTransformer, count_parameters, vit_flops
from vitkit.output_dirs import check_output_dir, claim_output_dir
from vitkit.prune import (
    PruningStep,
    RecipeRecovery,
    RecoveredStep,
    entropy_scorer,
    importance_scorer,
    iterative_pruning,
    one_shot_pruning,
    prune_heads,
    pruning_record,
    random_scorer,
    recover_steps,
    time_forward,
    within_budget,
)
from vitkit.prune.measure import eval_loaders
from vitkit.prune.plan import BatchCost, estimate, format_duration, iterative_steps, measure_batch_cost
from vitkit.prune.report import curve_rows, plot_pruning_curves
from vitkit.train import load_recipe
from vitkit.train.artifacts import CONFIG_FILE, write_json
from vitkit.train.model_builder import build_model, load_starting_weights, pretrained_data

from .commands import run_command

#: ``--max-drop`` of an iterative run that gives none (percentage points).
DEFAULT_MAX_DROP = 1.0


def recovery_recipe(args: argparse.Namespace) -> Path | None:
    """The recipe to recover with: ``--recipe``, else the ``config.yaml`` of the model's run
    directory (beside the model file, or beside its ``checkpoints/``); None without
    ``--recover-epochs``, whose companions are refused alone."""
    if args.recover_epochs is None:
        given = [flag for flag, value in (("--recover-at", args.recover_at), ("--recipe", args.recipe),
                                          ("--recover-lr", args.recover_lr)) if value is not None]
        if given:
            raise UsageError(f"{given[0]} only applies to recovery; add --recover-epochs N, or leave {given[0]} out.")
        return None
    if args.recipe is not None:
        return Path(args.recipe)
    checkpoint = Path(args.checkpoint)
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    if not (run_dir / CONFIG_FILE).is_file():
        raise UsageError(
            f"--recover-epochs fine-tunes with the model's recipe, but {run_dir} holds no {CONFIG_FILE} (the model "
            "is not in a training run directory); give the recipe with --recipe FILE."
        )
    return run_dir / CONFIG_FILE


def plan_recovery(args: argparse.Namespace, out: Path, extra: dict[str, Any]) -> RecipeRecovery | None:
    """The recovery of ``args`` (the model's metadata ``extra`` go into each pruned file), its
    recipe read and checked before any pruning work."""
    recipe = recovery_recipe(args)
    if recipe is None:
        return None
    plan = RecipeRecovery.from_recipe(recipe, epochs=args.recover_epochs, out=out, lr=args.recover_lr,
                                      data=args.data, extra=extra, source=str(args.checkpoint))
    # The recipe against the unpruned weights, as train() will check each pruned model: a bad --data
    # or lr, another architecture or class count is one line now, not after the pruning.
    config = load_recipe(recipe, plan.overrides(Path(args.checkpoint), out / "recover"))
    weights = load_starting_weights(config.model)
    if weights is not None:  # always: the overrides name the checkpoint
        data, _ = pretrained_data(config.data, weights)
        build_model(config, build_datasets(data).info, weights)
    return plan


def resolve_target(args: argparse.Namespace, model: VisionTransformer) -> None:
    """Check the pruning target against the model and the orders, before any work: sets
    ``args.target_pruned`` (heads a one-shot run removes, else ``None``) and the default ``--max-drop``."""
    if "importance" not in args.orders:
        raise UsageError("--orders must include importance: the pruned model follows the importance order; "
                         "the other orders only feed the plot.")
    total = sum(model.heads_per_layer())
    if args.heads is not None and args.heads > total:
        raise UsageError(f"--heads {args.heads} keeps more heads than the model has ({total}); give 0 to {total}.")
    args.target_pruned = (total - args.heads if args.heads is not None
                          else round(args.ratio * total) if args.ratio is not None else None)
    if args.max_drop is None and args.target_pruned is None:
        args.max_drop = DEFAULT_MAX_DROP


def run_plan(args: argparse.Namespace, model: VisionTransformer) -> dict[str, int]:
    """Scoring steps per order this run makes (``one-shot`` for ``--heads`` / ``--ratio``)."""
    total = sum(model.heads_per_layer())
    steps = iterative_steps(total, args.step_fraction)
    plan = {"one-shot": 1} if args.target_pruned is not None else {"importance": steps}
    for order in args.orders:
        if order != "importance":
            plan[order] = steps * (args.random_seeds if order == "random" else 1)
    return plan


def describe_plan(plan: dict[str, int], cost: BatchCost) -> str:
    """One line: what the run does and its estimated length, from one timed batch."""
    orders = ", ".join(f"{order} ({steps} step{'s' * (steps != 1)})" for order, steps in plan.items())
    faster = "" if list(plan) == ["one-shot"] else "; --orders importance --heads N is the fastest path"
    return (f"plan: {orders}; {cost.train_batches} scoring and {cost.eval_batches} evaluation batches per step; "
            f"estimated {format_duration(estimate(plan, cost))} ({cost.train_s:.2f} s per scoring batch here){faster}")


def prune(args: argparse.Namespace) -> dict:
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    check_output_dir(args.out, "prune_heads", inputs=[args.checkpoint])  # before the model is read
    model, extra = load_model_and_extra(args.checkpoint)
    model.eval()
    resolve_target(args, model)
    recovery = plan_recovery(args, Path(args.out), extra)
    out = claim_output_dir(args.out, "prune_heads", inputs=[args.checkpoint])
    splits = eval_loaders(data_config_for(extra, args.data, model), args.batch_size)
    train_loader, val, info = splits.train, splits.val, splits.info
    check_model_fits(model, info)
    if splits.test is None:
        print(f"note: {info.name!r} has no held-out test split; test accuracy is not reported (null), "
              "since the validation split already chose the pruning depth.", file=sys.stderr)
    timing_batch = next(iter(val))[0]
    common = dict(eval_loader=val, max_batches=args.max_batches)
    plan = run_plan(args, model)
    cost = measure_batch_cost(model, train_loader, val, args.max_batches)
    print(describe_plan(plan, cost), file=sys.stderr)
    curves: dict[str, list[list[PruningStep]]] = {}
    total_heads = sum(model.heads_per_layer())
    bar_total = sum(args.target_pruned if order == "one-shot" else total_heads * (args.random_seeds if order == "random"
                    else 1) for order in plan)  # heads each order removes: one bar over the whole run
    with tqdm(total=bar_total, desc="prune", unit="head") as bar:
        common["progress"] = bar
        raw = importance_scorer(train_loader, normalize_layers=False, max_batches=args.max_batches)
        if "one-shot" in plan:
            importance = one_shot_pruning(model, train_loader, args.target_pruned, scorer=raw, speed_batch=timing_batch,
                                          desc="importance, one shot", **common)
        else:
            importance = iterative_pruning(model, train_loader, args.step_fraction, scorer=raw,
                                           speed_batch=timing_batch, desc="importance", **common)
        curves["importance"] = [importance]
        iterative = dict(step_fraction=args.step_fraction, **common)
        if "importance-l2" in plan:
            michel = importance_scorer(train_loader, normalize_layers=True, max_batches=args.max_batches)
            curves["importance, per-layer L2"] = [
                iterative_pruning(model, train_loader, scorer=michel, desc="per-layer L2", **iterative)
            ]
        if "random" in plan:
            curves["random"] = [
                iterative_pruning(model, train_loader, scorer=random_scorer(seed), desc=f"random, seed {seed}",
                                  **iterative)
                for seed in range(args.random_seeds)
            ]
        if "entropy" in plan:
            entropy = entropy_scorer(train_loader, highest_first=args.entropy_order == "high",
                                     max_batches=args.max_batches)
            label = f"entropy ({args.entropy_order}est first)"
            curves[label] = [iterative_pruning(model, train_loader, scorer=entropy, desc=label, **iterative)]
    chosen = importance[-1] if "one-shot" in plan else within_budget(importance, args.max_drop)

    recovered: list[RecoveredStep] | None = None
    if recovery is not None:  # after every curve: training reseeds the random generators
        each = args.recover_at == "each"
        steps = [r for r in importance if r is chosen or (each and r.step > 0)]
        recovered = recover_steps(model, steps, recovery, val_loader=val, test_loader=splits.test,
                                  max_batches=args.max_batches)

    unrecovered = None if recovered is None else []  # the recovery columns in every row, or in none
    rows = [row for label, runs in curves.items() for seed, records in enumerate(runs)
            for row in curve_rows(label, seed if label == "random" else None, records,
                                  recovered if label == "importance" else unrecovered)]
    write_csv(out / "curves.csv", rows)
    recipe = extra.get("recipe", "model")
    name = recipe if recipe == info.name else f"{recipe} ({info.name})"  # not "digits on digits"
    title = f"{name}: pruning {sum(model.heads_per_layer())} heads"
    figure = {}
    if recovery is not None:
        figure = dict(recovery=recovered, speed_curve=importance,
                      recovery_label=f"after {recovery.epochs} epoch(s) of recovery at lr {recovery.lr:g}")
    plot_pruning_curves(curves, out / "curves.png", max_drop=args.max_drop, chosen=chosen, title=title, **figure)

    pruned = prune_heads(copy.deepcopy(model), chosen.pruned)
    test_acc, test_images = None, None
    if splits.test is not None:
        tests = [evaluate_model(m, splits.test, max_batches=args.max_batches) for m in (model, pruned)]
        test_acc, test_images = [t.top1 for t in tests], [tests[0].num_images, len(splits.test.dataset)]
    seconds_full, seconds_pruned = time_forward([model, pruned], timing_batch, rounds=args.rounds)
    pruning = {"max_drop": args.max_drop, "one_shot": "one-shot" in plan,
               **pruning_record(str(Path(args.checkpoint).resolve()), chosen.pruned, pruned)}  # not a moving latest/ link
    save_model(pruned, out / "pruned.safetensors", extra={**extra, "pruning": pruning})
    summary = {
        **pruning,
        "heads": [sum(model.heads_per_layer()), chosen.heads_left],
        "fraction_pruned": round(chosen.fraction_pruned, 4),
        "scored_on": "train",
        "selected_on": "val",
        "reported_on": "test" if test_acc is not None else None,
        "val_acc": [importance[0].accuracy, chosen.accuracy],
        "test_acc": test_acc,
        "test_images": test_images,
        "parameters": [count_parameters(model), count_parameters(pruned)],
        "flops": [vit_flops(model.config), vit_flops(pruned.config)],
        "timing_batch": len(timing_batch),
        "num_threads": torch.get_num_threads(),
        "median_forward_s": [round(seconds_full, 6), round(seconds_pruned, 6)],
        "speedup": round(seconds_full / seconds_pruned, 3),
    }
    if recovery is not None and recovered is not None:
        summary.update(save_recovered(recovery, recovered, chosen, importance[0], pruning, out))
    write_json(out / "summary.json", summary)
    return summary


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


def main(argv: list[str] | None = None) -> int:
    """``vitkit prune`` in this process (``tools/prune_heads.py``, tests)."""
    return run_command("prune", run, argv)


def run(args: argparse.Namespace) -> int:
    summary = prune(args)
    (full, kept) = summary["heads"]
    split, (acc_full, acc_kept) = ("test", summary["test_acc"]) if summary["test_acc"] else ("val", summary["val_acc"])
    if summary["test_images"] and summary["test_images"][0] < summary["test_images"][1]:
        split += f" ({summary['test_images'][0]:,} of {summary['test_images'][1]:,} images: --max-batches)"
    how = "in one shot (importance)" if summary["one_shot"] else f"within {args.max_drop:g} pt (chosen on val)"
    print(f"pruned {full - kept}/{full} heads {how}: {split} accuracy (one view, float32: not the training "
          "summary's, which scores under the recipe's views and precision) "
          f"{acc_full:.2f}% -> {acc_kept:.2f}%, parameters {summary['parameters'][0]:,} -> {summary['parameters'][1]:,}, "
          f"speed-up x{summary['speedup']:.2f} (batch {summary['timing_batch']}, median of {args.rounds} rounds)")
    if "recovery" in summary:
        split, after = (("test", summary["test_acc_recovered"]) if summary["test_acc_recovered"] is not None
                        else ("val", summary["val_acc_recovered"]))
        print(f"recovered ({summary['recovery']['epochs']} epoch(s) at lr {summary['recovery']['lr']:g}): "
              f"{split} accuracy {acc_kept:.2f}% -> {after:.2f}%")
    print(json.dumps(summary))
    recovered = ", pruned_recovered.safetensors" if "recovery" in summary else ""
    print(f"wrote {Path(args.out) / 'curves.csv'}, curves.png, pruned.safetensors{recovered} and summary.json")
    return 0

