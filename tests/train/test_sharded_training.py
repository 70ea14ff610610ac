"""vitkit's own part of FSDP training, on CPU: Lightning refuses its FSDP strategy without a GPU,
so a tiny ViT is sharded with torch's FSDP2 ``fully_shard`` in 2 gloo processes (torchrun) and
compared with an unsharded copy trained alike (tests/helpers/sharded_worker.py): clipping by the
global norm of the shards, and the full weights gathered into an unsharded model for export.
FSDP with a weight EMA is refused."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.strategies import FSDPStrategy
from tiny_runs import ROOT, run_tool, tiny_recipe

from vitkit.layers import EncoderBlock
from vitkit.train import load_recipe
from vitkit.train import module as module_lib
from vitkit.train.datamodule import ViTDataModule
from vitkit.train.model_builder import build_model
from vitkit.train.run import training_strategy
from vitkit.train.schema import RecipeError

WORKER = ROOT / "tests" / "helpers" / "sharded_worker.py"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
def test_export_of_an_fsdp2_sharded_module_gathers_the_whole_trained_model_on_every_rank(
    ranks: list[dict[str, float]],
) -> None:
    for result in ranks:  # ViTModule.export_model: the unsharded copy (zeroed first) filled from the shards
        assert result["weight_error"] < 1e-6 and result["output_error"] < 1e-5


def test_fsdp_strategy_wraps_and_checkpoints_each_encoder_block_and_the_model_does_not(tmp_path: Path) -> None:
    config = load_recipe(tiny_recipe(tmp_path), ["trainer.strategy=fsdp", "model.grad_checkpointing=true"])
    model, _ = build_model(config, ViTDataModule(config.data, 8).info, None)
    strategy = training_strategy(config, model)
    assert isinstance(strategy, FSDPStrategy) and strategy._state_dict_type == "full"
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {EncoderBlock}
    assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {EncoderBlock}
    assert not model.grad_checkpointing  # checkpointed once, by the strategy
    plain = load_recipe(tiny_recipe(tmp_path), ["trainer.strategy=fsdp"])
    assert training_strategy(plain, model)._activation_checkpointing_kwargs == {}
    assert training_strategy(load_recipe(tiny_recipe(tmp_path), ["trainer.strategy=ddp"]), model) == "ddp"


def test_gradients_under_fsdp_are_clipped_by_vitkit_as_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(module_lib, "clip_grad_norm", lambda params, norm, sharded: calls.append((norm, sharded)))
    model = torch.nn.Linear(2, 2)
    fake = SimpleNamespace(parameters=model.parameters, trainer=SimpleNamespace(strategy=FSDPStrategy()))
    optimizer = torch.optim.AdamW(model.parameters())
    module_lib.ViTModule.configure_gradient_clipping(fake, optimizer, 0.5, "norm")  # Lightning's would raise
    assert calls == [(0.5, True)]
    module_lib.ViTModule.configure_gradient_clipping(fake, optimizer, None, "norm")  # optim.clip_grad=null
    assert calls == [(0.5, True)]


def test_fsdp_with_a_weight_ema_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"optim\.ema .*trainer\.strategy=fsdp.*trainer\.strategy=ddp"):
        load_recipe(tiny_recipe(tmp_path), ["optim.ema=true", "trainer.strategy=fsdp"])
