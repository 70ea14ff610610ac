"""The pre-training tasks' options are checked against the model and the run at recipe load: a
recipe they cannot train is one ``error:`` line (exit 2) before a run directory exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_runs import short_recipe, tiny_recipe, write_tiny_recipe

from vitkit.cli.train import main as train_main
from vitkit.schema import RecipeError
from vitkit.train import train
from vitkit.train.config import load_recipe

MAE_RUN = ["task.name=mae", "trainer.monitor=val/loss"]
MAE = [*MAE_RUN, "task.mae.decoder_dim=16", "task.mae.decoder_heads=2", "task.mae.decoder_depth=1"]


def refused(tmp_path: Path, capsys: pytest.CaptureFixture, *overrides: str) -> str:
    """The one error line of ``vitkit train`` on the tiny recipe with ``overrides``; no run directory."""
    path = write_tiny_recipe(tmp_path)
    assert train_main([str(path), *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()
    return err


@pytest.mark.parametrize(("override", "key"), [("model.shifted_patches=true", "model.shifted_patches"),
                                               ("model.patch_embed=conv", "model.patch_embed")])
def test_mae_refuses_a_tokenizer_that_mixes_patches(tmp_path: Path, capsys: pytest.CaptureFixture, override: str,
                                                    key: str) -> None:
    err = refused(tmp_path, capsys, *MAE, override)
    assert f"{key} in a command-line override" in err and "hidden pixels reach the visible tokens" in err


@pytest.mark.parametrize(("overrides", "key"), [(["model.global_pool=avg"], "model.global_pool"),
                                                (["model.fc_norm=true"], "model.fc_norm")])
def test_mae_refuses_an_encoder_whose_final_norm_comes_after_pooling(
    tmp_path: Path, capsys: pytest.CaptureFixture, overrides: list[str], key: str
) -> None:
    """The decoder reads every token: with the norm after pooling they would leave the encoder unnormalised."""
    err = refused(tmp_path, capsys, *MAE, *overrides)
    assert f"{key} in a command-line override" in err and "fine-tune with model.global_pool=avg" in err
    load_recipe(tiny_recipe(tmp_path), [*MAE, "model.global_pool=avg", "model.fc_norm=false"])  # norm on every token


def test_mae_refuses_token_merging(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The decoder puts each visible token back in its own place: 2 merged tokens for 5 have none."""
    err = refused(tmp_path, capsys, *MAE, "model.merge_tokens=2")
    assert "model.merge_tokens in a command-line override is 2" in err and "merge_tokens=0" in err


