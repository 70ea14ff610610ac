"""A run resumes from a checkpoint of a previous format (written out by hand as that format laid
it out: the old config key, AdamW's decayed group first, the steps counted by Lightning's
automatic loop) exactly as from today's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from tiny_runs import short_recipe

from vitkit.io import FORMAT_KEY, FORMAT_VERSION
from vitkit.train import train

pytestmark = pytest.mark.slow


def as_format_2(checkpoint: dict) -> dict:
    """``checkpoint`` in format 2's layout."""
    hparams = dict(checkpoint["hyper_parameters"])
    config = dict(hparams["vit_config"])
    config["locality_attention"] = config.pop("locality")
    for key in ("block", "attn_layer", "mlp_layer"):
        del config[key]
    hparams.update(vit_config=config, **{FORMAT_KEY: "2"})
    optimizer = checkpoint["optimizer_states"][0]
    undecayed, decayed = optimizer["param_groups"]
    assert undecayed["weight_decay"] == 0 < decayed["weight_decay"]  # today's order, timm's
    order = [*decayed["params"], *undecayed["params"]]  # format 2 numbered the decayed group first
    renumber = {old: new for new, old in enumerate(order)}
    groups = [{**decayed, "params": [renumber[p] for p in decayed["params"]]},
              {**undecayed, "params": [renumber[p] for p in undecayed["params"]]}]
    state = {renumber[p]: value for p, value in optimizer["state"].items()}
    schedulers = [{**s, "base_lrs": s["base_lrs"][::-1], "_last_lr": s["_last_lr"][::-1]}
                  for s in checkpoint["lr_schedulers"]]
    return {**checkpoint, "hyper_parameters": hparams, "lr_schedulers": schedulers,
            "optimizer_states": [{**optimizer, "param_groups": groups, "state": state}]}


def as_automatic_loop(checkpoint: dict) -> dict:
    """``checkpoint`` as written when Lightning's automatic loop took the optimiser steps (format 2
    and the format 3 checkpoints before manual optimisation): the steps counted under that loop,
    none under the manual loop's."""
    loops = {key: dict(value) for key, value in checkpoint["loops"].items()}
    fit = loops["fit_loop"]
    steps = fit["epoch_loop.manual_optimization.optim_step_progress"]
    assert steps["total"]["completed"] > 0
    automatic = fit["epoch_loop.automatic_optimization.optim_progress"]
    fit["epoch_loop.automatic_optimization.optim_progress"] = {**automatic, "optimizer": {**automatic["optimizer"], "step": steps}}
    zero = {"ready": 0, "completed": 0}
    fit["epoch_loop.manual_optimization.optim_step_progress"] = {"total": dict(zero), "current": dict(zero)}
    return {**checkpoint, "loops": loops}


@pytest.mark.parametrize("convert", [lambda c: as_format_2(as_automatic_loop(c)), as_automatic_loop],
                         ids=["format 2", "automatic loop"])
def test_an_older_checkpoint_resumes_exactly_as_today_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, convert) -> None:  # noqa: ANN001
    monkeypatch.setenv("VITKIT_ATTN_IMPL", "explicit")  # no kernel timing: the two resumes run alike
    first = train(short_recipe(tmp_path / "first"))
    today = tmp_path / "today.ckpt"
    shutil.copy(first.run_dir / "checkpoints" / "last.ckpt", today)
    checkpoint = torch.load(today, weights_only=True)
    assert checkpoint["hyper_parameters"][FORMAT_KEY] == FORMAT_VERSION
    old = tmp_path / "old.ckpt"
    torch.save(convert(checkpoint), old)

    resumed = [train(short_recipe(tmp_path / name, max_epochs=2), resume=path)
               for name, path in (("from_today", today), ("from_old", old))]
    for (name, ours), theirs in zip(resumed[0].model.state_dict().items(), resumed[1].model.state_dict().values()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0, msg=name)
    assert not torch.equal(resumed[0].model.head.weight, first.model.head.weight)  # the second epoch trained
    assert resumed[0].summary["global_steps"] == resumed[1].summary["global_steps"] == 2 * first.summary["global_steps"]
