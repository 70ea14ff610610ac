"""What training across processes needs beyond Lightning's strategies: the FSDP strategy built
for a ViT (torch's FSDP2 ``fully_shard`` under Lightning's ``ModelParallelStrategy``, with sharded,
atomic checkpoints), gradient clipping of sharded gradients (by their global norm, or each
parameter's as DINO clips), and the full weights of a sharded model gathered on rank 0 for export.

Lightning runs the processes (``trainer.strategy=ddp``/``fsdp``, ``trainer.num_nodes``, torchrun
or SLURM); see docs/train.md. Under FSDP each rank holds a shard of every parameter and of its
gradient, so a norm computed on one rank is its shard's, not the model's: the global norm is
``sqrt(all_reduce(sum over ranks of the local sums of squares))``. Torch's FSDP1 wrapper
(each parameter a view of this rank's part of the flat shard) and FSDP2's ``fully_shard`` (each
parameter a ``DTensor`` sharded on dim 0) both keep every element on exactly one rank, so the sum
over ranks counts each element once.

FSDP2, not Lightning's ``FSDPStrategy`` (FSDP1): torch 2.14's FSDP1 refuses to run without a GPU
("FSDP needs a non-CPU accelerator device"), FSDP2 runs on CPU processes over gloo as on GPUs over
NCCL, so the sharded path is tested on CPU (tests/train/test_fsdp_resume.py).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate

from ..collective import all_reduce
from ..files import commit_directory, staging_directory
from .lightning_compat import set_parallel_sizes


class ShardedStrategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as vitkit's FSDP: every rank one data-parallel shard
    (no tensor parallelism; :meth:`ViTModule.configure_model` calls :func:`shard`), checkpoints
    saved sharded through ``torch.distributed.checkpoint`` (each rank writes its own part, nothing
    is gathered) into a directory committed atomically (:func:`~vitkit.files.commit_directory`:
    ``last.ckpt`` is a symlink to the complete directory of the last save)."""

    def __init__(self) -> None:
        super().__init__(save_distributed_checkpoint=True)

    def setup_environment(self) -> None:
        # every process of every node shards the same model: a 1-D data-parallel mesh
        set_parallel_sizes(self, data_parallel=self.num_nodes * self.num_processes, tensor_parallel=1)
        super().setup_environment()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: str | os.PathLike, storage_options: Any = None) -> None:
        """Every rank writes its shards into a staging directory beside ``filepath`` (rank 0 also
        the metadata); once all have, rank 0 commits it as ``filepath``."""
        path = Path(self.broadcast(os.fspath(filepath)))
        staging = Path(self.broadcast(os.fspath(staging_directory(path))))
        super().save_checkpoint(checkpoint, staging, storage_options)
        self.barrier()
        if self.is_global_zero:
            commit_directory(staging, path)
        self.barrier()


def shard(units: Iterable[nn.Module], mesh: DeviceMesh) -> None:
    """Shard each of ``units`` in place with FSDP2 over ``mesh``, inner ones first (each encoder
    block, then the model: its embeddings and head, then a task's own layers): a unit's weights
    are gathered only while its ``forward`` runs, so every unit must be called through it (tasks
    that call ``forward_features`` instead, MAE and DINO, are refused with FSDP). Blocks
    checkpoint their activations as without FSDP (``model.grad_checkpointing``, non-reentrant:
    the recomputation runs inside the block's gathering)."""
    for unit in units:
        fully_shard(unit, mesh=mesh)


def is_sharded(strategy: object) -> bool:
    """Whether ``strategy`` (a Lightning strategy) shards the parameters across the ranks."""
    return isinstance(strategy, ShardedStrategy)


