"""Run by tests in 2 processes forked from pytest (gloo, CPU): what FixMatch keeps across the
processes of a multi-device run. Each rank draws a pass of its share of a :class:`SemiSupervisedStream`'s
unlabeled images, feeds its own half of two fixed batches of weak-view probabilities to
:class:`DistributionAlignment` and its own half of a batch to :class:`FlexThresholds`, and writes
what they hold to ``<folder>/rank<r>.json``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from vitkit.data.arrays import ArrayDataset
from vitkit.data.unlabeled import SemiSupervisedStream
from vitkit.tasks.dist_align import DistributionAlignment
from vitkit.tasks.flexmatch import FlexThresholds

#: The fixed inputs: 2 batches of 4 weak views' probabilities over 3 classes (each rank takes 2 rows).
PROBS = [
    [[0.7, 0.2, 0.1], [0.02, 0.96, 0.02], [0.2, 0.2, 0.6], [0.97, 0.02, 0.01]],
    [[0.3, 0.3, 0.4], [0.05, 0.9, 0.05], [0.6, 0.3, 0.1], [0.01, 0.98, 0.01]],
]
#: FlexMatch's batch: the 4 images' places among 10 unlabeled images (each rank takes 2).
PLACES = [3, 7, 1, 8]
UNLABELED, MU = 20, 2


def main(rank: int, world: int, port: int, folder: Path) -> None:
    """Process ``rank`` of ``world``: join the group at ``port``, write ``<folder>/rank<rank>.json``."""
    torch.set_num_threads(1)  # forked from a process whose OpenMP pool is not copied: one thread, no pool
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    images = np.zeros((UNLABELED, 2, 2, 1), np.uint8)
    images[:, 0, 0, 0] = np.arange(UNLABELED)
    labelled = ArrayDataset(np.zeros((3, 2, 2, 1), np.uint8), np.arange(3), lambda image: torch.zeros(1), None)
    stream = SemiSupervisedStream(labelled, images, MU, seed=5)
    share = UNLABELED // world // MU
    drawn = [index for sample in range(share) for index in stream[sample][3].tolist()]

    mine = slice(rank * 2, rank * 2 + 2)
    align = DistributionAlignment(3)
    aligned = [align.aligned(torch.tensor(batch)[mine]).tolist() for batch in PROBS]

    flex = FlexThresholds(3)
    flex.bind(10)
    flex.thresholds(torch.tensor(PROBS[0])[mine], torch.tensor(PLACES)[mine], 0.95)
    result = {"drawn": drawn, "p_model": align.p_model.tolist(), "aligned": aligned,
              "kept": flex.kept.tolist(), "learning_effect": flex.learning_effect.tolist()}
    (folder / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
