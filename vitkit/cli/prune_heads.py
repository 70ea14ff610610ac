"""Prune attention heads of a trained model and trace accuracy against the heads removed.

    vitkit prune --checkpoint runs/quickstart/<timestamp>/model.safetensors --out prune/
    vitkit prune --checkpoint best.ckpt --data root=/data/cifar num_workers=0 --max-drop 0.5 --out prune/

Orders, each iterative (every step gates off the lowest-scoring ~10% of the remaining heads,
re-scored under the current gates): importance (Michel et al. 2019, E|dL/d gate|) on raw scores,
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
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

from vitkit import save_model
from vitkit.evaluation import evaluate_model
from vitkit.io import load_model_and_extra
from vitkit.models import count_parameters, vit_flops
from vitkit.output_dirs import claim_output_dir
from vitkit.prune import (
    entropy_scorer,
    importance_scorer,
    iterative_pruning,
    prune_heads,
    random_scorer,
    time_forward,
    within_budget,
)
from vitkit.prune.evaluate import eval_loaders
from vitkit.prune.report import curve_rows, plot_pruning_curves, write_csv
from vitkit.train.artifacts import write_json
from vitkit.train.evaluate import check_model_fits, data_config_for

from .main import run_command


def prune(args: argparse.Namespace) -> dict:
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    out = claim_output_dir(args.out, "prune_heads")
    model, extra = load_model_and_extra(args.checkpoint)
    model.eval()
    splits = eval_loaders(data_config_for(extra, args.data, model), args.batch_size)
    train, val, info = splits.train, splits.val, splits.info
    check_model_fits(model, info)
    if splits.test is None:
        print(f"note: {info.name!r} has no held-out test split; test accuracy is not reported (null), "
              "since the validation split already chose the pruning depth.", file=sys.stderr)
    timing_batch = next(iter(val))[0]
    common = dict(eval_loader=val, step_fraction=args.step_fraction, max_batches=args.max_batches)
    raw = importance_scorer(train, normalize_layers=False, max_batches=args.max_batches)
    importance = iterative_pruning(model, train, scorer=raw, speed_batch=timing_batch, desc="importance", **common)
    curves = {"importance": [importance]}
    michel = importance_scorer(train, normalize_layers=True, max_batches=args.max_batches)
    curves["importance, per-layer L2"] = [iterative_pruning(model, train, scorer=michel, desc="per-layer L2", **common)]
    curves["random"] = [
        iterative_pruning(model, train, scorer=random_scorer(seed), desc=f"random, seed {seed}", **common)
        for seed in range(args.random_seeds)
    ]
    entropy = entropy_scorer(train, highest_first=args.entropy_order == "high", max_batches=args.max_batches)
    label = f"entropy ({args.entropy_order}est first)"
    curves[label] = [iterative_pruning(model, train, scorer=entropy, desc=label, **common)]

    rows = [row for label, runs in curves.items() for seed, records in enumerate(runs)
            for row in curve_rows(label, seed if label == "random" else None, records)]
    write_csv(out / "curves.csv", rows)
    chosen = within_budget(importance, args.max_drop)
    recipe = extra.get("recipe", "model")
    name = recipe if recipe == info.name else f"{recipe} ({info.name})"  # not "digits on digits"
    title = f"{name}: pruning {sum(model.heads_per_layer())} heads"
    plot_pruning_curves(curves, out / "curves.png", max_drop=args.max_drop, chosen=chosen, title=title)

    pruned = prune_heads(copy.deepcopy(model), chosen.pruned)
    test_acc, test_images = None, None
    if splits.test is not None:
        tests = [evaluate_model(m, splits.test, max_batches=args.max_batches) for m in (model, pruned)]
        test_acc, test_images = [t.top1 for t in tests], [tests[0].num_images, len(splits.test.dataset)]
    seconds_full, seconds_pruned = time_forward([model, pruned], timing_batch, rounds=args.rounds)
    pruning = {
        "source": str(args.checkpoint),
        "max_drop": args.max_drop,
        "heads_pruned": {str(layer): heads for layer, heads in chosen.pruned.items()},
        "heads_per_layer": pruned.heads_per_layer(),
    }
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
    write_json(out / "summary.json", summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    """``vitkit prune`` in this process (``tools/prune_heads.py``, tests)."""
    return run_command("prune", argv)


def run(args: argparse.Namespace) -> int:
    summary = prune(args)
    (full, kept) = summary["heads"]
    split, (acc_full, acc_kept) = ("test", summary["test_acc"]) if summary["test_acc"] else ("val", summary["val_acc"])
    if summary["test_images"] and summary["test_images"][0] < summary["test_images"][1]:
        split += f" ({summary['test_images'][0]:,} of {summary['test_images'][1]:,} images: --max-batches)"
    print(f"pruned {full - kept}/{full} heads within {args.max_drop:g} pt (chosen on val): {split} accuracy "
          f"{acc_full:.2f}% -> {acc_kept:.2f}%, parameters {summary['parameters'][0]:,} -> {summary['parameters'][1]:,}, "
          f"speed-up x{summary['speedup']:.2f} (batch {summary['timing_batch']}, median of {args.rounds} rounds)")
    print(json.dumps(summary))
    print(f"wrote {Path(args.out) / 'curves.csv'}, curves.png, pruned.safetensors and summary.json")
    return 0

