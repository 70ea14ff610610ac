"""The own-images journey's table (docs/pretrain.md): pre-training's time and k-NN, then the test-folder
accuracy of the encoder fine-tuned and of the same model from fresh weights, per method and seed.

    python dev/own_images_table.py TEST_FOLDER "MAE=runs/journey/mae-s0" "MAE=runs/journey/mae-s1" ...

Each ``LABEL=DIR`` holds one seed's runs as the journey writes them: ``DIR/pre`` (``vitkit train
mae_imagefolder ...  output.dir=DIR/pre``), ``DIR/ft`` and ``DIR/scratch`` (``vitkit train finetune_small``
from the encoder, and with ``model.pretrained_weights=false``). Each fine-tuned model is scored on
TEST_FOLDER with ``vitkit evaluate MODEL TEST_FOLDER`` (its ``eval.json`` is reused when present).
Rows with the same label print as their mean and min-max. A developer tool, not part of the package.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path


def run_dir(folder: Path) -> Path:
    """The one run directory under ``folder`` (``folder/<recipe>/<time>``)."""
    (found,) = [path for path in folder.glob("*/2*") if path.is_dir() and not path.is_symlink()]
    return found


def test_accuracy(model: Path, test_folder: str) -> float:
    """Top-1 (percent) of ``model`` on every image of ``test_folder``, from ``vitkit evaluate``."""
    out = model.parent / "eval_test_folder"
    if not (out / "eval.json").exists():
        subprocess.run([sys.executable, "-m", "vitkit.cli.main", "evaluate", str(model), test_folder, "--out", str(out)],
                       check=True, capture_output=True)
    return json.loads((out / "eval.json").read_text())["top1"]


def spread(values: list[float]) -> str:
    mean = statistics.mean(values)
    return f"{mean:.1f}%" + (f" ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else "")


def main() -> None:
    test_folder, pairs = sys.argv[1], [arg.split("=", 1) for arg in sys.argv[2:]]
    rows: dict[str, list[dict[str, float]]] = {}
    for label, folder in pairs:
        pre = run_dir(Path(folder) / "pre")
        summary = json.loads((pre / "summary.json").read_text())
        rows.setdefault(label, []).append({
            "minutes": summary["wall_time_s"] / 60, "epochs": summary["epochs"], "knn": summary["knn_acc1"],
            "fine-tuned": test_accuracy(run_dir(Path(folder) / "ft") / "model.safetensors", test_folder),
            "scratch": test_accuracy(run_dir(Path(folder) / "scratch") / "model.safetensors", test_folder),
        })
    print("| method | seeds | pre-training (min, epochs) | k-NN on the labelled folder | fine-tuned | same model from scratch | gain |")
    print("|---|---|---|---|---|---|---|")
    for label, runs in rows.items():
        gains = [run["fine-tuned"] - run["scratch"] for run in runs]
        print(f"| {label} | {len(runs)} | {statistics.mean(r['minutes'] for r in runs):.1f}, "
              f"{statistics.mean(r['epochs'] for r in runs):.0f} | {spread([r['knn'] for r in runs])} | "
              f"{spread([r['fine-tuned'] for r in runs])} | {spread([r['scratch'] for r in runs])} | "
              f"{statistics.mean(gains):+.1f} points |")


if __name__ == "__main__":
    main()
