"""Issue 34 item 4(b): prune, then recover, with vitkit's head importance and with Torch-Pruning.

    python dev/prune_recover_table.py runs/fashion_mnist_fast/<timestamp>/model.safetensors --out prune_vs_tp \
        --figure docs/prune_recover_fashion_mnist.png --num-threads 1

For each fraction of the model's heads (``--fractions``, default 25, 50 and 75%) the same number of
heads is removed by

* vitkit: ``vitkit prune``'s importance order (Michel et al. 2019, E|dL/d gate| on raw scores,
  iterative: every step removes ``--step-fraction`` of the remaining heads, re-scored; the steps
  that have removed exactly that many heads are taken), and by
* Torch-Pruning (Fang et al. 2023, ``torch-pruning`` on PyPI; dev-only, not a vitkit dependency),
  as its timm ViT example does, on ``vitkit.models.to_timm(model)``: ``tp.pruner.MetaPruner`` with
  ``num_heads``, ``prune_num_heads=True``, ``prune_head_dims=False`` and
  ``GroupTaylorImportance`` (one shot per fraction); ``--tp-scope uniform`` removes the same
  number of heads in every block (the example's default), ``global`` ranks all heads together
  (Torch-Pruning 1.6.1 can count a block down to 0 heads while leaving them in its weights; the
  script then stops with that message, as on the Fashion-MNIST model at 12 of 16 heads).
  Only the heads are pruned (every layer but the ``qkv`` projections is ignored, so no MLP or
  embedding channel goes). The heads it removed are read off the pruned ``qkv`` weights and
  removed from the vitkit model with :func:`vitkit.prune.prune_heads`; its logits are checked
  against the pruned timm model's.

Both orders score heads on the same ``--score-batches`` batches of training images (no
augmentation). Every pruned model is then recovered the same way, by the recovery of ``vitkit
prune --recover-epochs N`` (:class:`vitkit.prune.RecipeRecovery`: the model's recipe,
``config.yaml`` of its run directory, from the pruned weights, a tenth of its lr, no warm-up).
Accuracy is top-1 on the test images alone (no mirrored views), before and after recovery; the
speed-up is the median forward time of the unpruned model over the pruned one, every model timed
on the same validation batch, interleaved (:func:`vitkit.prune.time_forward`).

Writes ``--out``/results.json (after each recovery, so a cut-short run keeps what it measured),
the recovery runs under ``--out``/<order>/recover/step_<k>/, and prints the Markdown table;
``--figure`` draws accuracy before and after recovery against heads removed and speed-up.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torch_pruning as tp
from matplotlib.figure import Figure
from torch import nn

from vitkit.data import data_config_for
from vitkit.evaluation import Batch
from vitkit.files import write_json
from vitkit.io import load_model_and_extra
from vitkit.models import VisionTransformer, count_parameters, to_timm, vit_flops
from vitkit.prune import (
    PruningStep,
    RecipeRecovery,
    RecoveredStep,
    evaluate_accuracy,
    importance_scorer,
    iterative_pruning,
    prune_heads,
    recover_steps,
    time_forward,
)
from vitkit.prune.measure import eval_loaders
from vitkit.train.artifacts import CONFIG_FILE


def first_batches(loader: Iterable[Batch], count: int) -> list[Batch]:
    """The first ``count`` batches of ``loader``, kept so both orders score on the same images."""
    batches = []
    for batch in loader:
        if len(batches) == count:
            break
        batches.append(batch)
    return batches


def vitkit_steps(model: VisionTransformer, score_on: list[Batch], val: Iterable[Batch], counts: Sequence[int],
                 step_fraction: float) -> list[PruningStep]:
    """``vitkit prune``'s raw-importance order, run down to the largest of ``counts``; the steps
    that have removed exactly ``counts`` heads (refused when the step size skips one)."""
    total = sum(model.heads_per_layer())
    records = iterative_pruning(model, score_on, step_fraction, eval_loader=val, min_heads=total - max(counts),
                                scorer=importance_scorer(score_on, normalize_layers=False), progress=False)
    removed = {total - record.heads_left: record for record in records}
    missing = [count for count in counts if count not in removed]
    if missing:
        raise SystemExit(f"--step-fraction {step_fraction} never has {missing} heads removed "
                         f"(steps at {sorted(removed)}); choose a smaller one.")
    return [removed[count] for count in counts]


def torch_pruning_heads(model: VisionTransformer, count: int, score_on: list[Batch], scope: str) -> tuple[
        dict[int, list[int]], nn.Module]:
    """The ``count`` heads Torch-Pruning removes from ``to_timm(model)`` (``{block: [head]}``) and
    the pruned timm model (``num_heads`` and ``attn_dim`` updated, as its example does)."""
    twin = to_timm(model).eval()
    attentions = [block.attn for block in twin.blocks]
    qkv = {attn.qkv: attn.num_heads for attn in attentions}
    total = sum(qkv.values())
    fraction = count / total
    before = [attn.qkv.weight.detach().clone() for attn in attentions]
    twin.zero_grad()
    for images, labels in score_on:  # GroupTaylorImportance reads the accumulated gradients
        F.cross_entropy(twin(images), labels).backward()
    pruner = tp.pruner.MetaPruner(
        twin, score_on[0][0][:1], importance=tp.importance.GroupTaylorImportance(),
        global_pruning=scope == "global", pruning_ratio=fraction, head_pruning_ratio=fraction,
        num_heads=dict(qkv), prune_num_heads=True, prune_head_dims=False,
        ignored_layers=[m for m in twin.modules() if isinstance(m, nn.Linear | nn.Conv2d) and m not in qkv],
    )
    pruner.step()
    removed: dict[int, list[int]] = {}
    for layer, (attn, weight) in enumerate(zip(attentions, before, strict=True)):
        attn.num_heads = pruner.num_heads[attn.qkv]
        attn.attn_dim = attn.num_heads * attn.head_dim
        if attn.qkv.out_features != 3 * attn.attn_dim:  # seen with global_pruning emptying a block
            raise RuntimeError(f"block {layer}: Torch-Pruning counts {attn.num_heads} heads but left "
                               f"{attn.qkv.out_features // (3 * attn.head_dim)} in the weights.")
        kept_q = attn.qkv.weight.detach()[: attn.attn_dim].split(attn.head_dim)
        heads = weight[: qkv[attn.qkv] * attn.head_dim].split(attn.head_dim)
        gone = [h for h, head in enumerate(heads) if not any(torch.equal(head, kept) for kept in kept_q)]
        if len(gone) != qkv[attn.qkv] - attn.num_heads:
            raise RuntimeError(f"block {layer}: cannot tell which heads Torch-Pruning removed.")
        if gone:
            removed[layer] = gone
    if sum(map(len, removed.values())) != count:
        raise RuntimeError(f"Torch-Pruning removed {sum(map(len, removed.values()))} heads, not {count}.")
    return removed, twin


def torch_pruning_step(model: VisionTransformer, count: int, score_on: list[Batch], val: Iterable[Batch],
                       check: torch.Tensor, scope: str) -> tuple[PruningStep, float]:
    """Torch-Pruning's ``count`` heads as a :class:`PruningStep` of ``model`` (validation accuracy
    of the vitkit model with them pruned), and the largest logit difference between that model and
    Torch-Pruning's pruned timm model on ``check``."""
    heads, twin = torch_pruning_heads(model, count, score_on, scope)
    pruned = prune_heads(copy.deepcopy(model), heads).eval()
    with torch.inference_mode():
        gap = (pruned(check) - twin.eval()(check)).abs().max().item()
    total = sum(model.heads_per_layer())
    step = PruningStep(step=count, heads_left=total - count, fraction_pruned=count / total,
                       accuracy=evaluate_accuracy(pruned, val), parameters=count_parameters(pruned),
                       flops=vit_flops(pruned.config), images_per_s=None, heads_per_layer=pruned.heads_per_layer(),
                       pruned=heads)
    return step, gap


