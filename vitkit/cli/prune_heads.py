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

The run is :func:`vitkit.prune.prepare_pruning` and :meth:`~vitkit.prune.PruningJob.run`; this
module reads the options, claims --out and prints the outcome.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from vitkit.output_dirs import check_output_dir, claim_output_dir
from vitkit.prune import PruneOptions, prepare_pruning

from .commands import run_command


def prune_options(args: argparse.Namespace) -> PruneOptions:
    """The :class:`~vitkit.prune.PruneOptions` of ``vitkit prune``'s arguments."""
    return PruneOptions(
        orders=tuple(args.orders), heads=args.heads, ratio=args.ratio, max_drop=args.max_drop,
        step_fraction=args.step_fraction, random_seeds=args.random_seeds, entropy_order=args.entropy_order,
        batch_size=args.batch_size, max_batches=args.max_batches, rounds=args.rounds, data=tuple(args.data),
        recover_epochs=args.recover_epochs, recover_at=args.recover_at, recipe=args.recipe, recover_lr=args.recover_lr,
    )


def prune(args: argparse.Namespace) -> dict:
    """Prune ``args.checkpoint`` into ``--out``; the summary written there."""
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    check_output_dir(args.out, "prune_heads", inputs=[args.checkpoint])  # before the model is read
    job = prepare_pruning(args.checkpoint, args.out, prune_options(args))  # every option checked, no work yet
    out = claim_output_dir(args.out, "prune_heads", inputs=[args.checkpoint])
    return job.run(out, notify=lambda line: print(line, file=sys.stderr)).summary


def main(argv: list[str] | None = None) -> int:
    """``vitkit prune`` in this process (``tools/prune_heads.py``, tests)."""
    return run_command("prune", run, argv)


def run(args: argparse.Namespace) -> int:
    summary = prune(args)
    (full, kept) = summary["heads"]
    split, (acc_full, acc_kept) = ("test", summary["test_acc"]) if summary["test_acc"] else ("val", summary["val_acc"])
    if summary["test_images"] and summary["test_images"][0] < summary["test_images"][1]:
        split += f" ({summary['test_images'][0]:,} of {summary['test_images'][1]:,} images: --max-batches)"
    how = "in one shot (importance)" if summary["one_shot"] else f"within {summary['max_drop']:g} pt (chosen on val)"
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
