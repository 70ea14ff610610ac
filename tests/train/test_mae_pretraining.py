"""MAE pre-training through the recipe (``task.name: mae``): a tiny pre-train -> fine-tune round
trip on the digits, the run's k-NN accuracy, figure and next command, resume, and a recipe that
mixes classification options with pre-training refused in one line, and the fine-tuning command as a
shell reads it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from tiny_runs import short_recipe, write_tiny_recipe

from vitkit.cli.train import main as train_main
from vitkit.io import read_model
from vitkit.schema import parse_overrides
from vitkit.train import load_recipe, train
from vitkit.train.artifacts import merge_metrics
from vitkit.train.pretraining import finetune_command

MAE_TASK = {"name": "mae", "mae": {"decoder_depth": 1, "decoder_dim": 16, "decoder_heads": 2}}


def mae_recipe(out_dir: Path, **trainer: object) -> dict:
    """The tiny digits recipe pre-training its encoder with MAE for a few steps."""
    recipe = short_recipe(out_dir, monitor="val/loss", **trainer)
    return {**recipe, "name": "tiny_mae", "task": MAE_TASK}


def test_pretrain_then_finetune_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pretrained = train(mae_recipe(tmp_path / "runs"), ["task.knn_every=1"])
    run_dir, summary = pretrained.run_dir, pretrained.summary
    assert 0.0 <= summary["knn_acc1"] <= 100.0 and "test_acc" not in summary  # the task summarises no accuracy
    assert any(row.get("val/knn_acc1") for row in merge_metrics(run_dir))  # measured after the epoch too
    assert (run_dir / "reconstructions.png").stat().st_size > 0
    encoder = run_dir / "model.safetensors"
    config, state, _ = read_model(encoder)
    assert config.num_classes == 0 and not any("decoder" in key for key in state)  # the encoder alone
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert "task.decoder.mask_token" in checkpoint["state_dict"]  # the decoder is checkpointed with the run
    assert f"model.pretrained={encoder}" in summary["finetune_command"]

    finetuned = train(short_recipe(tmp_path / "runs"), [f"model.pretrained={encoder}", "data.train_per_class=10"])
    assert finetuned.summary["test_acc"] is not None and finetuned.model.num_classes == 10
    start = finetuned.model.blocks[0].attn.qkv.weight
    assert start.shape == state["blocks.0.attn.qkv.weight"].shape


def test_the_cli_prints_the_knn_accuracy_and_the_finetuning_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write_tiny_recipe(tmp_path, **{"limit_train_batches": 2, "limit_val_batches": 1, "limit_test_batches": 1,
                                          "monitor": "val/loss"})
    assert train_main([str(path), "task.name=mae", "task.mae.decoder_dim=16", "task.mae.decoder_heads=2",
                       "task.mae.decoder_depth=1", "task.linear_probe=true"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(next((tmp_path / "runs").rglob("summary.json")).read_text())
    assert 0.0 <= summary["linear_probe_acc1"] <= 100.0
    assert f"k-NN accuracy of the encoder's features {summary['knn_acc1']:.2f}% (test split, k=20; linear probe" in out
    assert "next: fine-tune the encoder on labelled images" in out and "vitkit train RECIPE model.pretrained=" in out


def test_a_pretraining_run_resumes_with_its_decoder(tmp_path: Path) -> None:
    first = train(mae_recipe(tmp_path / "runs"))
    last = first.run_dir / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)["state_dict"]["task.decoder.mask_token"].clone()
    resumed = train(mae_recipe(tmp_path / "runs"), ["trainer.max_epochs=2"], resume=last)
    assert resumed.run_dir == first.run_dir
    assert resumed.summary["global_steps"] == 2 * first.summary["global_steps"]
    after = torch.load(last, weights_only=True)["state_dict"]["task.decoder.mask_token"]
    assert not torch.equal(after, saved)  # trained on from the saved decoder
    assert resumed.summary["knn_acc1"] is not None


@pytest.mark.parametrize(("overrides", "words"), [
    (["optim.mixup=0.8"], "optim.mixup=0.8"),
    (["optim.label_smoothing=0.1", "optim.cutmix=1.0"], "optim.cutmix=1, optim.label_smoothing=0.1"),
    (["trainer.monitor=val/acc1"], "trainer.monitor=val/acc1 (use val/loss or last)"),
    (["distill.type=hard", "distill.teacher.model=resnet18"], "distill.type=hard"),
    (["model.lora={rank: 4}"], "model.lora"),
    (["model.freeze=backbone"], "model.freeze"),
    (["model.reset_head=true", "model.pretrained=PRETRAINED"], "model.reset_head=True"),
    (["model.impl=timm"], "set model.impl=vitkit"),
    (["task.mae.mask_ratio=0.99"], "leaves no visible patch"),
    (["task.mae.mask_ratio=1.0"], "task.mae.mask_ratio"),
    (["task.mae.decoder_dim=18"], "task.mae.decoder_dim"),
])
def test_a_recipe_mixing_classification_options_with_pretraining_is_refused_in_one_line(
    overrides: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = write_tiny_recipe(tmp_path, monitor="val/loss")
    overrides = [o.replace("PRETRAINED", str(path)) for o in overrides]
    assert train_main([str(path), "task.name=mae", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # refused before a run directory is claimed


@pytest.mark.parametrize(("overrides", "words"), [
    (["task.name=mae", "task.dino.local_crops=2"], "task.name in a command-line override is 'mae', which does not read task.dino"),
    (["task.mae.mask_ratio=0.5"], "is 'classify', which does not read task.mae"),
    (["task.knn_every=1", "task.linear_probe=true"], "does not read task.knn_every, task.linear_probe"),
])
def test_options_of_a_task_the_recipe_does_not_run_are_refused_in_one_line(
    overrides: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """They would be ignored: a classification recipe given MAE's mask ratio would train as if it had none."""
    path = write_tiny_recipe(tmp_path)
    assert train_main([str(path), *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_maes_own_init_and_fixed_positions_carry_into_finetuning(tmp_path: Path) -> None:
    """``model.init=mae model.pos_embed=sincos`` (the MAE recipes'): the encoder file records both, and a
    fine-tuning run from it, whose recipe sets neither, trains the same fixed table (not a learned one)."""
    pretrained = train(mae_recipe(tmp_path / "runs"), ["model.init=mae", "model.pos_embed=sincos"])
    config, state, _ = read_model(pretrained.run_dir / "model.safetensors")
    assert (config.init, config.pos_embed) == ("mae", "sincos") and "pos_embed" not in state
    finetuned = train(short_recipe(tmp_path / "runs"),
                      [f"model.pretrained={pretrained.run_dir / 'model.safetensors'}", "data.train_per_class=10"])
    model = finetuned.model
    assert (model.config.init, model.config.pos_embed) == ("mae", "sincos")
    assert not any(name == "pos_embed" for name, _ in model.named_parameters())  # fixed, not trained
    torch.testing.assert_close(model.pos_embed, pretrained.model.pos_embed.to(model.pos_embed))


def test_the_finetuning_command_reads_back_through_a_shell(tmp_path: Path) -> None:
    # the encoder's 4-px patches differ from fashion_mnist_fast's; its file sits in a folder with a space
    config = load_recipe("mae_fashion_mnist", ["model.patch_size=4", "data.root=/data/fashion mnist"])
    encoder = tmp_path / "my runs" / "model.safetensors"
    command = finetune_command(config, encoder, depth=4)
    words = shlex.split(command)  # as bash splits the line a user pastes
    assert words[:3] == ["vitkit", "train", "fashion_mnist_fast"]
    overrides, _ = parse_overrides(words[3:])
    assert overrides["model"]["patch_size"] == 4 and overrides["model"]["pretrained"] == str(encoder)
    assert overrides["data"] == {"root": "/data/fashion mnist", "train_per_class": 10}
    finetuning = load_recipe("fashion_mnist_fast", words[3:])
    assert finetuning.model.patch_size == (4, 4)
