"""tools/prune_heads.py and tools/ablate_heads.py end to end on tiny digits models."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from tiny_models import hand_accuracy

import vitkit
from vitkit.data import DataConfig, build_datasets
from vitkit.files import markdown_table
from vitkit.io import load_model_and_extra
from vitkit.prune.head_sweep import SweepRun, loss_oscillation, summarise

TINY_DATA = {"name": "digits", "img_size": 8, "num_workers": 0, "val_fraction": 0.1, "test_fraction": 0.1}


@pytest.mark.slow
def test_prune_heads_tool_writes_curves_and_a_loadable_pruned_model(
    seed: int, tmp_path: Path, load_tool, capsys: pytest.CaptureFixture
) -> None:
    model = vitkit.create_model(
        "vit_cifar_tiny", img_size=8, in_chans=1, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=10
    )
    extra = {"dataset": "digits", "recipe": "tiny", "data_config": TINY_DATA}
    (tmp_path / "run").mkdir()
    checkpoint = vitkit.save_model(model, tmp_path / "run" / "model.safetensors", extra=extra)
    (tmp_path / "latest").symlink_to(tmp_path / "run", target_is_directory=True)  # as runs/<recipe>/latest
    out = tmp_path / "prune"
    code = load_tool("prune_heads").main(
        [str(tmp_path / "latest" / "model.safetensors"), "--out", str(out), "--random-seeds", "2", "--rounds", "2",
         "--step-fraction", "0.5", "--max-drop", "100"]
    )
    assert code == 0
    assert "test accuracy (one view, float32: not the training summary's" in capsys.readouterr().out
    with open(out / "curves.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    orders = {row["order"] for row in rows}
    assert orders == {"importance", "importance, per-layer L2", "random", "entropy (highest first)"}
    assert [row["heads_left"] for row in rows if row["order"] == "importance"] == ["4", "2", "1", "0"]
    assert {row["seed"] for row in rows if row["order"] == "random"} == {"0", "1"}
    assert 0 < (out / "curves.png").stat().st_size < 300_000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heads"] == [4, 0]  # a 100-point budget allows pruning every head
    assert summary["speedup"] > 0 and summary["parameters"][1] < summary["parameters"][0]
    assert (summary["scored_on"], summary["selected_on"], summary["reported_on"]) == ("train", "val", "test")
    assert summary["max_drop"] == 100 and len(summary["val_acc"]) == 2 and len(summary["test_acc"]) == 2
    # The reported accuracies of the unpruned model are its correct predictions on the digits test
    # and val splits, counted here with a plain argmax over the whole split.
    bundle = build_datasets(DataConfig.from_dict(TINY_DATA))
    assert summary["test_acc"][0] == pytest.approx(hand_accuracy(model, bundle.test))
    assert summary["val_acc"][0] == pytest.approx(hand_accuracy(model, bundle.val))
    assert summary["test_images"] == [len(bundle.test)] * 2  # the whole test split without --max-batches
    pruned, saved_extra = load_model_and_extra(out / "pruned.safetensors")
    assert pruned.heads_per_layer() == [0, 0]
    assert saved_extra["recipe"] == "tiny" and saved_extra["pruning"]["heads_per_layer"] == [0, 0]
    assert saved_extra["pruning"]["source"] == str(checkpoint.resolve())  # the file, not the moving link


def test_prune_heads_tool_reports_a_missing_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture, load_tool) -> None:
    code = load_tool("prune_heads").main(["--checkpoint", str(tmp_path / "none.safetensors"), "--out", str(tmp_path)])
    assert code == 2
    assert "none.safetensors does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_ablate_heads_tool_trains_every_head_count_and_writes_the_table(tmp_path: Path, load_tool) -> None:
    recipe = {
        "model": {"name": "vit_cifar_tiny", "patch_size": 4, "depth": 1, "mlp_ratio": 1.0},
        "data": {**TINY_DATA, "augment": {"enabled": False}},
        "optim": {"lr": 1e-3},
        "trainer": {"max_epochs": 2, "batch_size": 64, "precision": "32-true", "accelerator": "cpu",
                    "devices": 1, "limit_train_batches": 3, "limit_val_batches": 1, "num_sanity_val_steps": 0},
    }
    recipe_path = tmp_path / "tiny.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "ablation"
    code = load_tool("ablate_heads").main(
        [str(recipe_path), "--heads", "1", "2", "--seeds", "1", "--embed-dim", "8", "--last-epochs", "2",
         "--out", str(out)]
    )
    assert code == 0
    with open(out / "runs.csv", newline="") as handle:
        runs = list(csv.DictReader(handle))
    assert [(r["heads"], r["head_dim"]) for r in runs] == [("1", "8"), ("2", "4")]
    assert all(float(r["oscillation"]) > 0 and float(r["wall_time_s"]) > 0 for r in runs)
    table = (out / "summary.md").read_text()
    assert table.startswith("| heads | head_dim |") and table.count("\n") == 4
    assert 0 < (out / "head_sweep.png").stat().st_size < 300_000


def test_loss_oscillation_ignores_the_trend_and_earlier_epochs(tmp_path: Path) -> None:
    rows = ["epoch,step,train/loss,val/acc1"]
    for step in range(40):
        epoch = step // 10
        wobble = 0.3 if step % 2 else -0.3
        loss = 5.0 if epoch < 2 else 3.0 - 0.05 * step + wobble  # epochs 0-1: a different regime
        rows.append(f"{epoch},{step},{loss},")
    rows.append("3,39,,95.0")  # validation rows have no training loss
    metrics = tmp_path / "metrics.csv"
    metrics.write_text("\n".join(rows) + "\n")
    assert loss_oscillation(metrics, last_epochs=2) == pytest.approx(0.3, rel=0.05)
    with pytest.raises(ValueError, match="trainer.log_every=1"):
        loss_oscillation(metrics, last_epochs=0)


def test_summarise_gives_mean_and_sample_std_per_head_count() -> None:
    runs = [SweepRun(4, 32, seed, acc, 0.1, 10.0, -1.0, "") for seed, acc in enumerate([90.0, 92.0])]
    runs.append(SweepRun(2, 64, 0, 88.0, 0.2, 12.0, 0.0, ""))
    rows = summarise(runs)
    assert [row["heads"] for row in rows] == [2, 4]
    assert rows[1]["test acc (%)"] == "91.00 ± 1.41" and rows[1]["seeds"] == 2
    assert markdown_table(rows).splitlines()[2].startswith("| 2 | 64 | 1 | 88.00 ± 0.00 |")


@pytest.mark.slow
def test_prune_heads_tool_reports_no_test_accuracy_without_a_test_split(tmp_path: Path, load_tool, capsys) -> None:
    from PIL import Image

    root = tmp_path / "folder"
    for split in ("train", "val"):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for index in range(4):
                Image.new("L", (8, 8), 60 * index + (100 if label == "a" else 0)).save(root / split / label / f"{index}.png")
    model = vitkit.create_model("vit_cifar_tiny", img_size=8, in_chans=1, patch_size=4, embed_dim=16, depth=1,
                                num_heads=2, num_classes=2)
    data = {"name": "imagefolder", "root": str(root), "img_size": 8, "in_chans": 1, "num_workers": 0}
    checkpoint = vitkit.save_model(model, tmp_path / "m.safetensors", extra={"dataset": "imagefolder", "data_config": data})
    out = tmp_path / "prune"
    code = load_tool("prune_heads").main(["--checkpoint", str(checkpoint), "--out", str(out), "--random-seeds", "1",
                                          "--rounds", "1", "--step-fraction", "0.5"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_acc"] is None and summary["reported_on"] is None
    assert "no held-out test split" in capsys.readouterr().err
