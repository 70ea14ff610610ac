"""Issue 50 item 5: the host work vitkit's training loop adds, on a model too small to hide it.

    python dev/host_overhead.py --root /usr/share/datasets/fashion-mnist --steps 300 --rounds 3

Both sides train the fast recipe's ViT cut to one block, 16 wide, one head (its convolutional stem,
4x4 tokens), from the same recipe (``recipes/fashion_mnist_fast.yaml`` with the overrides of
:func:`overrides`): the same in-memory Fashion-MNIST ``uint8`` tensors, the same batch augmentation
(:mod:`vitkit.data.batch_transforms`: pad-crop and flip), bf16 autocast, the recipe's AdamW
(:func:`vitkit.train.optim.build_optimizer`), warm-up and cosine schedule, label smoothing and
gradient clipping, batch 128:

* **vitkit**: :func:`vitkit.train.train`, Lightning and all (what ``vitkit train`` runs), for
  ``--steps`` training batches; its ``summary.json`` ``train_images_per_s`` times the training
  batches after the first (data included, validation and test excluded);
* **plain**: a ``for`` loop over a shuffled index tensor: gather, augment, forward, loss,
  backward, clip, step, schedule; timed the same way (first step left out).

Rounds alternate (vitkit, plain, vitkit, plain, ...) so that other work on the machine weighs on
both alike; the script prints each round, the median images/s of each side and their ratio
(target: >= 0.95).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from vitkit.data import build_datasets
from vitkit.train import load_recipe, train
from vitkit.train.model_builder import build_model
from vitkit.train.optim import build_optimizer, warmup_cosine

RECIPE = "fashion_mnist_fast"


def overrides(root: str, steps: int, threads: int, out: str) -> list[str]:
    """The recipe cut to a model too small to matter, ``steps`` training batches, one batch of
    validation and of test (the run needs them to pick and report its model)."""
    return [f"data.root={json.dumps(root)}", "model.depth=1", "model.embed_dim=16", "model.num_heads=1",
            "trainer.max_epochs=1", f"trainer.limit_train_batches={steps}", "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1", f"trainer.num_threads={threads}", "trainer.enable_progress_bar=false",
            f"output.dir={json.dumps(out)}"]


def vitkit_round(changes: list[str]) -> float:
    """Training images/s of ``vitkit.train.train``."""
    return float(train(RECIPE, changes).summary["train_images_per_s"])


def plain_round(changes: list[str], steps: int, seed: int) -> float:
    """Training images/s of a plain loop over the same tensors, model, optimiser and schedule."""
    config = load_recipe(RECIPE, changes)
    bundle = build_datasets(config.data)
    data = bundle.train
    images, labels = torch.from_numpy(data.images), torch.from_numpy(data.labels)
    torch.manual_seed(seed)
    model, _ = build_model(config, bundle.info, None)
    model.train()
    optimizer = build_optimizer(model, config.optim)
    batch = config.trainer.batch_size
    per_epoch = len(images) // batch
    scheduler = warmup_cosine(optimizer, warmup_steps=int(config.optim.warmup_epochs * per_epoch),
                              total_steps=config.trainer.max_epochs * per_epoch, lr=config.optim.lr,
                              min_lr=config.optim.min_lr)
    order = torch.randperm(len(images))
    started = 0.0
    for step in range(steps):
        if step == 1:  # the first step (warm-up, kernel choice) is timed apart, as vitkit's Throughput does
            started = time.perf_counter()
        chosen = order[step * batch : (step + 1) * batch]
        inputs, targets = data.batch_transform(images[chosen]), labels[chosen]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(inputs), targets, label_smoothing=config.optim.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.clip_grad)
        optimizer.step()
        scheduler.step()
    return (steps - 1) * batch / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/usr/share/datasets/fashion-mnist", help="the Fashion-MNIST IDX files")
    parser.add_argument("--steps", type=int, default=300, help="training batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, list[float]] = {"vitkit": [], "plain": []}
    with tempfile.TemporaryDirectory(prefix="vitkit-overhead-") as out:
        changes = overrides(args.root, args.steps, args.threads, out)
        for index in range(args.rounds):
            results["vitkit"].append(vitkit_round(changes))
            results["plain"].append(plain_round(changes, args.steps, index))
            print(f"round {index + 1}: vitkit {results['vitkit'][-1]:,.0f} images/s, "
                  f"plain loop {results['plain'][-1]:,.0f} images/s", flush=True)
    ours, plain = statistics.median(results["vitkit"]), statistics.median(results["plain"])
    print("| loop | images/s (median) |\n|---|---|")
    print(f"| vitkit.train | {ours:,.0f} |\n| plain PyTorch loop | {plain:,.0f} |")
    print(f"vitkit / plain: {ours / plain:.2f} (target >= 0.95; {args.rounds} rounds of {args.steps} steps of "
          f"batch 128, {args.threads} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
