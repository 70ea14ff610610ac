"""vitkit's own part of FSDP training, on CPU: a tiny ViT sharded as a run shards it (torch's FSDP2
``fully_shard``) in 2 gloo processes (torchrun) and compared with an unsharded copy trained alike
(tests/helpers/sharded_worker.py): clipping by the global norm of the shards or by each parameter's
norm over the shards (DINO's), and the full weights
gathered on rank 0 only for export. FSDP with a weight EMA, or with what it cannot train, is
refused. A whole run that is killed and resumed: tests/train/test_fsdp_resume.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_runs import ROOT, free_port, run_tool, tiny_recipe

from vitkit.schema import RecipeError
from vitkit.train import load_recipe
from vitkit.train import module as module_lib
from vitkit.train.datamodule import ViTDataModule
from vitkit.train.distributed import ShardedStrategy
from vitkit.train.model_builder import build_model
from vitkit.train.run import training_strategy

WORKER = ROOT / "tests" / "helpers" / "sharded_worker.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, float]]:
    folder = tmp_path_factory.mktemp("sharded")
    done = run_tool("-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}",
                    str(WORKER), str(folder), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
def test_clipping_uses_the_global_norm_of_fsdp2_shards(ranks: list[dict[str, float]]) -> None:
    for result in ranks:
        assert result["sharded_numel"] < result["numel"]  # each rank holds a part of the weights
        assert result["norm"] == pytest.approx(result["reference_norm"], rel=1e-5)  # torch's norm of the whole model
        assert result["grad_error"] < 1e-7  # the gathered clipped gradients are the unsharded copy's
    # one shard's own norm is not the model's: the all-reduce is what makes it global
    assert all(abs(r["local_norm"] - r["reference_norm"]) > 0.05 for r in ranks)


@pytest.mark.slow
def test_clipping_sums_plain_tensor_shards_across_ranks_when_told_they_are_shards(ranks: list[dict[str, float]]) -> None:
    for result in ranks:
        assert result["flat_norm"] == pytest.approx(result["reference_norm"], rel=1e-5)
        assert result["flat_local_norm"] < result["reference_norm"] - 0.05


@pytest.mark.slow
def test_per_parameter_clipping_takes_each_gradients_norm_over_the_ranks_shards(ranks: list[dict[str, float]]) -> None:
    for result in ranks:
        assert result["per_param_norm_error"] < 1e-7 and result["flat_per_param_norm_error"] < 1e-7
        assert result["per_param_error"] < 1e-8 and result["flat_per_param_error"] < 1e-8
        assert 0 < result["clipped_share"] < 1 and 0 < result["flat_clipped_share"] < 1  # some clipped, some not


@pytest.mark.slow
def test_export_of_an_fsdp2_sharded_module_gathers_the_whole_trained_model_on_rank_0_only(
    ranks: list[dict[str, float]],
) -> None:
    assert all(result["skeleton_on_meta"] for result in ranks)  # no rank keeps a full copy of the model
    zero, one = ranks
    assert zero["exported"] and not one["exported"]
    assert zero["weight_error"] < 1e-6 and zero["output_error"] < 1e-5


def test_fsdp_is_vitkit_s_sharded_strategy_and_the_model_checkpoints_its_own_blocks(tmp_path: Path) -> None:
    config = load_recipe(tiny_recipe(tmp_path), ["trainer.strategy=fsdp", "model.grad_checkpointing=true"])
    model, _ = build_model(config, ViTDataModule(config.data, 8).info, None)
    strategy = training_strategy(config.trainer)
    assert isinstance(strategy, ShardedStrategy) and strategy._save_distributed_checkpoint
    assert model.grad_checkpointing  # inside each block's FSDP unit, as without FSDP
    assert training_strategy(load_recipe(tiny_recipe(tmp_path), ["trainer.strategy=ddp"]).trainer) == "ddp"


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.strategy=fsdp_cpu_offload"], r"trainer\.strategy .*must be 'fsdp' to shard, got 'fsdp_cpu_offload'.*use trainer\.strategy=fsdp"),
    (["trainer.strategy=fsdp", "trainer.precision=16-mixed"], r"trainer\.precision .*cannot be '16-mixed' with trainer\.strategy=fsdp.*bf16-mixed"),
    (["trainer.strategy=fsdp", "task.name=mae", "trainer.monitor=val/loss"],
     r"trainer\.strategy .*is 'fsdp', but MAE .*trainer\.strategy=ddp"),
])
def test_fsdp_combinations_vitkit_cannot_train_are_refused_in_one_line(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(RecipeError, match=message) as error:
        load_recipe(tiny_recipe(tmp_path), overrides)
    assert "\n" not in str(error.value)


def test_gradients_under_fsdp_are_clipped_by_vitkit_as_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(module_lib, "clip_grad_norm", lambda params, norm, sharded: calls.append((norm, sharded)))
    model = torch.nn.Linear(2, 2)
    fake = SimpleNamespace(parameters=model.parameters, trainer=SimpleNamespace(strategy=ShardedStrategy()),
                           optim_config=SimpleNamespace(clip_grad=0.5, clip_mode="norm"))
    optimizer = torch.optim.AdamW(model.parameters())
    module_lib.ViTModule.on_before_optimizer_step(fake, optimizer)  # Lightning's FSDP plugin clips by value only
    assert calls == [(0.5, True)]
    fake.optim_config.clip_grad = None  # optim.clip_grad=null
    module_lib.ViTModule.on_before_optimizer_step(fake, optimizer)
    assert calls == [(0.5, True)]


def test_fsdp_with_a_weight_ema_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"optim\.ema .*trainer\.strategy=fsdp.*trainer\.strategy=ddp"):
        load_recipe(tiny_recipe(tmp_path), ["optim.ema=true", "trainer.strategy=fsdp"])
