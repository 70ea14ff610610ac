"""dev/faithfulness_peers.py, the script behind docs/results.md's peer table, runs every peer's
method (pytorch-grad-cam, captum, lxt) on a random tiny model, and lxt's row equals vitkit's lrp
with the same rules (CP-LRP, LRP-0)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_peer_script_measures_every_peer(tmp_path: Path) -> None:
    for package in ("captum", "pytorch_grad_cam", "lxt"):
        pytest.importorskip(package)
    done = subprocess.run([sys.executable, str(ROOT / "dev" / "faithfulness_peers.py"), "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "peers.csv", newline="") as handle:
        rows = {row["method"]: row for row in csv.DictReader(handle)}
    assert {"lrp", "random", "pytorch-grad-cam gradcam", "pytorch-grad-cam gradcam++", "pytorch-grad-cam eigencam",
            "captum integrated_gradients", "captum input_x_gradient", "lxt CP-LRP (torchvision twin)", "lrp cp"} <= set(rows)
    for test in ("deletion_auc", "insertion_auc", "positive_auc", "negative_auc"):
        assert rows["lxt CP-LRP (torchvision twin)"][test] == rows["lrp cp"][test]
    assert done.stdout.strip().splitlines()[-1].startswith("most faithful (insertion minus deletion): ")
