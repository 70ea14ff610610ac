"""What training across processes needs beyond Lightning's strategies: the FSDP strategy built
for a ViT, gradient clipping by the global norm of sharded gradients, and the full weights of a
sharded model gathered for export.

Lightning runs the processes (``trainer.strategy=ddp``/``fsdp``, ``trainer.num_nodes``, torchrun
or SLURM); see docs/train.md. Under FSDP each rank holds a shard of every parameter and of its
gradient, so a norm computed on one rank is its shard's, not the model's: the global norm is
``sqrt(all_reduce(sum over ranks of the local sums of squares))``. Torch's FSDP1 wrapper
(Lightning's ``FSDPStrategy``, ``use_orig_params=True``: each parameter a view of this rank's part
of the flat shard) and FSDP2's ``fully_shard`` (each parameter a ``DTensor`` sharded on dim 0) both
keep every element on exactly one rank, so the sum over ranks counts each element once.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor, Replicate


def fsdp_strategy(model: nn.Module, checkpoint_blocks: bool) -> FSDPStrategy:
    """Lightning's ``FSDPStrategy`` for ``model`` (a ViT with ``blocks``): one FSDP unit per
    encoder block (the class of ``model.blocks``' members: vitkit's ``EncoderBlock`` or timm's
    ``Block``), the blocks' activations recomputed in the backward pass when ``checkpoint_blocks``,
    and checkpoints holding the full state dict (written by rank 0, readable by every tool)."""
    blocks = {type(block) for block in model.blocks}
    return FSDPStrategy(
        auto_wrap_policy=blocks,
        activation_checkpointing_policy=blocks if checkpoint_blocks else None,
        state_dict_type="full",
    )


def is_sharded(strategy: object) -> bool:
    """Whether ``strategy`` (a Lightning strategy) shards the parameters across the ranks."""
    return isinstance(strategy, FSDPStrategy)


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
        is_shard = (
            not all(isinstance(p, Replicate) for p in grad.placements) if isinstance(grad, DTensor) else sharded
        )
        if is_shard:
            summed += square
        else:
            replicated += square
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(summed)
    norm = (summed + replicated).sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for part in local:
        part.detach().mul_(scale.to(part.device, part.dtype))
    return norm


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s state dict with every shard gathered (FSDP1, FSDP2, DDP or a plain module), its
    keys those of the unwrapped module, on the CPU on every rank. A collective under FSDP: every
    rank must call it."""
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    return {name: tensor.detach().cpu() for name, tensor in state.items()}


def load_gathered(target: nn.Module, wrapped: nn.Module, prefix: str = "") -> nn.Module:
    """Fill ``target``, an unsharded copy of ``wrapped``'s submodule at ``prefix`` (kept before
    sharding), with the weights :func:`full_state_dict` gathers from ``wrapped``; every key must
    be there (a collective: every rank calls it). Returns ``target``."""
    gathered = full_state_dict(wrapped)
    target.load_state_dict({key[len(prefix):]: value for key, value in gathered.items() if key.startswith(prefix)})
    return target