def test_mae_refuses_norm_pix_loss_over_one_pixel(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """1x1 patches of gray digits: each target is one value, whose variance is 0 (a NaN at step 0)."""
    err = refused(tmp_path, capsys, *MAE, "model.patch_size=1")
    assert "task.mae.norm_pix_loss in" in err and "1 pixel value" in err
    load_recipe(tiny_recipe(tmp_path), [*MAE, "model.patch_size=1", "task.mae.norm_pix_loss=false"])  # plain pixels


def test_mae_refuses_a_decoder_past_the_parameter_limit(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """512 blocks 65536 wide: about 12 * 65536^2 * 512 = 2.6e13 weights (was a 51 GB allocation)."""
    err = refused(tmp_path, capsys, *MAE_RUN, "task.mae.decoder_dim=65536", "task.mae.decoder_depth=512")
    assert "task.mae.decoder_dim in" in err and "2.64e+13 weights" in err and "limit of 4e+09" in err


DINO_RUN = ["task.name=dino", "trainer.monitor=val/loss", "model.dynamic_img_size=true"]
DINO = [*DINO_RUN, "task.dino.out_dim=32", "task.dino.hidden_dim=32", "task.dino.bottleneck_dim=16",
        "task.dino.local_crops=2", "task.dino.local_size=4"]


def load_refused(tmp_path: Path, *overrides: str) -> str:
    """The one-line :class:`RecipeError` of loading the tiny recipe with ``overrides`` (nothing built)."""
    with pytest.raises(RecipeError) as error:
        load_recipe(tiny_recipe(tmp_path), overrides)
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize("key", ["global_size", "local_size"])
def test_dino_refuses_a_crop_past_the_token_limit(tmp_path: Path, key: str) -> None:
    """1024-px crops in 2-px patches: 512 * 512 = 262,144 patches, 4x the limit of 65,536."""
    err = load_refused(tmp_path, *DINO_RUN, f"task.dino.{key}=1024")
    assert err.startswith(f"task.dino.{key} in a command-line override is 1024: 262,144 patches"), err
    assert "65,536" in err
    load_recipe(tiny_recipe(tmp_path), [*DINO_RUN, f"task.dino.{key}=512"])  # 65,536 patches: the limit itself


@pytest.mark.parametrize(("overrides", "key", "weights"), [
    # the 32-wide model's head (default widths 2048, 256, out 4096), by hand: 33 * 2048 + 2049 * 2048 +
    # 2049 * 2^16 + (2^16 + 1) * 2^20 = 68,859,072,512
    (["task.dino.out_dim=1048576", "task.dino.bottleneck_dim=65536"], "out_dim", "6.89e+10"),
    # 33 * 2^16 + 14 * (2^16 + 1) * 2^16 + (2^16 + 1) * 256 + 257 * 4096 = 60,150,452,480
    (["task.dino.hidden_dim=65536", "task.dino.head_layers=16"], "hidden_dim", "6.02e+10"),
])
def test_dino_refuses_a_head_past_the_parameter_limit(tmp_path: Path, overrides: list[str], key: str, weights: str) -> None:
    err = load_refused(tmp_path, *DINO_RUN, *overrides)
    assert err.startswith(f"task.dino.{key} in a command-line override") and f"about {weights} weights" in err, err


def test_dino_refuses_the_data_sections_augmentation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """DINO trains on its multi-crop views only: data.augment would change nothing (identical weights)."""
    err = refused(tmp_path, capsys, *DINO, "data.augment.enabled=true", "data.augment.crop=pad",
                  "data.augment.color_jitter=0.4")
    assert "data.augment.enabled in a command-line override is true" in err and "task.dino's local_crops" in err


@pytest.mark.parametrize("key", ["teacher_temp", "student_temp", "warmup_teacher_temp"])
def test_dino_refuses_a_temperature_below_the_floor(tmp_path: Path, capsys: pytest.CaptureFixture, key: str) -> None:
    """1/1e-45 overflows: the first loss was NaN, and the advice was to lower optim.lr."""
    err = refused(tmp_path, capsys, *DINO, f"task.dino.{key}=1e-45")
    assert f"task.dino.{key} in a command-line override is out of range: got 1e-45, must be >= 0.001" in err
    load_recipe(tiny_recipe(tmp_path), [*DINO, f"task.dino.{key}=1e-3"])


def test_model_freeze_in_a_pretraining_recipe_gets_advice_that_works(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Not "set model.pretrained too", which the pre-training task would refuse next."""
    err = refused(tmp_path, capsys, *MAE, "model.freeze=blocks:1")
    assert "classification options: model.freeze=blocks:1; remove them" in err and "model.pretrained" not in err, err
    err = refused(tmp_path, capsys, "model.freeze=blocks:1")  # classification: the weights to freeze are missing
    assert "model.freeze in a command-line override only applies to pretrained weights: set model.pretrained" in err


def test_schedules_as_long_as_the_run_are_noted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recipe = short_recipe(tmp_path / "runs", max_epochs=2)
    train(recipe, ["optim.warmup_epochs=2"])
    notes = [record.getMessage() for record in caplog.records if record.getMessage().startswith("note: optim.warmup")]
    assert notes == ["note: optim.warmup_epochs=2 is as long as the run (trainer.max_epochs=2) or longer: the learning "
                     "rate rises all along (to optim.lr=0.005 at epoch 2) and never decays."]


@pytest.mark.parametrize(("overrides", "noted"), [
    (["optim.warmup_epochs=1.5"], []),
    (["optim.warmup_epochs=3"], ["optim.warmup_epochs"]),
    ([*DINO, "task.dino.freeze_last_layer_epochs=2"], ["task.dino.freeze_last_layer_epochs"]),
    ([*DINO, "task.dino.freeze_last_layer_epochs=1", "task.dino.warmup_teacher_temp_epochs=2"], []),
    ([*DINO, "task.dino.freeze_last_layer_epochs=0", "task.dino.warmup_teacher_temp_epochs=3"],
     ["task.dino.warmup_teacher_temp_epochs"]),
])
def test_each_schedule_is_noted_when_the_run_ends_before_it(tmp_path: Path, overrides: list[str], noted: list[str]) -> None:
    """A 2-epoch run: a warm-up or a frozen last layer of 2 epochs fills it; a teacher warm-up of 2 ends in it."""
    config = load_recipe(tiny_recipe(tmp_path, max_epochs=2), overrides)
    assert [note.removeprefix("note: ").split("=")[0] for note in config.schedule_notes()] == noted
