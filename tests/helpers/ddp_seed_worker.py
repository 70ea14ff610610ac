"""Run by tests in 2 processes forked from pytest: one rank each of a 2-process DDP run (gloo, CPU) of
:func:`~tiny_runs.tiny_recipe` through :func:`vitkit.train.train`, the rendezvous in the environment as a
cluster's launcher sets it. When training starts, each rank writes its model's first weights and
the first draws of torch's, numpy's and Python's global generators to ``<folder>/rank<r>.json``."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import lightning as L
import numpy as np
import torch
from tiny_runs import SHORT, tiny_recipe

from vitkit.train import train

#: The recipe's ``trainer.seed``.
SEED = 7


class DrawRecorder(L.Callback):
    """At the start of training: the first weights and the next draws of the global generators."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        drawn = {"torch": torch.rand(4).tolist(), "numpy": np.random.rand(4).tolist(),
                 "python": [random.random() for _ in range(4)],
                 "weights": pl_module.model.head.weight[0, :4].tolist()}
        self.path.write_text(json.dumps(drawn))


def main(rank: int, world: int, port: int, folder: Path) -> None:
    """Rank ``rank`` of ``world``: train the tiny recipe's 2 steps, write ``<folder>/rank<rank>.json``."""
    torch.set_num_threads(1)  # forked from a process whose OpenMP pool is not copied: one thread, no pool
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank), NODE_RANK="0")
    recipe = tiny_recipe(folder / "runs", **{**SHORT, "limit_train_batches": 2}, strategy="ddp", devices=world,
                         seed=SEED)
    train(recipe, callbacks=[DrawRecorder(folder / f"rank{rank}.json")])