def meta_skeleton(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and saved buffers are on the meta device (no memory),
    for :func:`gather_into` to fill; buffers left out of the state dict (fixed tables rebuilt at
    construction) are copied as they are."""
    saved = module.state_dict(keep_vars=True)
    memo: dict[int, Any] = {}
    for tensor in saved.values():
        empty = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = nn.Parameter(empty, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else empty
    return copy.deepcopy(module, memo)


def gather_into(skeleton: nn.Module, wrapped: nn.Module, prefix: str = "") -> nn.Module | None:
    """The full weights of ``wrapped``'s submodule at ``prefix``, gathered shard by shard onto rank
    0's CPU, loaded into ``skeleton`` (:func:`meta_skeleton` of that submodule) on rank 0; ``None``
    on the other ranks, which hold nothing more than their shards. A collective: every rank calls it."""
    gathered = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    skeleton.load_state_dict(
        {key[len(prefix):]: value for key, value in gathered.items() if key.startswith(prefix)}, assign=True
    )
    return skeleton


def _is_shard(grad: torch.Tensor, sharded: bool) -> bool:
    """Whether ``grad`` is this rank's part of a gradient spread over the ranks: a ``DTensor`` says
    so itself (a ``Replicate`` placement is the whole gradient on every rank), a plain tensor is
    one if ``sharded`` (FSDP1's flat shards)."""
    if isinstance(grad, DTensor):
        return not all(isinstance(p, Replicate) for p in grad.placements)
    return sharded


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float, sharded: bool = False) -> torch.Tensor:
    """Scale the gradients of ``parameters`` in place so that their global L2 norm is at most
    ``max_norm`` (as ``torch.nn.utils.clip_grad_norm_``), and return that norm before clipping.

    Args:
        parameters: this rank's parameters; their gradients may be FSDP2 ``DTensor`` shards.
        max_norm: the largest norm left unscaled.
        sharded: the plain-tensor gradients are this rank's shards (FSDP1): their squares are
            summed over the ranks too. ``DTensor`` gradients say so themselves (a ``Replicate``
            placement is counted once, not once per rank).

    Returns:
        The global norm, a float32 scalar on the gradients' device (on every rank).
    """
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    local = [grad.to_local() if isinstance(grad, DTensor) else grad for grad in grads]
    # a rank whose shards have no gradient still joins the all-reduce
    device = local[0].device if local else parameters[0].device
    summed = torch.zeros((), dtype=torch.float32, device=device)  # sums over the ranks' shards
    replicated = torch.zeros((), dtype=torch.float32, device=device)  # the same on every rank
    for grad, part in zip(grads, local):
        square = part.detach().float().square().sum()
        if _is_shard(grad, sharded):
            summed += square
        else:
            replicated += square
    all_reduce(summed)
    norm = (summed + replicated).sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for part in local:
        part.detach().mul_(scale.to(part.device, part.dtype))
    return norm


def clip_grad_per_param(parameters: Iterable[torch.Tensor], max_norm: float, sharded: bool = False) -> torch.Tensor:
    """Scale each parameter's gradient in place so that its own L2 norm is at most ``max_norm``,
    as DINO's ``clip_gradients`` (Caron et al. 2021, arXiv 2104.14294): a gradient of norm ``n``
    is multiplied by ``max_norm / (n + 1e-6)`` where that is below 1, the others are left as they
    are; no host sync (DINO reads each norm on the host).

    Args:
        parameters: this rank's parameters, the same list on every rank; their gradients may be
            FSDP2 ``DTensor`` shards (each norm is then that of the whole gradient, every rank's part).
        max_norm: the largest norm a gradient keeps.
        sharded: the plain-tensor gradients are this rank's shards (FSDP1), as :func:`clip_grad_norm`.

    Returns:
        ``[P]`` float32 each parameter's gradient norm before clipping (0 for one without a
        gradient), on the gradients' device.
    """
    parameters = list(parameters)
    grads = [p.grad for p in parameters]
    local = [grad.to_local() if isinstance(grad, DTensor) else grad for grad in grads]
    device = next((part.device for part in local if part is not None), parameters[0].device)
    zero = torch.zeros((), dtype=torch.float32, device=device)
    squares = torch.stack([zero if part is None else part.detach().float().square().sum() for part in local])
    if sharded or any(isinstance(grad, DTensor) for grad in grads):  # DDP's replicas need no collective
        shards = torch.tensor([grad is not None and _is_shard(grad, sharded) for grad in grads], device=device)
        summed = torch.where(shards, squares, zero)  # every rank's part of one gradient, summed over the ranks
        all_reduce(summed)
        squares = torch.where(shards, summed, squares)
    norms = squares.sqrt()
    scales = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for part, scale in zip(local, scales):
        if part is not None:
            part.detach().mul_(scale.to(part.device, part.dtype))
    return norms
