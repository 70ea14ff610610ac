"""The pruning figure and progress bars say what they show: validation accuracy, the chosen step,
which order is running; and the prune tool says how many test images it used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import tiny_model, toy_batches

import vitkit
from vitkit.data import DataConfig, build_datasets
from vitkit.prune import iterative_pruning, random_scorer
from vitkit.prune.iterative import PruningStep
from vitkit.prune.report import pruning_curves_figure


def step(fraction: float, accuracy: float, pruned: dict[int, list[int]]) -> PruningStep:
    return PruningStep(0, 0, fraction, accuracy, 0, 0, None, [], pruned)


def test_pruning_figure_labels_validation_and_marks_the_chosen_step() -> None:
    records = [step(0.0, 90.0, {}), step(0.25, 89.5, {0: [1]}), step(0.5, 70.0, {0: [1], 1: [0]})]
    fig = pruning_curves_figure({"importance": [records]}, max_drop=1.0, chosen=records[1], title="digits: 4 heads")
    (ax,) = fig.axes
    assert ax.get_ylabel() == "validation accuracy (%)" and ax.get_title() == "digits: 4 heads"
    (star,) = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert list(star.get_xdata()) == [0.25] and list(star.get_ydata()) == [89.5]
    assert "chosen: 1 head(s) pruned" in [text.get_text() for text in ax.get_legend().get_texts()]


def test_pruning_progress_bar_names_its_order(seed: int, capsys: pytest.CaptureFixture) -> None:
    data = toy_batches()
    iterative_pruning(tiny_model(), data, eval_loader=data, scorer=random_scorer(0), desc="random, seed 0")
    assert "random, seed 0: " in capsys.readouterr().err


@pytest.mark.slow
def test_prune_tool_records_how_many_test_images_max_batches_left(
    seed: int, tmp_path: Path, load_tool, capsys: pytest.CaptureFixture
) -> None:
    model = vitkit.create_model(
        "vit_cifar_tiny", img_size=8, in_chans=1, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=10
    )
    data = {"name": "digits", "img_size": 8, "num_workers": 0, "val_fraction": 0.1, "test_fraction": 0.1}
    checkpoint = vitkit.save_model(model, tmp_path / "m.safetensors", extra={"dataset": "digits", "data_config": data})
    out = tmp_path / "prune"
    argv = ["--checkpoint", str(checkpoint), "--out", str(out), "--random-seeds", "1", "--rounds", "1",
            "--batch-size", "16", "--max-batches", "2"]
    assert load_tool("prune_heads").main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    split = len(build_datasets(DataConfig(**data)).test)  # about 10% of scikit-learn's 1,797 digits
    assert summary["test_images"] == [32, split]  # 2 batches of 16
    assert f"test (32 of {split} images: --max-batches) accuracy" in capsys.readouterr().out
