"""FixMatch through a recipe (``task.name: fixmatch``, registered in :mod:`vitkit.tasks.fixmatch`):
a short run trains on the labelled split and the unlabeled images together (an epoch is one pass
over the unlabeled ones, ``mu`` to a labelled image), logs the unlabeled term and the mask rate,
tests as a classifier and resumes; ``task.fixmatch.unlabeled_root`` replaces the left-out training
images; a recipe FixMatch cannot train is one ``error:`` line before a run directory exists; the
shipped recipe is the paper's defaults on 10 labels a class."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from tiny_runs import refused, tiny_recipe

import vitkit.train.run as run_module
from vitkit.data import DataConfig, build_datasets
from vitkit.train import train
from vitkit.train.config import load_recipe

FIXMATCH = ["task.name=fixmatch", "data.train_per_class=5", "data.augment.enabled=true", "data.augment.padding=1"]
BATCH = 8  # 50 labelled images give batches of 8 as they are (no clamp to a small split)


def fixmatch_recipe(tmp_path: Path, **fixmatch: object) -> dict:
    recipe = tiny_recipe(tmp_path / "runs", batch_size=BATCH, limit_val_batches=2, limit_test_batches=2)
    recipe["task"] = {"name": "fixmatch", "fixmatch": {"threshold": 0.6, **fixmatch}}
    recipe["data"].update({"train_per_class": 5, "augment": {"enabled": True, "crop": "pad", "padding": 1}})
    return recipe


def left_out() -> int:
    """The digits' training images that 5 labelled images a class leave out (the unlabeled ones)."""
    return len(build_datasets(DataConfig(name="digits", img_size=8)).train) - 10 * 5


def test_an_epoch_passes_over_the_unlabeled_images_tests_as_a_classifier_and_resumes(tmp_path: Path) -> None:
    result = train(fixmatch_recipe(tmp_path, mu=7))
    steps = left_out() // 7 // BATCH  # one pass, mu = 7 unlabeled images per labelled one
    assert result.summary["global_steps"] == steps
    assert result.summary["test_acc"] is not None and result.model.config.num_classes == 10
    with open(result.run_dir / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    logged = [row for row in rows if row.get("train/mask_rate")]
    assert logged and all(0 <= float(row["train/mask_rate"]) <= 1 for row in logged)
    assert all(row["train/loss_unlabeled"] != "" for row in logged)

    last = result.run_dir / "checkpoints" / "last.ckpt"
    before = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    resumed = train(result.run_dir / "config.yaml", ["trainer.max_epochs=2"], resume=last)
    assert resumed.run_dir == result.run_dir and resumed.summary["resumed_from"] is not None
    assert resumed.summary["global_steps"] == 2 * steps
    after = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    assert not torch.equal(after["model.head.weight"], before["model.head.weight"])  # it trained on


def test_mu_sets_the_epochs_length(tmp_path: Path) -> None:
    result = train(fixmatch_recipe(tmp_path, mu=3), ["trainer.limit_test_batches=1"])
    assert result.summary["global_steps"] == left_out() // 3 // BATCH


def test_pure_bfloat16_trains_both_views_on_its_copy(tmp_path: Path) -> None:
    recipe = fixmatch_recipe(tmp_path, mu=2)
    result = train(recipe, ["trainer.precision=bf16-true", "trainer.limit_train_batches=3", "trainer.limit_test_batches=1"])
    assert result.summary["global_steps"] == 3 and result.summary["precision"] == "bf16-true"


def test_an_unlabeled_folder_replaces_the_left_out_training_images(tmp_path: Path) -> None:
    folder = tmp_path / "unlabeled"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for index in range(40):
        Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(folder / f"{index}.png")
    result = train(fixmatch_recipe(tmp_path, mu=2, unlabeled_root=str(folder)), ["trainer.limit_test_batches=1"])
    assert result.summary["global_steps"] == 40 // 2 // BATCH  # not the ~1,500 left-out digits


class Clock(L.Callback):
    """The run's clock (``time.perf_counter`` of :mod:`vitkit.train.run`), moved by the training
    steps (the first two take 3 s, the others 0.5 s) and the validations (0.25 s each, as the plan
    below estimates them: the epochs run at the plan's pace, so it stays)."""

    def __init__(self) -> None:
        self.now, self.taken = 0.0, 0

    def __call__(self) -> float:
        return self.now

    def on_train_batch_start(self, *args: Any) -> None:
        self.now += 3.0 if self.taken < 2 else 0.5
        self.taken += 1

    def on_validation_end(self, *args: Any) -> None:
        self.now += 0.25


def test_a_time_budget_prices_evaluation_by_the_images_a_fixmatch_step_trains(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(run_module, "time", SimpleNamespace(perf_counter=clock))
    recipe = fixmatch_recipe(tmp_path, mu=2)
    recipe["trainer"].update(time_budget_minutes=0.5, limit_train_batches=4)
    result = train(recipe, callbacks=[clock])
    # a step trains 8 labelled images and 16 strong views and forwards 16 weak views (half each): 32 images,
    # so an evaluated image costs 0.5 x 0.5 s / 32; validation and test read 2 batches of 16 each. The end:
    # 64 x 0.0078125 + 10 = 10.5 s; planned after the first epoch (4 steps, 7 s): room 30 - 7 - 10.5 + 4 x 0.5
    # = 14.5 s, an epoch 4 x 0.5 + 32 x 0.0078125 = 2.25 s: 6 epochs (per labelled image: 12 s kept, 4 epochs)
    plan = result.summary["time_budget"]
    assert plan["end_s"] == pytest.approx(10.5) and plan["epochs"] == 6 and result.summary["global_steps"] == 24


@pytest.mark.parametrize(("overrides", "expected"), [
    (["task.name=fixmatch"], "set data.train_per_class"),
    ([*FIXMATCH, "optim.mixup=0.8"], "optim.mixup=0.8"),
    ([*FIXMATCH, "optim.label_smoothing=0.1"], "optim.label_smoothing=0.1"),
    ([*FIXMATCH, "data.augment.crop=random_resized"], "data.augment.crop is 'random_resized'"),
    ([*FIXMATCH, "data.augment.color_jitter=0.4"], "data.augment.color_jitter"),
    (["task.fixmatch.threshold=0.5"], "task.fixmatch"),
    (["task.fixmatch.unlabeled_root=/tmp"], "task.fixmatch"),
    ([*FIXMATCH, "task.fixmatch.threshold=1.5"], "threshold"),
    ([*FIXMATCH, "task.fixmatch.mu=0"], "mu"),
    ([*FIXMATCH, "task.fixmatch.unlabeled_root="], "empty; give the folder of unlabeled images"),
])
def test_a_recipe_fixmatch_cannot_train_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                               overrides: list[str], expected: str) -> None:
    assert expected in refused(tmp_path, capsys, *overrides)


def test_the_shipped_recipe_is_the_papers_defaults_on_ten_labels_a_class_from_an_mae_encoder() -> None:
    config = load_recipe("fixmatch_fashion_mnist")
    options = config.task.options
    assert (config.task.name, options.threshold, options.mu, options.lambda_u, options.temperature) == \
        ("fixmatch", 0.95, 7, 1.0, None)
    assert options.threshold_mode == "fixed"
    assert config.data.name == "fashion_mnist" and config.data.train_per_class == 10 and options.unlabeled_root is None
    assert config.model.pretrained == "runs/mae_fashion_mnist/latest/model.safetensors"
    assert config.optim.ema and config.trainer.time_budget_minutes == 15