def row(result: RecoveredStep, speedup: float) -> dict[str, Any]:
    """One order's entry for one fraction."""
    assert result.test_acc is not None
    return {"heads_per_layer": result.step.heads_per_layer, "pruned": result.step.pruned,
            "val_acc": list(result.val_acc), "test_acc": list(result.test_acc), "speedup": round(speedup, 3)}


def markdown(results: dict[str, Any]) -> str:
    """The side-by-side table: per fraction, heads left, then each order's test accuracy before and
    after recovery and its speed-up."""
    orders = list(results["orders"])
    head = "| heads removed | heads left | " + " | ".join(
        f"{name}: before | {name}: after | {name}: speed-up" for name in orders) + " |"
    lines = [head, "|" + "---|" * (2 + 3 * len(orders))]
    total = results["heads"]
    lines.append(f"| 0 | {total} | " + " | ".join(
        f"{results['test_acc']:.2f} | – | ×1.00" for _ in orders) + " |")
    for count in results["counts"]:
        cells = []
        for name in orders:
            entry = results["orders"][name].get(str(count))
            cells += (["–"] * 3 if entry is None else
                      [f"{entry['test_acc'][0]:.2f}", f"{entry['test_acc'][1]:.2f}", f"×{entry['speedup']:.2f}"])
        lines.append(f"| {count} ({100 * count / total:.0f}%) | {total - count} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def figure(results: dict[str, Any], path: Path) -> None:
    """Test accuracy before (dashed) and after (solid) recovery against heads removed, and after
    recovery against the measured speed-up, one colour per order."""
    fig = Figure(figsize=(9.6, 3.8), dpi=100)
    by_count, by_speed = fig.subplots(1, 2)
    for colour, (name, entries) in zip(("C0", "C1", "C2"), results["orders"].items(), strict=False):
        counts = [0, *(int(c) for c in entries)]
        before = [results["test_acc"], *(e["test_acc"][0] for e in entries.values())]
        after = [results["test_acc"], *(e["test_acc"][1] for e in entries.values())]
        speed = [1.0, *(e["speedup"] for e in entries.values())]
        by_count.plot(counts, before, "--o", color=colour, alpha=0.6, label=f"{name}, pruned")
        by_count.plot(counts, after, "-o", color=colour, label=f"{name}, recovered")
        by_speed.plot(speed, after, "-o", color=colour, label=f"{name}, recovered")
        for x, y, c in zip(speed[1:], after[1:], counts[1:], strict=True):
            by_speed.annotate(f"−{c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8, color=colour)
    by_count.set_xticks([0, *results["counts"]])
    by_speed.margins(x=0.12, y=0.12)
    by_count.set(xlabel=f"heads removed (of {results['heads']})", ylabel="test top-1 (%)",
                 title="before and after recovery")
    by_speed.set(xlabel="measured speed-up (×)", ylabel="test top-1 (%)",
                 title=f"after {results['recover_epochs']} epoch(s) of recovery")
    for axis in (by_count, by_speed):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    fig.suptitle(results["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="model.safetensors in its training run directory")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--step-fraction", type=float, default=0.1, help="vitkit's step (vitkit prune's default)")
    parser.add_argument("--tp-scope", choices=["uniform", "global"], nargs="+", default=["uniform"])
    parser.add_argument("--score-batches", type=int, default=20, help="training batches both orders score on")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--recover-epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=50, help="interleaved timing rounds")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--figure", type=Path, default=None)
    parser.add_argument("--title", default=None, help="figure title (default: the recipe's name)")
    args = parser.parse_args(argv)
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    model, extra = load_model_and_extra(args.model)
    model.eval()
    recipe = args.model.parent / CONFIG_FILE
    template = RecipeRecovery.from_recipe(recipe, epochs=args.recover_epochs, out=args.out, extra=extra,
                                          source=str(args.model))  # the learning rates of vitkit prune's
    splits = eval_loaders(data_config_for(extra, [], model), args.batch_size)
    assert splits.test is not None
    score_on = first_batches(splits.train, args.score_batches)
    timing_batch = next(iter(splits.val))[0]
    total = sum(model.heads_per_layer())
    counts = [round(f * total) for f in args.fractions]

    steps = {"vitkit": vitkit_steps(model, score_on, splits.val, counts, args.step_fraction)}
    gaps = {}
    for scope in args.tp_scope:
        name = f"Torch-Pruning ({scope})"
        pairs = [torch_pruning_step(model, c, score_on, splits.val, timing_batch, scope) for c in counts]
        steps[name] = [step for step, _ in pairs]
        gaps[name] = max(gap for _, gap in pairs)
        print(f"{name}: largest logit difference, vitkit with its heads pruned vs its timm model: {gaps[name]:.2e}")

    pruned = {name: [prune_heads(copy.deepcopy(model), s.pruned) for s in order] for name, order in steps.items()}
    flat = [m for order in pruned.values() for m in order]
    seconds = time_forward([model, *flat], timing_batch, rounds=args.rounds)
    speedups = iter([seconds[0] / s for s in seconds[1:]])
    speed = {name: [next(speedups) for _ in order] for name, order in steps.items()}

    lr = template.lr
    results: dict[str, Any] = {
        "model": str(args.model), "title": args.title or f"{extra.get('recipe', 'model')}: pruning {total} heads, then recovery",
        "heads": total, "counts": counts, "test_acc": evaluate_accuracy(model, splits.test),
        "val_acc": evaluate_accuracy(model, splits.val), "score_batches": args.score_batches,
        "step_fraction": args.step_fraction, "recover_epochs": args.recover_epochs, "recover_lr": lr,
        "timing": {"batch": len(timing_batch), "rounds": args.rounds, "threads": torch.get_num_threads(),
                   "median_forward_s": [round(s, 6) for s in seconds]},
        "logit_gap": gaps, "orders": {name: {} for name in steps},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name, order in steps.items():
        folder = args.out / "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")
        recovery = dataclasses.replace(template, out=folder, runs={})
        for step, speedup in zip(order, speed[name], strict=True):
            (result,) = recover_steps(model, [step], recovery, val_loader=splits.val, test_loader=splits.test)
            results["orders"][name][str(total - step.heads_left)] = row(result, speedup)
            write_json(args.out / "results.json", results)
    print(markdown(results))
    if args.figure is not None:
        figure(results, args.figure)


if __name__ == "__main__":
    main()
