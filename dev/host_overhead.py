"""Issue 50 item 5: the host work vitkit's training loop adds, on a model too small to hide it.

    python dev/host_overhead.py --root /usr/share/datasets/fashion-mnist --steps 400 --rounds 7

Every arm trains the fast recipe's ViT cut to one block, 16 wide, one head (its convolutional
stem, 4x4 tokens), with SDPA attention in every arm (no kernel trial: the arms run the same
kernels, so that only the loops differ), from the same recipe (``recipes/fashion_mnist_fast.yaml`` with the overrides of
:func:`overrides`): the same in-memory Fashion-MNIST ``uint8`` tensors, the same batch augmentation
(:mod:`vitkit.data.batch_transforms`: pad-crop and flip), bf16 autocast, the recipe's AdamW
(:func:`vitkit.train.optim.build_optimizer`), warm-up and cosine schedule, label smoothing and
gradient clipping, batch 128:

* **vitkit**: :func:`vitkit.train.train`, Lightning and all (what ``vitkit train`` runs), for
  ``--steps`` training batches, timed by a callback of its own at each batch's end (data
  included, validation and test excluded);
* **vitkit, progress bar**: the same, drawing its progress bar (to standard error) as ``vitkit
  train`` does by default (the other arms draw none);
* **bare Lightning**: the smallest LightningModule that trains the same way, by Lightning's
  automatic optimisation (a ``Trainer`` without logger, checkpoints, progress bar or callbacks but
  the clock): the floor Lightning's own loop sets, so that the table tells what is vitkit's and
  what is Lightning's (vitkit's module takes its steps itself, which skips part of that loop);
* **plain**: a ``for`` loop over a shuffled index tensor: gather, augment, forward, loss,
  backward, clip, step, schedule;
* **plain, again**: the same loop once more, the control: its ratio to **plain** is the error of
  the measurement itself.

Each arm is timed the same way: the end of every training step, the first step left out. The plain
arm runs as a plain PyTorch script would, without the ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` that
importing Lightning sets. Rounds run the arms in turn, so that other work on the machine weighs on
all alike, and every other round in the reverse order, so that no arm always runs first or after
the same arm. Other work only ever adds time, and a round's ratio moves by +-0.1 on 2 shared cores
(the control read 0.947 in one 5-round run), so
the headline figure is each arm's **floor**: for every step index the fastest of the rounds, summed
over the steps (work that recurs at a step index, such as logging every N steps, stays in it; a
burst of other work must hit the same step in every round to count). The script also prints each
round, the median images/s of each arm and the medians of the rounds' ratios with their range
(target: vitkit / plain >= 0.95).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from vitkit.data import build_datasets
from vitkit.train import load_recipe, train
from vitkit.train.config import RecipeConfig
from vitkit.train.model_builder import build_model
from vitkit.train.optim import build_optimizer, warmup_cosine

RECIPE = "fashion_mnist_fast"
ARMS = ("vitkit", "vitkit, progress bar", "bare Lightning", "plain", "plain, again")


def overrides(root: str, steps: int, threads: int, out: str) -> list[str]:
    """The recipe cut to a model too small to matter, ``steps`` training batches, one batch of
    validation and of test (the run needs them to pick and report its model)."""
    return [f"data.root={json.dumps(root)}", "model.depth=1", "model.embed_dim=16", "model.num_heads=1", "model.attn_impl=sdpa",
            "trainer.max_epochs=1", f"trainer.limit_train_batches={steps}", "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1", f"trainer.num_threads={threads}", "trainer.enable_progress_bar=false",
            f"output.dir={json.dumps(out)}"]


class Setup:
    """What the bare Lightning and the plain arms share: the recipe, the training split's tensors
    and its batch augmentation."""

    def __init__(self, changes: list[str], steps: int) -> None:
        self.config: RecipeConfig = load_recipe(RECIPE, changes)
        self.bundle = build_datasets(self.config.data)
        data = self.bundle.train
        self.images, self.labels = torch.from_numpy(data.images), torch.from_numpy(data.labels)
        self.augment = data.batch_transform
        self.batch = self.config.trainer.batch_size
        self.steps = steps
        per_epoch = len(self.images) // self.batch
        if steps > per_epoch:
            raise SystemExit(f"error: --steps {steps} is more than one epoch ({per_epoch} batches of {self.batch}); lower --steps.")

    def model_and_optimiser(self, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
        """A fresh model (seeded), the recipe's AdamW and its warm-up cosine schedule over one epoch."""
        torch.manual_seed(seed)
        model, _ = build_model(self.config, self.bundle.info, None)
        model.train()
        optim = self.config.optim
        optimizer = build_optimizer(model, optim)
        per_epoch = len(self.images) // self.batch
        scheduler = warmup_cosine(optimizer, warmup_steps=int(optim.warmup_epochs * per_epoch), total_steps=per_epoch,
                                  lr=optim.lr, min_lr=optim.min_lr)
        return model, optimizer, scheduler

    def loss(self, model: torch.nn.Module, chosen: torch.Tensor) -> torch.Tensor:
        """The recipe's loss on the training images at ``chosen``, augmented as the recipe does."""
        inputs, targets = self.augment(self.images[chosen]), self.labels[chosen]
        return F.cross_entropy(model(inputs), targets, label_smoothing=self.config.optim.label_smoothing)


