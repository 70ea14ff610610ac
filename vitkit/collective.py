"""The processes of a multi-device run, as the parts that keep their own state across them see
them (the unlabeled stream's shares, distribution alignment, FlexMatch's record, DINO's centre):
which process this is, how many there are, and a reduction over all of them. Alone (no process
group, or a group of one) they are process 0 of 1 and a reduction leaves a tensor as it is."""

from __future__ import annotations

from typing import Literal

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
