"""Run by tests under ``torchrun --nproc-per-node=2`` (gloo, CPU): the tiny recipe's LightningModule
sharded as a run shards it (``ViTModule.configure_model``: FSDP2's ``fully_shard`` per encoder
block, then the model) and an unsharded copy of its model train one step on the same global batch
(each rank half of it); the ranks write what vitkit's clipping and export (rank 0) gave beside the
copy's values, computed with torch alone, to ``<folder>/rank<r>.json``."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tiny_runs import tiny_recipe
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from vitkit.train import load_recipe
from vitkit.train.datamodule import ViTDataModule
from vitkit.train.distributed import ShardedStrategy, clip_grad_norm, clip_grad_per_param
from vitkit.train.run import build_module

MAX_NORM = 0.05
#: The per-parameter bound: some gradients of the copy (clipped to MAX_NORM) are above it, some below.
PER_PARAM_NORM = 0.01


def flat_shards(grads: list[torch.Tensor], rank: int, world: int) -> list[nn.Parameter]:
    """Rank ``rank``'s contiguous part of each flattened gradient, as parameters holding them."""
    shards = []
    for grad in grads:
        part = grad.flatten().tensor_split(world)[rank]
        shard = nn.Parameter(torch.zeros_like(part))
        shard.grad = part.clone()
        shards.append(shard)
    return shards


def main(folder: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    config = load_recipe(tiny_recipe(folder))
    info = ViTDataModule(config.data, config.trainer.batch_size).info
    module = build_module(config, info)  # the LightningModule, as FSDP shards it in a run
    model = module.model
    reference = copy.deepcopy(model)
    strategy = ShardedStrategy()
    strategy._device_mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
    module.trainer = SimpleNamespace(strategy=strategy, model=module)
    module.configure_model()  # Lightning's hook: FSDP2 units per block, the model, the task's layers
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(8, info.in_chans, *info.img_size, generator=generator)
    labels = torch.randint(0, info.num_classes, (8,), generator=generator)
    half = len(images) // world
    mine = slice(rank * half, (rank + 1) * half)
    F.cross_entropy(module(images[mine]), labels[mine]).backward()  # FSDP2 averages the ranks' gradients
    F.cross_entropy(reference(images), labels).backward()
    unclipped = [param.grad.clone() for param in reference.parameters()]

    local_norm = torch.stack([p.grad.to_local().float().square().sum() for p in model.parameters()]).sum().sqrt()
    norm = clip_grad_norm(model.parameters(), MAX_NORM)
    reference_norm = nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
    grad_error = max((p.grad.full_tensor() - q.grad).abs().max().item()
                     for p, q in zip(model.parameters(), reference.parameters()))

    # FSDP1's layout: each rank holds a contiguous part of every flattened gradient, as a plain tensor
    flat_norm = clip_grad_norm(flat_shards(unclipped, rank, world), MAX_NORM, sharded=True)
    flat_local_norm = clip_grad_norm(flat_shards(unclipped, rank, world), MAX_NORM, sharded=False)

    # each parameter's gradient clipped by its own norm (DINO's clip_gradients): FSDP2's DTensor
    # shards, and FSDP1's flat shards, against the unsharded copy clipped by hand
    full_norms = torch.stack([q.grad.norm() for q in reference.parameters()])
    flat_full_norms = torch.stack([grad.norm() for grad in unclipped])
    per_param_norms = clip_grad_per_param(model.parameters(), PER_PARAM_NORM)
    flat_per_param = flat_shards(unclipped, rank, world)
    flat_bound = PER_PARAM_NORM * reference_norm.item() / MAX_NORM  # the unclipped gradients' scale
    flat_per_param_norms = clip_grad_per_param(flat_per_param, flat_bound, sharded=True)
    for q, grad in zip(reference.parameters(), unclipped):
        q.grad.mul_((PER_PARAM_NORM / (q.grad.norm() + 1e-6)).clamp(max=1.0))
        grad.mul_((flat_bound / (grad.norm() + 1e-6)).clamp(max=1.0))
    per_param_error = max((p.grad.full_tensor() - q.grad).abs().max().item()
                          for p, q in zip(model.parameters(), reference.parameters()))
    flat_per_param_error = max((shard.grad - grad.flatten().tensor_split(world)[rank]).abs().max().item()
                               for shard, grad in zip(flat_per_param, unclipped))

    for net in (model, reference):
        torch.optim.SGD(net.parameters(), lr=1.0).step()
    # the structure the export fills holds no weights: nothing but the shards stays on any rank
    skeleton_on_meta = all(t.is_meta for t in module.skeleton.state_dict().values())
    exported = module.export_model()  # rank 0 gathers; the others get None
    result = {
        "norm": norm.item(), "reference_norm": reference_norm.item(), "local_norm": local_norm.item(),
        "flat_norm": flat_norm.item(), "flat_local_norm": flat_local_norm.item(), "grad_error": grad_error,
        "per_param_norm_error": (per_param_norms - full_norms).abs().max().item(),
        "flat_per_param_norm_error": (flat_per_param_norms - flat_full_norms).abs().max().item(),
        "per_param_error": per_param_error, "flat_per_param_error": flat_per_param_error,
        "clipped_share": (full_norms > PER_PARAM_NORM).float().mean().item(),
        "flat_clipped_share": (flat_full_norms > flat_bound).float().mean().item(),
        "sharded_numel": sum(p.to_local().numel() for p in model.parameters()),
        "numel": sum(p.numel() for p in reference.parameters()), "skeleton_on_meta": skeleton_on_meta,
        "exported": exported is not None,
    }
    if exported is not None:
        expected = reference.state_dict()
        assert exported.state_dict().keys() == expected.keys()
        result["weight_error"] = max((value - expected[name]).abs().max().item() for name, value in exported.state_dict().items())
        with torch.no_grad():
            result["output_error"] = (exported(images) - reference.eval()(images)).abs().max().item()
    (folder / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
