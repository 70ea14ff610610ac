"""An image folder trains and evaluates as the user would expect without options: a recipe that
trains on whole images evaluates whole images (and the model file records that crop), gray images
train a 1-channel model, and a ``note:`` says each choice."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tiny_runs import gray_folder, short_recipe

from vitkit.data import DataConfig, settle_unset
from vitkit.io import load_model_and_extra
from vitkit.train import train


def test_a_recipe_training_on_whole_images_evaluates_whole_images_and_gray_images_train_one_channel(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = gray_folder(tmp_path / "folder")
    recipe = short_recipe(tmp_path / "runs")
    recipe["data"] = {"name": "imagefolder", "root": str(root), "img_size": 8, "num_workers": 0,
                      "augment": {"crop": "pad", "padding": 1}}
    recipe["trainer"]["batch_size"] = 4
    with caplog.at_level(logging.INFO):
        result = train(recipe)
    notes = [record.getMessage() for record in caplog.records if record.getMessage().startswith("note: ")]
    assert any("are grayscale: a 1-channel model (data.in_chans=1 to choose)" in note for note in notes), notes
    assert any("see whole images, resized to 8x8 as training resizes them (augment.crop pad)" in note for note in notes)
    _, extra = load_model_and_extra(result.run_dir / "model.safetensors")
    assert (extra["in_chans"], extra["crop_pct"], extra["crop_mode"]) == (1, 1.0, "squash")
    assert "in_chans: 1" in (result.run_dir / "config.yaml").read_text()  # a resume builds the same model


def test_the_folder_default_crop_stays_for_random_resized_training_and_colour_stays_three_channels(
    tmp_path: Path,
) -> None:
    root = gray_folder(tmp_path / "folder", mode="RGB")
    config, notes = settle_unset(DataConfig(name="imagefolder", root=str(root)))
    assert config.in_chans == 3 and config.resolved_crop_pct() == 0.875
    assert "in colour: a 3-channel (RGB) model" in notes[0]
    assert "about 10 px on their shorter side (median of 16): they are resized to 10x10" in notes[1]
    assert "the central 87.5% of each image (data.crop_pct 0.875" in notes[2]
    chosen, notes = settle_unset(DataConfig(name="imagefolder", root=str(root), in_chans=1, crop_pct=0.9, img_size=10))
    assert (chosen.in_chans, chosen.resolved_crop_pct(), notes) == (1, 0.9, [])  # set by the user: no note
    assert DataConfig(name="cifar10", augment={"crop": "pad"}).resolved_crop_pct() == 1.0
