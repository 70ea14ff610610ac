"""Head-count ablation at fixed width: train the same recipe with 1, 2, 4, ... heads.

    vitkit ablate recipes/quickstart.yaml
    vitkit ablate recipes/quickstart.yaml --heads 2 4 8 --seeds 2 trainer.max_epochs=10

Every (head count, seed) pair trains the recipe with ``model.embed_dim=<--embed-dim>``,
``model.num_heads=h`` and ``trainer.seed=s`` on top of the given overrides, so the head width is
``embed_dim / h``. Each run is then put through the quick redundancy test: the least important
half of every layer's heads (Michel et al. 2019 importance, scored on the training images) is pruned
and the test accuracy compared with the full model's.

Writes to --out: runs.csv (one row per run), summary.csv and summary.md (mean ± std over seeds per
head count: test accuracy, training-loss oscillation, wall time, redundancy-test accuracy change),
head_sweep.png and the run directories under runs/. The oscillation is the std of the per-step
training loss over the last --last-epochs epochs after removing a fitted line (so the loss's
downward trend does not count); every step is logged (trainer.log_every=1) unless overridden.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from tqdm import tqdm

from vitkit.files import markdown_table, write_csv
from vitkit.output_dirs import claim_output_dir
from vitkit.prune import redundancy_test
from vitkit.prune.head_sweep import SweepRun, loss_oscillation, summarise
from vitkit.prune.measure import eval_loaders
from vitkit.prune.report import plot_sweep
from vitkit.train import load_recipe, train

from .commands import run_command


def sweep(args: argparse.Namespace) -> list[SweepRun]:
    out = Path(args.out)
    base = [f"model.embed_dim={args.embed_dim}", "trainer.log_every=1", "trainer.enable_progress_bar=false",
            f"output.dir={out / 'runs'}", *args.overrides]
    # Fail on a bad recipe or head count before the first run trains.
    configs = [load_recipe(args.recipe, [*base, f"model.num_heads={heads}"]) for heads in args.heads]
    claim_output_dir(out, "ablate_heads")
    splits = eval_loaders(configs[0].data)
    held_out = splits.test if splits.test is not None else splits.val
    runs = []
    # Seed-major order: stopped early, runs.csv still covers every head count.
    jobs = [(heads, seed) for seed in range(args.seeds) for heads in args.heads]
    for heads, seed in tqdm(jobs, desc="head sweep"):
        result = train(args.recipe, [*base, f"model.num_heads={heads}", f"trainer.seed={seed}"])
        redundancy = redundancy_test(result.model, splits.train, eval_loader=held_out)
        runs.append(SweepRun(
            heads=heads,
            head_dim=result.model.config.resolved_head_dim(),
            seed=seed,
            accuracy=result.summary["test_acc"],
            oscillation=loss_oscillation(result.run_dir / "metrics.csv", args.last_epochs),
            wall_time_s=result.summary["wall_time_s"],
            redundancy_change=redundancy.change,
            run_dir=str(result.run_dir),
        ))
        write_csv(out / "runs.csv", [dataclasses.asdict(r) for r in runs])  # partial results survive a crash
    rows = summarise(runs)
    write_csv(out / "summary.csv", rows)
    (out / "summary.md").write_text(markdown_table(rows))
    plot_sweep(runs, out / "head_sweep.png", title=f"{Path(args.recipe).stem}, d_model={args.embed_dim}")
    return runs


def main(argv: list[str] | None = None) -> int:
    """``vitkit ablate`` in this process (``tools/ablate_heads.py``, tests)."""
    return run_command("ablate", run, argv)


def run(args: argparse.Namespace) -> int:
    runs = sweep(args)
    print(markdown_table(summarise(runs)), end="")
    print(f"wrote {Path(args.out) / 'summary.md'}, summary.csv, runs.csv and head_sweep.png")
    return 0