class _Clock(L.Callback):
    """The time at the end of each training batch."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def tick(self) -> None:
        """A step ended now."""
        self.ends.append(time.perf_counter())

    def on_train_batch_end(self, *args: Any) -> None:
        self.tick()

    def durations(self) -> list[float]:
        """Seconds of each training step after the first."""
        return [end - start for start, end in zip(self.ends, self.ends[1:])]


def vitkit_round(setup: Setup, changes: list[str], seed: int) -> list[float]:
    """Step times of ``vitkit.train.train``."""
    clock = _Clock()
    train(RECIPE, [*changes, f"trainer.seed={seed}"], callbacks=[clock])
    return clock.durations()


def vitkit_bar_round(setup: Setup, changes: list[str], seed: int) -> list[float]:
    """Step times of ``vitkit.train.train`` drawing its progress bar, as ``vitkit train`` does."""
    drawn = [change for change in changes if not change.startswith("trainer.enable_progress_bar=")]
    return vitkit_round(setup, [*drawn, "trainer.enable_progress_bar=true"], seed)


def bare_lightning_round(setup: Setup, changes: list[str], seed: int) -> list[float]:
    """Step times of the smallest LightningModule that trains the same way."""

    class Bare(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.optimizer, self.scheduler = setup.model_and_optimiser(seed)

        def training_step(self, chosen: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return setup.loss(self.model, chosen)

        def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                        gradient_clip_algorithm: Any = None) -> None:
            # Lightning refuses to clip for a fused AdamW under bf16 (there is no scaler): clip here
            torch.nn.utils.clip_grad_norm_(self.parameters(), setup.config.optim.clip_grad)

        def configure_optimizers(self) -> dict[str, Any]:
            return {"optimizer": self.optimizer, "lr_scheduler": {"scheduler": self.scheduler, "interval": "step"}}

    clock = _Clock()
    trainer = L.Trainer(max_epochs=1, limit_train_batches=setup.steps, precision="bf16-mixed", accelerator="cpu",
                        devices=1, gradient_clip_val=setup.config.optim.clip_grad, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[clock])
    loader = DataLoader(torch.arange(len(setup.images)), batch_size=setup.batch, shuffle=True, drop_last=True)
    trainer.fit(Bare(), loader)
    return clock.durations()


def plain_round(setup: Setup, changes: list[str], seed: int) -> list[float]:
    """Step times of a plain loop over the same tensors, model, optimiser and schedule, with torch's
    own CUDA check (a script that does not import Lightning)."""
    lightning_setting = os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    try:
        model, optimizer, scheduler = setup.model_and_optimiser(seed)
        order = torch.randperm(len(setup.images))
        ends = _Clock()
        for step in range(setup.steps):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = setup.loss(model, order[step * setup.batch : (step + 1) * setup.batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), setup.config.optim.clip_grad)
            optimizer.step()
            scheduler.step()
            ends.tick()
        return ends.durations()
    finally:
        if lightning_setting is not None:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = lightning_setting


def rate(batch: int, durations: list[float]) -> float:
    """Images/s of steps of ``batch`` images that took ``durations`` seconds."""
    return len(durations) * batch / sum(durations)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/usr/share/datasets/fashion-mnist", help="the Fashion-MNIST IDX files")
    parser.add_argument("--steps", type=int, default=400, help="training batches per round (at most one epoch)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = {"vitkit": vitkit_round, "vitkit, progress bar": vitkit_bar_round, "bare Lightning": bare_lightning_round, "plain": plain_round,
              "plain, again": plain_round}
    steps: dict[str, list[list[float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="vitkit-overhead-") as out:
        changes = overrides(args.root, args.steps, args.threads, out)
        setup = Setup(changes, args.steps)
        for index in range(args.rounds):
            for arm in ARMS if index % 2 == 0 else reversed(ARMS):
                steps[arm].append(rounds[arm](setup, changes, index))
            print(f"round {index + 1}: " + ", ".join(f"{arm} {rate(setup.batch, steps[arm][-1]):,.0f}" for arm in ARMS)
                  + " images/s", flush=True)
    floors = {arm: rate(setup.batch, [min(times) for times in zip(*steps[arm])]) for arm in ARMS}
    per_round = {arm: [rate(setup.batch, times) for times in steps[arm]] for arm in ARMS}
    print("| loop | images/s, floor (fastest round at each step) | images/s, median of rounds |\n|---|---|---|")
    for arm in ARMS:
        print(f"| {arm} | {floors[arm]:,.0f} | {statistics.median(per_round[arm]):,.0f} |")
    print("| ratio | of the floors | median over rounds (range) |\n|---|---|---|")
    for top, bottom in (("vitkit", "plain"), ("vitkit, progress bar", "plain"), ("bare Lightning", "plain"), ("vitkit", "bare Lightning"),
                        ("plain, again", "plain")):
        ratios = [a / b for a, b in zip(per_round[top], per_round[bottom])]
        print(f"| {top} / {bottom} | {floors[top] / floors[bottom]:.3f} | {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f}) |")
    print(f"target: vitkit / plain >= 0.95 (the floors); {args.rounds} rounds of {args.steps} steps of batch 128, {args.threads} threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
