"""The pre-training tasks' options are checked against the model and the run at recipe load: a
recipe they cannot train is one ``error:`` line (exit 2) before a run directory exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_runs import write_tiny_recipe

from vitkit.cli.train import main as train_main

MAE = ["task.name=mae", "task.mae.decoder_dim=16", "task.mae.decoder_heads=2", "task.mae.decoder_depth=1",
       "trainer.monitor=val/loss"]


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
