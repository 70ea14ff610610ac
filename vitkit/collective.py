"""The processes of a multi-device run, as the parts that keep their own state across them see
them (the unlabeled stream's shares, distribution alignment, FlexMatch's record, DINO's centre):
which process this is, how many there are, and a reduction over all of them; and the random draws
each process makes apart. Alone (no process group, or a group of one) they are process 0 of 1, a
reduction leaves a tensor as it is and the generators are not touched."""

from __future__ import annotations

import random
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist


def process_place() -> tuple[int, int]:
    """``(rank, world size)`` of this process: ``(0, 1)`` without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce(tensor: torch.Tensor, op: Literal["sum", "max"] = "sum") -> torch.Tensor:
    """Reduce ``tensor`` in place over every process (a collective: each calls it), and return it.
    A tensor of one process is left as it is."""
    if process_place()[1] > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor


def seed_per_process(seed: int) -> None:
    """Seed the global generators (torch's on every device, numpy's, Python's) with ``seed + rank``
    in a run of several processes, as MAE's and timm's training scripts seed each process.

    A run seeds every process alike, so that they build the same initial weights; once the model is
    shared out, the draws each process makes on its own batch (augmentation on the device, the
    loader's transforms without workers, masks, dropout) must differ, or every process flips,
    crops and masks its images exactly as the others do. Alone, nothing changes."""
    rank, world = process_place()
    if world > 1:
        mine = (seed + rank) % 2**32  # numpy's seeds stop below 2**32 (a recipe's seed may be 2**32 - 1)
        random.seed(mine)
        np.random.seed(mine)
        torch.manual_seed(mine)
