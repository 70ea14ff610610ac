"""The pre-training tasks' options are checked against the model and the run at recipe load: a
recipe they cannot train is one ``error:`` line (exit 2) before a run directory exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_runs import tiny_recipe, write_tiny_recipe

from vitkit.cli.train import main as train_main
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
