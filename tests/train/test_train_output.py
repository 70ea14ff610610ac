"""What a training run prints: a few closing lines (the rest in summary.json), no third-party
banners; summary.json names the variant and what the recipe overrode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import SHORT, write_tiny_recipe


@pytest.mark.slow
def test_training_ends_with_a_few_lines_and_no_lightning_banners(
    tmp_path: Path, load_tool, capfd: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    assert load_tool("train").main([str(write_tiny_recipe(tmp_path, **SHORT))]) == 0
    out, err = capfd.readouterr()
    (run_dir,) = (tmp_path / "runs" / "tiny").glob("2*")
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = out.strip().splitlines()
    closing = lines[lines.index(next(line for line in lines if line.startswith("test accuracy"))):]
    assert len(closing) <= 8 and closing[0].startswith(f"test accuracy {summary['test_acc']:.2f}%")
    assert f"{summary['epochs']} epochs in {summary['wall_time_s']:.0f} s" in closing[0]
    tested, total = summary["test_images"]  # SHORT's 2 test batches of 64: the accuracy says what it covers
    assert tested == 128 < total and f" on 128 of {total} test images (trainer.limit_test_batches)" in closing[0]
    assert any(line == f"run directory: {run_dir} (summary.json has the rest)" for line in closing)
    assert any(f"vitkit predict {run_dir / 'model.safetensors'}" in line for line in closing)
    assert "attention_kernels" not in out  # the summary's bulk stays in summary.json
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "GPU available" in logged  # Lightning's log is captured here, and has no tips
    assert "Tip:" not in out + err + logged and "Total Flops" not in out + err + logged
    # tiny_recipe overrides these fields of vit_cifar_tiny
    overridden = "patch_size=(2, 2), embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0"
    assert summary["model"] == f"vit_cifar_tiny, overridden: {overridden}"


def test_closing_line_names_each_view_count_the_summary_scored(load_tool) -> None:
    summary = {"test_acc": 94.61, "test_acc5": 99.9, "val_acc": 94.2, "epochs": 100, "wall_time_s": 3100.4,
               "train_images_per_s": 1790.0, "tta": "hflip_shift", "test_acc_one_view": 93.9, "test_acc_mirrored": 94.3}
    first = load_tool("train").closing_lines(summary, Path("runs/r")).splitlines()[0]
    assert first.startswith("test accuracy 94.61% with hflip_shift views, 93.90% without, 94.30% with hflip's two")
    plain = {**summary, "tta": "none"}
    del plain["test_acc_one_view"], plain["test_acc_mirrored"]
    assert load_tool("train").closing_lines(plain, Path("runs/r")).splitlines()[0].startswith("test accuracy 94.61% (top-5")
    mixed = load_tool("train").closing_lines({**plain, "precision": "bf16-mixed"}, Path("runs/r")).splitlines()[0]
    assert mixed.startswith("test accuracy 94.61%, in bf16-mixed (top-5")  # prune and evaluate score in float32
