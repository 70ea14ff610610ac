"""Issue 21's tables (docs/results.md): one markdown row per training run, from its summary.json.

    python dev/fashion_mnist_table.py "conv stem, 20 epochs=runs/fm_fast/20261201-120000" ...

Each argument is ``LABEL=RUN_DIR`` (a run directory written by ``tools/train.py``); rows with the
same label are one configuration over several seeds and print as their mean, min-max and count.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def row(label: str, summaries: list[dict]) -> str:
    """``| label | epochs | test acc. mean (min-max, seeds) | one view | wall time | img/s | teacher |``:
    with ``trainer.tta`` the test accuracy averages the views and "one view" is the images alone."""
    tests = [s["test_acc"] for s in summaries]
    one_view = statistics.mean(s.get("test_acc_one_view", s["test_acc"]) for s in summaries)
    walls = [s["wall_time_s"] for s in summaries]
    spread = f" ({min(tests):.2f}-{max(tests):.2f}, {len(tests)} seeds)" if len(tests) > 1 else " (1 seed)"
    teacher = [s for s in summaries if "teacher_test_acc" in s]
    taught = (
        f"{statistics.mean(s['teacher_test_acc'] for s in teacher):.2f}% in "
        f"{statistics.mean(s['teacher_train_s'] for s in teacher):.0f} s" if teacher else "-"
    )
    return (f"| {label} | {summaries[0]['epochs']} | {statistics.mean(tests):.2f}%{spread} | {one_view:.2f}% | "
            f"{statistics.mean(walls) / 60:.1f} min | {statistics.mean(s['train_images_per_s'] for s in summaries):,.0f} | "
            f"{taught} |")


def main(argv: list[str]) -> int:
    groups: dict[str, list[dict]] = {}
    for argument in argv:
        label, _, run_dir = argument.rpartition("=")
        groups.setdefault(label, []).append(json.loads((Path(run_dir) / "summary.json").read_text()))
    print("| configuration | epochs | test accuracy | one view | wall time | train img/s | teacher (test acc., training time) |")
    print("|---|---|---|---|---|---|---|")
    for label, summaries in groups.items():
        print(row(label, summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
