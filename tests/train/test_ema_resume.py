"""The weight EMA (``optim.ema``) across a resume: the checkpoint carries the average, and the
resumed run continues its recurrence rather than restarting it from the weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_runs import SHORT, Recorder, tiny_recipe

from vitkit.train import load_checkpoint, train

pytestmark = pytest.mark.slow


def test_resumed_run_continues_the_ema_recurrence_from_the_checkpoint(tmp_path: Path) -> None:
    decay = 0.6
    recipe = tiny_recipe(tmp_path, **SHORT)
    recipe["optim"].update(ema=True, ema_decay=decay)
    first = train(recipe)
    last = first.run_dir / "checkpoints" / "last.ckpt"
    saved = load_checkpoint(last)["state_dict"]
    ema, weights = saved["ema.module.head.weight"], saved["model.head.weight"]
    assert not torch.equal(ema, weights)
    recorder = Recorder()
    train(recipe, ["trainer.max_epochs=2"], resume=last, callbacks=[recorder])
    assert len(recorder.weights) == 4  # the second epoch's steps only
    expected = ema
    for step_weights in recorder.weights:  # EMA_k = d EMA_{k-1} + (1 - d) theta_k from the saved average
        expected = decay * expected + (1 - decay) * step_weights
    torch.testing.assert_close(recorder.ema_weights[-1], expected, atol=1e-6, rtol=1e-5)
